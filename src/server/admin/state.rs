//! What the admin API's handlers read.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::limiter::Limiter;
use crate::sources::file::ReloadStatus;

/// What the admin API reads.
#[derive(Clone)]
pub struct AdminState {
    /// The limiter (rules and store).
    pub limiter: Arc<Limiter>,
    /// Reload status of the policy file.
    pub status: Arc<ReloadStatus>,
    /// Set when shutdown begins: readiness turns false.
    pub shutting_down: Arc<AtomicBool>,
    /// What readiness follows (the store, a loaded configuration).
    pub readiness: crate::server::readiness::Readiness,
    /// The admin token (reads and knob changes) and the read token.
    pub tokens: super::auth::Tokens,
    /// The policy's governors (for `GET /governors`).
    pub governors: Arc<crate::governor::Governors>,
    /// Kept back from a `/json` caller's timeout header to answer in time.
    pub deadline_margin: std::time::Duration,
    /// `/healthcheck` fails until a configuration is loaded (envoyproxy/ratelimit's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_needs_config: bool,
    /// The failure policy that decides while a shared counter store fails
    /// (`None` for the memory store), for the dashboard.
    pub failure_policy: Option<&'static str>,
    /// The RLQS streams (for `GET /rlqs`).
    pub rlqs: Arc<crate::server::rlqs::Hub>,
    /// Counter resets, told to every replica (`DELETE /counters`).
    pub resets: Arc<crate::counters::resets::CounterResets>,
}
