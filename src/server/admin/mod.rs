//! The HTTP admin API (default port 8080; its routes are listed in the
//! README, "Operating it: admin API, metrics, logs, shutdown").
//!
//! `routes.rs` holds the routes and handlers (`/healthz`, `/readyz`,
//! `/metrics`, `/config`, `/explain`, `POST /json`, `/knobs`), `knobs.rs`
//! the knob changes (see [`crate::knobs`]; they need
//! `Authorization: Bearer <--admin-token>`), `auth.rs` the tokens and the
//! layer that protects reads with `--admin-read-token`, `state.rs` the
//! state they read, `render.rs` the JSON shapes of knobs and limits,
//! `counters.rs` one actor's counters read and reset (`/counters`),
//! `api.rs` the dashboard's JSON API under `/api/v1/` and `ui.rs` the
//! dashboard page at `/ui` (assets embedded in the binary).

pub mod api;
pub mod auth;
pub mod counters;
mod debts;
pub mod fair;
pub mod knobs;
pub mod render;
pub mod rlqs;
pub mod routes;
pub mod state;
pub mod ui;

pub use routes::{router, serve_http, serve_https};
pub use state::AdminState;

/// Serves envoyproxy/ratelimit's Prometheus names
/// ([`crate::observe::ratelimit_names`]) at `path` on `addr` (its
/// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH`), in the background.
pub async fn spawn_ratelimit_metrics(
    addr: &str,
    path: &str,
    mapper: Option<crate::observe::statsd_mapper::Mapper>,
    metrics: std::sync::Arc<crate::observe::metrics::Metrics>,
) -> std::io::Result<()> {
    let mapper = std::sync::Arc::new(mapper);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        "envoyproxy/ratelimit metrics listening on {}{path}",
        listener.local_addr()?
    );
    let app = axum::Router::new().route(
        path,
        axum::routing::get(move || async move {
            crate::observe::ratelimit_names::render_with(&metrics, mapper.as_ref().as_ref())
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("envoyproxy/ratelimit metrics listener failed: {e}");
        }
    });
    Ok(())
}
