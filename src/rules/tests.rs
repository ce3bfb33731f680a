//! The rule set's unit tests.

use super::*;
use crate::config::{parse_str, Format};

fn set(yaml: &str) -> RuleSet {
    RuleSet::new(parse_str(yaml, Format::Yaml, "test.yaml").unwrap())
}

fn op(pairs: &[(&str, &str)]) -> Operation {
    Operation::from_pairs(pairs.iter().copied())
}

const POLICY: &str = r#"
overrides:
  - operation: {method: GET, path: /status}
    creditLimit: 1000
    resetSeconds: 60
  - operation: {method: GET, path: /pantry/cookies/special-cookie}
    creditLimit: 1
    resetSeconds: 1d
    matchPolicy: canary
  - operation: {method: GET, path: /pantry/cookies/*, ip: "*"}
    creditLimit: 3
    resetSeconds: 1h
    actorField: ip
  - operation: {path: "/img/*.png"}
    creditLimit: 5
    resetSeconds: 60
  - operation: {method: POST}
    domain: api
    creditLimit: 7
    resetSeconds: 60
default:
  creditLimit: 2
  resetSeconds: 30
"#;

#[test]
fn first_stop_rule_decides_after_canaries() {
    let rs = set(POLICY);
    let plan = rs.plan(
        None,
        &op(&[
            ("method", "GET"),
            ("path", "/pantry/cookies/special-cookie"),
            ("ip", "1.2.3.4"),
        ]),
    );
    assert_eq!(
        plan,
        MatchPlan {
            canaries: vec![1],
            decider: 2
        }
    );
    // Without ip the cookie rule needs the key present: default decides.
    let plan = rs.plan(
        None,
        &op(&[("method", "GET"), ("path", "/pantry/cookies/x")]),
    );
    assert_eq!(plan.decider, 5);
    assert_eq!(rs.plan(None, &op(&[("path", "/img/a/b.png")])).decider, 3);
    assert_eq!(rs.plan(None, &op(&[("path", "/img/a.png.gz")])).decider, 5);
}

#[test]
fn domain_rules_only_apply_in_their_domain() {
    let rs = set(POLICY);
    let post = op(&[("method", "POST")]);
    assert_eq!(rs.plan(Some("api"), &post).decider, 4);
    assert_eq!(rs.plan(Some("web"), &post).decider, 5);
    assert_eq!(rs.plan(None, &post).decider, 5);
}

#[test]
fn a_counter_key_built_on_a_recycled_one_is_its_own() {
    let rs = set(POLICY);
    let o = op(&[
        ("method", "GET"),
        ("path", "/pantry/cookies/x"),
        ("ip", "1.2.3.4"),
    ]);
    let old = String::from("divvy:something much longer than the next key, to see it gone");
    let buffer = old.as_ptr();
    recycle_key(old);
    let key = rs.rule(5).counter_key(&o, rs.rule(5).spec.first_limit());
    assert_eq!((key.as_str(), key.as_ptr()), ("divvy:::2:30", buffer));
    // A long one is not kept.
    recycle_key("x".repeat(SPARE_KEY_BYTES + 1));
    let next = rs.rule(5).counter_key(&o, rs.rule(5).spec.first_limit());
    assert!(next.capacity() <= SPARE_KEY_BYTES);
}

#[test]
fn counter_keys_follow_divvy() {
    let rs = set(POLICY);
    let o = op(&[
        ("method", "GET"),
        ("path", "/pantry/cookies/x"),
        ("ip", "192.168.1.1"),
    ]);
    let key = |i: usize| rs.rule(i).counter_key(&o, rs.rule(i).spec.first_limit());
    assert_eq!(
        key(2),
        "divvy:ip=* method=GET path=/pantry/cookies/*:192.168.1.1:3:3600"
    );
    assert_eq!(key(5), "divvy:::2:30");
    assert_eq!(key(4), "divvy@api:method=POST::7:60");
}

#[test]
fn other_algorithms_and_limits_have_their_own_key_shape() {
    let rs = set(r#"
overrides:
  - operation: {path: "/api/*"}
    limits:
      - {creditLimit: 40, resetSeconds: 1, algorithm: token_bucket, burst: 80, actorField: key}
      - {creditLimit: 40, resetSeconds: 1, algorithm: token_bucket, actorField: customer}
      - {creditLimit: 1000, resetSeconds: 1h}
  - operation: {path: /s}
    creditLimit: 5
    resetSeconds: 60
    algorithm: sliding
    actorField: ip
default: {creditLimit: 2, resetSeconds: 30}
"#);
    let o = op(&[
        ("path", "/api/x"),
        ("key", "k1"),
        ("customer", "k1"),
        ("ip", "1"),
    ]);
    let keys: Vec<String> = rs
        .rule(0)
        .spec
        .limits
        .iter()
        .map(|l| rs.rule(0).counter_key(&o, l))
        .collect();
    assert_eq!(
        keys,
        vec![
            "divvy:path=/api/*:key=k1:40:1:token_bucket",
            "divvy:path=/api/*:customer=k1:40:1:token_bucket",
            "divvy:path=/api/*::1000:3600:window",
        ]
    );
    let o = op(&[("path", "/s"), ("ip", "1.2.3.4")]);
    assert_eq!(
        rs.rule(1).counter_key(&o, rs.rule(1).spec.first_limit()),
        "divvy:path=/s:1.2.3.4:5:60:sliding"
    );
}

#[test]
fn index_finds_the_same_rule_as_a_linear_scan() {
    let mut yaml = String::from("overrides:\n");
    for i in 0..500 {
        yaml.push_str(&format!(
                "  - operation: {{user: u{i}, path: \"/p/{}*\"}}\n    creditLimit: 1\n    resetSeconds: 1\n",
                i % 7
            ));
    }
    yaml.push_str("  - operation: {path: \"/p/3*\"}\n    creditLimit: 1\n    resetSeconds: 1\n");
    yaml.push_str("default: {creditLimit: 1, resetSeconds: 1}\n");
    let rs = set(&yaml);
    for i in (0..520).step_by(3) {
        for p in ["/p/3x", "/p/1", "/q"] {
            let o = op(&[("user", &format!("u{i}")), ("path", p)]);
            let linear = rs.rules().iter().position(|r| r.matches(None, &o)).unwrap();
            assert_eq!(rs.plan(None, &o).decider, linear, "user u{i} path {p}");
        }
    }
}

proptest::proptest! {
    /// With exact values on any of five keys, canaries among them, and
    /// requests carrying any of those keys: the index (looked up either
    /// way, by its keys or by the request's) plans what a scan of every
    /// rule in order plans.
    #[test]
    fn index_plans_what_a_scan_plans(
        rules in proptest::collection::vec(
            (proptest::collection::btree_map(0..5usize, 0..3usize, 1..4), proptest::bool::ANY),
            0..12,
        ),
        request in proptest::collection::btree_map(0..5usize, 0..3usize, 0..6),
    ) {
        // A rule an earlier stop rule's pairs all cover is unreachable
        // (the policy is refused): left out.
        let mut kept: Vec<&(std::collections::BTreeMap<usize, usize>, bool)> = Vec::new();
        for rule in &rules {
            let covered = kept.iter().any(|(earlier, canary)| {
                !canary && earlier.iter().all(|(k, v)| rule.0.get(k) == Some(v))
            });
            if !covered {
                kept.push(rule);
            }
        }
        let mut yaml = String::from("overrides:\n");
        for (operation, canary) in kept {
            let pairs: Vec<String> =
                operation.iter().map(|(k, v)| format!("k{k}: v{v}")).collect();
            yaml.push_str(&format!(
                "  - operation: {{{}}}\n    creditLimit: 1\n    resetSeconds: 1\n{}",
                pairs.join(", "),
                if *canary { "    matchPolicy: canary\n" } else { "" }
            ));
        }
        yaml.push_str("default: {creditLimit: 1, resetSeconds: 1}\n");
        let rs = set(&yaml);
        let pairs: Vec<(String, String)> =
            request.iter().map(|(k, v)| (format!("k{k}"), format!("v{v}"))).collect();
        let o = Operation::from_pairs(pairs);
        let matching: Vec<usize> = (0..rs.rules().len())
            .filter(|&i| rs.rule(i).matches(None, &o))
            .collect();
        let decider = matching.iter().copied().find(|&i| !rs.rule(i).is_canary());
        let canaries: Vec<usize> = matching
            .iter()
            .copied()
            .take_while(|&i| Some(i) != decider)
            .collect();
        let plan = rs.plan(None, &o);
        proptest::prop_assert_eq!(Some(plan.decider), decider);
        proptest::prop_assert_eq!(plan.canaries, canaries);
    }
}
