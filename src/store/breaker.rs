//! The circuit breaker in front of a shared store, and how long a call to
//! it may wait.
//!
//! Closed: calls go to the store. After [`Breaker::threshold`] failures in a
//! row (an error, a command timeout, a missed deadline, or a call its caller
//! abandoned) it opens: calls are decided by the failure policy without
//! touching the store. A background probe half-opens it now and then and
//! closes it when the store answers within the time callers allow.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::observe::metrics::Metrics;

/// Why a store call failed, or why the failure policy decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum FailureReason {
    /// The caller's deadline, less the margin, came before the store's answer.
    Deadline,
    /// The store did not answer within its timeout (`--redis-timeout-ms`).
    Timeout,
    /// The store answered with an error or could not be reached.
    Connection,
    /// The caller went away (cancelled, disconnected) while the call was out.
    Abandoned,
    /// The breaker was open: the store was not asked.
    BreakerOpen,
    /// The store refused this call (a permanent error): decided by the
    /// policy, but no failure of the store.
    Refused,
}

impl FailureReason {
    /// Every reason, in the order of their discriminants.
    pub const ALL: [FailureReason; 6] = [
        FailureReason::Deadline,
        FailureReason::Timeout,
        FailureReason::Connection,
        FailureReason::Abandoned,
        FailureReason::BreakerOpen,
        FailureReason::Refused,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Deadline => "deadline",
            FailureReason::Timeout => "timeout",
            FailureReason::Connection => "connection",
            FailureReason::Abandoned => "abandoned",
            FailureReason::BreakerOpen => "breaker_open",
            FailureReason::Refused => "refused",
        }
    }
}

/// The breaker's state, as `divvy_store_breaker_state` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store (0).
    Closed = 0,
    /// Calls are decided by the failure policy (1).
    Open = 1,
    /// A probe is checking the store; calls are still decided locally (2).
    HalfOpen = 2,
}

/// Failures in a row that open the breaker by default.
pub const DEFAULT_THRESHOLD: u32 = 3;

/// The least time a caller must allow the store for a missed deadline to
/// count against it: a caller that allowed less (a request that waited long
/// before it was handled, a `grpc-timeout` of almost nothing) is answered by
/// the policy, but it says nothing about the store, and must neither open
/// the breaker nor hold the probe to its budget.
pub const MIN_BUDGET: Duration = Duration::from_millis(2);

/// A circuit breaker counting consecutive failures.
pub struct Breaker {
    state: AtomicU8,
    failures: AtomicU32,
    threshold: u32,
    /// The shortest time a caller has allowed the store, in µs: a probe
    /// must answer within it to close the breaker.
    budget_us: AtomicU64,
    /// Where failures and the state are shown (`divvy_store_*`).
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("state", &self.state())
            .field("failures", &self.failures)
            .field("threshold", &self.threshold)
            .field("budget_us", &self.budget_us)
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// A closed breaker opening after `threshold` failures in a row (at
    /// least 1), counting failures and showing its state in `metrics`.
    pub fn new(threshold: u32, metrics: Arc<Metrics>) -> Breaker {
        Breaker {
            state: AtomicU8::new(BreakerState::Closed as u8),
            failures: AtomicU32::new(0),
            threshold: threshold.max(1),
            budget_us: AtomicU64::new(u64::MAX),
            metrics,
        }
    }

    /// Failures in a row that open it.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            1 => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether calls go to the store.
    pub fn closed(&self) -> bool {
        self.state() == BreakerState::Closed
    }

    /// Moves from `from` to `to` if it is in `from`; true when it moved.
    fn shift(&self, from: BreakerState, to: BreakerState) -> bool {
        let moved = self
            .state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.publish(to);
        }
        moved
    }

    /// A store call answered: the count of failures in a row starts again.
    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// A store call failed; true when this failure opened the breaker.
    pub fn failed(&self, reason: FailureReason) -> bool {
        self.metrics.store.errors.inc();
        self.metrics
            .store
            .failures
            .with_label_values(&[reason.as_str()])
            .inc();
        // "In a row" is approximate under concurrency: a success racing a
        // failure may reset the count either side of it.
        let row = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        row >= self.threshold && self.shift(BreakerState::Closed, BreakerState::Open)
    }

    /// Opens it at once (the store is known to be down).
    pub fn open(&self) {
        self.state
            .store(BreakerState::Open as u8, Ordering::Release);
        self.publish(BreakerState::Open);
    }

    /// A probe is about to check the store: open → half-open. False when
    /// the breaker was not open (nothing to probe).
    pub fn half_open(&self) -> bool {
        self.shift(BreakerState::Open, BreakerState::HalfOpen)
    }

    /// The probe's verdict on a half-open breaker: closed (the count and the
    /// callers' budget start again) or open. True when this closed it.
    pub fn probed(&self, answered: bool) -> bool {
        if !answered {
            self.shift(BreakerState::HalfOpen, BreakerState::Open);
            return false;
        }
        self.failures.store(0, Ordering::Relaxed);
        self.budget_us.store(u64::MAX, Ordering::Relaxed);
        self.shift(BreakerState::HalfOpen, BreakerState::Closed)
    }

    /// Notes the time a caller allows the store (the probe's bar); budgets
    /// under [`MIN_BUDGET`] are not taken.
    pub fn note_budget(&self, budget: Duration) {
        if budget >= MIN_BUDGET {
            let us = u64::try_from(budget.as_micros()).unwrap_or(u64::MAX);
            // A plain load first: callers mostly allow what they allowed
            // before, and a read-modify-write on every call is not free.
            if us < self.budget_us.load(Ordering::Relaxed) {
                self.budget_us.fetch_min(us, Ordering::Relaxed);
            }
        }
    }

    /// How long a probe may take to count as an answer: the shortest budget
    /// a caller allowed, else `wait`.
    pub fn probe_budget(&self, wait: Duration) -> Duration {
        match self.budget_us.load(Ordering::Relaxed) {
            u64::MAX => wait,
            us => wait.min(Duration::from_micros(us)),
        }
    }

    /// Shows `state` in the metrics.
    fn publish(&self, state: BreakerState) {
        self.metrics.store.breaker_state.set(state as i64);
        self.metrics
            .store
            .ready
            .set(i64::from(state == BreakerState::Closed));
    }
}

/// When a store call started at `now` stops waiting, and why: the caller's
/// `deadline` if it comes first, else `wait` (the store's own timeout).
pub fn wait_until(
    now: Instant,
    wait: Duration,
    deadline: Option<Instant>,
) -> (Instant, FailureReason) {
    let by_timeout = now + wait;
    match deadline {
        Some(d) if d < by_timeout => (d, FailureReason::Deadline),
        _ => (by_timeout, FailureReason::Timeout),
    }
}

/// The part of a caller's `timeout` the store may take: all but `margin`
/// (kept to decide and answer), or half of it when it is shorter than two
/// margins, so a short timeout still gives the store a chance.
pub fn store_budget(timeout: Duration, margin: Duration) -> Duration {
    if timeout >= margin * 2 {
        timeout - margin
    } else {
        timeout / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_store_gets_the_timeout_less_the_margin_or_half_a_short_one() {
        // Envoy's default 20 ms with the default 5 ms margin.
        assert_eq!(store_budget(20 * MS, 5 * MS), 15 * MS);
        assert_eq!(store_budget(10 * MS, 5 * MS), 5 * MS);
        assert_eq!(store_budget(8 * MS, 5 * MS), 4 * MS);
        assert_eq!(store_budget(Duration::ZERO, 5 * MS), Duration::ZERO);
        assert_eq!(store_budget(20 * MS, Duration::ZERO), 20 * MS);
    }

    #[test]
    fn the_earlier_of_deadline_and_timeout_ends_the_wait() {
        // An injected "now": any instant works as the origin.
        let now = Instant::now();
        let (at, why) = wait_until(now, 50 * MS, Some(now + 15 * MS));
        assert_eq!((at - now, why), (15 * MS, FailureReason::Deadline));
        let (at, why) = wait_until(now, 50 * MS, Some(now + 80 * MS));
        assert_eq!((at - now, why), (50 * MS, FailureReason::Timeout));
        let (at, why) = wait_until(now, 50 * MS, None);
        assert_eq!((at - now, why), (50 * MS, FailureReason::Timeout));
        // A deadline already past: stop at once.
        let (at, why) = wait_until(now + 10 * MS, 50 * MS, Some(now));
        assert_eq!((at, why), (now, FailureReason::Deadline));
    }

    #[test]
    fn opens_after_the_threshold_in_a_row_and_a_success_starts_again() {
        let b = Breaker::new(3, Arc::new(Metrics::new()));
        assert!(!b.failed(FailureReason::Deadline));
        assert!(!b.failed(FailureReason::Abandoned));
        b.succeeded();
        assert!(!b.failed(FailureReason::Timeout));
        assert!(!b.failed(FailureReason::Timeout));
        assert!(b.closed());
        assert!(b.failed(FailureReason::Connection));
        assert_eq!(b.state(), BreakerState::Open);
        // Only the failure that opened it says so.
        assert!(!b.failed(FailureReason::Connection));
        assert!(b.half_open());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // A failure while half-open leaves it to the probe.
        assert!(!b.failed(FailureReason::Timeout));
        assert!(!b.probed(false));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.half_open());
        assert!(b.probed(true));
        assert!(b.closed());
        // Closed: nothing to probe.
        assert!(!b.half_open());
        assert!(b.closed());
        // Closed again with a fresh count.
        assert!(!b.failed(FailureReason::Timeout));
        assert!(b.closed());
    }

    #[test]
    fn failures_and_the_state_are_shown_in_the_registry_handed_in() {
        let m = Arc::new(Metrics::new());
        let b = Breaker::new(1, m.clone());
        assert!(b.failed(FailureReason::Timeout));
        assert_eq!(m.store.errors.get(), 1);
        assert_eq!(m.store.failures.with_label_values(&["timeout"]).get(), 1);
        assert_eq!(m.store.breaker_state.get(), BreakerState::Open as i64);
        assert_eq!(m.store.ready.get(), 0);
        assert!(b.half_open());
        assert_eq!(m.store.breaker_state.get(), BreakerState::HalfOpen as i64);
        assert!(b.probed(true));
        assert_eq!(m.store.breaker_state.get(), BreakerState::Closed as i64);
        assert_eq!(m.store.ready.get(), 1);
    }

    #[test]
    fn the_probe_must_answer_within_the_shortest_budget_seen_since_it_closed() {
        let b = Breaker::new(1, Arc::new(Metrics::new()));
        assert_eq!(b.probe_budget(50 * MS), 50 * MS);
        b.note_budget(15 * MS);
        b.note_budget(30 * MS);
        // A caller that allowed (almost) nothing sets no bar.
        b.note_budget(Duration::ZERO);
        b.note_budget(MIN_BUDGET - Duration::from_micros(1));
        assert_eq!(b.probe_budget(50 * MS), 15 * MS);
        assert_eq!(b.probe_budget(10 * MS), 10 * MS);
        // Closing starts the bar again.
        b.failed(FailureReason::Deadline);
        assert!(b.half_open());
        assert!(b.probed(true));
        assert_eq!(b.probe_budget(50 * MS), 50 * MS);
    }
}
