//! What requests get while the shared store (Redis) is failing.
//!
//! [`FailoverStore`] wraps the shared store with a circuit breaker. While the
//! store answers, every op goes to it. The first failure (an error or a
//! command timeout) opens the breaker: from then on requests are decided by
//! the [`FailurePolicy`] at once, without touching the store, so a dead
//! Redis costs microseconds per request rather than a timeout each. A
//! background probe pings the store every [`PROBE_EVERY`] and closes the
//! breaker as soon as it answers.
//!
//! - `allow`: fail open: every hit is allowed (credits shown as the full limit).
//! - `deny`: fail closed: every hit is denied (0 credits left).
//! - `local`: decide from the embedded memory store with a conservative share
//!   of each limit (`--local-share`, default 0.5: at least 1 credit), per
//!   replica, until the shared store is back. Local counters are this
//!   replica's own and expire with their windows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::metrics;

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

/// The shared store behind a circuit breaker and a failure policy.
pub struct FailoverStore {
    primary: Arc<dyn Store>,
    local: MemoryStore,
    policy: FailurePolicy,
    local_share: f64,
    healthy: AtomicBool,
}

impl FailoverStore {
    /// Wraps `primary` (breaker closed); `local_share` is clamped to (0, 1].
    pub fn new(primary: Arc<dyn Store>, policy: FailurePolicy, local_share: f64) -> FailoverStore {
        let local_share = if local_share.is_finite() && local_share > 0.0 {
            local_share.min(1.0)
        } else {
            0.5
        };
        FailoverStore {
            primary,
            local: MemoryStore::new(),
            policy,
            local_share,
            healthy: AtomicBool::new(true),
        }
    }

    /// Caps the local counters (the `local` policy's) at `max`, as
    /// `--max-counters` caps the memory store.
    pub fn with_max_counters(mut self, max: usize) -> FailoverStore {
        self.local =
            MemoryStore::with_max_counters(Arc::new(super::memory::SystemClock::default()), max);
        self
    }

    /// Probes the primary now and then in the background, closing the breaker
    /// when it answers; also sweeps the local counters.
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
                if me.healthy.load(Ordering::Acquire) {
                    continue;
                }
                match me.primary.probe().await {
                    Ok(()) => {
                        if !me.healthy.swap(true, Ordering::AcqRel) {
                            metrics().store_ready.set(1);
                            tracing::info!(
                                store = me.primary.name(),
                                "counter store answers again; failure policy lifted"
                            );
                        }
                    }
                    Err(e) => tracing::debug!("counter store still failing: {e}"),
                }
            }
        })
    }

    /// Starts with the breaker open when the primary is known to be down.
    pub fn start_failed(self) -> FailoverStore {
        self.healthy.store(false, Ordering::Release);
        metrics().store_ready.set(0);
        tracing::warn!(
            store = self.primary.name(),
            policy = ?self.policy,
            "counter store unreachable at startup; deciding by the failure policy until it answers"
        );
        self
    }

    fn policy_name(&self) -> &'static str {
        match self.policy {
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }

    /// Opens the breaker (the store just failed).
    fn trip(&self, error: &StoreError) {
        metrics().store_errors.inc();
        if self.healthy.swap(false, Ordering::AcqRel) {
            metrics().store_ready.set(0);
            metrics()
                .failure_activations
                .with_label_values(&[self.policy_name()])
                .inc();
            tracing::warn!(
                store = self.primary.name(),
                policy = ?self.policy,
                "counter store failed ({error}); deciding by the failure policy until it answers"
            );
        }
    }

    /// The local share of `limit`: at least one credit.
    fn share(&self, limit: u64) -> u64 {
        ((limit as f64 * self.local_share).floor() as u64).clamp(1, limit.max(1))
    }

    fn fallback(&self, ops: &[CounterOp], charge: Charge) -> Vec<CounterState> {
        metrics()
            .failure_decisions
            .with_label_values(&[self.policy_name()])
            .inc_by(ops.len() as u64);
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
                _ if op.refund && self.policy != FailurePolicy::Local => CounterState {
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
        self.healthy.load(Ordering::Acquire)
    }
}

impl Store for FailoverStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(async move {
            if !self.healthy() {
                return Ok(self.fallback(ops, charge));
            }
            match self.primary.apply(ops, charge).await {
                Ok(states) => Ok(states),
                Err(e) => {
                    self.trip(&e);
                    Ok(self.fallback(ops, charge))
                }
            }
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
    use std::sync::atomic::AtomicUsize;

    /// A store that fails while `down` is set and counts the calls it gets.
    struct Flaky {
        down: AtomicBool,
        calls: AtomicUsize,
        inner: MemoryStore,
    }

    impl Store for Flaky {
        fn apply<'a>(
            &'a self,
            ops: &'a [CounterOp],
            charge: Charge,
        ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                Box::pin(std::future::ready(Err(StoreError::Unavailable(
                    "down".into(),
                ))))
            } else {
                self.inner.apply(ops, charge)
            }
        }
        fn peek<'a>(
            &'a self,
            op: &'a CounterOp,
        ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
            self.inner.peek(op)
        }
        fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
            let r = if self.down.load(Ordering::SeqCst) {
                Err(StoreError::Unavailable("down".into()))
            } else {
                Ok(())
            };
            Box::pin(std::future::ready(r))
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
            calls: AtomicUsize::new(0),
            inner: MemoryStore::new(),
        })
    }

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
            // Only the first request reached the failing store.
            assert_eq!(primary.calls.load(Ordering::SeqCst), 1);
            assert!(!store.ready());
        }
    }

    #[tokio::test]
    async fn probe_closes_the_breaker() {
        let primary = flaky();
        let store = Arc::new(FailoverStore::new(
            primary.clone(),
            FailurePolicy::Deny,
            0.5,
        ));
        let _probe = store.spawn_probe();
        assert!(!store.apply(&[op(3)], Charge::Each).await.unwrap()[0].allowed);
        primary.down.store(false, Ordering::SeqCst);
        for _ in 0..100 {
            if store.ready() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(store.ready());
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
