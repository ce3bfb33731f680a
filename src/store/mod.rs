//! Where counters live.
//!
//! The limiter hands a store every counter a request touches in one call
//! ([`Store::apply`]), so a networked store can answer them in one round trip.
//! The store applies each [`CounterOp`] in order with the op's algorithm and
//! reports a [`CounterState`] per op. Protocol code never sees a store.

pub mod algorithm;
pub mod breaker;
pub mod failover;
pub mod lru_table;
pub mod memory;
pub mod over_limit;
pub mod redis;
pub mod redis_tls;
pub mod redis_url;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use thiserror::Error;

pub use memory::MemoryStore;

/// A boxed future returned by [`Store`] methods.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use algorithm::Algorithm;

/// How the counters of one request are charged together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Charge {
    /// Each group (each rule's limits) is charged if it is allowed.
    #[default]
    Each,
    /// If any deciding group is denied, nothing of the request is charged.
    AllOrNothing,
    /// The request is already denied (by a rule with no counter); nothing is
    /// charged, the counters only answer.
    Denied,
}

/// One check-and-consume on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterOp {
    /// Counter identity (divvy's Redis key shape).
    pub key: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Credits per window (> 0).
    pub limit: u64,
    /// Window (refill period for a token bucket; > 0).
    pub window: Duration,
    /// Token bucket capacity in credits; equal to `limit` for other algorithms.
    pub burst: u64,
    /// Credits to take. 0 checks without consuming: allowed while at least one credit is left.
    pub cost: u64,
    /// Give `cost` credits back instead (Envoy's `is_negative_hits`), never
    /// above the limit; a counter with nothing open is left alone.
    pub refund: bool,
    /// Whether this op belongs to the group of the op before it (the limits
    /// of one rule): a group is charged only if every op in it is allowed.
    pub joint: bool,
    /// Whether a denial of this op's group denies the request (false for a
    /// canary rule's counters); matters for [`Charge::AllOrNothing`].
    pub decides: bool,
    /// When the hit is denied because it is larger than what is left, take
    /// what is left instead, so the counter reads exhausted
    /// (envoyproxy/ratelimit counts every hit). The op still answers denied,
    /// with 0 credits left and the reset a retry of the same hit would get.
    /// Honoured for an op charged on its own: under [`Charge::Each`], in a
    /// group of one, not a refund, cost above 0; elsewhere it is a plain
    /// denied hit.
    pub fill: bool,
    /// Apply a hit in full even past what is left, leaving the counter in
    /// debt that the algorithm's own recovery pays back (a window's reset, a
    /// bucket's refill). The op is allowed while anything is left before
    /// the hit (a check: while something is left) and answers 0 left while
    /// in debt. A denied hit is charged anyway when charged on its own (as
    /// [`CounterOp::fill`]); in a group or an all-or-nothing request it is
    /// charged only when the whole is (see [`algorithm::overdrawn`]).
    pub overdraft: bool,
}

impl CounterOp {
    /// A deciding op of its own group, taking `cost` credits.
    pub fn new(
        key: impl Into<String>,
        algorithm: Algorithm,
        limit: u64,
        window: Duration,
        cost: u64,
    ) -> CounterOp {
        CounterOp {
            key: key.into(),
            algorithm,
            limit,
            window,
            burst: limit,
            cost,
            refund: false,
            joint: false,
            decides: true,
            fill: false,
            overdraft: false,
        }
    }
}

/// A counter after an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterState {
    /// Whether the op's credits were available (and so taken).
    pub allowed: bool,
    /// Credits left after the op.
    pub remaining: u64,
    /// Allowed: time until the counter is full again (window over, bucket
    /// full). Denied: time until the same hit would be allowed.
    pub reset_after: Duration,
    /// Credits charged past what was left (an overdraft's new debt); 0
    /// unless an overdrawing op was charged.
    pub overdrawn: u64,
}

/// A store failure; the request that hit it gets an error, never a panic.
/// Transient failures (the first two) say the store is failing and count
/// toward the circuit breaker; a permanent one says this call cannot
/// succeed, whatever the store's health.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The backend could not be reached, the connection was lost, or it is
    /// failing over (transient).
    #[error("counter store unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer within its command timeout (transient).
    #[error("counter store timed out: {0}")]
    TimedOut(String),
    /// The backend refused the call or answered it wrongly: a script error,
    /// a malformed reply (permanent: the same call fails the same way).
    #[error("counter store refused the call: {0}")]
    Refused(String),
}

impl StoreError {
    /// Whether the failure says the store is failing (and may pass), rather
    /// than that this call cannot succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self, StoreError::Refused(_))
    }
}

/// `states` when the store answered one per op of the `asked`, else the
/// error that says it did not.
pub fn answered_all(
    states: Vec<CounterState>,
    asked: usize,
) -> Result<Vec<CounterState>, StoreError> {
    if states.len() == asked {
        Ok(states)
    } else {
        Err(StoreError::Refused(format!(
            "store answered {} counters for {asked} asked",
            states.len()
        )))
    }
}

thread_local! {
    /// A call's answer list, kept for the thread's next (see [`crate::reuse`]).
    static STATES: std::cell::Cell<Vec<CounterState>> = const { std::cell::Cell::new(Vec::new()) };
}

/// An empty list for a call's answers: the one the thread's previous
/// caller gave back with [`keep_states`], so a warm call allocates none.
pub fn state_list() -> Vec<CounterState> {
    crate::reuse::take(&STATES)
}

/// Gives a call's answers back for the thread's next call.
pub fn keep_states(states: Vec<CounterState>) {
    crate::reuse::keep(&STATES, states);
}

/// A counter store.
pub trait Store: Send + Sync + 'static {
    /// Applies the ops of one request atomically and in order (see
    /// [`algorithm::apply_request`] for groups and `charge`), and returns one
    /// state per op.
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>>;

    /// [`Store::apply`], answered by `deadline` (when the caller's own
    /// deadline, less a margin, runs out). [`failover::FailoverStore`], which
    /// wraps every shared store, decides by its failure policy when the
    /// backend has not answered by then; the stores themselves (memory,
    /// Redis) ignore it. A new wrapper of a store must pass it on.
    fn apply_by<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        let _ = deadline;
        self.apply(ops, charge)
    }

    /// [`Store::apply`]'s answer when the store has it at once, with no
    /// future to allocate and poll (the memory store); `None`: the caller
    /// awaits [`Store::apply_by`]. Only a store whose `apply_by` would do
    /// nothing else may answer here: a wrapper (failover, over-limit cache)
    /// keeps the default, so its own logic always runs.
    fn apply_ready(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        at: std::time::Instant,
    ) -> Option<Result<Vec<CounterState>, StoreError>> {
        let _ = (ops, charge, at);
        None
    }

    /// The current state of the counter of `op` without changing it (`None`:
    /// no counter is stored, it is full).
    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>>;

    /// Deletes the counter at `key`, so its next hit finds a fresh one, and
    /// drops what this process caches of it; true when a counter was stored.
    /// A store that cannot reset refuses (the default).
    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(StoreError::Refused(format!(
            "the {} store cannot reset counters",
            self.name()
        )))))
    }

    /// Drops this process's cached denial of `key` (the over-limit cache's),
    /// after another replica reset its counter; true when one was dropped.
    fn forget(&self, key: &str) -> bool {
        let _ = key;
        false
    }

    /// Whether this process's over-limit cache holds a live denial of `key`
    /// (`None`: no such cache in front of the store).
    fn cached_denial(&self, key: &str) -> Option<bool> {
        let _ = key;
        None
    }

    /// Checks that the backend answers (used to close the circuit breaker).
    fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether counters are currently kept by the configured backend
    /// (false while a failure policy is standing in for it).
    fn ready(&self) -> bool {
        true
    }

    /// A short name for logs ("memory", "redis").
    fn name(&self) -> &'static str;
}
