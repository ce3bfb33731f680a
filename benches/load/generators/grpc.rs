//! gRPC through tonic: the benchmark's ShouldRateLimit request, tonic
//! clients at maximum load, the answer check, the request as an HTTP/2
//! body, and the choice of maximum-load generator (h2load or tonic).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

use crate::stats::figures::Figures;

/// The `i`th ShouldRateLimit request: the `/api/*` rule, one of 65536 actors.
pub fn grpc_request(i: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "path".into(),
                    value: "/api/items".into(),
                },
                Entry {
                    key: "ip".into(),
                    value: format!("10.1.{}.{}", (i / 256) % 256, i % 256),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// `channels` clients, each on an HTTP/2 connection of its own.
pub async fn grpc_clients(addr: SocketAddr, channels: u64) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..channels {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    clients
}

/// `concurrency` ShouldRateLimit calls in flight, spread over `channels`
/// HTTP/2 connections (Envoy opens one per worker thread); each call's
/// answer must be OK.
pub async fn grpc_concurrent(
    addr: SocketAddr,
    run: Duration,
    concurrency: u64,
    channels: u64,
) -> Figures {
    let clients = grpc_clients(addr, channels).await;
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..concurrency)
        .map(|c| {
            let mut client = clients[(c % channels) as usize].clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = c * 1_000_000;
                while Instant::now() < deadline {
                    let req = grpc_request(i);
                    let t = Instant::now();
                    let r = client
                        .should_rate_limit(req)
                        .await
                        .expect("rpc")
                        .into_inner();
                    assert_eq!(r.overall_code, Code::Ok as i32);
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// Checks that `addr` answers [`grpc_request`]`(0)`, the call h2load repeats,
/// with OK.
pub async fn grpc_answers_ok(addr: SocketAddr) {
    let mut client = grpc_clients(addr, 1).await.remove(0);
    let answer = client
        .should_rate_limit(grpc_request(0))
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
}

/// The URL of ShouldRateLimit on `addr` (h2load's target, and the paced
/// generator's request URI).
pub fn grpc_url(addr: SocketAddr) -> String {
    format!("http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
}

/// `request` as the body of a unary gRPC call: the 5-byte frame header
/// (uncompressed, length) and the protobuf message.
pub fn grpc_body(request: &RateLimitRequest) -> Vec<u8> {
    let message = prost::Message::encode_to_vec(request);
    let len = u32::try_from(message.len()).expect("small message");
    let mut body = vec![0u8];
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(&message);
    body
}

/// The gRPC generator of maximum load: h2load when it is on the PATH, else
/// this program's tonic client (paced load always comes from [`grpc_paced`]).
#[derive(Clone, Copy)]
pub enum GrpcGenerator {
    /// h2load, from Debian's nghttp2-client (the test command installs it):
    /// nghttp2 in C, several times cheaper per call than a tonic client, so
    /// the server rather than the generator sets the maximum.
    H2load,
    /// This program's tonic client ([`grpc_concurrent`]).
    Tonic,
}

impl GrpcGenerator {
    /// h2load if `h2load --version` runs, else tonic.
    pub fn pick() -> GrpcGenerator {
        let runs = Command::new("h2load")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if runs {
            GrpcGenerator::H2load
        } else {
            GrpcGenerator::Tonic
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            GrpcGenerator::H2load => {
                "h2load (nghttp2-client), one process on the load generator's CPU; \
                 every call is the same request (one actor)"
            }
            GrpcGenerator::Tonic => {
                "this program's tonic client (h2load not on the PATH: install \
                 nghttp2-client for a generator that costs less than the servers)"
            }
        }
    }
}
