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

use crate::observe::metrics::metrics;

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
    /// wait up to 100 ms); `local_share` is clamped to (0, 1].
    pub fn new(primary: Arc<dyn Store>, policy: FailurePolicy, local_share: f64) -> FailoverStore {
        let local_share = if local_share.is_finite() && local_share > 0.0 {
            local_share.min(1.0)
        } else {
            0.5
        };
        metrics()
            .store
            .breaker_state
            .set(BreakerState::Closed as i64);
        FailoverStore {
            primary,
            local: MemoryStore::new(),
            policy,
            local_share,
            breaker: Breaker::new(DEFAULT_THRESHOLD),
            wait: Duration::from_millis(100),
            decided: FailureReason::ALL.map(|r| {
                metrics()
                    .store
                    .failure_decisions
                    .with_label_values(&[policy.as_str(), r.as_str()])
            }),
        }
    }

    /// Calls without a deadline wait up to `wait` for the store (its
    /// command timeout); `failures` in a row open the breaker.
    pub fn with_breaker(mut self, wait: Duration, failures: u32) -> FailoverStore {
        self.wait = wait;
        self.breaker = Breaker::new(failures);
        self
    }

    /// Caps the local counters (the `local` policy's) at `max`, as
    /// `--max-counters` caps the memory store.
    pub fn with_max_counters(mut self, max: usize) -> FailoverStore {
        self.local =
            MemoryStore::with_max_counters(Arc::new(super::memory::SystemClock::default()), max);
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
        metrics()
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
            metrics()
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
                },
                FailurePolicy::Allow => CounterState {
                    allowed: true,
                    remaining: op.limit,
                    reset_after: op.window,
                },
                FailurePolicy::Deny | FailurePolicy::Local => CounterState {
                    allowed: false,
                    remaining: 0,
                    reset_after: op.window,
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
mod tests {
    use super::*;
    use crate::store::Algorithm;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A store that fails (or hangs) while `down` is set, counts the calls
    /// it gets, and answers its probe after `probe_delay`.
    struct Flaky {
        down: AtomicBool,
        hangs: bool,
        calls: AtomicUsize,
        probe_delay: Duration,
        inner: MemoryStore,
    }

    impl Store for Flaky {
        fn apply<'a>(
            &'a self,
            ops: &'a [CounterOp],
            charge: Charge,
        ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match (self.down.load(Ordering::SeqCst), self.hangs) {
                (false, _) => self.inner.apply(ops, charge),
                (true, true) => Box::pin(std::future::pending()),
                (true, false) => Box::pin(std::future::ready(Err(StoreError::Unavailable(
                    "down".into(),
                )))),
            }
        }
        fn peek<'a>(
            &'a self,
            op: &'a CounterOp,
        ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
            self.inner.peek(op)
        }
        fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
            let down = self.down.load(Ordering::SeqCst);
            let delay = self.probe_delay;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                if down {
                    Err(StoreError::Unavailable("down".into()))
                } else {
                    Ok(())
                }
            })
        }
        fn name(&self) -> &'static str {
            "flaky"
        }
    }

    fn op(limit: u64) -> CounterOp {
        CounterOp::new("k", Algorithm::Window, limit, Duration::from_secs(60), 1)
    }

    fn flaky() -> Arc<Flaky> {
        Arc::new(Flaky {
            down: AtomicBool::new(true),
            hangs: false,
            calls: AtomicUsize::new(0),
            probe_delay: Duration::ZERO,
            inner: MemoryStore::new(),
        })
    }

    fn hung(probe_delay: Duration) -> Arc<Flaky> {
        Arc::new(Flaky {
            hangs: true,
            probe_delay,
            ..Arc::into_inner(flaky()).unwrap()
        })
    }

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn policies_answer_while_down_and_the_breaker_skips_the_store() {
        for (policy, expect) in [
            (FailurePolicy::Allow, vec![true; 6]),
            (FailurePolicy::Deny, vec![false; 6]),
            // Limit 10 at a share of 0.5: 5 local credits.
            (
                FailurePolicy::Local,
                vec![true, true, true, true, true, false],
            ),
        ] {
            let primary = flaky();
            let store = FailoverStore::new(primary.clone(), policy, 0.5);
            let mut got = Vec::new();
            for _ in 0..6 {
                got.push(store.apply(&[op(10)], Charge::Each).await.unwrap()[0].allowed);
            }
            assert_eq!(got, expect, "{policy:?}");
            // Only the failures that opened the breaker reached the store.
            assert_eq!(
                primary.calls.load(Ordering::SeqCst),
                DEFAULT_THRESHOLD as usize
            );
            assert!(!store.ready());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_store_is_decided_at_the_deadline_then_skipped() {
        let primary = hung(Duration::ZERO);
        let store =
            FailoverStore::new(primary.clone(), FailurePolicy::Deny, 0.5).with_breaker(50 * MS, 3);
        for n in 1..=3 {
            let started = Instant::now();
            let deadline = Some(started + 15 * MS);
            let states = store
                .apply_by(&[op(10)], Charge::Each, deadline)
                .await
                .unwrap();
            // Decided by the policy exactly at the deadline, not at the timeout.
            assert_eq!(started.elapsed(), 15 * MS);
            assert!(!states[0].allowed);
            assert_eq!(store.ready(), n < 3, "after {n} missed deadlines");
        }
        // Open: answered at once, the store untouched.
        let started = Instant::now();
        store
            .apply_by(&[op(10)], Charge::Each, Some(started + 15 * MS))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(primary.calls.load(Ordering::SeqCst), 3);
        assert_eq!(store.breaker_state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_deadline_the_store_timeout_bounds_the_wait() {
        let store = FailoverStore::new(hung(Duration::ZERO), FailurePolicy::Allow, 0.5)
            .with_breaker(50 * MS, 2);
        // No deadline, or one later than the timeout: the timeout ends the wait.
        for after in [None, Some(80 * MS)] {
            let started = Instant::now();
            let deadline = after.map(|a| started + a);
            let states = store
                .apply_by(&[op(10)], Charge::Each, deadline)
                .await
                .unwrap();
            assert_eq!(started.elapsed(), 50 * MS, "{deadline:?}");
            assert!(states[0].allowed);
        }
        assert!(!store.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_allowed_almost_nothing_is_answered_but_blames_nothing() {
        let primary = hung(Duration::ZERO);
        let store =
            FailoverStore::new(primary.clone(), FailurePolicy::Allow, 0.5).with_breaker(50 * MS, 1);
        // Already past: answered at once, the store not asked.
        let now = Instant::now();
        let states = store
            .apply_by(&[op(10)], Charge::Each, Some(now))
            .await
            .unwrap();
        assert!(states[0].allowed);
        assert_eq!(now.elapsed(), Duration::ZERO);
        assert_eq!(primary.calls.load(Ordering::SeqCst), 0);
        // 1 ms (under MIN_BUDGET): asked, missed, answered at the deadline.
        let now = Instant::now();
        store
            .apply_by(&[op(10)], Charge::Each, Some(now + MS))
            .await
            .unwrap();
        assert_eq!(now.elapsed(), MS);
        assert_eq!(primary.calls.load(Ordering::SeqCst), 1);
        assert!(store.ready(), "a 1 ms deadline opened the breaker");
        // 15 ms missed: that one counts.
        store
            .apply_by(&[op(10)], Charge::Each, Some(Instant::now() + 15 * MS))
            .await
            .unwrap();
        assert!(!store.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_goes_away_mid_call_counts_as_a_failure() {
        let store = FailoverStore::new(hung(Duration::ZERO), FailurePolicy::Local, 0.5)
            .with_breaker(50 * MS, 2);
        for _ in 0..2 {
            // The caller gives up after 5 ms (its client disconnected): the
            // call's future is dropped while the store has not answered.
            let ops = [op(10)];
            let call = store.apply(&ops, Charge::Each);
            assert!(tokio::time::timeout(5 * MS, call).await.is_err());
        }
        assert_eq!(store.breaker_state(), BreakerState::Open);
        // A call answered in time is no failure, even with a threshold of 1.
        let up = flaky();
        up.down.store(false, Ordering::SeqCst);
        let healthy = FailoverStore::new(up, FailurePolicy::Local, 0.5).with_breaker(50 * MS, 1);
        healthy.apply(&[op(10)], Charge::Each).await.unwrap();
        assert!(healthy.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn the_probe_closes_the_breaker_only_when_the_store_answers_in_time() {
        // Callers allow 15 ms; the store answers again, in 30 ms or in 10 ms.
        for (probe_takes, closes) in [(30 * MS, false), (10 * MS, true)] {
            let primary = hung(probe_takes);
            let store = FailoverStore::new(primary.clone(), FailurePolicy::Deny, 0.5)
                .with_breaker(50 * MS, 1);
            let now = Instant::now();
            store
                .apply_by(&[op(3)], Charge::Each, Some(now + 15 * MS))
                .await
                .unwrap();
            assert_eq!(store.breaker_state(), BreakerState::Open);
            primary.down.store(false, Ordering::SeqCst);
            store.probe_once().await;
            assert_eq!(store.ready(), closes, "probe taking {probe_takes:?}");
        }
    }

    /// A store that refuses every call (a permanent error).
    struct Refusing;

    impl Store for Refusing {
        fn apply<'a>(
            &'a self,
            _ops: &'a [CounterOp],
            _charge: Charge,
        ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
            Box::pin(std::future::ready(Err(StoreError::Refused(
                "script error".into(),
            ))))
        }
        fn peek<'a>(
            &'a self,
            _op: &'a CounterOp,
        ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
            Box::pin(std::future::ready(Ok(None)))
        }
        fn name(&self) -> &'static str {
            "refusing"
        }
    }

    #[tokio::test]
    async fn a_refused_call_is_decided_by_the_policy_and_blames_nothing() {
        let store = FailoverStore::new(Arc::new(Refusing), FailurePolicy::Deny, 0.5)
            .with_breaker(50 * MS, 1);
        for _ in 0..3 {
            let states = store.apply(&[op(10)], Charge::Each).await.unwrap();
            assert!(!states[0].allowed);
        }
        assert!(store.ready(), "a permanent error opened the breaker");
        assert!(!StoreError::Refused(String::new()).is_transient());
        assert!(StoreError::TimedOut(String::new()).is_transient());
        assert!(StoreError::Unavailable(String::new()).is_transient());
    }

    #[tokio::test]
    async fn probe_closes_the_breaker() {
        let primary = flaky();
        let store = Arc::new(
            FailoverStore::new(primary.clone(), FailurePolicy::Deny, 0.5).with_breaker(100 * MS, 1),
        );
        let _probe = store.spawn_probe();
        assert!(!store.apply(&[op(3)], Charge::Each).await.unwrap()[0].allowed);
        assert!(!store.ready());
        primary.down.store(false, Ordering::SeqCst);
        for _ in 0..100 {
            if store.ready() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(store.ready());
        assert_eq!(store.breaker_state(), BreakerState::Closed);
        let s = store.apply(&[op(3)], Charge::Each).await.unwrap()[0];
        assert!(s.allowed && s.remaining == 2);
    }

    #[test]
    fn local_share_keeps_at_least_one_credit() {
        let store = FailoverStore::new(flaky(), FailurePolicy::Local, 0.5);
        assert_eq!(store.share(1), 1);
        assert_eq!(store.share(3), 1);
        assert_eq!(store.share(100), 50);
        let store = FailoverStore::new(flaky(), FailurePolicy::Local, 7.0);
        assert_eq!(store.share(100), 100);
    }
}
