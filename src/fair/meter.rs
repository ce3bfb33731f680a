//! A value's rate over the last second, in quarter-second slots.

/// Length of one slot, in milliseconds.
pub const SLOT_MS: u64 = 250;
/// Slots kept: the rate is measured over the last second.
const SLOTS: usize = 4;

/// Credits counted per slot over the last [`SLOTS`] slots.
#[derive(Debug, Clone)]
pub struct Meter {
    slots: [u64; SLOTS],
    /// The slot `slots[slot % SLOTS]` counts (ms since the epoch / [`SLOT_MS`]).
    slot: u64,
    /// When the value was first counted (a newcomer's rate is over its life).
    since_ms: u64,
}

impl Meter {
    /// An empty meter started at `now_ms`.
    pub fn new(now_ms: u64) -> Meter {
        Meter {
            slots: [0; SLOTS],
            slot: now_ms / SLOT_MS,
            since_ms: now_ms,
        }
    }

    /// Counts `credits` at `now_ms`.
    pub fn add(&mut self, now_ms: u64, credits: u64) {
        self.roll(now_ms);
        let i = (self.slot % SLOTS as u64) as usize;
        self.slots[i] = self.slots[i].saturating_add(credits);
    }

    /// Credits per second over the last second (over the meter's life when
    /// it is younger, and never over less than one slot).
    pub fn rate(&mut self, now_ms: u64) -> f64 {
        self.roll(now_ms);
        let total = self.slots.iter().fold(0u64, |t, &x| t.saturating_add(x));
        let window = (SLOTS as u64 - 1) * SLOT_MS + now_ms % SLOT_MS;
        let span = window
            .min(now_ms.saturating_sub(self.since_ms))
            .max(SLOT_MS);
        total as f64 * 1000.0 / span as f64
    }

    /// Clears the slots that ended since the last count.
    fn roll(&mut self, now_ms: u64) {
        let now = now_ms / SLOT_MS;
        if now <= self.slot {
            return;
        }
        let gone = (now - self.slot).min(SLOTS as u64);
        for k in 1..=gone {
            self.slots[((self.slot + k) % SLOTS as u64) as usize] = 0;
        }
        self.slot = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_rate_is_measured_and_a_stopped_one_falls_to_zero_within_a_second() {
        let mut m = Meter::new(10_000);
        // 40 a second for 3 s, one every 25 ms.
        for t in (10_000..13_000).step_by(25) {
            m.add(t, 1);
        }
        let r = m.rate(13_000);
        assert!((38.0..=42.0).contains(&r), "{r}");
        assert!(m.rate(13_500) < 20.0);
        assert_eq!(m.rate(14_001), 0.0);
        assert_eq!(m.rate(20_000), 0.0);
    }

    #[test]
    fn huge_costs_saturate_instead_of_overflowing() {
        let mut m = Meter::new(0);
        m.add(0, u64::MAX / 2 + 1);
        m.add(300, u64::MAX / 2 + 1);
        assert!(m.rate(400) > 0.0);
    }

    #[test]
    fn a_newcomer_is_measured_over_its_life_but_never_under_a_slot() {
        let mut m = Meter::new(1_000);
        m.add(1_000, 1);
        assert_eq!(m.rate(1_010), 4.0);
        for t in (1_000..1_500).step_by(50) {
            m.add(t, 1);
        }
        let r = m.rate(1_500);
        assert!((21.0..=23.0).contains(&r), "{r}");
    }
}
