//! Unit tests of fair shares through the limiter, on an injected clock.

use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::config::{parse_str, Format};
use crate::rules::Operation;
use crate::store::MemoryStore;

/// A limiter over `policy` whose store and fair shares read `clock`.
fn limiter(policy: &str, clock: &Arc<ManualClock>) -> Limiter {
    let policy = parse_str(policy, Format::Yaml, "fair.yaml").unwrap();
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let l = Limiter::new(RuleSet::new(policy), store);
    let metrics = l.telemetry().metrics.fair.clone();
    let fair = FairShares::new(clock.clone(), metrics, None);
    l.with_fair(Arc::new(fair))
}

/// Whether one line-protocol HIT of `user` is allowed, and the answer's remaining.
async fn hit(l: &Limiter, user: &str) -> (bool, u64) {
    hit_at(l, "p", user).await
}

/// Like [`hit`], on `site`.
async fn hit_at(l: &Limiter, site: &str, user: &str) -> (bool, u64) {
    let op = Operation::from_pairs([("site", site), ("user", user)]);
    let hits = [Hit::one(op)];
    let verdict = l.decide(&Request::line(&hits)).await.unwrap();
    let d = verdict.into_decisions().unwrap();
    (d.items[0].decider.allowed, d.items[0].decider.remaining)
}

/// Each user asks every `every` for `ms` (round robin); allowed per user.
async fn run(
    l: &Limiter,
    clock: &ManualClock,
    users: &[&str],
    every: u64,
    ms: u64,
) -> HashMap<String, u64> {
    let mut allowed = HashMap::new();
    for _ in 0..ms / every {
        for u in users {
            if hit(l, u).await.0 {
                *allowed.entry(u.to_string()).or_default() += 1;
            }
        }
        clock.advance(Duration::from_millis(every));
    }
    allowed
}

fn clock() -> Arc<ManualClock> {
    let c = Arc::new(ManualClock::default());
    c.advance(Duration::from_secs(1_000_000));
    c
}

#[tokio::test]
async fn a_window_s_credits_are_shared_and_the_limit_still_holds() {
    for algorithm in ["fixed", "window", "sliding"] {
        let clock = clock();
        let l = limiter(
            &format!("overrides:\n  - operation: {{site: p, user: '*'}}\n    creditLimit: 60\n    resetSeconds: 60\n    algorithm: {algorithm}\n    fairShare: user\ndefault: {{creditLimit: 0}}\n"),
            &clock,
        );
        let got = run(&l, &clock, &["a", "b"], 10, 2_000).await;
        assert_eq!((got["a"], got["b"]), (30, 30), "{algorithm}: {got:?}");
        // A newcomer in the same window finds the window's credits spent.
        let got = run(&l, &clock, &["c"], 10, 500).await;
        assert_eq!(got.get("c"), None, "{algorithm}");
    }
}

#[tokio::test]
async fn with_an_actor_field_each_site_is_shared_among_its_own_users() {
    let clock = clock();
    let l = limiter(
        "overrides:\n  - operation: {site: '*', user: '*'}\n    actorField: site\n    creditLimit: 60\n    resetSeconds: 60\n    algorithm: fixed\n    fairShare: user\ndefault: {creditLimit: 0}\n",
        &clock,
    );
    let mut got = HashMap::new();
    for _ in 0..200 {
        for (site, user) in [("p", "a"), ("p", "b"), ("q", "c")] {
            if hit_at(&l, site, user).await.0 {
                *got.entry(user).or_insert(0) += 1;
            }
        }
        clock.advance(Duration::from_millis(10));
    }
    assert_eq!((got["a"], got["b"], got["c"]), (30, 30, 60), "{got:?}");
}

#[tokio::test]
async fn a_knob_changes_the_rate_that_is_shared() {
    let clock = clock();
    let l = limiter(
        "overrides:\n  - label: site\n    operation: {site: p, user: '*'}\n    creditLimit: 100\n    resetSeconds: 1\n    algorithm: token_bucket\n    fairShare: user\ndefault: {creditLimit: 0}\n",
        &clock,
    );
    run(&l, &clock, &["a", "b"], 2, 2_000).await;
    let got = run(&l, &clock, &["a", "b"], 2, 1_000).await;
    assert!(
        got["a"].abs_diff(50) <= 2 && got["b"].abs_diff(50) <= 2,
        "{got:?}"
    );
    let knob = crate::knobs::Knob::credit_limit(40);
    l.knobs().set("site", knob).await.unwrap();
    // The bucket shrunk below what it had spent pays the difference back first.
    run(&l, &clock, &["a", "b"], 2, 2_000).await;
    let got = run(&l, &clock, &["a", "b"], 2, 1_000).await;
    assert!(
        got["a"].abs_diff(20) <= 2 && got["b"].abs_diff(20) <= 2,
        "{got:?}"
    );
}

#[tokio::test]
async fn the_binding_constraint_answers_in_a_multi_limit_rule() {
    let clock = clock();
    let l = limiter(
        "overrides:\n  - operation: {site: p, user: '*'}\n    limits:\n      - {creditLimit: 100, resetSeconds: 1, algorithm: token_bucket, fairShare: user}\n      - {creditLimit: 1000, resetSeconds: 3600, actorField: user}\ndefault: {creditLimit: 0}\n",
        &clock,
    );
    // Alone, a's share is the whole rate: its answer is its own bucket's
    // (99 left), not the hour's (999 left).
    assert_eq!(hit(&l, "a").await, (true, 99));
    run(&l, &clock, &["a", "b", "c", "d"], 5, 2_000).await;
    // Four users: a's share is 25/s, its bucket holds at most 25.
    clock.advance(Duration::from_secs(1));
    let (allowed, remaining) = hit(&l, "a").await;
    assert!(allowed && remaining <= 25, "{allowed} {remaining}");
    // The hour's limit still counts every allowed hit of a.
    let got = run(&l, &clock, &["a"], 1, 60_000).await;
    assert!(got["a"] < 1000, "{got:?}");
}
