//! Where counters live.
//!
//! The limiter hands a store every counter a request touches in one call
//! ([`Store::apply`]), so a networked store can answer them in one round trip.
//! The store applies each [`CounterOp`] in order with the op's algorithm and
//! reports a [`CounterState`] per op. Protocol code never sees a store.

pub mod failover;
pub mod memory;
pub mod redis;
pub mod redis_url;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use thiserror::Error;

pub use memory::MemoryStore;

/// A boxed future returned by [`Store`] methods.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a counter is spent and refilled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// divvy's window: it opens at the counter's first hit with `limit`
    /// credits and lasts `window`; a hit of N takes N credits if N are left.
    #[default]
    DivvyWindow,
}

/// One check-and-consume on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterOp {
    /// Counter identity (divvy's Redis key shape).
    pub key: String,
    /// Credits per window (> 0).
    pub limit: u64,
    /// Window length (> 0).
    pub window: Duration,
    /// Credits to take. 0 checks without consuming: allowed while at least one credit is left.
    pub cost: u64,
    /// Give `cost` credits back instead (Envoy's `is_negative_hits`), never
    /// above the limit; a counter with no open window is left alone.
    pub refund: bool,
    /// The algorithm.
    pub algorithm: Algorithm,
}

/// A counter after an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterState {
    /// Whether the op's credits were available (and so taken).
    pub allowed: bool,
    /// Credits left after the op.
    pub remaining: u64,
    /// Time until the window ends (the full window when no window is open).
    pub reset_after: Duration,
}

/// A store failure; the request that hit it gets an error, never a panic.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The backend could not be reached or answered wrongly.
    #[error("counter store unavailable: {0}")]
    Unavailable(String),
}

/// A counter store.
pub trait Store: Send + Sync + 'static {
    /// Applies `ops` in order, atomically per op, and returns one state per op.
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>>;

    /// The current state of a counter without changing it (`None`: no open window).
    fn peek<'a>(
        &'a self,
        key: &'a str,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>>;

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
