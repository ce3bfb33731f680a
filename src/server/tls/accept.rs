//! Accepting TLS connections: the accept loop never waits for a handshake;
//! each runs in a task of its own, bounded in time and in number, and the
//! connections that complete it are handed to the server.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

use super::{ServerTls, HANDSHAKE_TIMEOUT, MAX_HANDSHAKES};
use crate::server::idle::IdleStream;

/// A connection that completed its handshake, and its peer's address.
type Accepted<T> = (TlsStream<T>, SocketAddr);

/// Connections handed over but not yet taken by the server.
const QUEUE: usize = 128;

/// Accepts on `listener` until the returned receiver is dropped; `wrap`
/// puts each TCP stream in the transport the TLS session runs over.
fn spawn_accept<T, W>(listener: TcpListener, tls: ServerTls, wrap: W) -> mpsc::Receiver<Accepted<T>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    W: Fn(TcpStream) -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel(QUEUE);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let label = tls.port().label();
    let metrics = tls.metrics.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors: back off instead of spinning.
                    warn!(port = label, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                metrics.tls.handshake_failed(label, "limit");
                continue;
            };
            // Small frames must not wait for Nagle's algorithm.
            let _ = stream.set_nodelay(true);
            let acceptor = TlsAcceptor::from(tls.config());
            let io = wrap(stream);
            let tx = tx.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await;
                drop(permit);
                match done {
                    Ok(Ok(conn)) => {
                        let _ = tx.send((conn, peer)).await;
                    }
                    Ok(Err(e)) => {
                        debug!(port = label, %peer, "TLS handshake failed: {e}");
                        metrics.tls.handshake_failed(label, "error");
                    }
                    Err(_) => metrics.tls.handshake_failed(label, "timeout"),
                }
            });
        }
    });
    rx
}

/// The gRPC port's connections over TLS, for tonic's
/// `serve_with_incoming`: each TCP stream closes after `idle` without a
/// byte from the peer (as on the plaintext path), under the TLS session.
pub fn incoming(
    listener: TcpListener,
    tls: ServerTls,
    idle: Duration,
) -> impl Stream<Item = io::Result<TlsConn>> {
    let rx = spawn_accept(listener, tls, move |s| IdleStream::new(s, idle));
    ReceiverStream::new(rx).map(|(conn, _)| Ok(TlsConn(conn)))
}

/// A gRPC connection over TLS (tonic needs [`Connected`] on it).
pub struct TlsConn(TlsStream<IdleStream>);

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The admin port's connections over TLS, as an axum listener.
pub struct TlsListener {
    rx: mpsc::Receiver<Accepted<TcpStream>>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts TLS connections on `listener` with `tls`.
    pub fn new(listener: TcpListener, tls: ServerTls) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        Ok(TlsListener {
            rx: spawn_accept(listener, tls, |s| s),
            local,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> Accepted<TcpStream> {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop only stops once this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
