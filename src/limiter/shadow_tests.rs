//! Unit tests of `matchPolicy: shadow` in the limiter: it decides as a stop
//! rule, never denies, and counts what it would have denied.

use super::*;
use crate::clock::SystemClock;
use crate::config::{parse_str, Format};
use crate::observe::metrics::HitStatus;
use crate::observe::telemetry::Telemetry;
use crate::rules::Operation;
use crate::store::MemoryStore;

const POLICY: &str = r#"
charge: all-or-nothing
overrides:
  - operation: {k: s}
    label: s
    matchPolicy: shadow
    creditLimit: 1
    resetSeconds: 1h
  - operation: {k: "*"}
    label: later
    creditLimit: 100
    resetSeconds: 1h
default: {label: d, creditLimit: 100, resetSeconds: 1h}
"#;

fn limiter() -> Limiter {
    let policy = parse_str(POLICY, Format::Yaml, "t.yaml").unwrap();
    let telemetry = Telemetry::detached(Arc::new(SystemClock::default()));
    let knobs = Arc::new(crate::knobs::Knobs::local(telemetry.metrics.clone()));
    Limiter::build(
        RuleSet::new(policy),
        Arc::new(MemoryStore::new()),
        knobs,
        telemetry,
    )
}

fn hit(k: &str) -> Hit {
    Hit::one(Operation::from_pairs([("k", k)]))
}

async fn decide(l: &Limiter, hits: &[Hit]) -> Decisions {
    let verdict = l.decide(&Request::hits(Some("d"), hits)).await.unwrap();
    verdict.into_decisions().expect("divvy rules decide")
}

#[tokio::test]
async fn a_shadow_rule_decides_never_denies_and_counts_its_would_be_denials() {
    let l = limiter();
    let mut shadowed = Vec::new();
    for _ in 0..3 {
        let d = decide(&l, &[hit("s")]).await;
        let item = &d.items[0];
        // It decides (the later rule that also matches is not consulted).
        assert_eq!(d.rule(&item.decider).name(), "s");
        assert!(item.decider.allowed);
        shadowed.push(item.shadow_denied);
    }
    assert_eq!(shadowed, [false, true, true]);
    let m = &l.telemetry().metrics;
    let count = |status: HitStatus| m.hits.with_label_values(&[status.as_str(), "s"]).get();
    assert_eq!(count(HitStatus::Shadow), 2);
    assert_eq!(count(HitStatus::Accepted), 3);
    assert_eq!(count(HitStatus::Rejected), 0);
    let rules = l.rules();
    let stats = &rules.rule(0).telemetry().unwrap().stats;
    assert_eq!(stats.shadow_denials(), 2);
}

#[tokio::test]
async fn a_shadow_denial_does_not_deny_the_requests_other_descriptors() {
    let l = limiter();
    decide(&l, &[hit("s")]).await;
    // All-or-nothing: a real denial would leave the other counter uncharged.
    let d = decide(&l, &[hit("s"), hit("x")]).await;
    assert!(d.items[0].shadow_denied);
    assert!(d.items.iter().all(|i| i.decider.allowed));
    assert_eq!(
        d.items[1].decider.remaining, 99,
        "the other hit was charged"
    );
}
