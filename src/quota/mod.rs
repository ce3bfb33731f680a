//! How a limit is shared fairly among claimants (regions of a global quota;
//! the arithmetic of a lease renewal, once). The renewal script
//! (`store/lua/global_renew.lua`) mirrors it; the simulation in this
//! module's tests runs it in virtual time.
//!
//! Targets are max-min fair with demand-proportional sharing: each region
//! with demand (credits per second asked for) wants `max(demand × (1 +
//! headroom), floor)`; regions whose demand is no more than an equal split
//! of what is left get what they want (capped at it), repeatedly; the rest
//! is split in proportion to what they want, unwanted capacity in
//! proportion to demand. A renewing region is granted `min(its target,
//! rate − what the others hold back)`: each other region's live grant, and
//! the fallback reserve of each region whose grant lapsed, for as long as
//! it may still decide on it ([`Record`], [`renew`]). Live grants and
//! reserves never exceed the rate, so neither does what every region may
//! admit while some are cut off from the store.

/// The knobs of the sharing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sharing {
    /// The global rate in credits per second.
    pub rate: f64,
    /// The smallest share of a region with demand, as a fraction of the rate.
    pub floor: f64,
    /// Extra share above measured demand, as a fraction of it (room to grow).
    pub headroom: f64,
}

/// Targets for regions with `demands` (credits per second; 0 wants nothing).
pub fn targets(s: &Sharing, demands: &[f64]) -> Vec<f64> {
    targets_weighted(s, demands, &vec![0.0; demands.len()])
}

/// Targets for regions with `demands` and `weights`: how many claimants
/// each stands for (a region's users asking now on a `fairShare` limit), or
/// 0 for a region that claims as one (a limit without fair shares). When
/// every region with demand has a weight, the sharing is weighted max-min:
/// a region's equal split, and its part of what is left, go by its weight,
/// so a region of six users and one of one, all asking more than they get,
/// are given six parts and one. Otherwise it is [`targets`]' sharing: the
/// rest in proportion to demand.
pub fn targets_weighted(s: &Sharing, demands: &[f64], weights: &[f64]) -> Vec<f64> {
    let n = demands.len();
    let given = |i: usize| weights.get(i).copied().unwrap_or(0.0);
    let weighted = (0..n).all(|i| demands[i] <= 0.0 || given(i) >= 1.0);
    let weight = |i: usize| if weighted { given(i).max(1.0) } else { 1.0 };
    let mut out = vec![0.0; n];
    let want: Vec<f64> = demands
        .iter()
        .map(|&d| {
            if d > 0.0 {
                (d * (1.0 + s.headroom)).max(s.floor * s.rate)
            } else {
                0.0
            }
        })
        .collect();
    let mut active: Vec<usize> = (0..n).filter(|&i| want[i] > 0.0).collect();
    let mut left = s.rate;
    // Regions asking no more than an equal split of what is left get what
    // they want, capped at that split (the headroom never pushes a region
    // under its fair share out of it); repeat with what is left.
    loop {
        if active.is_empty() {
            break;
        }
        let unit = left / active.iter().map(|&i| weight(i)).sum::<f64>();
        let (small, rest): (Vec<usize>, Vec<usize>) = active
            .iter()
            .partition(|&&i| demands[i] <= unit * weight(i));
        if small.is_empty() {
            break;
        }
        for &i in &small {
            let give = want[i].min(unit * weight(i));
            out[i] = give;
            left -= give;
        }
        active = rest;
    }
    if !active.is_empty() {
        // Weighted: each part of what is left goes to a claimant; else in
        // proportion to what each region wants.
        let part = |i: usize| if weighted { weight(i) } else { want[i] };
        let total: f64 = active.iter().map(|&i| part(i)).sum();
        for &i in &active {
            out[i] = left * part(i) / total;
        }
    } else if left > 0.0 {
        // Everyone is satisfied: the rest goes to regions with demand, in
        // proportion to it, so a growing region need not wait a renewal.
        let total: f64 = want.iter().sum();
        if total > 0.0 {
            for i in 0..n {
                out[i] += left * want[i] / total;
            }
        }
    }
    out
}

/// Max-min fair shares of `rate` among claimants with `demands` (credits
/// per second), by water-filling: from the smallest demand up, each gets
/// `min(demand × (1 + headroom), an equal split of what is left)`, so a
/// claimant that needs less than an equal share gets what it needs and the
/// others split the rest equally. What nobody wants is spread in proportion
/// to what each wants, so a growing claimant need not wait a recompute.
/// A claimant with no demand gets nothing; the shares never sum above `rate`.
pub fn max_min(rate: f64, headroom: f64, demands: &[f64]) -> Vec<f64> {
    let want = |d: f64| if d > 0.0 { d * (1.0 + headroom) } else { 0.0 };
    let mut order: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0.0).collect();
    order.sort_unstable_by(|&a, &b| demands[a].total_cmp(&demands[b]));
    let mut out = vec![0.0; demands.len()];
    let mut left = rate.max(0.0);
    for (done, &i) in order.iter().enumerate() {
        let fair = left / (order.len() - done) as f64;
        let give = want(demands[i]).min(fair);
        out[i] = give;
        left -= give;
    }
    let wanted: f64 = order.iter().map(|&i| want(demands[i])).sum();
    if left > 1e-9 && wanted > 0.0 {
        for &i in &order {
            out[i] += left * want(demands[i]) / wanted;
        }
    }
    out
}

/// Whether a counter's demand moved since the region last reported it by
/// more than 20 % of what it reported (or of the floor share, so a trickle
/// does not count) and by more than chance would move it: three standard
/// deviations of a Poisson count over the `window_secs` the demand is
/// measured over (a 100/s counter measured over 1 s must move by 30/s).
/// The region then renews at its next quarter-period step rather than at
/// its period, so share a falling region no longer uses goes back, and a
/// rising region asks for more, within a quarter period. `floor_rate` is
/// the floor as credits per second (floor × rate).
pub fn demand_moved(reported: f64, now: f64, floor_rate: f64, window_secs: f64) -> bool {
    let noise = 3.0 * (reported.max(now) / window_secs.max(1e-3)).sqrt();
    (now - reported).abs() > (0.2 * reported.max(floor_rate)).max(noise)
}

/// The grant of a renewing region with `target`, while the others hold
/// `others` (the sum of their live grants).
pub fn grant(rate: f64, target: f64, others: f64) -> f64 {
    target.min(rate - others).max(0.0)
}

/// Whether another region waits for share the renewing one holds: some
/// other region's live grant is below 0.9 × its target. `targets` and
/// `grants` are the others', in the same order. The renewing region then
/// renews every quarter period, so the share it gives up moves at once.
pub fn others_waiting(targets: &[f64], grants: &[f64]) -> bool {
    targets.iter().zip(grants).any(|(t, g)| *g < 0.9 * t)
}

/// How a holder decides once it can no longer renew, as it tells the
/// store with each renewal, so the store holds back what it may still use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fallback {
    /// The share of its lease it keeps deciding on.
    pub share: f64,
    /// How long after its grant lapses it keeps that share, in ms.
    pub hold_ms: u64,
}

/// What the store keeps of one holder of a counter (the renewal script's
/// `demand grant expires reserve until`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// Its demand as last reported, credits per second.
    pub demand: f64,
    /// Its grant, credits per second.
    pub grant: f64,
    /// Epoch ms its grant lapses unless renewed.
    pub expires_ms: u64,
    /// What it may decide on without the store, credits per second: the
    /// fallback share of the larger of its grant and the lease it held
    /// when it asked (an answer it never got cannot lower its fallback).
    pub reserve: f64,
    /// Epoch ms until which the reserve is held back; the record goes then.
    pub until_ms: u64,
    /// How many claimants it stands for, 0 for one claiming as one (see
    /// [`targets_weighted`]).
    pub weight: f64,
}

impl Record {
    /// The record a renewal at `now_ms` writes: `grant` for `life_ms`, and
    /// the fallback of `grant` or of `base` (the holder's lease in force)
    /// for `fallback.hold_ms` more.
    pub fn new(
        demand: f64,
        grant: f64,
        base: f64,
        now_ms: u64,
        life_ms: u64,
        fallback: &Fallback,
    ) -> Record {
        let expires_ms = now_ms.saturating_add(life_ms);
        Record {
            demand,
            grant,
            expires_ms,
            reserve: fallback.share * grant.max(base),
            until_ms: expires_ms.saturating_add(fallback.hold_ms),
            weight: 0.0,
        }
    }

    /// Whether the holder still renews: it takes part in the sharing.
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_ms > now_ms
    }

    /// What the record holds back from the others at `now_ms`: the grant
    /// (or the reserve, if larger) while live, then the reserve until its
    /// end; `None` once it is over (the store drops it).
    pub fn held(&self, now_ms: u64) -> Option<f64> {
        if self.live(now_ms) {
            Some(self.grant.max(self.reserve))
        } else if self.until_ms > now_ms {
            Some(self.reserve)
        } else {
            None
        }
    }
}

/// The terms every renewal of a holder carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    /// The counter's sharing knobs.
    pub sharing: Sharing,
    /// How long a grant lives without renewal, in ms.
    pub life_ms: u64,
    /// How the holder falls back.
    pub fallback: Fallback,
}

/// What one renewal answers for one counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Renewed {
    /// The holder's grant, credits per second.
    pub grant: f64,
    /// Its target (what it gets once the others have renewed).
    pub target: f64,
    /// Whether another live holder waits for share (see [`others_waiting`]).
    pub others_waiting: bool,
}

/// One renewal of one counter by `holder` at `now_ms`, as the renewal script
/// runs it on `records` (in the store's order): records whose reserve is
/// over are dropped; targets are shared among the live holders and this
/// one; the grant is `min(target, rate − what the others hold back)`, so
/// live grants and the reserves of holders cut off from the store never sum
/// above the rate; this holder's record is written (in place, or last).
pub fn renew(
    records: &mut Vec<(String, Record)>,
    holder: &str,
    demand: f64,
    base: f64,
    terms: &Terms,
    now_ms: u64,
) -> Renewed {
    let ask = Ask {
        demand,
        weight: 0.0,
        base,
    };
    renew_weighted(records, holder, ask, terms, now_ms)
}

/// What a holder asks for one counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// Its demand, credits per second.
    pub demand: f64,
    /// How many claimants it stands for (0: it claims as one).
    pub weight: f64,
    /// Its lease in force, credits per second (what it falls back from).
    pub base: f64,
}

/// [`renew`] with the holder's weight ([`targets_weighted`]).
pub fn renew_weighted(
    records: &mut Vec<(String, Record)>,
    holder: &str,
    ask: Ask,
    terms: &Terms,
    now_ms: u64,
) -> Renewed {
    records.retain(|(h, r)| h == holder || r.held(now_ms).is_some());
    let live: Vec<&Record> = records
        .iter()
        .filter(|(h, r)| h != holder && r.live(now_ms))
        .map(|(_, r)| r)
        .collect();
    let others: f64 = records
        .iter()
        .filter(|(h, _)| h != holder)
        .filter_map(|(_, r)| r.held(now_ms))
        .sum();
    let mut demands: Vec<f64> = live.iter().map(|r| r.demand).collect();
    demands.push(ask.demand);
    let mut weights: Vec<f64> = live.iter().map(|r| r.weight).collect();
    weights.push(ask.weight);
    let t = targets_weighted(&terms.sharing, &demands, &weights);
    let target = t[t.len() - 1];
    let grants: Vec<f64> = live.iter().map(|r| r.grant).collect();
    let waiting = others_waiting(&t[..t.len() - 1], &grants);
    let g = grant(terms.sharing.rate, target, others);
    let mut record = Record::new(
        ask.demand,
        g,
        ask.base,
        now_ms,
        terms.life_ms,
        &terms.fallback,
    );
    record.weight = ask.weight.max(0.0);
    match records.iter_mut().find(|(h, _)| h == holder) {
        Some((_, r)) => *r = record,
        None => records.push((holder.to_owned(), record)),
    }
    Renewed {
        grant: g,
        target,
        others_waiting: waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharing(rate: f64) -> Sharing {
        Sharing {
            rate,
            floor: 0.01,
            headroom: 0.1,
        }
    }

    #[test]
    fn small_regions_get_what_they_ask_and_the_rest_is_shared_by_demand() {
        // 3× a limit of 200/s offered 60/30/10 %.
        let t = targets(&sharing(200.0), &[360.0, 180.0, 60.0]);
        assert!((t[2] - 66.0).abs() < 1e-9, "{t:?}");
        // Measured a little high, the small region still gets its fair share
        // (no cliff where the headroom crosses it).
        let t = targets(&sharing(200.0), &[360.0, 180.0, 62.0]);
        assert!((t[2] - 200.0 / 3.0).abs() < 1e-9, "{t:?}");
        assert!((t.iter().sum::<f64>() - 200.0).abs() < 1e-9);
        assert!((t[0] / t[1] - 2.0).abs() < 1e-9);
        // Under the limit: everyone gets its want, the rest by demand.
        let t = targets(&sharing(200.0), &[50.0, 10.0, 0.0]);
        assert!(t[0] >= 55.0 && t[1] >= 11.0 && t[2] == 0.0, "{t:?}");
        assert!((t.iter().sum::<f64>() - 200.0).abs() < 1e-9);
        // Nobody wants anything: nothing is granted.
        assert_eq!(targets(&sharing(200.0), &[0.0, 0.0]), vec![0.0, 0.0]);
        // A region with a trickle of demand gets at least the floor.
        let t = targets(&sharing(200.0), &[1000.0, 0.01]);
        assert!(t[1] >= 2.0, "{t:?}");
    }

    #[test]
    fn max_min_gives_the_small_what_they_need_and_splits_the_rest_equally() {
        let near = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        // Everyone wants more than an equal share: equal shares.
        let s = max_min(100.0, 0.1, &[30.0, 40.0, 60.0, 80.0]);
        assert!(near(&s, &[25.0, 25.0, 25.0, 25.0]), "{s:?}");
        // Three light users get what they ask (with headroom), the heavy the rest.
        let s = max_min(100.0, 0.1, &[200.0, 10.0, 10.0, 10.0]);
        assert!(near(&s, &[67.0, 11.0, 11.0, 11.0]), "{s:?}");
        // One at 30 under a split of 33.3: 33 (its want); the others 33.5.
        let s = max_min(100.0, 0.1, &[30.0, 40.0, 80.0, 0.0]);
        assert!(near(&s, &[33.0, 33.5, 33.5, 0.0]), "{s:?}");
        // Under the limit: the rest in proportion to wants; never above the rate.
        let s = max_min(100.0, 0.0, &[10.0, 30.0]);
        assert!(near(&s, &[25.0, 75.0]), "{s:?}");
        assert!(max_min(100.0, 0.1, &[0.0, 0.0]).iter().all(|&x| x == 0.0));
        assert!(max_min(100.0, 0.1, &[]).is_empty());
        for d in [[1e9, 1.0, 0.5], [3.0, 3.0, 3.0], [50.0, 49.0, 1.0]] {
            assert!(max_min(90.0, 0.1, &d).iter().sum::<f64>() <= 90.0 + 1e-9);
        }
    }

    #[test]
    fn regions_are_weighted_by_the_claimants_they_stand_for() {
        // Six users in one region, one in each of two others, all asking 80/s.
        let t = targets_weighted(&sharing(300.0), &[480.0, 80.0, 80.0], &[6.0, 1.0, 1.0]);
        for (got, users) in t.iter().zip([6.0, 1.0, 1.0]) {
            assert!((got / users - 37.5).abs() < 1.0, "{t:?}");
        }
        // A light region still gets what it asks.
        let t = targets_weighted(&sharing(300.0), &[480.0, 10.0], &[6.0, 1.0]);
        assert!((t[1] - 11.0).abs() < 1e-9, "{t:?}");
        // The rest goes by weight, not by demand: one user asking 200/s
        // beside six asking 80/s gets one part of seven.
        let t = targets_weighted(&sharing(300.0), &[480.0, 200.0], &[6.0, 1.0]);
        assert!((t[1] - 300.0 / 7.0).abs() < 1e-9, "{t:?}");
        // A region claiming as one (weight 0) makes it the unweighted sharing.
        let d = [360.0, 180.0, 60.0];
        let unweighted = targets(&sharing(200.0), &d);
        assert_eq!(
            targets_weighted(&sharing(200.0), &d, &[2.0, 0.0, 1.0]),
            unweighted
        );
        // A region without demand does not count.
        let d = [360.0, 180.0, 0.0];
        assert_eq!(
            targets_weighted(&sharing(200.0), &d, &[1.0, 1.0, 0.0]),
            targets_weighted(&sharing(200.0), &d, &[1.0, 1.0, 5.0])
        );
    }

    #[test]
    fn a_grant_never_lifts_the_sum_above_the_rate() {
        assert_eq!(grant(200.0, 120.0, 100.0), 100.0);
        assert_eq!(grant(200.0, 50.0, 100.0), 50.0);
        assert_eq!(grant(200.0, 50.0, 250.0), 0.0);
    }

    #[test]
    fn a_demand_moved_by_a_fifth_is_reported_at_once() {
        // Over a 1 s window: a fifth of 360 is 72 (noise 57).
        assert!(!demand_moved(360.0, 300.0, 2.0, 1.0));
        assert!(demand_moved(360.0, 285.0, 2.0, 1.0));
        assert!(demand_moved(360.0, 60.0, 2.0, 1.0));
        // 60/s: chance moves a 1 s count by up to 3 × √75 ≈ 26/s.
        assert!(!demand_moved(60.0, 75.0, 2.0, 1.0));
        assert!(demand_moved(60.0, 90.0, 2.0, 1.0));
        assert!(demand_moved(60.0, 360.0, 2.0, 1.0));
        // Measured over 10 s, chance moves it less: a fifth counts.
        assert!(demand_moved(60.0, 75.0, 2.0, 10.0));
        assert!(!demand_moved(60.0, 61.5, 2.0, 10.0));
        // Below the floor share, moves of less than a fifth of it do not count.
        assert!(!demand_moved(0.0, 0.3, 2.0, 100.0));
        assert!(demand_moved(0.0, 0.5, 2.0, 100.0));
    }

    fn terms(rate: f64) -> Terms {
        Terms {
            sharing: sharing(rate),
            life_ms: 3000,
            fallback: Fallback {
                share: 0.5,
                hold_ms: 2000,
            },
        }
    }

    #[test]
    fn a_lapsed_grant_is_held_back_at_its_fallback_share_for_the_fallback_time() {
        let fb = terms(200.0).fallback;
        let r = Record::new(150.0, 60.0, 0.0, 1000, 3000, &fb);
        assert_eq!((r.expires_ms, r.until_ms, r.reserve), (4000, 6000, 30.0));
        assert_eq!(r.held(3999), Some(60.0));
        assert!(r.live(3999) && !r.live(4000));
        assert_eq!(r.held(4000), Some(30.0));
        assert_eq!(r.held(5999), Some(30.0));
        assert_eq!(r.held(6000), None);
        // The lease in force when it asked counts, if larger than the grant.
        let r = Record::new(10.0, 20.0, 100.0, 1000, 3000, &fb);
        assert_eq!((r.held(3999), r.held(4000)), (Some(50.0), Some(50.0)));
    }

    #[test]
    fn a_cut_off_region_s_reserve_is_granted_to_nobody_until_its_time_is_over() {
        let t = terms(200.0);
        let mut records = Vec::new();
        for (i, h) in ["a", "b", "c", "a", "b", "c"].iter().enumerate() {
            renew(&mut records, h, 150.0, 0.0, &t, 500 * i as u64);
        }
        // "a" last renewed at 1500: its grant lives to 4500, its reserve to 6500.
        let a = records[0].1;
        assert!((a.grant - 200.0 / 3.0).abs() < 1e-6, "{records:?}");
        let held_by = |records: &Vec<(String, Record)>, now| -> f64 {
            records.iter().filter_map(|(_, r)| r.held(now)).sum()
        };
        let mut now = 3000;
        while now < 9000 {
            let (b, c) = (
                renew(&mut records, "b", 150.0, 0.0, &t, now),
                renew(&mut records, "c", 150.0, 0.0, &t, now + 250),
            );
            assert!(
                held_by(&records, now + 250) <= 200.0 + 1e-9,
                "at {now}: {records:?}"
            );
            let a_holds = if now + 250 < 4500 {
                a.grant
            } else if now + 250 < 6500 {
                a.reserve
            } else {
                0.0
            };
            assert!(
                b.grant + c.grant + a_holds <= 200.0 + 1e-9,
                "at {now}: {b:?} {c:?}"
            );
            if now >= 6500 {
                // Once the reserve is over, "a" is gone and the others share the rate.
                assert!(
                    (b.grant + c.grant - 200.0).abs() < 1e-6,
                    "at {now}: {b:?} {c:?}"
                );
                assert!(records.iter().all(|(h, _)| h != "a"));
            }
            now += 500;
        }
    }

    #[test]
    fn an_answer_that_never_arrived_does_not_lower_the_reserve() {
        let t = terms(200.0);
        let mut records = Vec::new();
        renew(&mut records, "a", 150.0, 0.0, &t, 0);
        let first = renew(&mut records, "b", 150.0, 0.0, &t, 0);
        // "a" asks again with a lower demand and never hears the answer: it
        // falls back on half its lease in force (base), not of the new grant.
        let lowered = renew(&mut records, "a", 5.0, 100.0, &t, 100);
        assert!(lowered.grant < 10.0, "{lowered:?}");
        assert_eq!(records[0].1.reserve, 50.0);
        let b = renew(&mut records, "b", 150.0, 0.0, &t, 200);
        assert!((b.grant - 150.0).abs() < 1e-6, "{first:?} {b:?}");
    }

    #[test]
    fn a_region_under_its_target_is_waiting() {
        assert!(others_waiting(&[100.0, 50.0], &[100.0, 10.0]));
        assert!(!others_waiting(&[100.0, 50.0], &[95.0, 46.0]));
        assert!(!others_waiting(&[], &[]));
    }
}
