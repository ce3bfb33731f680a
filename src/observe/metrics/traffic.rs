//! The traffic recorder's metrics (`serve --record`).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use super::build::{counter, counter_vec_of, gauge};

/// What `--record` wrote, dropped and rotated.
#[derive(Clone)]
pub struct TrafficMetrics {
    /// `divvy_record_lines_total{result}`: requests recorded (`written`),
    /// `dropped` (the writer's queue full) or `failed` (a write error).
    pub lines: IntCounterVec,
    /// `divvy_record_rotations_total`: times the file reached
    /// `--record-max-bytes` and was moved to `<file>.1`.
    pub rotations: IntCounter,
    /// `divvy_record_alive_timestamp_seconds`: last step of the writer thread.
    pub alive: IntGauge,
}

impl TrafficMetrics {
    pub(super) fn new(r: &Registry) -> TrafficMetrics {
        TrafficMetrics {
            lines: counter_vec_of(
                r,
                "divvy_record_lines_total",
                "Requests recorded by --record: written, dropped (queue full) or failed (write error)",
                "result",
                &["written", "dropped", "failed"],
            ),
            rotations: counter(
                r,
                "divvy_record_rotations_total",
                "Times the --record file reached --record-max-bytes and was moved to <file>.1",
            ),
            alive: gauge(
                r,
                "divvy_record_alive_timestamp_seconds",
                "Last step of the --record writer thread (unix seconds)",
            ),
        }
    }
}
