//! Property tests: no input panics the parser, the matcher, the limiter or
//! the gRPC adapter, and the unreachable-rule check is sound.

use std::sync::Arc;

use divvy::config::{parse_str, validate::masks, Format, LimitSpec, MatchPolicy, RuleSpec};
use divvy::limiter::{Hit, Limiter, Request};
use divvy::pattern::Pattern;
use divvy::rules::{Operation, RuleSet};
use divvy::server::rls::{to_hits, to_response};
use divvy::store::{Algorithm, MemoryStore};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;

const POLICY: &str = r#"
overrides:
  - operation: {a: "x*"}
    matchPolicy: canary
    creditLimit: 2
    resetSeconds: 60
  - operation: {a: "*y*", b: "*"}
    creditLimit: 3
    resetSeconds: 60
    actorField: b
  - operation: {b: ""}
    domain: "d*"
    creditLimit: 0
  - operation: {c: z}
    creditLimit: 4
    resetSeconds: 0
default: {creditLimit: 5, resetSeconds: 60}
"#;

fn small_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[abcxyz*]{0,4}",
        any::<String>(),
        Just(String::new()),
        Just("*".to_owned()),
    ]
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec(
            (
                prop_oneof![
                    Just("a".to_owned()),
                    Just("b".to_owned()),
                    Just("c".to_owned()),
                    small_text()
                ],
                small_text(),
            ),
            0..5,
        ),
        prop::option::of((any::<u32>(), any::<i32>())),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, addend, negative)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit: unit.rem_euclid(8),
            }),
            hits_addend: addend.map(|value| UInt64Value { value }),
            is_negative_hits: negative && addend.is_some_and(|v| v % 7 == 0),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_requests_never_panic(
        domain in small_text(),
        descriptors in prop::collection::vec(descriptor(), 0..6),
        hits_addend in any::<u32>(),
    ) {
        let policy = parse_str(POLICY, Format::Yaml, "p.yaml").unwrap();
        let limiter = Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()));
        let request = RateLimitRequest { domain, descriptors, hits_addend };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        if let Ok(hits) = to_hits(request.clone(), &limiter.telemetry().metrics) {
            prop_assert_eq!(hits.len(), request.descriptors.len());
            let decisions = runtime
                .block_on(limiter.decide(&Request::hits(Some(&request.domain), &hits)))
                .unwrap()
                .into_decisions()
                .expect("decided by divvy rules");
            let response = to_response(&decisions);
            prop_assert_eq!(response.statuses.len(), hits.len());
            for (hit, status) in hits.iter().zip(&response.statuses) {
                // A hit is never allowed for more credit than the limit has.
                if let Some(limit) = &status.current_limit {
                    if !hit.refund && status.code == 1 && status.duration_until_reset.is_some() {
                        prop_assert!(hit.cost <= u64::from(limit.requests_per_unit) || limit.requests_per_unit == u32::MAX);
                    }
                }
            }
        }
    }

    #[test]
    fn random_config_text_never_panics(text in any::<String>()) {
        for format in [Format::Yaml, Format::Json, Format::Ini] {
            let _ = parse_str(&text, format, "fuzz");
        }
    }

    #[test]
    fn config_shaped_text_never_panics(
        lines in prop::collection::vec(prop_oneof![
            Just("overrides:".to_owned()),
            Just("  - operation: {a: b}".to_owned()),
            Just("    creditLimit: 3".to_owned()),
            Just("    resetSeconds: 1h".to_owned()),
            Just("default: {creditLimit: 1, resetSeconds: 1}".to_owned()),
            Just("[a=b c=*]".to_owned()),
            Just("[default]".to_owned()),
            Just("creditLimit = 2".to_owned()),
            Just("resetSeconds = '90s'".to_owned()),
            "[ -~]{0,20}",
        ], 0..12)
    ) {
        let text = lines.join("\n");
        for format in [Format::Yaml, Format::Json, Format::Ini] {
            let _ = parse_str(&text, format, "fuzz");
        }
    }

    /// If the validator says rule A masks rule B, every request B matches, A matches.
    #[test]
    fn masking_is_sound(
        a_ops in prop::collection::btree_map("[abc]", "[xy*]{0,4}", 0..3),
        b_ops in prop::collection::btree_map("[abc]", "[xy*]{0,4}", 0..3),
        a_domain in prop::option::of("[dx*]{1,3}"),
        b_domain in prop::option::of("[dx*]{1,3}"),
        requests in prop::collection::vec((prop::collection::btree_map("[abc]", "[xy]{0,5}", 0..4), prop::option::of("[dx]{1,4}")), 1..40),
    ) {
        let spec = |ops: &std::collections::BTreeMap<String, String>, domain: &Option<String>| RuleSpec {
            position: 1,
            is_default: false,
            aux: false,
            operation: ops.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            limits: vec![LimitSpec {
                credit_limit: 1,
                reset_seconds: 1,
                algorithm: Algorithm::Window,
                burst: 1,
                actor_field: None,
                label: None,
                global: false,
                fair_share: None,
                overdraft: false,
            }],
            multi: false,
            match_policy: MatchPolicy::Stop,
            label: None,
            comment: None,
            domain: domain.clone(),
            denied_body: None,
        };
        let a = spec(&a_ops, &a_domain);
        let b = spec(&b_ops, &b_domain);
        if masks(&a, &b) {
            let matches = |r: &RuleSpec, op: &std::collections::BTreeMap<String, String>, d: &Option<String>| {
                let domain_ok = match (&r.domain, d) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(p), Some(d)) => Pattern::new(p).matches(d),
                };
                domain_ok && r.operation.iter().all(|(k, v)| op.get(k).is_some_and(|x| Pattern::new(v).matches(x)))
            };
            for (op, d) in &requests {
                if matches(&b, op, d) {
                    prop_assert!(matches(&a, op, d), "a={a:?} b={b:?} request={op:?} {d:?}");
                }
            }
        }
    }

    #[test]
    fn glob_matching_agrees_with_a_reference(pattern in "[ab*]{0,6}", value in "[ab]{0,8}") {
        // Reference: a regex-free recursive matcher.
        fn reference(p: &[u8], v: &[u8]) -> bool {
            match p.split_first() {
                None => v.is_empty(),
                Some((b'*', rest)) => (0..=v.len()).any(|i| reference(rest, &v[i..])),
                Some((c, rest)) => v.first() == Some(c) && reference(rest, &v[1..]),
            }
        }
        prop_assert_eq!(Pattern::new(&pattern).matches(&value), reference(pattern.as_bytes(), value.as_bytes()));
    }

    #[test]
    fn operations_keep_the_last_repeated_key(pairs in prop::collection::vec(("[ab]", "[xyz]{0,2}"), 0..8)) {
        let op = Operation::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for key in ["a", "b"] {
            let last = pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            prop_assert_eq!(op.get(key), last);
        }
        let _ = Hit::one(op);
    }
}
