//! What requests get while the shared store (Redis) is failing.
//!
//! [`FailoverStore`] wraps the shared store with a [`Breaker`]. While it is
//! closed every op goes to the store, waiting at most until the caller's
//! deadline (less the margin) or the store's timeout; an unanswered call is
//! decided by the [`FailurePolicy`] in time. Failed calls count toward the
//! breaker; once open, requests are decided by the policy at once, so a dead
//! Redis costs microseconds per request. A probe every [`PROBE_EVERY`]
//! closes it when the store answers within the time callers allow.
//!
//! Policies: `allow` (fail open), `deny` (fail closed), `local` (this
//! replica's memory store with `--local-share` of each limit, at least 1).

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::time::Instant;

use crate::observe::metrics::Metrics;

use super::breaker::{
    wait_until, Breaker, BreakerState, FailureReason, DEFAULT_THRESHOLD, MIN_BUDGET,
};
use super::{Charge, CounterOp, CounterState, MemoryStore, Store, StoreError, StoreFuture};

/// How often the background probe checks a failed store.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// What requests get while the shared store is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Allow every hit.
    Allow,
    /// Deny every hit.
    Deny,
    /// Decide locally with a share of each limit.
    Local,
}

impl FailurePolicy {
    /// The metric label and config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }
}

/// The shared store behind a circuit breaker and a failure policy.
pub struct FailoverStore {
    primary: Arc<dyn Store>,
    local: MemoryStore,
    policy: FailurePolicy,
    local_share: f64,
    breaker: Breaker,
    /// Longest wait for a call without a deadline (the store's timeout).
    wait: Duration,
    /// `divvy_failure_policy_decisions_total{policy,reason}` by
    /// [`FailureReason`], looked up once.
    decided: [IntCounter; FailureReason::ALL.len()],
    /// Where the breaker, the policy and the local counters are shown.
    metrics: Arc<Metrics>,
}

/// Counts the store call it guards as abandoned when dropped before
/// [`Abandon::answered`]: the caller went away while the call was out.
struct Abandon<'a> {
    store: &'a FailoverStore,
    armed: bool,
}

impl Abandon<'_> {
    fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.failed(FailureReason::Abandoned, None);
        }
    }
}

/// The one log line of a breaker opening.
fn log_opened(
    primary: &dyn Store,
    policy: FailurePolicy,
    reason: FailureReason,
    error: Option<&StoreError>,
) {
    let error = error.map_or_else(String::new, |e| format!(": {e}"));
    tracing::warn!(
        store = primary.name(),
        policy = policy.as_str(),
        reason = reason.as_str(),
        "counter store failing ({}{error}); breaker open, deciding by the failure policy until it answers",
        reason.as_str()
    );
}

impl FailoverStore {
    /// Wraps `primary` (breaker closed, opening after
    /// [`DEFAULT_THRESHOLD`] failures in a row; calls without a deadline
    /// wait up to 100 ms); `local_share` is clamped to (0, 1]. The breaker,
    /// the policy's decisions and the local counters are shown in `metrics`
    /// (the service's: the registry `/metrics` serves).
    pub fn new(
        primary: Arc<dyn Store>,
        policy: FailurePolicy,
        local_share: f64,
        metrics: Arc<Metrics>,
    ) -> FailoverStore {
        let local_share = if local_share.is_finite() && local_share > 0.0 {
            local_share.min(1.0)
        } else {
            0.5
        };
        metrics.store.breaker_state.set(BreakerState::Closed as i64);
        FailoverStore {
            primary,
            local: MemoryStore::build(
                Arc::new(super::memory::SystemClock::default()),
                None,
                metrics.clone(),
            ),
            policy,
            local_share,
            breaker: Breaker::new(DEFAULT_THRESHOLD, metrics.clone()),
            wait: Duration::from_millis(100),
            decided: FailureReason::ALL.map(|r| {
                metrics
                    .store
                    .failure_decisions
                    .with_label_values(&[policy.as_str(), r.as_str()])
            }),
            metrics,
        }
    }

    /// Calls without a deadline wait up to `wait` for the store (its
    /// command timeout); `failures` in a row open the breaker.
    pub fn with_breaker(mut self, wait: Duration, failures: u32) -> FailoverStore {
        self.wait = wait;
        self.breaker = Breaker::new(failures, self.metrics.clone());
        self
    }

    /// Caps the local counters (the `local` policy's) at `max`, as
    /// `--max-counters` caps the memory store.
    pub fn with_max_counters(mut self, max: usize) -> FailoverStore {
        self.local = MemoryStore::with_max_counters(
            Arc::new(super::memory::SystemClock::default()),
            max,
            self.metrics.clone(),
        );
        self
    }

    /// Probes the primary now and then in the background while the breaker
    /// is open, closing it when the store answers in time; also sweeps the
    /// local counters.
    pub fn spawn_probe(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROBE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                // Local counters of past outages expire like any others.
                me.local.sweep();
                if !me.breaker.closed() {
                    me.probe_once().await;
                }
            }
        })
    }

    /// Half-opens the breaker and closes it if the store answers within
    /// the shortest time a caller has allowed it, else opens it again.
    pub async fn probe_once(&self) {
        if !self.breaker.half_open() {
            return;
        }
        let budget = self.breaker.probe_budget(self.wait);
        let answered = match tokio::time::timeout(budget, self.primary.probe()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!("counter store still failing: {e}");
                false
            }
            Err(_) => {
                tracing::debug!("counter store still not answering within {budget:?}");
                false
            }
        };
        if self.breaker.probed(answered) {
            tracing::info!(
                store = self.primary.name(),
                "counter store answers again; breaker closed, failure policy lifted"
            );
        }
    }

    /// Starts with the breaker open when the primary is known to be down.
    pub fn start_failed(self) -> FailoverStore {
        self.breaker.open();
        self.metrics
            .store
            .failure_activations
            .with_label_values(&[self.policy.as_str()])
            .inc();
        tracing::warn!(
            store = self.primary.name(),
            policy = self.policy.as_str(),
            "counter store unreachable at startup; breaker open, deciding by the failure policy until it answers"
        );
        self
    }

    /// Counts a failed call toward the breaker; logs and counts its opening.
    fn failed(&self, reason: FailureReason, error: Option<&StoreError>) {
        if self.breaker.failed(reason) {
            self.metrics
                .store
                .failure_activations
                .with_label_values(&[self.policy.as_str()])
                .inc();
            log_opened(&*self.primary, self.policy, reason, error);
        }
    }

    /// The local share of `limit`: at least one credit.
    fn share(&self, limit: u64) -> u64 {
        ((limit as f64 * self.local_share).floor() as u64).clamp(1, limit.max(1))
    }

    fn fallback(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        reason: FailureReason,
    ) -> Vec<CounterState> {
        self.decided[reason as usize].inc_by(ops.len() as u64);
        if self.policy == FailurePolicy::Local {
            let local: Vec<CounterOp> = ops
                .iter()
                .map(|op| CounterOp {
                    limit: self.share(op.limit),
                    burst: self.share(op.burst),
                    ..op.clone()
                })
                .collect();
            return self.local.apply_now(&local, charge);
        }
        ops.iter()
            .map(|op| match self.policy {
                // A refund is never refused; there is nothing to give back to.
                _ if op.refund => CounterState {
                    allowed: true,
                    remaining: op.limit,
                    reset_after: op.window,
                    overdrawn: 0,
                },
                FailurePolicy::Allow => CounterState {
                    allowed: true,
                    remaining: op.limit,
                    reset_after: op.window,
                    overdrawn: 0,
                },
                FailurePolicy::Deny | FailurePolicy::Local => CounterState {
                    allowed: false,
                    remaining: 0,
                    reset_after: op.window,
                    overdrawn: 0,
                },
            })
            .collect()
    }

    /// Whether the shared store is in use (the breaker is closed).
    pub fn healthy(&self) -> bool {
        self.breaker.closed()
    }

    /// The breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// One call to the primary, waiting until the caller's `deadline` or
    /// the store's timeout; a failure is counted and decided by the policy.
    async fn call(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        deadline: Option<Instant>,
    ) -> Vec<CounterState> {
        let now = Instant::now();
        let budget = deadline.map(|d| d.saturating_duration_since(now));
        match budget {
            // Already late (the request waited before it was handled): the
            // store is not asked, and not blamed.
            Some(Duration::ZERO) => return self.fallback(ops, charge, FailureReason::Deadline),
            Some(b) => self.breaker.note_budget(b),
            None => {}
        }
        let (until, late) = wait_until(now, self.wait, deadline);
        let guard = Abandon {
            store: self,
            armed: true,
        };
        let result = tokio::time::timeout_at(until, self.primary.apply(ops, charge)).await;
        guard.answered();
        let (reason, error) = match result {
            Ok(Ok(states)) => {
                self.breaker.succeeded();
                return states;
            }
            Ok(Err(e)) if !e.is_transient() => {
                // This call cannot succeed; the store is not failing.
                tracing::debug!("counter store refused a call: {e}");
                return self.fallback(ops, charge, FailureReason::Refused);
            }
            Ok(Err(e @ StoreError::TimedOut(_))) => (FailureReason::Timeout, Some(e)),
            Ok(Err(e)) => (FailureReason::Connection, Some(e)),
            Err(_) => (late, None),
        };
        // A caller that allowed the store almost nothing says nothing about it.
        let blameless = reason == FailureReason::Deadline && budget.is_some_and(|b| b < MIN_BUDGET);
        if !blameless {
            self.failed(reason, error.as_ref());
        }
        self.fallback(ops, charge, reason)
    }
}

impl Store for FailoverStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        self.apply_by(ops, charge, None)
    }

    fn apply_by<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
        deadline: Option<Instant>,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(async move {
            if !self.breaker.closed() {
                return Ok(self.fallback(ops, charge, FailureReason::BreakerOpen));
            }
            Ok(self.call(ops, charge, deadline).await)
        })
    }

    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        self.primary.peek(op)
    }

    /// The shared store's counter, and this replica's fallback copy of it
    /// (counted while the store failed under the `local` policy).
    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let local = self.local.reset(key).await.unwrap_or(false);
            Ok(self.primary.reset(key).await? || local)
        })
    }

    fn forget(&self, key: &str) -> bool {
        self.primary.forget(key)
    }

    fn cached_denial(&self, key: &str) -> Option<bool> {
        self.primary.cached_denial(key)
    }

    fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
        self.primary.probe()
    }

    fn ready(&self) -> bool {
        self.healthy()
    }

    fn name(&self) -> &'static str {
        self.primary.name()
    }
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
