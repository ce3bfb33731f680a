//! The divvy line protocol over TCP (default port 8321): a drop-in for the
//! original divvy server's clients. [`parse`] holds the grammar, [`conn`] one
//! connection; this module accepts connections.

pub mod conn;
pub mod parse;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub use conn::ConnLimits;

use crate::limiter::Limiter;

/// Accepts connections on `listener` until `shutdown` completes; each
/// connection is served on its own task. Accept errors (such as running out
/// of file descriptors) are logged and retried: the listener never stops.
pub async fn serve_line(
    listener: TcpListener,
    limiter: Arc<Limiter>,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let limiter = limiter.clone();
                    tokio::spawn(conn::serve_connection(stream, limiter, limits));
                }
                Err(e) => {
                    tracing::warn!("line protocol: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}
