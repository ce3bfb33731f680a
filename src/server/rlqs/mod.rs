//! Envoy's Rate Limit Quota Service (`StreamRateLimitQuotas`): Envoy
//! enforces each bucket itself; divvy assigns each stream its share.
//!
//! A thin adapter over [`hub::Hub`]: a stream's reports go to the hub,
//! which asks the limiter ([`crate::limiter::Limiter::bucket_limit`]) what
//! limit decides each bucket id (one descriptor of the stream's domain) and
//! divides each limit's rate among the streams reporting it, max-min fair
//! by demand ([`assign`]). Changed assignments are pushed by one background
//! task ([`spawn`]) within a second of a knob, a reload or a shift in
//! demand. With the Redis store the replicas first share each limit by
//! their streams' demand ([`replicas`]); with the memory store each
//! replica divides a limit among its own streams only.

pub mod assign;
pub mod hub;
pub mod replicas;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
pub use hub::Hub;

/// Most entries in one bucket id.
pub const MAX_BUCKET_ID_ENTRIES: usize = 32;
/// Most bytes (keys and values) in one bucket id.
pub const MAX_BUCKET_ID_BYTES: usize = 1024;
/// Responses queued for one stream; a stream that reads slower misses
/// pushes until it catches up (they are sent again at the next second).
const QUEUE: usize = 16;

/// The service's settings.
#[derive(Debug, Clone, Copy)]
pub struct RlqsSettings {
    /// `assignment_time_to_live` of every assignment (`--rlqs-assignment-ttl`).
    pub assignment_ttl: Duration,
    /// Most buckets one stream may report (`--rlqs-max-buckets-per-stream`).
    pub max_buckets_per_stream: usize,
}

impl Default for RlqsSettings {
    fn default() -> RlqsSettings {
        RlqsSettings {
            assignment_ttl: Duration::from_secs(15),
            max_buckets_per_stream: 1000,
        }
    }
}

/// Why a stream's message was refused; the stream ends with the status.
#[derive(Debug, Error)]
pub enum RlqsError {
    /// The first reports message carried no domain.
    #[error("the first usage reports message must carry a domain")]
    NoDomain,
    /// A usage report's bucket id is missing or empty.
    #[error("a bucket id must have at least one key")]
    EmptyBucketId,
    /// A bucket id over the bounds.
    #[error("a bucket id has {entries} entries and {bytes} bytes; at most {MAX_BUCKET_ID_ENTRIES} entries and {MAX_BUCKET_ID_BYTES} bytes are accepted")]
    BucketIdTooLarge {
        /// Its entries.
        entries: usize,
        /// Its bytes.
        bytes: usize,
    },
    /// The stream was closed meanwhile.
    #[error("the stream is closed")]
    Closed,
}

impl From<RlqsError> for Status {
    fn from(e: RlqsError) -> Status {
        match e {
            RlqsError::Closed => Status::cancelled(e.to_string()),
            _ => Status::invalid_argument(e.to_string()),
        }
    }
}

/// The gRPC service.
pub struct RlqsService {
    hub: Arc<Hub>,
}

impl RlqsService {
    /// A service registering its streams in `hub`.
    pub fn new(hub: Arc<Hub>) -> RlqsService {
        RlqsService { hub }
    }
}

/// Forgets a stream when its reader ends, however it ends.
struct Registered {
    hub: Arc<Hub>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.hub.close(self.id);
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<hub::Outbound>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(QUEUE);
        let id = self.hub.open(peer, tx.clone());
        let registered = Registered {
            hub: self.hub.clone(),
            id,
        };
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    m = inbound.message() => m,
                    () = tx.closed() => break,
                };
                let Ok(Some(reports)) = message else { break };
                if let Err(e) = registered.hub.report(registered.id, reports) {
                    registered
                        .hub
                        .metrics()
                        .errors
                        .with_label_values(&["rlqs"])
                        .inc();
                    let _ = tx.send(Err(e.into())).await;
                    break;
                }
            }
            drop(registered);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The service for `hub`, with the gRPC server's message-size limit.
pub fn service(
    hub: Arc<Hub>,
    max_request_bytes: usize,
) -> RateLimitQuotaServiceServer<RlqsService> {
    RateLimitQuotaServiceServer::new(RlqsService::new(hub))
        .max_decoding_message_size(max_request_bytes)
}

/// Starts the one task that recomputes every second, and within a tenth
/// of a second of a report or a change of the rules or the knobs, and
/// pushes what changed; when `shutdown`
/// completes it ends every stream and stops.
/// `divvy_rlqs_allocated_timestamp_seconds` says it is alive.
pub fn spawn(hub: Arc<Hub>, shutdown: impl Future<Output = ()> + Send + 'static) {
    let mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(shutdown);
    tokio::spawn(async move {
        let mut seen = Seen::of(&hub);
        let mut last = tokio::time::Instant::now();
        let mut shared = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let now_seen = Seen::of(&hub);
            let mut due = hub.take_dirty();
            if let Some(replicas) = hub.replicas() {
                let asks = hub.asks();
                let new = asks.iter().any(|a| replicas.lacks(&a.counter));
                if new || shared.elapsed() >= replicas::PERIOD {
                    shared = tokio::time::Instant::now();
                    if !asks.is_empty() {
                        replicas.renew(&asks).await;
                        due = true;
                    }
                }
            }
            if due || now_seen != seen || last.elapsed() >= Duration::from_secs(1) {
                seen = now_seen;
                last = tokio::time::Instant::now();
                hub.tick();
                hub.metrics()
                    .rlqs
                    .allocated
                    .set(crate::clock::now_ms() as i64 / 1000);
            }
        }
        hub.close_all();
    });
}

/// What a recompute depends on besides demand: the rule set in force and
/// the knobs.
#[derive(PartialEq)]
struct Seen {
    rules: usize,
    knobs: Vec<(String, crate::knobs::Knob)>,
}

impl Seen {
    fn of(hub: &Hub) -> Seen {
        Seen {
            rules: Arc::as_ptr(&hub.limiter().rules()) as usize,
            knobs: hub.limiter().knobs().list(),
        }
    }
}
