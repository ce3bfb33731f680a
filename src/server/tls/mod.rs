//! TLS (and mutual TLS) on the gRPC and admin ports, with the certificate
//! and key rotated without a restart.
//!
//! `load.rs` reads the PEM files and builds a rustls server configuration
//! (ring provider, TLS 1.2 and 1.3, the port's ALPN), `verify.rs` the
//! client-certificate verifier that also requires a SAN, `watch.rs` the task
//! that reloads changed files (keeping the last good pair when a
//! replacement is broken), `accept.rs` the accept loop that hands each
//! connection's handshake to a task of its own.
//!
//! The line protocol stays plaintext; without TLS files the gRPC and admin
//! ports are served exactly as before, with no TLS layer at all.

mod accept;
mod load;
#[cfg(test)]
mod tests;
mod verify;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;

use crate::observe::metrics::Metrics;

pub use accept::{incoming, TlsConn, TlsListener};
pub use load::{load, Loaded};
pub use verify::SanVerifier;
pub use watch::POLL;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most TLS handshakes in progress at once on one port; a connection
/// accepted beyond them is closed at once (and counted), so slow or silent
/// clients cannot pile up tasks.
pub const MAX_HANDSHAKES: usize = 4096;

/// The files (and client requirements) of one port's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, clients must present a certificate that chains to one of
    /// these CAs (PEM).
    pub client_ca: Option<PathBuf>,
    /// With it (and `client_ca`), the client certificate must carry this
    /// subject alternative name (DNS, IP or URI).
    pub client_san: Option<String>,
}

/// Which port a TLS configuration serves: its ALPN and its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port: ALPN `h2`.
    Grpc,
    /// The admin (HTTP/1.1) port: ALPN `http/1.1`.
    Http,
}

impl Port {
    /// The `port` label of the TLS metrics.
    pub fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
        }
    }

    /// The protocols offered in ALPN.
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Port::Grpc => vec![b"h2".to_vec()],
            Port::Http => vec![b"http/1.1".to_vec()],
        }
    }
}

/// Why TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the certificate, key or CA (a key that does not
    /// match the certificate, an unsupported key type, a bad CA).
    #[error("{path}: {source}")]
    Rustls {
        /// The file the problem is attributed to.
        path: PathBuf,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// The client CA could not make a verifier.
    #[error("{path}: {what}")]
    ClientCa {
        /// The CA file.
        path: PathBuf,
        /// rustls's reason.
        what: String,
    },
}

/// One port's TLS configuration as it stands: swapped whole when the files
/// change, read once per accepted connection.
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<ArcSwap<ServerConfig>>,
    port: Port,
    metrics: Arc<Metrics>,
}

impl ServerTls {
    /// Loads `files` for `port` and starts watching them (changed files are
    /// in force within two [`POLL`]s); an error names the file at fault. The watch task ends once every copy of the result is dropped.
    /// Must be called within a tokio runtime.
    /// Its reloads, refusals, handshake failures and the certificate's
    /// expiry are shown in `metrics`.
    pub fn start(
        files: TlsFiles,
        port: Port,
        metrics: Arc<Metrics>,
    ) -> Result<ServerTls, TlsError> {
        let loaded = load(&files, port)?;
        let m = &metrics.tls;
        m.set_expiry(port.label(), loaded.not_after);
        // Exported from the start, so a first refusal shows as a rise.
        m.reload_errors.with_label_values(&[port.label()]);
        m.reloads.with_label_values(&[port.label()]);
        m.checked
            .with_label_values(&[port.label()])
            .set(watch::unix_now() as f64);
        let tls = ServerTls {
            current: Arc::new(ArcSwap::new(loaded.config)),
            port,
            metrics: metrics.clone(),
        };
        let state = watch::State::new(files, port, loaded.fingerprint, loaded.not_after, metrics);
        watch::spawn(Arc::downgrade(&tls.current), state);
        Ok(tls)
    }

    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// The port this configuration serves.
    pub fn port(&self) -> Port {
        self.port
    }
}
