//! The one source of time: a [`Clock`] trait the stores and tests inject,
//! the real [`SystemClock`], and [`now_ms`] for wall-clock stamps (knob
//! expiry, lease times, metrics).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time, replaceable in tests.
pub trait Clock: Send + Sync + 'static {
    /// Time since the Unix epoch (epoch-aligned windows need wall time).
    fn now(&self) -> Duration;
}

/// The real clock: the wall time read at start, advanced by the monotonic
/// clock, so it never goes back when the system clock is stepped.
#[derive(Debug)]
pub struct SystemClock {
    at_start: Duration,
    start: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            at_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            start: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.at_start + self.start.elapsed()
    }
}

/// Epoch milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A clock the unit tests move by hand (ms since the epoch).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct ManualClock(std::sync::atomic::AtomicU64);

#[cfg(test)]
impl ManualClock {
    /// Moves the clock on by `d`.
    pub(crate) fn advance(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}
