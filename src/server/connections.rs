//! The gRPC port's connections, each served by tonic on its own, so that
//! each can have an age of its own: the configured age ±10%. Envoy keeps
//! a few HTTP/2 connections open for as long as it runs; after a scale-out
//! the new replicas get none of its calls until those connections close.
//! At its age a connection is sent GOAWAY, its calls in flight have the
//! grace to finish, then it is closed; Envoy opens a new one, which the
//! load balancer may send to a new replica. The jitter keeps connections
//! opened together (at Envoy's start) from all going away together.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{future, stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::idle::{waiting_until, write_through};
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Sleep;
use tonic::body::Body;
use tonic::codegen::StdError;
use tonic::service::Routes;
use tonic::transport::server::{Connected, Router, TcpConnectInfo};
use tonic::transport::Body as HttpBody;
use tower::{Layer, Service};

/// How long a gRPC connection is served before it is asked to go away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionAge {
    /// The age before jitter: each connection's is this ±10%.
    pub age: Duration,
    /// How long the calls in flight at the GOAWAY may take before the
    /// connection is closed (`None`: as long as they take).
    pub grace: Option<Duration>,
}

impl ConnectionAge {
    /// The age of one connection: [`ConnectionAge::age`] times a factor in
    /// [0.9, 1.1], uniform over `random`'s values.
    pub fn jittered(&self, random: u64) -> Duration {
        // The top 53 bits as a fraction in [0, 1), exact in an f64.
        let unit = (random >> 11) as f64 / (1u64 << 53) as f64;
        Duration::try_from_secs_f64(self.age.as_secs_f64() * (0.9 + 0.2 * unit)).unwrap_or(self.age)
    }
}

/// A connection-age flag's value: `0` (off; for the grace, no limit) or a
/// duration such as `500ms`, `30s`, `5m`, `24h`.
pub fn parse_flag(text: &str) -> Result<Duration, String> {
    crate::config::duration::parse_millis(text)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration such as 0, 500ms, 30s, 5m or 24h"))
}

/// When connections are asked to go away, and where those that were are
/// counted.
#[derive(Clone)]
pub(crate) struct Aging {
    /// Each connection's age (`None`: served until it closes).
    pub age: Option<ConnectionAge>,
    /// `divvy_grpc_connections_aged_total`.
    pub aged: prometheus::IntCounter,
}

/// A fresh random number for one connection's jitter.
fn random() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No entropy source: the clock's nanoseconds still spread
        // connections accepted at different moments.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
        nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    })
}

/// The bounds `serve` and `serve_one` put on their connections, router and
/// answers (tonic's `serve_with_incoming_shutdown`'s), each named once.
pub(crate) trait GrpcIo:
    AsyncRead + AsyncWrite + Connected<ConnectInfo = TcpConnectInfo> + Unpin + Send + 'static
{
}

impl<IO> GrpcIo for IO where
    IO: AsyncRead + AsyncWrite + Connected<ConnectInfo = TcpConnectInfo> + Unpin + Send + 'static
{
}

/// A router's service (its layers around its routes) answering `ResBody`.
pub(crate) trait GrpcService<ResBody>:
    Service<
        http::Request<Body>,
        Response = http::Response<ResBody>,
        Future: Send,
        Error: Into<StdError> + Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S, ResBody> GrpcService<ResBody> for S where
    S: Service<
            http::Request<Body>,
            Response = http::Response<ResBody>,
            Future: Send,
            Error: Into<StdError> + Send,
        > + Clone
        + Send
        + 'static
{
}

/// An answer's body tonic can send.
pub(crate) trait GrpcBody:
    HttpBody<Data = bytes::Bytes, Error: Into<StdError>> + Send + 'static
{
}

impl<B> GrpcBody for B where B: HttpBody<Data = bytes::Bytes, Error: Into<StdError>> + Send + 'static
{}

/// Serves `router` on every connection of `incoming` (accept errors are
/// skipped: the stream reports them) until `shutdown` completes, then stops
/// accepting (the listener is dropped), sends GOAWAY on every connection
/// and returns once they have closed. With an age in `aging`, each
/// connection is also sent GOAWAY at its own jittered age and closed its
/// grace later.
pub(crate) async fn serve<L, I, IO, ResBody>(
    router: Router<L>,
    incoming: I,
    aging: Aging,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    I: futures_util::Stream<Item = io::Result<IO>>,
    IO: GrpcIo,
    L: Layer<Routes, Service: GrpcService<ResBody>> + Clone + Send + Sync + 'static,
    ResBody: GrpcBody,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    {
        let mut incoming = pin!(incoming);
        let mut shutdown = pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                next = incoming.next() => match next {
                    Some(Ok(io)) => {
                        connections.spawn(serve_one(router.clone(), io, aging.clone(), stop_rx.clone()));
                    }
                    Some(Err(_)) => continue,
                    None => break,
                },
                Some(done) = connections.join_next() => report(done),
            }
        }
    }
    let _ = stop_tx.send(true);
    while let Some(done) = connections.join_next().await {
        report(done);
    }
    Ok(())
}

/// Logs a connection's server that failed (tonic fails only to set one up).
fn report(done: Result<Result<(), tonic::transport::Error>, JoinError>) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("gRPC connection: {e}"),
        Err(e) => tracing::warn!("gRPC connection task: {e}"),
    }
}

/// One connection served by tonic's server (its HTTP/2 settings, layers and
/// services, its draining) until it closes. tonic drains its connections
/// when its stream of them ends or its shutdown signal completes: the
/// stream here is this connection, then an end once the connection is gone
/// (its I/O dropped); the signal is `stop` or this connection's age.
async fn serve_one<L, IO, ResBody>(
    router: Router<L>,
    io: IO,
    Aging { age, aged }: Aging,
    mut stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error>
where
    IO: GrpcIo,
    L: Layer<Routes, Service: GrpcService<ResBody>>,
    ResBody: GrpcBody,
{
    let peer = io.connect_info().remote_addr();
    let lifetime = age.map(|a| (a.jittered(random()), a.grace));
    let close_at = lifetime.and_then(|(age, grace)| age.checked_add(grace?));
    let (gone_tx, gone_rx) = oneshot::channel::<()>();
    let io = Aged::new(io, close_at, gone_tx);
    let incoming = stream::once(future::ready(io::Result::Ok(io)))
        .chain(stream::once(gone_rx).filter_map(|_| future::ready(None)));
    let aged = async move {
        let Some((age, grace)) = lifetime else {
            return future::pending().await;
        };
        tokio::time::sleep(age).await;
        aged.inc();
        tracing::debug!(?peer, ?age, ?grace, "gRPC connection aged: GOAWAY sent");
    };
    let signal = async move {
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => {}
            () = aged => {}
        }
    };
    router.serve_with_incoming_shutdown(incoming, signal).await
}

/// A connection's I/O that fails from `close_at` (its age and grace) on,
/// which closes the connection however long its calls take, and that tells
/// `gone` when it is dropped (the connection closed).
struct Aged<IO> {
    inner: IO,
    close_at: Option<Pin<Box<Sleep>>>,
    _gone: oneshot::Sender<()>,
}

impl<IO> Aged<IO> {
    fn new(inner: IO, close_at: Option<Duration>, gone: oneshot::Sender<()>) -> Aged<IO> {
        Aged {
            inner,
            close_at: close_at.map(|d| Box::pin(tokio::time::sleep(d))),
            _gone: gone,
        }
    }

    fn closed(&self) -> bool {
        self.close_at.as_ref().is_some_and(|s| s.is_elapsed())
    }
}

const PAST_GRACE: &str = "the connection outlived its age and grace";

impl<IO: AsyncRead + Unpin> AsyncRead for Aged<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.closed() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, PAST_GRACE)));
        }
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending => match self.close_at.as_mut() {
                Some(close_at) => waiting_until(close_at.as_mut(), cx, PAST_GRACE),
                None => Poll::Pending,
            },
        }
    }
}

write_through!(
    impl[IO: AsyncWrite + Unpin] for Aged<IO>,
    refuse: |aged: &Aged<IO>| aged
        .closed()
        .then(|| io::Error::new(io::ErrorKind::TimedOut, PAST_GRACE))
);

impl<IO: Connected> Connected for Aged<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> IO::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent_and_covers_the_range() {
        let age = ConnectionAge {
            age: Duration::from_secs(100),
            grace: None,
        };
        // [0.9, 1.1] x age, give or take a floating-point rounding.
        let bounds = Duration::from_secs(90)..=Duration::from_secs(110) + Duration::from_micros(1);
        assert_eq!(age.jittered(0), Duration::from_secs(90));
        let top = age.jittered(u64::MAX);
        assert!(bounds.contains(&top) && top > Duration::from_millis(109_999));
        let (mut low, mut high) = (Duration::MAX, Duration::ZERO);
        for _ in 0..10_000 {
            let d = age.jittered(random());
            assert!(bounds.contains(&d), "{d:?}");
            low = low.min(d);
            high = high.max(d);
        }
        // Drawn from the whole range, not a corner of it.
        assert!(low < Duration::from_secs(91) && high > Duration::from_secs(109));
    }

    #[test]
    fn flag_values() {
        assert_eq!(parse_flag("0"), Ok(Duration::ZERO));
        assert_eq!(parse_flag("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_flag("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_flag("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_flag("24h"), Ok(Duration::from_secs(86_400)));
        let err = parse_flag("soon").expect_err("not a duration");
        assert!(err.contains("`soon`"), "{err}");
        assert!(parse_flag("1h30m").is_err());
    }
}
