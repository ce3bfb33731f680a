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
//! rate − the live grants of the others)`: live grants never exceed the rate.

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
    let n = demands.len();
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
        let fair = left / active.len() as f64;
        let (small, rest): (Vec<usize>, Vec<usize>) =
            active.iter().partition(|&&i| demands[i] <= fair);
        if small.is_empty() {
            break;
        }
        for &i in &small {
            let give = want[i].min(fair);
            out[i] = give;
            left -= give;
        }
        active = rest;
    }
    if !active.is_empty() {
        let total: f64 = active.iter().map(|&i| want[i]).sum();
        for &i in &active {
            out[i] = left * want[i] / total;
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

    #[test]
    fn a_region_under_its_target_is_waiting() {
        assert!(others_waiting(&[100.0, 50.0], &[100.0, 10.0]));
        assert!(!others_waiting(&[100.0, 50.0], &[95.0, 46.0]));
        assert!(!others_waiting(&[], &[]));
    }
}
