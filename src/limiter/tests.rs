//! Unit tests of `limiter/mod.rs`.

use super::*;
use crate::clock::SystemClock;
use crate::config::{parse_str, Format};
use crate::observe::telemetry::Telemetry;
use crate::rules::Operation;
use crate::store::{Algorithm, MemoryStore};

/// The divvy rules' decisions of one request.
async fn check(l: &Limiter, domain: Option<&str>, hits: &[Hit]) -> Result<Decisions, StoreError> {
    let verdict = l.decide(&Request::hits(domain, hits)).await?;
    Ok(verdict.into_decisions().expect("decided by divvy rules"))
}

/// The decisions of a line connection's pipelined HITs.
async fn check_each(l: &Limiter, hits: &[Hit]) -> Result<Decisions, StoreError> {
    let verdict = l.decide(&Request::line(hits)).await?;
    Ok(verdict.into_decisions().expect("decided by divvy rules"))
}

const POLICY: &str = r#"
overrides:
  - operation: {path: /canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 60
  - operation: {path: "/c*"}
    creditLimit: 2
    resetSeconds: 60
    actorField: ip
  - operation: {path: /deny}
    creditLimit: 0
  - operation: {path: /free}
    creditLimit: 5
    resetSeconds: 0
default: {creditLimit: 100, resetSeconds: 60}
"#;

fn limiter() -> Limiter {
    let policy = parse_str(POLICY, Format::Yaml, "t.yaml").unwrap();
    Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()))
}

fn hit(pairs: &[(&str, &str)]) -> Hit {
    Hit::one(Operation::from_pairs(pairs.iter().copied()))
}

async fn one(l: &Limiter, pairs: &[(&str, &str)]) -> Decision {
    let mut d = check(l, None, &[hit(pairs)]).await.unwrap();
    d.items.remove(0)
}

#[tokio::test]
async fn canary_counts_but_never_decides() {
    let l = limiter();
    for i in 0..2 {
        let d = one(&l, &[("path", "/canary"), ("ip", "a")]).await;
        assert!(d.decider.allowed);
        assert_eq!(d.decider.rule, 1);
        assert_eq!(d.canaries.len(), 1);
        assert_eq!(d.canaries[0].allowed, i == 0);
    }
    assert!(
        !one(&l, &[("path", "/canary"), ("ip", "a")])
            .await
            .decider
            .allowed
    );
    // Another actor has its own counter.
    assert!(
        one(&l, &[("path", "/canary"), ("ip", "b")])
            .await
            .decider
            .allowed
    );
}

#[tokio::test]
async fn always_deny_and_always_allow_touch_no_counter() {
    let l = limiter();
    let d = one(&l, &[("path", "/deny")]).await;
    assert_eq!(
        (d.decider.allowed, d.decider.remaining, d.decider.reset),
        (false, 0, Reset::Never)
    );
    for _ in 0..10 {
        let d = one(&l, &[("path", "/free")]).await;
        assert_eq!(
            (d.decider.allowed, d.decider.remaining, d.decider.reset),
            (true, 5, Reset::Unlimited)
        );
        assert!(d.decider.counter_key.is_none());
    }
}

#[tokio::test]
async fn decisions_reach_the_dashboard_and_long_actors_come_bounded() {
    let policy = parse_str(
            "overrides:\n  - label: dash-limiter-test\n    operation: {k: d}\n    actorField: who\n    creditLimit: 1\n    resetSeconds: 60\ndefault: {creditLimit: 1, resetSeconds: 60}\n",
            Format::Yaml,
            "t.yaml",
        )
        .unwrap();
    let telemetry = Telemetry::detached(Arc::new(SystemClock::default()));
    let rules = RuleSet::new(policy);
    let store = Arc::new(MemoryStore::new());
    let knobs = Arc::new(Knobs::local(telemetry.metrics.clone()));
    let l = Limiter::build(rules, store, knobs, telemetry.clone());
    let long = "x".repeat(100);
    for _ in 0..3 {
        one(&l, &[("k", "d"), ("who", &long)]).await;
    }
    let board = &telemetry.recorder;
    let stats = l.rules().rule(0).telemetry().unwrap().stats.clone();
    let counted = stats.history.sum(board.now(), 5);
    assert_eq!((counted.allowed, counted.denied), (1, 2));
    let top = board.top(60, Some("dash-limiter-test"), 20);
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top[0].count, 2);
    assert!(
        top[0].actor.starts_with("xxxxxxxxxxxxxxxx~h"),
        "{}",
        top[0].actor
    );
    assert_eq!(top[0].actor.len(), 16 + 2 + 32);
}

#[tokio::test]
async fn override_gets_its_own_counter() {
    let l = limiter();
    let mut h = hit(&[("path", "/x")]);
    h.limit_override = Some(LimitOverride {
        credit_limit: 1,
        reset_seconds: 60,
    });
    let d = check(&l, None, &[h.clone(), h]).await.unwrap();
    assert!(d.items[0].decider.allowed);
    assert!(!d.items[1].decider.allowed);
    assert_eq!(
        d.items[1].decider.counter_key.as_deref(),
        Some("divvy:::1:60")
    );
    // The default's own counter is untouched.
    assert_eq!(one(&l, &[("path", "/x")]).await.decider.remaining, 99);
}

const AON: &str = r#"
charge: all-or-nothing
overrides:
  - operation: {k: canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 1h
  - operation: {k: a}
    creditLimit: 5
    resetSeconds: 1h
    algorithm: fixed
  - operation: {k: b}
    creditLimit: 1
    resetSeconds: 1h
    algorithm: token_bucket
  - operation: {k: zero}
    creditLimit: 0
  - operation: {k: multi}
    limits:
      - {creditLimit: 3, resetSeconds: 1h, actorField: key, algorithm: sliding}
      - {creditLimit: 4, resetSeconds: 1h, actorField: customer}
default: {creditLimit: 100, resetSeconds: 60}
"#;

fn aon() -> Limiter {
    let policy = parse_str(AON, Format::Yaml, "t.yaml").unwrap();
    Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()))
}

#[tokio::test]
async fn all_or_nothing_charges_nothing_when_a_descriptor_is_denied() {
    let l = aon();
    let (a, b) = (hit(&[("k", "a")]), hit(&[("k", "b")]));
    let d = check(&l, Some("d"), &[a.clone(), b.clone()]).await.unwrap();
    assert_eq!(
        (d.items[0].decider.remaining, d.items[1].decider.remaining),
        (4, 0)
    );
    // b is spent: a is allowed but not charged, and says so.
    let d = check(&l, Some("d"), &[a.clone(), b.clone()]).await.unwrap();
    assert!(d.items[0].decider.allowed && !d.items[1].decider.allowed);
    assert_eq!(d.items[0].decider.remaining, 4);
    // A rule that always denies blocks the request too.
    let d = check(&l, Some("d"), &[a.clone(), hit(&[("k", "zero")])])
        .await
        .unwrap();
    assert!(d.items[0].decider.allowed && !d.items[1].decider.allowed);
    assert_eq!(d.items[0].decider.remaining, 4);
    assert_eq!(one(&l, &[("k", "a")]).await.decider.remaining, 3);
    // Line-protocol HITs are separate requests: each is charged on its own.
    let d = check_each(&l, &[a.clone(), b]).await.unwrap();
    assert_eq!(d.items[0].decider.remaining, 2);
}

#[tokio::test]
async fn a_denied_canary_does_not_block_and_a_blocked_request_charges_no_canary() {
    let l = aon();
    let c = hit(&[("k", "canary")]);
    let d = check(&l, Some("d"), std::slice::from_ref(&c))
        .await
        .unwrap();
    assert!(d.items[0].canaries[0].allowed);
    let d = check(&l, Some("d"), &[c.clone(), hit(&[("k", "a")])])
        .await
        .unwrap();
    assert!(!d.items[0].canaries[0].allowed);
    assert!(d.items[1].decider.allowed && d.items[1].decider.remaining == 4);
}

#[tokio::test]
async fn several_limits_answer_the_smallest_and_a_denial_charges_none() {
    let l = aon();
    let h = |key: &str| hit(&[("k", "multi"), ("key", key), ("customer", "c")]);
    let d = one(&l, &[("k", "multi"), ("key", "k1"), ("customer", "c")]).await;
    assert_eq!((d.decider.allowed, d.decider.remaining), (true, 2));
    assert_eq!(d.decider.limits.len(), 2);
    assert_eq!(d.decider.algorithm, Algorithm::Sliding);
    let d = check(&l, None, &[h("k2"), h("k2"), h("k2")]).await.unwrap();
    assert!(d.items.iter().all(|i| i.decider.allowed));
    // 1 left in both after the second: on a tie the limit full last speaks
    // (divvy's 1 h window).
    assert_eq!(d.items[1].decider.remaining, 1);
    assert_eq!(d.items[1].decider.algorithm, Algorithm::Window);
    // Now the customer is spent; k3 is denied and its own limit keeps its credit.
    let d = check(&l, None, &[h("k3")]).await.unwrap();
    let o = &d.items[0].decider;
    assert!(!o.allowed);
    assert_eq!((o.limits[0].allowed, o.limits[0].remaining), (true, 3));
    assert_eq!((o.limits[1].allowed, o.limits[1].remaining), (false, 0));
    assert_eq!(o.credit_limit, 4, "the denying limit speaks");
}

#[tokio::test]
async fn huge_overrides_are_kept_countable_and_a_stopped_rule_stays_stopped() {
    let policy = parse_str(
            "overrides:\n  - operation: {k: tb}\n    label: tb\n    creditLimit: 5\n    resetSeconds: 1\n    algorithm: token_bucket\ndefault: {creditLimit: 1, resetSeconds: 1}\n",
            Format::Yaml,
            "t.yaml",
        )
        .unwrap();
    let knobs = Arc::new(Knobs::local(Arc::new(
        crate::observe::metrics::Metrics::new(),
    )));
    let l = Limiter::with_knobs(
        RuleSet::new(policy),
        Arc::new(MemoryStore::new()),
        knobs.clone(),
    );
    let mut h = hit(&[("k", "tb")]);
    h.cost = 1_000_000_000;
    h.limit_override = Some(LimitOverride {
        credit_limit: u64::from(u32::MAX),
        reset_seconds: 365 * 86_400,
    });
    // No overflow, no panic: the override is clamped to what stores count exactly.
    let d = check(&l, Some("d"), &[h.clone()]).await.unwrap();
    assert!(d.items[0].decider.credit_limit <= crate::config::model::MAX_CREDIT_MS);
    h.cost = 1;
    assert!(
        check(&l, Some("d"), &[h.clone()]).await.unwrap().items[0]
            .decider
            .allowed
    );
    let stop = crate::knobs::Knob::credit_limit(0);
    knobs.set("tb", stop).await.unwrap();
    let d = check(&l, Some("d"), &[h]).await.unwrap();
    assert!(
        !d.items[0].decider.allowed,
        "the breaker wins over a request's own limit"
    );
}

#[tokio::test]
async fn compiling_registers_nothing_and_a_limiter_records_to_what_it_is_handed() {
    let policy = parse_str(
        "overrides:\n  - label: handed-in\n    operation: {k: v}\n    creditLimit: 1\n    resetSeconds: 60\ndefault: {creditLimit: 1, resetSeconds: 60}\n",
        Format::Yaml,
        "t.yaml",
    )
    .unwrap();
    let telemetry = Telemetry::detached(Arc::new(SystemClock::default()));
    let rules = RuleSet::new(policy);
    assert!(rules.rules().iter().all(|r| r.telemetry().is_none()));
    assert!(
        !telemetry.metrics.render().contains("handed-in"),
        "compiling a rule registers no series"
    );
    let store = Arc::new(MemoryStore::new());
    let l = Limiter::build(
        rules,
        store,
        Arc::new(Knobs::local(telemetry.metrics.clone())),
        telemetry.clone(),
    );
    one(&l, &[("k", "v")]).await;
    one(&l, &[("k", "v")]).await;
    let text = telemetry.metrics.render();
    let line = |status: &str| {
        format!("divvy_hits_total{{rule_label=\"handed-in\",status=\"{status}\"}} 1")
    };
    assert!(text.contains(&line("accepted")), "{text}");
    assert!(text.contains(&line("rejected")), "{text}");
}
