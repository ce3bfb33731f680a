//! The renewal script (`store/lua/global_renew.lua`) against the arithmetic
//! it mirrors (`divvy::quota`), on a real redis-server: random
//! sequences of renewals by several regions, each grant (and whether
//! another region waits for share) compared.

mod common;

use common::redis::Redis;
use divvy::global::RENEW_SCRIPT;
use divvy::quota::{grant, others_waiting, targets, Sharing};
use proptest::prelude::Rng;

#[test]
fn the_script_grants_what_the_arithmetic_says() {
    let redis = Redis::start();
    let sha = redis.cli(&["SCRIPT", "LOAD", RENEW_SCRIPT]);
    let mut rng = common::seeded_rng(42);
    let life = 3000u64;
    for case in 0..40 {
        let key = format!("divvy:global:{{g}}:case{case}");
        let rate = 50.0 + (rng.next_u64() % 500) as f64;
        let regions = 2 + (rng.next_u64() % 5) as usize;
        let sharing = Sharing {
            rate,
            floor: 0.01,
            headroom: 0.1,
        };
        // The store as the arithmetic sees it: (demand, grant, expires).
        let mut entries: Vec<Option<(f64, f64, u64)>> = vec![None; regions];
        let mut now = 1_700_000_000_000u64;
        for _ in 0..30 {
            now += rng.next_u64() % 2000;
            let r = (rng.next_u64() % regions as u64) as usize;
            let demand = match rng.next_u64() % 4 {
                0 => 0.0,
                _ => (rng.next_u64() % 2000) as f64 / 3.0,
            };
            let out = redis.cli(&[
                "EVALSHA",
                &sha,
                "1",
                &key,
                &format!("r{r}"),
                &life.to_string(),
                "0.01",
                "0.1",
                &now.to_string(),
                &rate.to_string(),
                &demand.to_string(),
            ]);
            let lines: Vec<&str> = out.lines().collect();
            let got: f64 = lines
                .first()
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or_else(|| panic!("script answer {out:?}"));
            let target: f64 = lines
                .get(1)
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or_else(|| panic!("script answer {out:?}"));
            // The arithmetic: live others in region order, this region last.
            let live: Vec<usize> = (0..regions)
                .filter(|&o| o != r && entries[o].is_some_and(|e| e.2 > now))
                .collect();
            let mut demands: Vec<f64> = live
                .iter()
                .map(|&o| entries[o].map_or(0.0, |e| e.0))
                .collect();
            demands.push(demand);
            let t = targets(&sharing, &demands);
            let others: f64 = live.iter().map(|&o| entries[o].map_or(0.0, |e| e.1)).sum();
            let want = grant(rate, t[t.len() - 1], others);
            let grants: Vec<f64> = live
                .iter()
                .map(|&o| entries[o].map_or(0.0, |e| e.1))
                .collect();
            let waiting = others_waiting(&t[..t.len() - 1], &grants);
            assert_eq!(
                lines.get(3).map(|l| l.trim()),
                Some(if waiting { "1" } else { "0" }),
                "case {case}: others waiting (targets {t:?}, grants {grants:?})"
            );
            assert!(
                (target - t[t.len() - 1]).abs() < 1e-3,
                "case {case}: target {target} vs {}",
                t[t.len() - 1]
            );
            // The script keeps six decimals.
            assert!(
                (got - want).abs() < 1e-3,
                "case {case}: region r{r} demand {demand} got {got} want {want}"
            );
            entries[r] = Some((
                (demand * 1e6).round() / 1e6,
                (got * 1e6).round() / 1e6,
                now + life,
            ));
            let sum: f64 = entries
                .iter()
                .flatten()
                .filter(|e| e.2 > now)
                .map(|e| e.1)
                .sum();
            assert!(
                sum <= rate + 1e-3,
                "case {case}: live grants {sum} above the rate {rate}"
            );
        }
    }
}
