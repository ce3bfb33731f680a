//! Unit tests of `replay`: the simulated clock, shadow rules, comparisons.

use super::*;
use crate::config::{parse_str, Format};

fn policy(yaml: &str) -> Policy {
    parse_str(yaml, Format::Yaml, "t.yaml").unwrap()
}

const TWO_A_MINUTE: &str = r#"
overrides:
  - operation: {path: /a}
    label: a
    creditLimit: 2
    resetSeconds: 60
    actorField: ip
default: {label: rest, creditLimit: 100, resetSeconds: 60}
"#;

const ONE_A_MINUTE: &str = r#"
overrides:
  - operation: {path: /a}
    label: a
    creditLimit: 1
    resetSeconds: 60
    actorField: ip
default: {label: rest, creditLimit: 100, resetSeconds: 60}
"#;

async fn run(traffic: &str, new: &str, old: Option<&str>) -> Report {
    replay(traffic.as_bytes(), policy(new), old.map(policy), 10)
        .await
        .unwrap()
}

#[tokio::test]
async fn windows_follow_the_recorded_times_not_the_replays() {
    // Three hits within the minute, then one 61 s later: the window reopened.
    let t = 1_700_000_000_000u64;
    let traffic = format!(
        "{t} HIT path=/a ip=1\n{} HIT path=/a ip=1\n{} HIT path=/a ip=1\n{} HIT path=/a ip=1\n",
        t + 1000,
        t + 2000,
        t + 61_000
    );
    let r = run(&traffic, TWO_A_MINUTE, None).await;
    let (a, _) = r.rules["a"];
    assert_eq!((a.allowed, a.denied), (3, 1));
    assert_eq!(r.span_ms, Some((t, t + 61_000)));
}

#[tokio::test]
async fn a_tighter_policy_shows_the_requests_it_would_deny() {
    let traffic = "HIT path=/a ip=1\nHIT path=/a ip=1\nHIT path=/a ip=2\nHIT path=/b\n";
    let r = run(traffic, ONE_A_MINUTE, Some(TWO_A_MINUTE)).await;
    let (new, old) = r.rules["a"];
    assert_eq!((new.allowed, new.denied), (2, 1));
    assert_eq!((old.allowed, old.denied), (3, 0));
    assert_eq!(r.changed, 1);
    assert_eq!(r.examples[0].line, 2);
    assert!(r.examples[0].new.starts_with("denied by a"));
    let text = r.to_string();
    assert!(text.contains("changed decisions: 1"), "{text}");
}

#[tokio::test]
async fn a_shadow_rule_never_denies_but_counts_what_it_would_deny() {
    let shadow = ONE_A_MINUTE.replace("label: a\n", "label: a\n    matchPolicy: shadow\n");
    let traffic = "HIT path=/a ip=1\nHIT path=/a ip=1\nHIT path=/a ip=1\n";
    let r = run(traffic, &shadow, Some(ONE_A_MINUTE)).await;
    let (new, old) = r.rules["a"];
    assert_eq!((new.allowed, new.denied, new.shadow), (3, 0, 2));
    assert_eq!((old.allowed, old.denied, old.shadow), (1, 2, 0));
    assert_eq!(r.changed, 2);
}

#[tokio::test]
async fn malformed_lines_are_skipped_and_counted() {
    let traffic = "HIT path=/a ip=1\nGET x=y\n\n{\"domain\": 3}\nHIT path=/b\n";
    let r = run(traffic, TWO_A_MINUTE, None).await;
    assert_eq!((r.requests, r.skipped), (2, 2));
    assert_eq!(r.skipped_examples[0].0, 2);
    assert_eq!(r.skipped_examples[1].0, 4);
}
