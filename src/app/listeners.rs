//! The three listeners (gRPC, the line protocol, the HTTP admin API): bound
//! with their TLS, then served until the stop signal.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use super::{AppError, Settings};
use crate::limiter::Limiter;
use crate::observe::metrics::Metrics;
use crate::server::admin::{serve_http, serve_https, AdminState};
use crate::server::connections::ConnectionAge;
use crate::server::line::{serve_line, ConnLimits};
use crate::server::tls::{Port, ServerTls, TlsFiles};
use crate::server::{Answers, GrpcLimits};

/// The three listeners, bound, and the TLS of the gRPC and admin ports.
pub(super) struct Listeners {
    grpc: TcpListener,
    line: TcpListener,
    http: TcpListener,
    grpc_tls: Option<ServerTls>,
    http_tls: Option<ServerTls>,
    /// The addresses bound.
    pub grpc_addr: SocketAddr,
    pub line_addr: SocketAddr,
    pub http_addr: SocketAddr,
}

/// The servers' tasks, to wait for once stopped.
pub(super) struct Tasks {
    line: JoinHandle<()>,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<std::io::Result<()>>,
}

impl Tasks {
    /// Waits for every server to finish; the first error, if any.
    pub async fn join(self) -> Result<(), AppError> {
        let _ = self.line.await;
        let (grpc, http) = (self.grpc.await, self.http.await);
        if let Ok(Err(e)) = grpc {
            return Err(AppError::Server {
                what: "gRPC",
                message: e.to_string(),
            });
        }
        if let Ok(Err(e)) = http {
            return Err(AppError::Server {
                what: "HTTP",
                message: e.to_string(),
            });
        }
        Ok(())
    }
}

/// Binds one listener, logging its address.
async fn listen(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    let bind_error = |source| AppError::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    info!("{what} listening on {bound}");
    Ok(listener)
}

impl Listeners {
    /// Binds gRPC, the line protocol and HTTP, and loads their TLS files (a
    /// bad file stops the start with its name; their reloads are shown in
    /// `metrics`).
    pub async fn bind(s: &Settings, metrics: &Arc<Metrics>) -> Result<Listeners, AppError> {
        let grpc = listen("grpc", s.grpc_addr).await?;
        let line = listen("line protocol", s.line_addr).await?;
        let http = listen("http", s.http_addr).await?;
        let addr = |l: &TcpListener, wanted| l.local_addr().unwrap_or(wanted);
        Ok(Listeners {
            grpc_addr: addr(&grpc, s.grpc_addr),
            line_addr: addr(&line, s.line_addr),
            http_addr: addr(&http, s.http_addr),
            grpc,
            line,
            http,
            grpc_tls: start_tls(s.grpc_tls.clone(), Port::Grpc, metrics)?,
            http_tls: start_tls(s.http_tls.clone(), Port::Http, metrics)?,
        })
    }

    /// Starts the three servers; they stop when `true` is sent on the
    /// returned channel.
    pub fn serve(
        self,
        s: &Settings,
        limiter: Arc<Limiter>,
        admin: AdminState,
    ) -> (watch::Sender<bool>, Tasks) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let line = tokio::spawn(serve_line(
            self.line,
            limiter.clone(),
            conn_limits(s),
            stop_rx.clone(),
        ));
        crate::server::rlqs::spawn(admin.rlqs.clone(), stopped(stop_rx.clone()));
        let answers = Answers {
            headers: s.rate_limit_headers,
            denied_body: s.denied_body,
            envoy: s.envoy.clone(),
        };
        let grpc = tokio::spawn(crate::server::serve_grpc(
            self.grpc,
            limiter,
            answers,
            grpc_limits(s),
            admin.rlqs.clone(),
            self.grpc_tls,
            stopped(stop_rx.clone()),
        ));
        let (listener, tls, path) = (self.http, self.http_tls, s.metrics_path.clone());
        let http_stop = stopped(stop_rx);
        let http = tokio::spawn(async move {
            match tls {
                None => serve_http(listener, admin, &path, http_stop).await,
                Some(tls) => serve_https(listener, tls, admin, &path, http_stop).await,
            }
        });
        (stop_tx, Tasks { line, grpc, http })
    }
}

/// Completes once `true` is sent.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// A port's TLS, started (its files watched) when files are given.
fn start_tls(
    files: Option<TlsFiles>,
    port: Port,
    metrics: &Arc<Metrics>,
) -> Result<Option<ServerTls>, AppError> {
    let Some(files) = files else {
        return Ok(None);
    };
    let mtls = files.client_ca.is_some();
    let tls = ServerTls::start(files, port, metrics.clone()).map_err(|source| AppError::Tls {
        port: port.label(),
        source,
    })?;
    info!(port = port.label(), client_certificates = mtls, "TLS on");
    Ok(Some(tls))
}

/// The line protocol's bounds.
fn conn_limits(s: &Settings) -> ConnLimits {
    ConnLimits {
        max_line: s.line_max_bytes.max(1),
        max_batch: s.line_max_batch.max(1),
        idle_timeout: s.line_idle.max(std::time::Duration::from_secs(1)),
        max_connections: s.line_max_connections.max(1),
    }
}

/// The gRPC server's bounds.
fn grpc_limits(s: &Settings) -> GrpcLimits {
    GrpcLimits {
        max_concurrent_streams: s.grpc_max_concurrent_streams.max(1),
        max_request_bytes: s.grpc_max_request_bytes.max(1024),
        idle: s.grpc_idle.max(std::time::Duration::from_secs(1)),
        keepalive: s.grpc_keepalive,
        connection_age: s.grpc_max_connection_age.map(|age| ConnectionAge {
            age,
            grace: s.grpc_max_connection_age_grace,
        }),
        keepalive_timeout: std::time::Duration::from_secs(20),
        deadline_margin: s.deadline_margin,
        ready_requires_store: s.ready_requires_store,
        reflection: s.grpc_reflection,
        failure_policy: s.on_store_failure,
    }
}

/// The metrics path must be a plain absolute path that no other admin route uses.
pub(super) fn validate_metrics_path(path: &str) -> Result<(), AppError> {
    let plain = path.starts_with('/')
        && path.len() > 1
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b))
        && !path.contains("//");
    // Every other admin route: the metrics path is answered without a
    // token, so it must not shadow one that needs a token.
    let taken = [
        "/healthz",
        "/readyz",
        "/config",
        "/explain",
        "/json",
        "/global",
        "/governors",
        "/healthcheck",
        "/rlconfig",
        "/knobs",
    ];
    if !plain || taken.contains(&path) || path.starts_with("/knobs/") {
        return Err(AppError::Setting(format!(
            "the metrics path `{path}` must be an absolute path of letters, digits, `-`, `_`, `.` and `/`, other than the admin API's routes ({})",
            taken.join(", ")
        )));
    }
    Ok(())
}
