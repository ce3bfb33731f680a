//! The HTTP admin API (default port 8080): routes and handlers in
//! `routes.rs`, knob changes in `knobs.rs`, the state they read in
//! `state.rs`, the JSON shapes of knobs and limits in `render.rs`.
//!
//! - `GET /healthz`: the process is alive (200).
//! - `GET /readyz`: 200 when rules are loaded, the counter store is in use
//!   and the service is not shutting down; 503 with the reason otherwise.
//! - `GET /metrics` (or `PROMETHEUS_METRICS_PATH`): Prometheus text format.
//! - `GET /config`: the rules in force as JSON, with source file, content
//!   hash, load time, generation, reload counts and the last reload error.
//! - `GET /explain?key=value&...[&domain=D]`: which rule decides, which
//!   canaries run, each counter key and its current state; consumes nothing.
//!   `domain` names the Envoy domain (without it, a line-protocol HIT).
//! - `POST /json`: a `RateLimitRequest` in protobuf JSON, answered as a
//!   `RateLimitResponse` in JSON: 200 when OK, 429 when over limit, 400 with
//!   a message for a bad body or request, 503 when the store fails.
//! - `GET /knobs`, `PUT /knobs/{label}`, `DELETE /knobs/{label}`: live
//!   overrides of a rule's numbers (see [`crate::knobs`]). Changes need
//!   `Authorization: Bearer <--admin-token>`.

pub mod knobs;
pub mod render;
pub mod routes;
pub mod state;

pub use routes::{router, serve_http};
pub use state::AdminState;
