//! The one source of time: a [`Clock`] trait the stores and tests inject,
//! the real [`SystemClock`], and [`now_ms`] for wall-clock stamps (knob
//! expiry, lease times, metrics).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time, replaceable in tests.
pub trait Clock: Send + Sync + 'static {
    /// Time since the Unix epoch (epoch-aligned windows need wall time).
    fn now(&self) -> Duration;

    /// [`Clock::now`] to within a few milliseconds, where that is cheaper
    /// to read (what counts whole seconds needs no more).
    fn now_coarse(&self) -> Duration {
        self.now()
    }

    /// Milliseconds since the epoch at `instant`, a monotonic instant
    /// already read: a decision reads the clock once and derives every time
    /// it needs from that. A clock not driven by the monotonic clock
    /// (tests, replay) answers [`Clock::now`].
    fn ms_at(&self, instant: Instant) -> u64 {
        let _ = instant;
        u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A monotonic instant from the kernel's coarse clock: a few milliseconds'
/// resolution for a fraction of the precise clock's cost, for times read
/// on every request where milliseconds do not matter (idle limits).
#[derive(Debug, Clone, Copy)]
pub struct CoarseInstant(coarsetime::Instant);

impl CoarseInstant {
    /// Now, to within the coarse clock's resolution.
    pub fn now() -> CoarseInstant {
        CoarseInstant(coarsetime::Instant::now_without_cache_update())
    }

    /// Time since `self` (saturating at zero).
    pub fn elapsed(self) -> Duration {
        CoarseInstant::now().0.duration_since(self.0).into()
    }
}

/// The real clock: the wall time read at start, advanced by the monotonic
/// clock, so it never goes back when the system clock is stepped.
#[derive(Debug)]
pub struct SystemClock {
    at_start: Duration,
    /// `at_start` in whole milliseconds, and the nanoseconds past them.
    at_start_ms: u64,
    at_start_sub_ms_ns: u32,
    start: Instant,
    coarse_start: CoarseInstant,
}

impl Default for SystemClock {
    fn default() -> Self {
        let at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        SystemClock {
            at_start,
            at_start_ms: u64::try_from(at_start.as_millis()).unwrap_or(u64::MAX),
            at_start_sub_ms_ns: at_start.subsec_nanos() % 1_000_000,
            start: Instant::now(),
            coarse_start: CoarseInstant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.at_start + self.start.elapsed()
    }

    fn now_coarse(&self) -> Duration {
        self.at_start + self.coarse_start.elapsed()
    }

    fn ms_at(&self, instant: Instant) -> u64 {
        // `(at_start + since).as_millis()` in u64 arithmetic (`as_millis`
        // is u128's): the sub-millisecond nanoseconds of both carry over.
        let since = instant.saturating_duration_since(self.start);
        let nanos = self.at_start_sub_ms_ns + since.subsec_nanos();
        self.at_start_ms
            .saturating_add(since.as_secs().saturating_mul(1000))
            .saturating_add(u64::from(nanos / 1_000_000))
    }
}

/// Epoch milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A clock set from outside, in ms since the epoch: `divvy replay` sets it
/// to each recorded request's time, so windows open and close at the
/// recorded pace however fast the replay runs.
#[derive(Debug, Default)]
pub struct SimulatedClock(std::sync::atomic::AtomicU64);

impl SimulatedClock {
    /// A clock reading `ms` since the epoch.
    pub fn at(ms: u64) -> SimulatedClock {
        SimulatedClock(std::sync::atomic::AtomicU64::new(ms))
    }

    /// Moves the clock to `ms`; never back (recorded times from several
    /// connections may arrive slightly out of order).
    pub fn set(&self, ms: u64) {
        self.0.fetch_max(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for SimulatedClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_keeps_up_with_the_precise_one() {
        let clock = SystemClock::default();
        let started = CoarseInstant::now();
        std::thread::sleep(Duration::from_millis(30));
        // Between two coarse reads, so a pause between the reads cannot fail it.
        let before = clock.now_coarse();
        let precise = clock.now();
        let after = clock.now_coarse();
        // The kernel's coarse clock ticks every 1 to 10 ms.
        let tick = Duration::from_millis(10);
        assert!(before <= precise + tick, "{before:?} {precise:?}");
        assert!(precise <= after + tick, "{precise:?} {after:?}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(15), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn milliseconds_at_an_instant_read_are_the_clocks_own() {
        let clock = SystemClock::default();
        for step in [
            0u64,
            1,
            999_999,
            1_000_000,
            1_500_000_123,
            86_400_000_000_007,
        ] {
            let instant = clock.start + Duration::from_nanos(step);
            let exact = clock.at_start + Duration::from_nanos(step);
            assert_eq!(
                u128::from(clock.ms_at(instant)),
                exact.as_millis(),
                "{step} ns after start"
            );
        }
        // An instant before the clock's start reads as its start.
        let early = clock.start.checked_sub(Duration::from_millis(5));
        if let Some(early) = early {
            assert_eq!(u128::from(clock.ms_at(early)), clock.at_start.as_millis());
        }
        // A clock that is not the monotonic one answers its own now.
        let manual = ManualClock::default();
        manual.advance(Duration::from_millis(1234));
        assert_eq!(manual.ms_at(Instant::now()), 1234);
    }
}
