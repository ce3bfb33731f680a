//! Reloads a port's TLS files when their contents change.
//!
//! The files are polled (read and hashed) rather than watched for events:
//! a poll sees an in-place write, a rename over the file and Kubernetes'
//! `..data` symlink swap alike, and misses nothing when the directory is
//! replaced under a watch. A change is acted on once the same contents are
//! seen on two polls in a row, so a certificate and key written one after
//! the other are not taken half-way.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tracing::{info, warn};

use super::load::{fingerprint, load};
use super::{Port, TlsFiles};
use crate::observe::metrics::Metrics;

/// How often the files are read.
pub const POLL: Duration = Duration::from_secs(2);

/// What the watcher knows between polls.
pub(super) struct State {
    files: TlsFiles,
    port: Port,
    /// The contents in force, or last refused.
    settled: u64,
    /// Contents seen once, waiting for a second poll to agree.
    pending: Option<u64>,
    /// notAfter of the certificate in force.
    not_after: i64,
    /// The files could not be read on the last poll (warned and counted once).
    unreadable: bool,
    /// Where reloads, refusals and the certificate's expiry are shown.
    metrics: Arc<Metrics>,
}

/// Polls `files` every [`POLL`] and swaps a new configuration into
/// `current`; ends once `current` is dropped (the server it feeds is gone).
/// `state`: the files, and what is in force.
pub(super) fn spawn(
    current: Weak<ArcSwap<ServerConfig>>,
    mut state: State,
) -> tokio::task::JoinHandle<()> {
    let port = state.port;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            let Some(current) = current.upgrade() else {
                return;
            };
            // The files may sit on a slow or hung filesystem: they are read
            // off the workers. A hung read stops the checked timestamp.
            let polled = tokio::task::spawn_blocking(move || {
                state.poll(&current);
                state
            })
            .await;
            state = match polled {
                Ok(state) => state,
                Err(e) => {
                    warn!(port = port.label(), "TLS file watch stopped: {e}");
                    return;
                }
            };
            let m = &state.metrics.tls;
            m.set_expiry(port.label(), state.not_after);
            m.checked
                .with_label_values(&[port.label()])
                .set(unix_now() as f64);
        }
    })
}

impl State {
    /// The state after loading contents `settled` with a certificate
    /// valid until `not_after`, shown in `metrics`.
    pub(super) fn new(
        files: TlsFiles,
        port: Port,
        settled: u64,
        not_after: i64,
        metrics: Arc<Metrics>,
    ) -> State {
        State {
            files,
            port,
            settled,
            pending: None,
            not_after,
            unreadable: false,
            metrics,
        }
    }

    /// One poll: reloads when changed contents have settled.
    pub(super) fn poll(&mut self, current: &ArcSwap<ServerConfig>) {
        let label = self.port.label();
        let seen = match fingerprint(&self.files) {
            Ok(seen) => seen,
            Err(e) => {
                if !self.unreadable {
                    self.metrics
                        .tls
                        .reload_errors
                        .with_label_values(&[label])
                        .inc();
                    warn!(
                        port = label,
                        "TLS files unreadable, keeping the certificate in force: {e}"
                    );
                }
                self.unreadable = true;
                self.pending = None;
                return;
            }
        };
        self.unreadable = false;
        if seen == self.settled {
            self.pending = None;
            return;
        }
        if self.pending != Some(seen) {
            self.pending = Some(seen);
            return;
        }
        self.pending = None;
        self.settled = seen;
        let m = &self.metrics.tls;
        match load(&self.files, self.port) {
            Ok(loaded) => {
                current.store(loaded.config);
                self.not_after = loaded.not_after;
                // A file changed again after the read: the next poll sees it.
                self.settled = loaded.fingerprint;
                m.reloads.with_label_values(&[label]).inc();
                info!(port = label, cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                m.reload_errors.with_label_values(&[label]).inc();
                warn!(
                    port = label,
                    "TLS reload refused, keeping the certificate in force: {e}"
                );
            }
        }
    }
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
