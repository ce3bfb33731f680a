//! A partition in virtual time: three regions renew against the store's
//! arithmetic ([`crate::quota::renew`], what the renewal script runs) and
//! decide by the region's own rules ([`quota_at`], [`fallback_lease`],
//! [`fallback_base`]); one region's link is cut, then healed, then the
//! region dies. Answers arrive at once (no round trip), except the one lost
//! at the cut. Each millisecond, the rates the regions may admit are summed.

use super::renew::{fallback_base, fallback_lease};
use super::{quota_at, Lease, Phase};
use crate::quota::{renew, Fallback, Record, Sharing, Terms};

const RATE: f64 = 200.0;
const FLOOR: f64 = 0.01;
const PERIOD: u64 = 2000;
const CUT: (u64, u64) = (10_000, 40_000);
const KILL: u64 = 60_000;
const END: u64 = 75_000;

struct Region {
    name: &'static str,
    /// The last lease granted (what a failure falls back from).
    last: Option<Lease>,
    /// The lease in force.
    installed: Option<Lease>,
    next_ms: u64,
    short: bool,
    /// A renewal that will time out at this time.
    failing_at: Option<u64>,
}

struct World {
    regions: Vec<Region>,
    store: Vec<(String, Record)>,
    terms: Terms,
    /// A renewal of the cut-off region that reached the store and whose
    /// answer was lost: until when, and the lease it may use meanwhile.
    lost: Option<(u64, f64)>,
}

impl World {
    fn new() -> World {
        let regions = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, name)| Region {
                name,
                last: None,
                installed: None,
                next_ms: 100 * i as u64,
                short: false,
                failing_at: None,
            })
            .collect();
        World {
            regions,
            store: Vec::new(),
            terms: Terms {
                sharing: Sharing {
                    rate: RATE,
                    floor: FLOOR,
                    headroom: 0.05,
                },
                life_ms: PERIOD * 3 / 2,
                fallback: Fallback {
                    share: 0.5,
                    hold_ms: PERIOD,
                },
            },
            lost: None,
        }
    }

    /// Region `r` renews at `now` (as `Global::renew` does), its link cut or not.
    fn renew(&mut self, r: usize, now: u64, cut: bool) {
        let timeout = PERIOD / 4;
        let reg = &mut self.regions[r];
        let base = fallback_base(reg.last.as_ref(), now, self.terms.fallback.hold_ms);
        if cut {
            if self.lost.is_none() {
                // The first renewal after the cut reached the store, asking
                // less (its grant falls); its answer never came back.
                renew(&mut self.store, reg.name, 5.0, base, &self.terms, now);
                let using = reg.installed.map_or(0.0, |l| l.rate);
                self.lost = Some((now + timeout, using));
            }
            reg.failing_at = Some(now + timeout);
            reg.next_ms = now + PERIOD;
            return;
        }
        let answer = renew(&mut self.store, reg.name, 150.0, base, &self.terms, now);
        let lease = Lease {
            rate: answer.grant,
            burst: answer.grant as u64,
            expires_at_ms: now + self.terms.life_ms,
            fallback: false,
        };
        reg.last = Some(lease);
        reg.installed = Some(lease);
        reg.short = answer.grant < 0.9 * answer.target || answer.others_waiting;
        reg.next_ms = now + if reg.short { PERIOD / 4 } else { PERIOD };
    }

    /// The rate region `r` may admit at `now`, and its phase.
    fn rate(&self, r: usize, now: u64) -> (f64, Phase) {
        let reg = &self.regions[r];
        let (rate, _) = quota_at(
            reg.installed.as_ref(),
            now,
            &self.terms.fallback,
            (RATE * FLOOR, 1),
        );
        let phase = reg
            .installed
            .map_or(Phase::Floor, |l| l.phase(now, self.terms.fallback.hold_ms));
        (rate, phase)
    }

    /// One millisecond: failures time out, renewals fall due.
    fn step(&mut self, now: u64) {
        let alive = if now < KILL { 3 } else { 2 };
        for r in (0..3).filter(|&r| r > 0 || alive == 3) {
            if self.regions[r].failing_at == Some(now) {
                let reg = &mut self.regions[r];
                reg.failing_at = None;
                reg.installed = reg.last.map(|l| fallback_lease(&l, &self.terms.fallback));
            }
            if now >= self.regions[r].next_ms {
                let cut = r == 0 && (CUT.0..CUT.1).contains(&now);
                self.renew(r, now, cut);
            }
        }
    }
}

#[test]
fn a_cut_off_region_and_the_others_never_admit_more_than_the_rate_and_its_floor() {
    let mut w = World::new();
    let (mut fallback_ms, mut floor_ms, mut worst) = (0u64, 0u64, 0.0f64);
    let (mut back, mut absorbed) = (None, None);
    for now in 0..END {
        w.step(now);
        let alive = if now < KILL { 3 } else { 2 };
        let rates: Vec<(f64, Phase)> = (3 - alive..3).map(|r| w.rate(r, now)).collect();
        let sum: f64 = rates.iter().map(|(rate, _)| rate).sum();
        // A region decides on its floor past its fallback, or with a grant
        // below it (briefly, while the others give back share).
        let floors = rates
            .iter()
            .filter(|(rate, p)| *p == Phase::Floor || (*rate - RATE * FLOOR).abs() < 1e-9)
            .count();
        let mut bound = RATE + RATE * FLOOR * floors as f64;
        if let Some((until, using)) = w.lost.filter(|&(until, _)| now < until) {
            // Until the lost answer times out, the region still uses its
            // lease while the store has lowered it to its fallback share.
            bound += (1.0 - w.terms.fallback.share) * using;
            assert!(now < until);
        }
        assert!(
            sum <= bound + 1e-6,
            "at {now} ms: {rates:?} sum {sum} > {bound}"
        );
        worst = worst.max(sum - RATE);
        if (CUT.0..CUT.1).contains(&now) {
            match w.rate(0, now).1 {
                Phase::Fallback => fallback_ms += 1,
                Phase::Floor => floor_ms += 1,
                Phase::Lease => {}
            }
        }
        if now >= CUT.1 && back.is_none() && w.rate(0, now).0 >= 0.9 * RATE / 3.0 {
            back = Some(now - CUT.1);
        }
        if now >= KILL && absorbed.is_none() && sum >= 0.99 * RATE {
            absorbed = Some(now - KILL);
        }
    }
    // The cut-off region's lease runs out, then its fallback share for the
    // fallback time (fallback + expiry: from its last good renewal, less
    // than a period before the cut), then the floor.
    let life = w.terms.life_ms;
    assert!(
        fallback_ms >= PERIOD && fallback_ms <= life + PERIOD,
        "{fallback_ms}"
    );
    assert!(
        floor_ms >= CUT.1 - CUT.0 - life - PERIOD - PERIOD / 4,
        "{floor_ms}"
    );
    // Beyond the rate: the cut-off region's floor (2/s), and the lost answer.
    assert!(worst <= RATE * FLOOR + 0.5 * RATE / 3.0 + 1e-6, "{worst}");
    let back = back.expect("the region gets its share back after the cut");
    assert!(back <= 10_000, "{back} ms");
    // A dead region's share: its grant's life, then the fallback time.
    let absorbed = absorbed.expect("a dead region's share is absorbed");
    assert!(absorbed <= life + PERIOD + PERIOD / 4, "{absorbed} ms");
}
