//! Unit tests of `store/failover.rs`.

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

/// A failover store recording to a registry of its own.
fn failover(primary: Arc<dyn Store>, policy: FailurePolicy, local_share: f64) -> FailoverStore {
    FailoverStore::new(primary, policy, local_share, Arc::new(Metrics::new()))
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
        let store = failover(primary.clone(), policy, 0.5);
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
    let store = failover(primary.clone(), FailurePolicy::Deny, 0.5).with_breaker(50 * MS, 3);
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
    let store = failover(hung(Duration::ZERO), FailurePolicy::Allow, 0.5).with_breaker(50 * MS, 2);
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
    let store = failover(primary.clone(), FailurePolicy::Allow, 0.5).with_breaker(50 * MS, 1);
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
    let store = failover(hung(Duration::ZERO), FailurePolicy::Local, 0.5).with_breaker(50 * MS, 2);
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
    let healthy = failover(up, FailurePolicy::Local, 0.5).with_breaker(50 * MS, 1);
    healthy.apply(&[op(10)], Charge::Each).await.unwrap();
    assert!(healthy.ready());
}

#[tokio::test(start_paused = true)]
async fn the_probe_closes_the_breaker_only_when_the_store_answers_in_time() {
    // Callers allow 15 ms; the store answers again, in 30 ms or in 10 ms.
    for (probe_takes, closes) in [(30 * MS, false), (10 * MS, true)] {
        let primary = hung(probe_takes);
        let store = failover(primary.clone(), FailurePolicy::Deny, 0.5).with_breaker(50 * MS, 1);
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
    let store = failover(Arc::new(Refusing), FailurePolicy::Deny, 0.5).with_breaker(50 * MS, 1);
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
    let store =
        Arc::new(failover(primary.clone(), FailurePolicy::Deny, 0.5).with_breaker(100 * MS, 1));
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
    let store = failover(flaky(), FailurePolicy::Local, 0.5);
    assert_eq!(store.share(1), 1);
    assert_eq!(store.share(3), 1);
    assert_eq!(store.share(100), 50);
    let store = failover(flaky(), FailurePolicy::Local, 7.0);
    assert_eq!(store.share(100), 100);
}

#[tokio::test]
async fn the_breaker_and_the_policy_are_shown_in_the_registry_handed_in() {
    let m = Arc::new(Metrics::new());
    let store =
        FailoverStore::new(flaky(), FailurePolicy::Deny, 0.5, m.clone()).with_breaker(50 * MS, 1);
    assert!(!store.apply(&[op(10)], Charge::Each).await.unwrap()[0].allowed);
    assert!(!store.apply(&[op(10)], Charge::Each).await.unwrap()[0].allowed);
    let decided = |reason: &str| {
        m.store
            .failure_decisions
            .with_label_values(&["deny", reason])
            .get()
    };
    assert_eq!((decided("connection"), decided("breaker_open")), (1, 1));
    let activations = m.store.failure_activations.with_label_values(&["deny"]);
    assert_eq!(activations.get(), 1);
    assert_eq!(m.store.failures.with_label_values(&["connection"]).get(), 1);
    assert_eq!(m.store.breaker_state.get(), BreakerState::Open as i64);
}
