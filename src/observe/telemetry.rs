//! What records is handed its registry: the metrics and the dashboard's
//! recorder travel together as one handle, built once at start.

use std::sync::Arc;

use super::metrics::{Metrics, RuleCounters};
use super::recorder::{Recorder, RuleStats};
use crate::clock::Clock;

/// The metrics registry and the dashboard's recorder a component records to.
#[derive(Clone)]
pub struct Telemetry {
    /// The Prometheus metrics (and their statsd mirror).
    pub metrics: Arc<Metrics>,
    /// The dashboard's per-second history and top offenders.
    pub recorder: Arc<Recorder>,
}

impl Telemetry {
    /// A registry and recorder of their own, on the system clock: a
    /// service's, which its `/metrics` and dashboard serve (no registry is
    /// global: two in one process count apart).
    pub fn system() -> Telemetry {
        Telemetry::detached(Arc::new(crate::clock::SystemClock::default()))
    }

    /// A registry and recorder of their own, on `clock` (tests, replays:
    /// nothing they count reaches a service's metrics).
    pub fn detached(clock: Arc<dyn Clock>) -> Telemetry {
        Telemetry {
            metrics: Arc::new(Metrics::new()),
            recorder: Arc::new(Recorder::new(clock)),
        }
    }

    /// A rule's counters and dashboard history, looked up once when a rule
    /// set is installed (a label lookup per request costs a hash of every
    /// label value).
    pub fn rule(&self, name: &str, label: Option<&str>, domain: Option<&str>) -> RuleTelemetry {
        RuleTelemetry {
            counters: RuleCounters::new(&self.metrics, label, domain),
            stats: self.recorder.rule(name),
        }
    }
}

/// One rule's metrics and dashboard history.
#[derive(Debug, Clone)]
pub struct RuleTelemetry {
    /// Its `divvy_hits_total` and `divvy_decisions_total` series.
    pub counters: RuleCounters,
    /// Its decisions per second for the dashboard (a reload that keeps the
    /// rule's name keeps its history).
    pub stats: Arc<RuleStats>,
}
