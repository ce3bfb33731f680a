//! The embedded in-memory store: the default, no other process needed.
//!
//! Counters live in a [`DashMap`] (a sharded hash map: a lock per shard, no
//! global lock), keyed by divvy's counter key. A counter holds the credits
//! left and the instant its window ends, exactly what divvy keeps in Redis
//! (value and TTL). Expired counters are ignored on access and reclaimed by
//! [`MemoryStore::sweep`], which [`MemoryStore::spawn_sweeper`] runs
//! periodically, so memory is bounded by the counters whose window is still
//! open, however many distinct actors come and go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::{Algorithm, CounterOp, CounterState, Store, StoreError, StoreFuture};

/// A source of monotonic time, replaceable in tests.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// The real monotonic clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

#[derive(Debug, Clone, Copy)]
struct Counter {
    remaining: u64,
    /// Clock time at which the window ends.
    expires_at: Duration,
}

/// The embedded store.
pub struct MemoryStore {
    counters: DashMap<Box<str>, Counter>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock::default()))
    }
}

impl MemoryStore {
    /// A store on the system clock.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// A store on the given clock.
    pub fn with_clock(clock: Arc<dyn Clock>) -> MemoryStore {
        let shards =
            (std::thread::available_parallelism().map_or(4, |n| n.get()) * 32).next_power_of_two();
        MemoryStore {
            counters: DashMap::with_shard_amount(shards),
            clock,
        }
    }

    /// Number of counters held (open windows plus expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Drops every expired counter; returns how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let before = self.counters.len();
        self.counters.retain(|_, c| c.expires_at > now);
        before.saturating_sub(self.counters.len())
    }

    /// Runs [`sweep`](Self::sweep) every `every` on the current tokio runtime.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { return };
                // Sweeping walks every shard: keep it off the async workers.
                let dropped = tokio::task::spawn_blocking(move || store.sweep()).await;
                if let Ok(n) = dropped {
                    if n > 0 {
                        tracing::debug!(dropped = n, "swept expired counters");
                    }
                }
            }
        })
    }

    /// Applies one op; the shard lock is held only for this counter.
    pub fn apply_one(&self, op: &CounterOp) -> CounterState {
        match op.algorithm {
            Algorithm::DivvyWindow => self.divvy_window(op),
        }
    }

    fn divvy_window(&self, op: &CounterOp) -> CounterState {
        let now = self.clock.now();
        if op.refund {
            return self.refund(op, now);
        }
        let fresh = |c: &Counter| c.expires_at > now;
        // Fast path: an open window is updated under the shard's write lock
        // without allocating the key.
        if let Some(mut c) = self.counters.get_mut(op.key.as_str()) {
            if !fresh(&c) {
                if op.cost == 0 || op.cost > op.limit {
                    // Nothing is taken, so no window opens; the sweeper drops it.
                    return unopened(op);
                }
                *c = Counter {
                    remaining: op.limit,
                    expires_at: now + op.window,
                };
            }
            return spend(&mut c, op, now);
        }
        if op.cost == 0 || op.cost > op.limit {
            return unopened(op);
        }
        let mut entry = self
            .counters
            .entry(op.key.as_str().into())
            .or_insert(Counter {
                remaining: op.limit,
                expires_at: now + op.window,
            });
        if !fresh(&entry) {
            *entry = Counter {
                remaining: op.limit,
                expires_at: now + op.window,
            };
        }
        spend(&mut entry, op, now)
    }
}

impl MemoryStore {
    /// Gives credits back to an open window, never above the limit.
    fn refund(&self, op: &CounterOp, now: Duration) -> CounterState {
        if let Some(mut c) = self.counters.get_mut(op.key.as_str()) {
            if c.expires_at > now {
                c.remaining = c.remaining.saturating_add(op.cost).min(op.limit);
                return CounterState {
                    allowed: true,
                    remaining: c.remaining,
                    reset_after: c.expires_at.saturating_sub(now),
                };
            }
        }
        CounterState {
            allowed: true,
            remaining: op.limit,
            reset_after: op.window,
        }
    }
}

/// The answer for a counter with no open window that an op does not open.
fn unopened(op: &CounterOp) -> CounterState {
    CounterState {
        allowed: op.cost <= op.limit && op.limit > 0,
        remaining: op.limit,
        reset_after: op.window,
    }
}

fn spend(c: &mut Counter, op: &CounterOp, now: Duration) -> CounterState {
    let allowed = if op.cost == 0 {
        c.remaining > 0
    } else if c.remaining >= op.cost {
        c.remaining -= op.cost;
        true
    } else {
        false
    };
    CounterState {
        allowed,
        remaining: c.remaining,
        reset_after: c.expires_at.saturating_sub(now),
    }
}

impl Store for MemoryStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        let states = ops.iter().map(|op| self.apply_one(op)).collect();
        Box::pin(std::future::ready(Ok(states)))
    }

    fn peek<'a>(
        &'a self,
        key: &'a str,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        let now = self.clock.now();
        let state = self.counters.get(key).and_then(|c| {
            (c.expires_at > now).then(|| CounterState {
                allowed: c.remaining > 0,
                remaining: c.remaining,
                reset_after: c.expires_at.saturating_sub(now),
            })
        });
        Box::pin(std::future::ready(Ok(state)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A clock the test moves by hand.
    #[derive(Default)]
    struct ManualClock(AtomicU64);

    impl ManualClock {
        fn advance(&self, d: Duration) {
            self.0.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Duration {
            Duration::from_millis(self.0.load(Ordering::SeqCst))
        }
    }

    fn op(key: &str, limit: u64, secs: u64, cost: u64) -> CounterOp {
        CounterOp {
            key: key.to_owned(),
            limit,
            window: Duration::from_secs(secs),
            cost,
            refund: false,
            algorithm: Algorithm::DivvyWindow,
        }
    }

    fn store() -> (MemoryStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        (MemoryStore::with_clock(clock.clone()), clock)
    }

    #[test]
    fn window_opens_at_first_hit_and_resets() {
        let (s, clock) = store();
        let o = op("k", 3, 60, 1);
        let seq: Vec<(bool, u64)> = (0..5)
            .map(|_| {
                let st = s.apply_one(&o);
                (st.allowed, st.remaining)
            })
            .collect();
        assert_eq!(
            seq,
            vec![(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
        );
        clock.advance(Duration::from_secs(59));
        let st = s.apply_one(&o);
        assert_eq!(
            (st.allowed, st.reset_after),
            (false, Duration::from_secs(1))
        );
        clock.advance(Duration::from_secs(1));
        let st = s.apply_one(&o);
        assert_eq!(
            (st.allowed, st.remaining, st.reset_after),
            (true, 2, Duration::from_secs(60))
        );
    }

    #[test]
    fn multi_credit_hits_and_checks() {
        let (s, _) = store();
        assert_eq!(s.apply_one(&op("k", 10, 60, 3)).remaining, 7);
        assert_eq!(s.apply_one(&op("k", 10, 60, 7)).remaining, 0);
        let st = s.apply_one(&op("k", 10, 60, 1));
        assert!(!st.allowed);
        // A check (cost 0) never opens a window or takes credit.
        let st = s.apply_one(&op("fresh", 10, 60, 0));
        assert!(st.allowed && st.remaining == 10);
        assert!(s.counters.get("fresh").is_none());
        // Too big a hit on a fresh counter is denied and opens nothing.
        let st = s.apply_one(&op("big", 2, 60, 3));
        assert!(!st.allowed && st.remaining == 2);
        assert!(s.counters.get("big").is_none());
        // Denied hits are not charged.
        s.apply_one(&op("p", 5, 60, 4));
        assert!(!s.apply_one(&op("p", 5, 60, 2)).allowed);
        assert_eq!(s.apply_one(&op("p", 5, 60, 1)).remaining, 0);
    }

    #[test]
    fn sweep_reclaims_expired_counters() {
        let (s, clock) = store();
        for round in 0..10u64 {
            for i in 0..10_000u64 {
                s.apply_one(&op(&format!("ip-{round}-{i}"), 5, 60, 1));
            }
            clock.advance(Duration::from_secs(61));
            s.sweep();
            assert_eq!(s.len(), 0, "round {round}");
        }
        s.apply_one(&op("live", 5, 60, 1));
        clock.advance(Duration::from_secs(30));
        s.apply_one(&op("young", 5, 60, 1));
        clock.advance(Duration::from_secs(31));
        assert_eq!(s.sweep(), 1);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn concurrent_hits_are_exact() {
        let s = Arc::new(MemoryStore::new());
        let allowed = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                let allowed = allowed.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if s.apply_one(&op("shared", 777, 600, 1)).allowed {
                            allowed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(allowed.load(Ordering::SeqCst), 777);
    }
}
