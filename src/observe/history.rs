//! Decisions per second of one rule over the last 15 minutes.
//!
//! A [`RuleHistory`] is a ring of [`SECONDS`] one-second slots, each one
//! `AtomicU64` packing the second it belongs to (16 bits), the allowed count
//! (24 bits) and the denied count (24 bits). Recording is one load and one
//! `fetch_add` (a compare-exchange when a slot of an older second is taken
//! over): no lock, no allocation after the rule's first decision, which
//! allocates the ring (so a rule that never decides costs no ring).
//!
//! Bytes: 900 × 8 = 7,200 per rule that has decided, plus about 100 for
//! the rule's entry; at 10,000 rules that all decide, about 73 MB
//! (7,300 × 10,000); rules that never decide cost about 1 MB in all.
//!
//! Bounds: a count stops at 2^24 - 1 (16.7 million decisions of one rule
//! in one second, far beyond what one process decides). A slot is known
//! stale by its 16-bit second; a slot left untouched for exactly a multiple
//! of lcm(900, 65,536) s (about 170 days) would read as current.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// How many one-second slots a rule keeps: 15 minutes.
pub const SECONDS: usize = 900;
/// Bytes one rule's history takes once it has decided: its ring and entry.
pub const RULE_BYTES: u64 = SECONDS as u64 * 8 + 100;

const COUNT_BITS: u32 = 24;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const TAG_SHIFT: u32 = 2 * COUNT_BITS;
const TAG_MASK: u64 = 0xFFFF << TAG_SHIFT;

/// Allowed and denied decisions of one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    /// Allowed decisions.
    pub allowed: u64,
    /// Denied decisions.
    pub denied: u64,
}

/// One rule's decisions per second for the last [`SECONDS`] seconds.
#[derive(Default)]
pub struct RuleHistory {
    slots: OnceLock<Box<[AtomicU64]>>,
}

impl std::fmt::Debug for RuleHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleHistory")
            .field("allocated", &self.slots.get().is_some())
            .finish()
    }
}

fn tag(second: u64) -> u64 {
    (second & 0xFFFF) << TAG_SHIFT
}

fn unpack(v: u64) -> Second {
    Second {
        allowed: (v >> COUNT_BITS) & COUNT_MAX,
        denied: v & COUNT_MAX,
    }
}

impl RuleHistory {
    /// Counts one decision at `second` (seconds since the epoch).
    pub fn record(&self, second: u64, allowed: bool) {
        let slots = self
            .slots
            .get_or_init(|| (0..SECONDS).map(|_| AtomicU64::new(0)).collect());
        let slot = &slots[(second % SECONDS as u64) as usize];
        let (tag, shift) = (tag(second), if allowed { COUNT_BITS } else { 0 });
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            if current & TAG_MASK == tag {
                // Saturate instead of carrying into the next field.
                if (current >> shift) & COUNT_MAX == COUNT_MAX {
                    return;
                }
                slot.fetch_add(1 << shift, Ordering::Relaxed);
                return;
            }
            // An older second's slot: the first decision of this second takes it over.
            match slot.compare_exchange_weak(
                current,
                tag | (1 << shift),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// Whether the rule has decided since it was created (a ring exists).
    pub fn active(&self) -> bool {
        self.slots.get().is_some()
    }

    /// The count of `second`, if it is within the last [`SECONDS`] of `now`.
    pub fn at(&self, second: u64, now: u64) -> Second {
        let Some(slots) = self.slots.get() else {
            return Second::default();
        };
        if second > now || now - second >= SECONDS as u64 {
            return Second::default();
        }
        let v = slots[(second % SECONDS as u64) as usize].load(Ordering::Relaxed);
        if v & TAG_MASK == tag(second) {
            unpack(v)
        } else {
            Second::default()
        }
    }

    /// The last `SECONDS` seconds up to `now`, oldest first, added into
    /// `out` (which has [`SECONDS`] entries): summing several rules reads
    /// each once.
    pub fn add_into(&self, now: u64, out: &mut [Second]) {
        if !self.active() {
            return;
        }
        let first = now.saturating_sub(SECONDS as u64 - 1);
        for (i, o) in out.iter_mut().enumerate().take(SECONDS) {
            let s = self.at(first + i as u64, now);
            o.allowed += s.allowed;
            o.denied += s.denied;
        }
    }

    /// The sum of the `seconds` seconds up to `now` (included).
    pub fn sum(&self, now: u64, seconds: u64) -> Second {
        let mut total = Second::default();
        if !self.active() {
            return total;
        }
        for s in now.saturating_sub(seconds.saturating_sub(1))..=now {
            let c = self.at(s, now);
            total.allowed += c.allowed;
            total.denied += c.denied;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use std::time::Duration;

    fn now(c: &ManualClock) -> u64 {
        c.now().as_secs()
    }

    #[test]
    fn counts_per_second_and_forgets_after_fifteen_minutes() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_secs(1_700_000_000));
        let h = RuleHistory::default();
        assert!(!h.active());
        for i in 0..5 {
            h.record(now(&clock), i % 2 == 0);
        }
        let t0 = now(&clock);
        assert_eq!(
            h.at(t0, t0),
            Second {
                allowed: 3,
                denied: 2
            }
        );
        clock.advance(Duration::from_secs(1));
        h.record(now(&clock), false);
        assert_eq!(
            h.sum(now(&clock), 10),
            Second {
                allowed: 3,
                denied: 3
            }
        );
        // 899 s later the first second is still in; 900 s later it is out.
        clock.advance(Duration::from_secs(898));
        assert_eq!(h.at(t0, now(&clock)).allowed, 3);
        clock.advance(Duration::from_secs(1));
        assert_eq!(h.at(t0, now(&clock)), Second::default());
        // The slot of t0 is taken over by a new second, not added to.
        h.record(now(&clock), true);
        assert_eq!(
            h.sum(now(&clock), 1),
            Second {
                allowed: 1,
                denied: 0
            }
        );
    }

    #[test]
    fn the_ring_reads_oldest_first_and_adds_up() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_secs(1_000_000));
        let h = RuleHistory::default();
        for s in 0..10 {
            for _ in 0..s {
                h.record(now(&clock), false);
            }
            clock.advance(Duration::from_secs(1));
        }
        let t = now(&clock) - 1;
        let mut out = vec![Second::default(); SECONDS];
        h.add_into(t, &mut out);
        h.add_into(t, &mut out);
        assert_eq!(out[SECONDS - 1].denied, 18);
        assert_eq!(out[SECONDS - 10].denied, 0);
        assert_eq!(out[SECONDS - 2].denied, 16);
    }

    #[test]
    fn a_count_saturates_instead_of_spilling_into_the_other() {
        let h = RuleHistory::default();
        h.record(7, true);
        let slots = h.slots.get().unwrap();
        slots[7].store(tag(7) | (COUNT_MAX << COUNT_BITS), Ordering::Relaxed);
        h.record(7, true);
        assert_eq!(
            h.at(7, 7),
            Second {
                allowed: COUNT_MAX,
                denied: 0
            }
        );
    }
}
