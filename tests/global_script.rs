//! The renewal script (`store/lua/global_renew.lua`) against the arithmetic
//! it mirrors (`divvy::quota::renew`), on a real redis-server: random
//! sequences of renewals by several regions (with and without a fallback
//! reserve, some carrying the lease in force), each grant, target, record
//! and whether another region waits for share compared.

mod common;

use common::redis::Redis;
use divvy::global::RENEW_SCRIPT;
use divvy::quota::{renew_weighted, Ask, Fallback, Record, Sharing, Terms};
use proptest::prelude::Rng;
use proptest::test_runner::TestRng;

#[test]
fn the_script_grants_what_the_arithmetic_says() {
    let redis = Redis::start();
    let sha = redis.cli(&["SCRIPT", "LOAD", RENEW_SCRIPT]);
    let mut rng = common::seeded_rng(42);
    for case in 0..40 {
        let key = format!("divvy:global:{{g}}:case{case}");
        let (terms, regions) = case_terms(case, &mut rng);
        let (rate, fallback) = (terms.sharing.rate, terms.fallback);
        // The store as the arithmetic sees it, in the hash's order.
        let mut records: Vec<(String, Record)> = Vec::new();
        // Each region's last grant received, and when it was asked for: a
        // region's base (its lease in force) is one the store granted it.
        let mut received: Vec<Option<(f64, u64)>> = vec![None; regions];
        let mut now = 1_700_000_000_000u64;
        for _ in 0..30 {
            now += rng.next_u64() % 2000;
            let r = (rng.next_u64() % regions as u64) as usize;
            let region = format!("r{r}");
            let demand = match rng.next_u64() % 4 {
                0 => 0.0,
                _ => (rng.next_u64() % 2000) as f64 / 3.0,
            };
            // Its lease in force, until its fallback time is over.
            let base = received[r]
                .filter(|&(_, at)| now < at + terms.life_ms + fallback.hold_ms)
                .map_or(0.0, |(g, _)| g);
            // How many users the region stands for (a fairShare limit's;
            // 0: it claims as one).
            let weight = rng.next_u64() % 7;
            let out = script_renew(
                &redis,
                &sha,
                &key,
                &region,
                &terms,
                now,
                (demand, base, weight),
            );
            let lines: Vec<&str> = out.lines().map(str::trim).collect();
            let number = |i: usize| -> f64 {
                lines
                    .get(i)
                    .and_then(|l| l.parse().ok())
                    .unwrap_or_else(|| panic!("script answer {out:?}"))
            };
            let (got, target) = (number(0), number(1));
            let ask = Ask {
                demand,
                weight: weight as f64,
                base,
            };
            let want = renew_weighted(&mut records, &region, ask, &terms, now);
            // A quarter of the answers never reach the region.
            if !rng.next_u64().is_multiple_of(4) {
                received[r] = Some((got, now));
            }
            assert_eq!(
                lines.get(3).copied(),
                Some(if want.others_waiting { "1" } else { "0" }),
                "case {case}: others waiting ({want:?}, records {records:?})"
            );
            assert!(
                (target - want.target).abs() < 1e-3,
                "case {case}: target {target} vs {}",
                want.target
            );
            // The script keeps six decimals.
            assert!(
                (got - want.grant).abs() < 1e-3,
                "case {case}: region {region} demand {demand} got {got} want {want:?}"
            );
            check_record(&redis, &key, &region, &mut records, case, now, rate);
            // What the view shows is what the others and this region hold.
            let view: f64 = lines
                .get(2)
                .map(|v| {
                    v.split(' ')
                        .filter_map(|p| p.split_once('='))
                        .filter_map(|(_, g)| g.parse::<f64>().ok())
                        .sum()
                })
                .unwrap_or(0.0);
            assert!(view <= rate + 1e-3, "case {case}: view {:?}", lines.get(2));
        }
    }
}

/// Case `case`'s terms (a random rate; half the cases without a fallback
/// reserve, as RLQS sharing asks) and its number of regions.
fn case_terms(case: usize, rng: &mut TestRng) -> (Terms, usize) {
    let rate = 50.0 + (rng.next_u64() % 500) as f64;
    let regions = 2 + (rng.next_u64() % 5) as usize;
    // Half the cases without a fallback reserve (as RLQS sharing asks).
    let fallback = match case % 2 {
        0 => Fallback {
            share: 0.5,
            hold_ms: 1000 + rng.next_u64() % 3000,
        },
        _ => Fallback {
            share: 0.0,
            hold_ms: 0,
        },
    };
    let terms = Terms {
        sharing: Sharing {
            rate,
            floor: 0.01,
            headroom: 0.1,
        },
        life_ms: 3000,
        fallback,
    };
    (terms, regions)
}

/// One renewal by the script: `region` asks `key` for (demand, base,
/// weight) at `now`; its answer as redis-cli prints it.
fn script_renew(
    redis: &Redis,
    sha: &str,
    key: &str,
    region: &str,
    terms: &Terms,
    now: u64,
    (demand, base, weight): (f64, f64, u64),
) -> String {
    let fallback = terms.fallback;
    let rate = terms.sharing.rate;
    redis.cli(&[
        "EVALSHA",
        sha,
        "1",
        key,
        region,
        &terms.life_ms.to_string(),
        "0.01",
        "0.1",
        &now.to_string(),
        &fallback.share.to_string(),
        &fallback.hold_ms.to_string(),
        &rate.to_string(),
        &demand.to_string(),
        &base.to_string(),
        &weight.to_string(),
    ])
}

/// The record the script wrote for `region` (six decimals) matches the
/// arithmetic's, which takes its figures for the next renewal; the live
/// grants and reserves stay within `rate`.
fn check_record(
    redis: &Redis,
    key: &str,
    region: &str,
    records: &mut [(String, Record)],
    case: usize,
    now: u64,
    rate: f64,
) {
    // The store as the script wrote it (six decimals), for the next renewal.
    let stored = redis.cli(&["HGET", key, region]);
    let fields: Vec<f64> = stored
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let Some((_, mine)) = records.iter_mut().find(|(h, _)| *h == region) else {
        panic!("case {case}: no record of {region}");
    };
    assert!(
        fields.len() == 6
            && (fields[3] - mine.reserve).abs() < 1e-3
            && (fields[5] - mine.weight).abs() < 1e-3,
        "case {case}: record {stored:?} vs {mine:?}"
    );
    mine.demand = fields[0];
    mine.grant = fields[1];
    mine.reserve = fields[3];
    let held: f64 = records.iter().filter_map(|(_, r)| r.held(now)).sum();
    assert!(
        held <= rate + 1e-3,
        "case {case}: live grants and reserves {held} above the rate {rate}"
    );
}

#[test]
fn a_record_of_the_older_form_holds_its_grant_and_no_reserve() {
    let redis = Redis::start();
    let sha = redis.cli(&["SCRIPT", "LOAD", RENEW_SCRIPT]);
    let key = "divvy:global:{g}:old";
    let now = 1_700_000_000_000u64;
    redis.cli(&["HSET", key, "old", &format!("100 60 {}", now + 1000)]);
    let ask = |at: u64| {
        redis.cli(&[
            "EVALSHA",
            &sha,
            "1",
            key,
            "new",
            "3000",
            "0.01",
            "0.1",
            &at.to_string(),
            "0.5",
            "2000",
            "100",
            "500",
            "0",
            "1",
        ])
    };
    let first: f64 = ask(now)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(-1.0);
    assert!((first - 40.0).abs() < 1e-3, "{first}");
    // Once it expires, nothing of it is held back: it goes.
    let later: f64 = ask(now + 1000)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(-1.0);
    assert!((later - 100.0).abs() < 1e-3, "{later}");
    assert_eq!(redis.cli(&["HEXISTS", key, "old"]).trim(), "0");
}
