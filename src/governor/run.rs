//! The governors' tasks: one per `governors:` entry of the policy, each
//! stepping its controller every interval while this replica holds its
//! lease, and setting the governed label's `creditLimit` knob.
//!
//! A supervisor follows policy reloads: a governor that is added starts, one
//! that changes restarts (with a bumpless start from the limit in force),
//! one that is removed stops and leaves its last knob in force (delete it
//! with `divvy knob delete` to return to the rule's own limit).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::lease::{Holding, Lease};
use super::pid::{Controller, Step};
use super::prometheus::{Prometheus, ReadError};
use crate::clock::now_ms;
use crate::config::GovernorSpec;
use crate::coord::Coordination;
use crate::knobs::body::target;
use crate::knobs::Knob;
use crate::limiter::Limiter;
use crate::observe::metrics::Metrics;

/// What `/governors` shows for one governor.
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct GovernorState {
    /// The governed label.
    pub rule: String,
    /// The PromQL query.
    pub query: String,
    /// The Prometheus it asks.
    pub prometheus: String,
    /// The load held.
    pub setpoint: f64,
    /// The control interval in milliseconds.
    pub every_ms: u64,
    /// `[min, max]`.
    pub min: f64,
    /// `[min, max]`.
    pub max: f64,
    /// `governing` (this replica holds the lease), `idle` (another does, or
    /// Redis did not answer) or `starting`.
    pub role: String,
    /// Who holds the lease, when known.
    pub lease_holder: Option<String>,
    /// The last measurement read.
    pub measurement: Option<f64>,
    /// Epoch ms of that measurement.
    pub measured_at_ms: Option<u64>,
    /// Why the last query gave no number, if it did not.
    pub last_error: Option<String>,
    /// Intervals in a row without data.
    pub missing: u32,
    /// Proportional term.
    pub p: f64,
    /// Integral term.
    pub i: f64,
    /// Derivative term.
    pub d: f64,
    /// The creditLimit last set.
    pub output: Option<u64>,
    /// Whether the breaker is open.
    pub breaker_open: bool,
    /// Epoch ms of the last step.
    pub stepped_at_ms: Option<u64>,
}

struct Running {
    spec: GovernorSpec,
    task: JoinHandle<()>,
}

/// Every governor of the policy in force, and their state.
pub struct Governors {
    limiter: Arc<Limiter>,
    coord: Coordination,
    default_prometheus: Option<String>,
    states: Mutex<BTreeMap<String, GovernorState>>,
    running: Mutex<BTreeMap<String, Running>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Governors {
    /// Governors for `limiter`'s policy. `coord`: where replicas elect who
    /// governs (this process's own without Redis).
    /// `default_prometheus`: `--prometheus-url`.
    pub fn new(
        limiter: Arc<Limiter>,
        coord: Coordination,
        default_prometheus: Option<String>,
    ) -> Governors {
        Governors {
            limiter,
            coord,
            default_prometheus,
            states: Mutex::new(BTreeMap::new()),
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// The registry the governors record to (the limiter's).
    fn metrics(&self) -> &Metrics {
        &self.limiter.telemetry().metrics
    }

    /// This replica's name (the lease holder's name).
    pub fn replica(&self) -> &str {
        self.limiter.knobs().replica()
    }

    /// The state of every governor, by label.
    pub fn states(&self) -> Vec<GovernorState> {
        lock(&self.states).values().cloned().collect()
    }

    /// Starts the supervisor: it follows the policy every 500 ms.
    pub fn spawn(self: &Arc<Self>) -> JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(g) = me.upgrade() else { return };
                g.follow_policy();
                drop(g);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    }

    /// Starts, restarts and stops governors to match the policy in force.
    pub fn follow_policy(self: &Arc<Self>) {
        let rules = self.limiter.rules();
        let wanted: BTreeMap<String, GovernorSpec> = rules
            .governors()
            .iter()
            .map(|g| (g.rule.clone(), g.clone()))
            .collect();
        let mut running = lock(&self.running);
        let stale: Vec<String> = running
            .iter()
            .filter(|(label, r)| wanted.get(*label) != Some(&r.spec))
            .map(|(label, _)| label.clone())
            .collect();
        for label in stale {
            if let Some(r) = running.remove(&label) {
                r.task.abort();
                // A governor that only changed restarts below under the same
                // name and keeps its lease; one that is gone gives it up.
                if !wanted.contains_key(&label) {
                    let lease = Lease::new(self.coord.clone(), &label, self.replica());
                    tokio::spawn(async move { lease.release().await });
                }
                lock(&self.states).remove(&label);
                forget_metrics(self.metrics(), &label);
                tracing::info!(rule = %label, "governor stopped (policy changed); its last knob stays in force");
            }
        }
        for (label, spec) in wanted {
            if running.contains_key(&label) {
                continue;
            }
            let url = spec
                .prometheus
                .clone()
                .or_else(|| self.default_prometheus.clone());
            let task = match url {
                None => {
                    tracing::error!(rule = %label, "governor not started: no `prometheus` URL in the policy and no --prometheus-url");
                    self.record(&spec, "", |s| {
                        s.role = "stopped".to_owned();
                        s.last_error = Some(
                            "no `prometheus` URL in the policy and no --prometheus-url".to_owned(),
                        );
                    });
                    tokio::spawn(async {})
                }
                Some(url) => {
                    self.record(&spec, &url, |s| s.role = "starting".to_owned());
                    let me = Arc::clone(self);
                    let spec2 = spec.clone();
                    tracing::info!(rule = %label, prometheus = %url, query = %spec.query, setpoint = spec.tuning.setpoint, "governor started");
                    tokio::spawn(async move { me.govern(spec2, url).await })
                }
            };
            running.insert(label, Running { spec, task });
        }
    }

    fn record(&self, spec: &GovernorSpec, url: &str, f: impl FnOnce(&mut GovernorState)) {
        let mut states = lock(&self.states);
        let s = states
            .entry(spec.rule.clone())
            .or_insert_with(|| GovernorState {
                rule: spec.rule.clone(),
                query: spec.query.clone(),
                prometheus: url.to_owned(),
                setpoint: spec.tuning.setpoint,
                every_ms: u64::try_from(spec.every.as_millis()).unwrap_or(u64::MAX),
                min: spec.tuning.min,
                max: spec.tuning.max,
                ..GovernorState::default()
            });
        f(s);
    }

    /// The creditLimit in force for `label` (knob applied), if it exists.
    fn limit_in_force(&self, label: &str) -> Option<u64> {
        let rules = self.limiter.rules();
        let own = target(&rules, label).ok()?;
        Some(match self.limiter.knobs().get(label) {
            Some(k) => k.apply(own).credit_limit,
            None => own.credit_limit,
        })
    }

    /// One governor's loop: every interval, while this replica holds the
    /// lease, read the measurement, step the controller, set the knob and
    /// show the step (metrics, `/governors`).
    async fn govern(self: Arc<Self>, spec: GovernorSpec, url: String) {
        let Some(source) = self.open_source(&spec, &url) else {
            return;
        };
        let label = spec.rule.clone();
        let lease = Lease::new(self.coord.clone(), &label, self.replica());
        // The query must answer well within the interval.
        let timeout = (spec.every * 4 / 5).max(Duration::from_millis(50));
        let stale_after = spec.every * 3;
        let start = Instant::now();
        let mut controller: Option<Controller> = None;
        let mut tick = tokio::time::interval(spec.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.lead(&spec, &url, &lease, &mut controller).await {
                continue;
            }
            let reading = source.read(&spec.query, timeout, stale_after).await;
            self.metrics()
                .governor
                .queries
                .with_label_values(&[
                    label.as_str(),
                    reading.as_ref().map_or_else(ReadError::kind, |_| "ok"),
                ])
                .inc();
            let ctl = controller.get_or_insert_with(|| self.bumpless_start(&spec));
            let step = ctl.step(start.elapsed(), reading.as_ref().ok().copied());
            if let Err(e) = &reading {
                tracing::warn!(rule = %label, missing = step.missing, "governor has no measurement: {e}");
            }
            self.apply(&label, &step).await;
            publish(self.metrics(), &label, &reading, &step);
            self.record_step(&spec, &url, &reading, &step);
        }
    }

    /// Shows the governor's setpoint, not leading yet, and opens its
    /// Prometheus; `None` (the governor stopped, and why) when the URL is unusable.
    fn open_source(&self, spec: &GovernorSpec, url: &str) -> Option<Prometheus> {
        let label = spec.rule.as_str();
        let m = self.metrics();
        m.governor
            .setpoint
            .with_label_values(&[label])
            .set(spec.tuning.setpoint);
        m.governor.leader.with_label_values(&[label]).set(0.0);
        match Prometheus::new(url) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(rule = %label, "governor not started: {e}");
                self.record(spec, url, |s| {
                    s.role = "stopped".to_owned();
                    s.last_error = Some(e.to_string());
                });
                None
            }
        }
    }

    /// Holds the lease for another two intervals; true when this replica
    /// governs. When another holds it (or Redis does not answer), the
    /// controller is dropped (the next leader starts bumpless) and the
    /// governor shows as idle.
    async fn lead(
        &self,
        spec: &GovernorSpec,
        url: &str,
        lease: &Lease,
        controller: &mut Option<Controller>,
    ) -> bool {
        let label = spec.rule.as_str();
        let leader = &self.metrics().governor.leader;
        let (holder, error) = match lease.hold(spec.every * 2).await {
            Ok(Holding::Mine) => {
                leader.with_label_values(&[label]).set(1.0);
                return true;
            }
            Ok(Holding::Theirs(h)) => (h, None),
            Err(e) => (
                None,
                Some(format!("lease not held: Redis did not answer ({e})")),
            ),
        };
        if controller.take().is_some() {
            tracing::info!(rule = %label, "governor idle: another replica holds the lease");
        }
        leader.with_label_values(&[label]).set(0.0);
        self.record(spec, url, |s| {
            s.role = "idle".to_owned();
            s.lease_holder = holder;
            if error.is_some() {
                s.last_error = error;
            }
        });
        false
    }

    /// A controller that starts from the limit in force, so taking over
    /// does not jump the limit.
    fn bumpless_start(&self, spec: &GovernorSpec) -> Controller {
        let current = self.limit_in_force(&spec.rule).unwrap_or(0);
        tracing::info!(rule = %spec.rule, start = current, "governor governing (bumpless start from the limit in force)");
        Controller::new(spec.tuning, current as f64)
    }

    /// What `/governors` shows after a step of this replica.
    fn record_step(
        &self,
        spec: &GovernorSpec,
        url: &str,
        reading: &Result<f64, ReadError>,
        step: &Step,
    ) {
        let me = self.replica().to_owned();
        self.record(spec, url, |s| {
            s.role = "governing".to_owned();
            s.lease_holder = Some(me);
            match reading {
                Ok(v) => {
                    s.measurement = Some(*v);
                    s.measured_at_ms = Some(now_ms());
                    s.last_error = None;
                }
                Err(e) => s.last_error = Some(e.to_string()),
            }
            s.missing = step.missing;
            s.p = step.p;
            s.i = step.i;
            s.d = step.d;
            s.output = Some(step.output);
            s.breaker_open = step.breaker_open;
            s.stepped_at_ms = Some(now_ms());
        });
    }

    /// Sets `label`'s creditLimit knob to the step's output when it differs
    /// from the one in force (keeping the knob's other fields).
    async fn apply(&self, label: &str, step: &Step) {
        let knobs = self.limiter.knobs();
        let old = knobs.get(label);
        if old.as_ref().and_then(|k| k.credit_limit) == Some(step.output) {
            return;
        }
        let knob = Knob {
            credit_limit: Some(step.output),
            reset_seconds: old.as_ref().and_then(|k| k.reset_seconds),
            burst: old.as_ref().and_then(|k| k.burst),
            expires_at_ms: None,
            set_by: format!("governor@{}", knobs.replica()),
            set_at_ms: now_ms(),
        };
        match knobs.set(label, knob).await {
            Ok(_) => {
                self.metrics()
                    .knob_changes
                    .with_label_values(&["governor"])
                    .inc();
                tracing::info!(
                    rule = %label,
                    old = ?old.and_then(|k| k.credit_limit),
                    new = step.output,
                    breaker_open = step.breaker_open,
                    p = step.p, i = step.i, d = step.d,
                    "governor set creditLimit"
                );
            }
            Err(e) => tracing::warn!(rule = %label, "governor could not set its knob: {e}"),
        }
    }
}

/// The step's gauges: the measurement (when there was one), the output
/// and the breaker.
fn publish(m: &Metrics, label: &str, reading: &Result<f64, ReadError>, step: &Step) {
    if let Ok(v) = reading {
        m.governor.measurement.with_label_values(&[label]).set(*v);
    }
    m.governor
        .output
        .with_label_values(&[label])
        .set(step.output as f64);
    m.governor
        .breaker_open
        .with_label_values(&[label])
        .set(if step.breaker_open { 1.0 } else { 0.0 });
}

fn forget_metrics(m: &Metrics, label: &str) {
    for g in [
        &m.governor.measurement,
        &m.governor.output,
        &m.governor.setpoint,
        &m.governor.breaker_open,
        &m.governor.leader,
    ] {
        let _ = g.remove_label_values(&[label]);
    }
}
