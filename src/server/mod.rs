//! Protocol front ends. Each parses, calls the one [`Limiter`], and formats.

pub mod admin;
pub mod arrival;
pub mod connections;
pub mod deadline;
pub mod headers;
pub mod idle;
pub mod json;
pub mod line;
pub mod problem;
pub mod readiness;
pub mod recv_time;
pub mod reflection;
pub mod rlqs;
pub mod rls;
pub mod rls_envoy;
mod rls_trace;
pub mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic_health::server::HealthReporter;

use crate::limiter::Limiter;
use headers::HeaderStyle;
use rls::{RateLimitServiceServer, RlsService};

/// How the rate-limit service answers: its rate-limit headers, the body of
/// a denial, and envoyproxy/ratelimit's settings for the domains its files define.
#[derive(Debug, Clone)]
pub struct Answers {
    /// Rate-limit response headers for Envoy to add.
    pub headers: HeaderStyle,
    /// The body of a denial (a denying rule's `deniedBody` overrides it).
    pub denied_body: crate::config::DeniedBody,
    /// envoyproxy/ratelimit's settings, built once at start.
    pub envoy: crate::limiter::envoy::EnvoySettings,
}

/// Bounds on gRPC connections and requests (see the README's "Limits and
/// hostile traffic").
#[derive(Debug, Clone, Copy)]
pub struct GrpcLimits {
    /// Most concurrent streams per HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// Largest request message, in bytes.
    pub max_request_bytes: usize,
    /// A connection whose peer sends nothing for this long is closed.
    pub idle: Duration,
    /// HTTP/2 PING interval (`None`: no pings); a peer that does not answer
    /// within `keepalive_timeout` is closed.
    pub keepalive: Option<Duration>,
    /// How long a PING may go unanswered.
    pub keepalive_timeout: Duration,
    /// Kept back from a caller's timeout (`grpc-timeout`) to decide and
    /// answer: the store is waited for until the timeout less this.
    pub deadline_margin: Duration,
    /// Each connection is sent GOAWAY at this age (±10%) and closed a
    /// grace later (`None`: connections live as long as their peers keep them).
    pub connection_age: Option<connections::ConnectionAge>,
    /// What a `ShouldRateLimit` that waited past its deadline is answered
    /// (`--on-store-failure`; see [`arrival`]).
    pub failure_policy: crate::store::failover::FailurePolicy,
    /// The rate-limit service's gRPC health follows the counter store's
    /// (NOT_SERVING while a failure policy decides): `--ready-requires-store`.
    pub ready_requires_store: bool,
    /// Serve gRPC reflection (`--grpc-reflection`).
    pub reflection: bool,
}

impl Default for GrpcLimits {
    fn default() -> GrpcLimits {
        GrpcLimits {
            max_concurrent_streams: 1024,
            max_request_bytes: 1 << 20,
            idle: Duration::from_secs(3600),
            keepalive: None,
            keepalive_timeout: Duration::from_secs(20),
            deadline_margin: deadline::DEFAULT_MARGIN,
            connection_age: None,
            ready_requires_store: false,
            reflection: false,
            failure_policy: crate::store::failover::FailurePolicy::Local,
        }
    }
}

/// Serves Envoy's RateLimitService (with rate-limit headers in `headers`
/// style), its Rate Limit Quota Service (streams registered in `rlqs`) and
/// grpc.health.v1 on `listener` until `shutdown` completes; over TLS with
/// `tls` (its certificate rotating), else in plaintext.
pub async fn serve_grpc(
    listener: TcpListener,
    limiter: Arc<Limiter>,
    answers: Answers,
    limits: GrpcLimits,
    rlqs: Arc<rlqs::Hub>,
    tls: Option<tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let readiness = readiness::Readiness {
        requires_store: limits.ready_requires_store,
        needs_config: answers.envoy.error_without_config,
    };
    let health_service = spawn_health(limiter.clone(), readiness).await;
    let metrics = limiter.telemetry().metrics.clone();
    let shed = &metrics.store.shed;
    let shed = arrival::ShedCounters {
        queue: shed.with_label_values(&["queue"]),
        deadline: shed.with_label_values(&["deadline"]),
    };
    let arrival = arrival::ArrivalLayer::new(limits.deadline_margin, limits.failure_policy, shed);
    let too_large = metrics.rejected.with_label_values(&["request_too_large"]);
    let style = rls::ResponseStyle {
        headers: answers.headers,
        denied_body: answers.denied_body,
    };
    let service = RlsService::new(limiter, style).with_deadline_margin(limits.deadline_margin);
    let service =
        RateLimitServiceServer::new(service).max_decoding_message_size(limits.max_request_bytes);
    let (reflect_v1, reflect_v1alpha) = match limits.reflection.then(reflection::services) {
        Some(Ok((v1, v1alpha))) => (Some(v1), Some(v1alpha)),
        Some(Err(e)) => {
            tracing::error!("{e}; serving without it");
            (None, None)
        }
        None => (None, None),
    };
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        // A request Envoy gave up on while it waited in the socket arrives
        // with its reset; h2 closed the connection (GOAWAY, every call on
        // it failing) past 20 such in one read. Bounded by the stream limit.
        .http2_max_pending_accept_reset_streams(Some(limits.max_concurrent_streams as usize))
        .http2_keepalive_interval(limits.keepalive)
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // Outermost: the arrival is stamped before anything else runs.
        .layer(arrival)
        .layer(tower::util::MapResponseLayer::new(move |r| {
            count_too_large(r, &too_large)
        }))
        .add_service(health_service)
        .add_service(service)
        .add_service(rlqs::service(rlqs, limits.max_request_bytes))
        .add_optional_service(reflect_v1)
        .add_optional_service(reflect_v1alpha);
    let aging = connections::Aging {
        age: limits.connection_age,
        aged: metrics.grpc_connections_aged.clone(),
    };
    match tls {
        None => {
            let incoming = plain_incoming(listener, limits.idle);
            connections::serve(router, incoming, aging, shutdown).await
        }
        Some(tls) => {
            let incoming = tls::incoming(listener, tls, limits.idle);
            connections::serve(router, incoming, aging, shutdown).await
        }
    }
}

/// grpc.health.v1: the rate-limit service reports NOT_SERVING while this
/// replica cannot answer ([`readiness::Readiness`]); "" (the process) stays
/// SERVING. The status is set before the first request can arrive, then
/// followed; a change of the store's health is logged.
async fn spawn_health(
    limiter: Arc<Limiter>,
    readiness: readiness::Readiness,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (health, health_service) = tonic_health::server::health_reporter();
    let set_status = |health: HealthReporter, ready: bool| async move {
        if ready {
            health
                .set_serving::<RateLimitServiceServer<RlsService>>()
                .await;
        } else {
            health
                .set_not_serving::<RateLimitServiceServer<RlsService>>()
                .await;
        }
    };
    let mut last = readiness.check(&limiter, false);
    set_status(health.clone(), last.is_ready()).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let now = readiness.check(&limiter, false);
            if now != last {
                log_readiness(&now);
                if now.is_ready() != last.is_ready() {
                    set_status(health.clone(), now.is_ready()).await;
                }
                last = now;
            }
        }
    });
    health_service
}

/// One line when what this replica answers from changes.
fn log_readiness(verdict: &readiness::Verdict) {
    match verdict {
        readiness::Verdict::Ready => tracing::info!("ready: answering from the counter store"),
        readiness::Verdict::Degraded(why) => {
            tracing::warn!("still ready, still answering: {why}")
        }
        readiness::Verdict::NotReady(why) => tracing::warn!("not ready: {why}"),
    }
}

/// The plaintext gRPC connections. Envoy multiplexes every call on a few
/// HTTP/2 connections: small frames must not wait for Nagle's algorithm.
/// Accept errors (out of file descriptors) back off instead of spinning.
fn plain_incoming(
    listener: TcpListener,
    idle: Duration,
) -> impl tokio_stream::Stream<Item = std::io::Result<idle::IdleStream>> {
    TcpListenerStream::new(listener).then(move |conn| async move {
        match &conn {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
            }
            Err(e) => {
                tracing::warn!("gRPC: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        conn.map(|stream| idle::IdleStream::new(stream, idle))
    })
}

/// Counts requests tonic refused as larger than the limit
/// (`divvy_rejected_total{reason="request_too_large"}`): they never reach
/// the service, and answer `OUT_OF_RANGE` in a trailers-only response.
fn count_too_large<B>(
    response: ::http::Response<B>,
    too_large: &prometheus::IntCounter,
) -> ::http::Response<B> {
    // A name made once: a `&str` lookup parses the name on every response.
    static GRPC_STATUS: ::http::HeaderName = ::http::HeaderName::from_static("grpc-status");
    if response.headers().get(&GRPC_STATUS).map(|v| v.as_bytes()) == Some(b"11") {
        too_large.inc();
    }
    response
}
