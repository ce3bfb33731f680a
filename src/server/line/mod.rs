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

/// How long shutdown waits for open connections to finish their batch.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` until `shutdown` turns true; each
/// connection is served on its own task. Accept errors (such as running out
/// of file descriptors) are logged and retried: the listener never stops.
/// On shutdown it stops accepting, lets every connection answer the batch it
/// is deciding, and waits for them (at most [`DRAIN_TIMEOUT`]).
pub async fn serve_line(
    listener: TcpListener,
    limiter: Arc<Limiter>,
    limits: ConnLimits,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { break },
            // Reap finished connections so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let limiter = limiter.clone();
                    connections.spawn(conn::serve_connection(
                        stream,
                        limiter,
                        limits,
                        shutdown.clone(),
                    ));
                }
                Err(e) => {
                    tracing::warn!("line protocol: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "line protocol: connections still open after the drain timeout; closing them"
        );
        connections.abort_all();
    }
}
