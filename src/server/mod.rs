//! Protocol front ends. Each parses, calls the one [`Limiter`], and formats.

pub mod headers;
pub mod http;
pub mod json;
pub mod knobs_api;
pub mod line;
pub mod rls;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic_health::server::HealthReporter;

use crate::limiter::Limiter;
use headers::HeaderStyle;
use rls::{RateLimitServiceServer, RlsService};

/// Serves Envoy's RateLimitService (with rate-limit headers in `headers`
/// style) and grpc.health.v1 on `listener` until `shutdown` completes.
pub async fn serve_grpc(
    listener: TcpListener,
    limiter: Arc<Limiter>,
    headers: HeaderStyle,
    ready_requires_store: bool,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    // The rate-limit service reports NOT_SERVING while its counter store is
    // failing (and a failure policy decides); "" (the process) stays SERVING.
    // The status is set before the first request can arrive, then followed.
    let watched = limiter.clone();
    let ready_now = move || !ready_requires_store || watched.store().ready();
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
    let mut last = ready_now();
    set_status(health.clone(), last).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let ready = ready_now();
            if ready != last {
                set_status(health.clone(), ready).await;
                last = ready;
            }
        }
    });
    let service = RateLimitServiceServer::new(RlsService::new(limiter, headers));
    // Envoy multiplexes every call on a few HTTP/2 connections: small
    // frames must not wait for Nagle's algorithm. Accept errors (out of file
    // descriptors) back off instead of spinning.
    let incoming = TcpListenerStream::new(listener).then(|conn| async move {
        match &conn {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
            }
            Err(e) => {
                tracing::warn!("gRPC: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        conn
    });
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
