//! Baselines: this program started again as a do-nothing gRPC server or a
//! constant-answer line server, and the servers themselves.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Stdio};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::procs::placement::server_command;

/// The hidden argument that makes this program the do-nothing gRPC server.
pub const BASELINE_GRPC: &str = "--baseline-grpc-server";
/// The hidden argument that makes this program the constant-answer line server.
pub const BASELINE_LINE: &str = "--baseline-line-server";

/// A baseline server process (this program with [`BASELINE_GRPC`] or
/// [`BASELINE_LINE`]), on the servers' CPU. It exits when its stdin closes,
/// so it never outlives the benchmark.
pub struct BaselineProc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl BaselineProc {
    pub fn start(flag: &str) -> BaselineProc {
        let exe = std::env::current_exe().expect("this benchmark's path");
        let mut child = server_command(exe)
            .args([flag, "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a baseline server");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("baseline address");
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("baseline server said {first:?}"));
        BaselineProc { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BaselineProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The do-nothing RateLimitService: one constant answer to every call.
pub struct DoNothing(RateLimitResponse);

#[tonic::async_trait]
impl RateLimitService for DoNothing {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

/// The do-nothing server's answer: OK, shaped like divvy's answer to the
/// benchmark's request (one descriptor status with its limit and reset).
pub fn constant_response() -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: String::from("bench"),
                requests_per_unit: 1_000_000_000,
                unit: Unit::Hour as i32,
            }),
            limit_remaining: 999_999_999,
            duration_until_reset: Some(PbDuration {
                seconds: 3599,
                nanos: 0,
            }),
            quota: None,
        }],
        ..Default::default()
    }
}

/// Runs this program as a baseline server (`flag` is [`BASELINE_GRPC`] or
/// [`BASELINE_LINE`]) on 127.0.0.1:`port` (0: any free port): prints
/// `listening on ADDR`, serves until stdin closes, exits.
pub fn serve_baseline(flag: &str, port: &str) -> ! {
    let port: u16 = port.parse().expect("baseline server port");
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    // The runtime `divvy serve` picks: one worker per allowed CPU, the
    // single-threaded scheduler on one (pinned) CPU.
    let rt = divvy::runtime::build(divvy::runtime::worker_threads(None)).expect("runtime");
    let grpc = flag == BASELINE_GRPC;
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        println!("listening on {}", listener.local_addr().expect("addr"));
        if grpc {
            serve_do_nothing_grpc(listener).await;
        } else {
            serve_constant_lines(listener).await;
        }
    });
    std::process::exit(0)
}

/// The do-nothing gRPC server: tonic with divvy's stream limit, no Nagle.
pub async fn serve_do_nothing_grpc(listener: TcpListener) {
    use tokio_stream::StreamExt as _;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    tonic::transport::Server::builder()
        .max_concurrent_streams(1024)
        .add_service(RateLimitServiceServer::new(DoNothing(constant_response())))
        .serve_with_incoming(incoming)
        .await
        .expect("serve gRPC");
}

/// The line baseline: answers each line with a constant, batching like divvy
/// does (everything read at once is answered in one write).
pub async fn serve_constant_lines(listener: TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut out = Vec::new();
            loop {
                let n = match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for _ in buf[..n].iter().filter(|&&b| b == b'\n') {
                    out.extend_from_slice(b"OK true 1 3600\n");
                }
                if s.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
        });
    }
}
