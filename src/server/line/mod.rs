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

/// Connections being refused at once; beyond this a connection over the
/// cap is closed without its `ERR` line (a flood must not grow tasks).
const MAX_REFUSING: usize = 256;

/// Answers a connection over the cap with one `ERR` line and closes it: the
/// line is written, the write side shut, and what the client sent is read
/// and dropped for up to 200 ms (closing with unread input would reset the
/// connection, and the client could lose the line). The refusal is
/// counted in `metrics`.
fn refuse(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    max: usize,
    metrics: &crate::observe::metrics::Metrics,
) {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    static REFUSING: AtomicUsize = AtomicUsize::new(0);
    static LOGGED: AtomicU64 = AtomicU64::new(0);
    metrics
        .rejected
        .with_label_values(&["connection_limit"])
        .inc();
    let now = crate::clock::now_ms();
    let last = LOGGED.load(Ordering::Relaxed);
    if now >= last + 60_000 {
        LOGGED.store(now, Ordering::Relaxed);
        tracing::warn!(%peer, max, "line protocol: connection refused, too many open (--line-max-connections); logged at most once a minute");
    }
    let line = format!("ERR unknown \"Too many connections: the limit is {max}.\"\n");
    if REFUSING.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
        REFUSING.fetch_sub(1, Ordering::AcqRel);
        let _ = stream.try_write(line.as_bytes());
        return;
    }
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(Duration::from_millis(200), async {
            stream.write_all(line.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            let mut read = 0usize;
            while read < 64 * 1024 {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => read += n,
                }
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        REFUSING.fetch_sub(1, Ordering::AcqRel);
    });
}

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
                Ok((stream, peer)) => {
                    while connections.try_join_next().is_some() {}
                    if connections.len() >= limits.max_connections {
                        refuse(stream, peer, limits.max_connections, &limiter.telemetry().metrics);
                        continue;
                    }
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
