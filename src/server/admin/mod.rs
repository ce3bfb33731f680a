//! The HTTP admin API (default port 8080; its routes are listed in the
//! README, "Operating it: admin API, metrics, logs, shutdown").
//!
//! `routes.rs` holds the routes and handlers (`/healthz`, `/readyz`,
//! `/metrics`, `/config`, `/explain`, `POST /json`, `/knobs`), `knobs.rs`
//! the knob changes (see [`crate::knobs`]; they need
//! `Authorization: Bearer <--admin-token>`), `state.rs` the state they read,
//! `render.rs` the JSON shapes of knobs and limits.

pub mod knobs;
pub mod render;
pub mod routes;
pub mod state;

pub use routes::{router, serve_http, serve_https};
pub use state::AdminState;
