//! Counter-reset metrics (`DELETE /counters`, see `crate::counters`).

use prometheus::{IntCounterVec, IntGauge, Registry};

use super::build::{counter_vec_of, gauge};

/// The results of `divvy_counter_resets_total`: reset, refused (token),
/// invalid (query), failed (store or Redis).
pub const COUNTER_RESET_RESULTS: [&str; 4] = ["reset", "refused", "invalid", "failed"];

/// Counter resets and the task that hears of other replicas' resets.
#[derive(Clone)]
pub struct CounterResetMetrics {
    /// `divvy_counter_resets_total{result}`: `DELETE /counters` calls by
    /// result ([`COUNTER_RESET_RESULTS`]).
    pub resets: IntCounterVec,
    /// `divvy_counter_resets_polled_timestamp_seconds`: last read of the
    /// shared list of counter resets (with Redis).
    pub polled: IntGauge,
}

impl CounterResetMetrics {
    pub(super) fn new(r: &Registry) -> CounterResetMetrics {
        CounterResetMetrics {
            resets: counter_vec_of(
                r,
                "divvy_counter_resets_total",
                "DELETE /counters calls by result: reset, refused (token), invalid (query), failed (store)",
                "result",
                &COUNTER_RESET_RESULTS,
            ),
            polled: gauge(
                r,
                "divvy_counter_resets_polled_timestamp_seconds",
                "Unix time of the last read of the shared counter resets (with Redis)",
            ),
        }
    }
}
