//! When a gRPC request arrived, and what one that waited past its deadline
//! gets (docs/reliability.md, "Overload").
//!
//! A caller's deadline counts from when its headers were read, not from
//! when a handler got to it: on a busy server a request can wait its turn
//! past Envoy's 20 ms. [`ArrivalLayer`], outermost, stamps each request
//! ([`Arrived`]) when the service is cloned, not when it is called: tonic's
//! glue (`hyper_util`'s `TowerToHyperService`) clones the stack as hyper
//! accepts the stream, right after the read, and calls the clone only once
//! the stream's task runs. A clone's first call takes that stamp: the
//! kernel's receive time of the read's batch ([`super::recv_time`]) when
//! there is one, else the clone's instant.
//!
//! A `ShouldRateLimit` whose budget ([`store_deadline`]) is spent when its
//! task starts, or that waited a [`QUEUE_SHARE`] of its timeout, gets the
//! failure policy's overall code at once ([`ShedAnswer`]), undecoded, and is
//! counted in `divvy_shed_total{reason="deadline"|"queue"}`. Under
//! `local` (it needs the counters) nothing is shed here: the handler's
//! deadline, from the same stamp, is already past. No deadline, no shedding.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use prometheus::IntCounter;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::deadline::{caller_timeout, store_deadline};
use crate::store::failover::FailurePolicy;

/// The instant a request's headers were read, in its extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrived(pub Instant);

/// The path of Envoy's `ShouldRateLimit`: the only call shed.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// What a shed `ShouldRateLimit` is answered: the overall code alone (the
/// request is not decoded, so no per-descriptor statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedAnswer {
    /// `OK` (the `allow` policy: fail open).
    Allow,
    /// `OVER_LIMIT` (the `deny` policy: fail closed).
    Deny,
}

impl ShedAnswer {
    /// The answer of `policy`; `None` for `local`, which decides with the
    /// counters and so cannot answer without the request.
    pub fn of(policy: FailurePolicy) -> Option<ShedAnswer> {
        match policy {
            FailurePolicy::Allow => Some(ShedAnswer::Allow),
            FailurePolicy::Deny => Some(ShedAnswer::Deny),
            FailurePolicy::Local => None,
        }
    }

    /// The gRPC message: a length-prefixed `RateLimitResponse` with only
    /// `overall_code` (field 1, a varint: 1 `OK`, 2 `OVER_LIMIT`).
    fn message(self) -> Bytes {
        Bytes::from_static(match self {
            ShedAnswer::Allow => &[0, 0, 0, 0, 2, 0x08, 1],
            ShedAnswer::Deny => &[0, 0, 0, 0, 2, 0x08, 2],
        })
    }
}

/// The part of a caller's timeout a call may wait for its turn before it
/// is shed: once divvy is that far behind, the answer (decided or shed)
/// waits about as long again for its connection's task to write it, so a
/// call let wait its whole budget would be answered past the caller's
/// timeout (docs/reliability.md, "Overload").
pub const QUEUE_SHARE: u32 = 4;

/// Why a call is shed: the `reason` of `divvy_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// It waited a [`QUEUE_SHARE`] of its caller's timeout for its turn.
    Queue,
    /// Its budget (the timeout less the margin) is spent.
    Deadline,
}

/// Whether a request that arrived at `arrived` allowing `timeout` is shed
/// at `now`, and why: the spent budget (the timeout less `margin`) first,
/// then a wait of a [`QUEUE_SHARE`] of the timeout.
pub fn is_late(
    arrived: Instant,
    timeout: Duration,
    margin: Duration,
    now: Instant,
) -> Option<Late> {
    if now >= store_deadline(arrived, timeout, margin) {
        Some(Late::Deadline)
    } else if now.saturating_duration_since(arrived) >= timeout / QUEUE_SHARE {
        Some(Late::Queue)
    } else {
        None
    }
}

/// What the layer needs to shed: the margin, the policy's answer (`None`:
/// nothing is shed) and the counters of shed requests.
#[derive(Debug, Clone)]
struct Shed {
    margin: Duration,
    answer: Option<ShedAnswer>,
    counted: ShedCounters,
}

/// `divvy_shed_total`'s series, one per [`Late`] reason.
#[derive(Debug, Clone)]
pub struct ShedCounters {
    /// `reason="queue"`.
    pub queue: IntCounter,
    /// `reason="deadline"`.
    pub deadline: IntCounter,
}

impl ShedCounters {
    /// The series of `reason`.
    fn of(&self, reason: Late) -> &IntCounter {
        match reason {
            Late::Queue => &self.queue,
            Late::Deadline => &self.deadline,
        }
    }
}

/// Stamps requests with [`Arrived`] and sheds late `ShouldRateLimit`s.
#[derive(Debug, Clone)]
pub struct ArrivalLayer {
    shed: Shed,
}

impl ArrivalLayer {
    /// Keeps `margin` of each caller's timeout; a late request gets
    /// `policy`'s answer and is counted in `counted`.
    pub fn new(margin: Duration, policy: FailurePolicy, counted: ShedCounters) -> ArrivalLayer {
        ArrivalLayer {
            shed: Shed {
                margin,
                answer: ShedAnswer::of(policy),
                counted,
            },
        }
    }
}

impl<S> Layer<S> for ArrivalLayer {
    type Service = Arrival<S>;

    fn layer(&self, inner: S) -> Arrival<S> {
        Arrival {
            inner,
            shed: self.shed.clone(),
            cloned_at: None,
        }
    }
}

/// The service [`ArrivalLayer`] makes.
#[derive(Debug)]
pub struct Arrival<S> {
    inner: S,
    shed: Shed,
    /// When this copy was made: for the copy hyper makes per request, when
    /// the request's headers were read (see the module's notes).
    cloned_at: Option<Instant>,
}

impl<S: Clone> Clone for Arrival<S> {
    fn clone(&self) -> Arrival<S> {
        Arrival {
            inner: self.inner.clone(),
            shed: self.shed.clone(),
            cloned_at: Some(arrived_now()),
        }
    }
}

/// When the request being accepted now arrived: its read's batch
/// ([`super::recv_time`]), else now.
fn arrived_now() -> Instant {
    let now = Instant::now();
    super::recv_time::batch_arrival(now).map_or(now, |at| at.min(now))
}

/// A request that may be shed: answered when its task first runs.
type MaybeShed<E> =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, E>> + Send>>;

impl<S, B> Service<http::Request<B>> for Arrival<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<S::Future, MaybeShed<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let arrived = self
            .cloned_at
            .take()
            .map_or_else(Instant::now, |at| at.min(Instant::now()));
        request.extensions_mut().insert(Arrived(arrived));
        let timeout = match self.shed.answer {
            Some(answer) if request.uri().path() == SHOULD_RATE_LIMIT => {
                caller_timeout(request.headers()).map(|timeout| (timeout, answer))
            }
            _ => None,
        };
        let Some((timeout, answer)) = timeout else {
            return Either::Left(self.inner.call(request));
        };
        // The service made ready is the one called later; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (counted, margin) = (self.shed.counted.clone(), self.shed.margin);
        Either::Right(Box::pin(async move {
            if let Some(reason) = is_late(arrived, timeout, margin, Instant::now()) {
                counted.of(reason).inc();
                return Ok(shed_response(answer));
            }
            inner.call(request).await
        }))
    }
}

/// A unary gRPC answer carrying `answer`'s message and status 0.
fn shed_response(answer: ShedAnswer) -> http::Response<tonic::body::Body> {
    let mut response = http::Response::new(tonic::body::Body::new(OneMessage {
        message: Some(answer.message()),
        trailers: true,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A body of one data frame then the trailers `grpc-status: 0`.
struct OneMessage {
    message: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.trailers
    }
}

#[cfg(test)]
#[path = "arrival_tests.rs"]
mod tests;
