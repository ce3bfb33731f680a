//! The algorithm fields of the policy: every validation error names the
//! file, the rule and the field; INI takes the same keys; `divvy check`,
//! `divvy explain` and `/config` show each limit.

mod common;

use common::assert_has;

use std::process::Command;

use divvy::config::{parse_str, Format};
use divvy::store::{Algorithm, Charge};

fn errors(text: &str, format: Format) -> String {
    match parse_str(text, format, "policy.test") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn yaml(rules: &str) -> String {
    format!("overrides:\n{rules}default: {{creditLimit: 1, resetSeconds: 60}}\n")
}

/// Asserts that the YAML policy with `rules` is refused with every one of
/// `messages`.
fn refused(rules: &str, messages: &[&str]) {
    assert_has(&errors(&yaml(rules), Format::Yaml), messages);
}

#[test]
fn algorithm_and_burst_are_checked() {
    refused(
        "  - operation: {a: b}\n    label: x\n    creditLimit: 3\n    resetSeconds: 1\n    algorithm: leaky\n",
        &[
            "policy.test: rule #1 (label x): algorithm must be one of window, fixed, sliding, token_bucket; found `leaky`",
        ],
    );
    refused(
        "  - operation: {a: b}\n    creditLimit: 3\n    resetSeconds: 1\n    algorithm: fixed\n    burst: 5\n",
        &[
            "rule #1 (a=b): burst applies only to algorithm token_bucket (this limit's algorithm is fixed)",
        ],
    );
    // burst without an algorithm: the default window takes no burst either.
    refused(
        "  - operation: {a: b}\n    creditLimit: 3\n    resetSeconds: 1\n    burst: 5\n",
        &["burst applies only to algorithm token_bucket"],
    );
    for bad in ["0", "-1", "1.5", "many"] {
        refused(
            &format!("  - operation: {{a: b}}\n    creditLimit: 3\n    resetSeconds: 1\n    algorithm: token_bucket\n    burst: {bad}\n"),
            &["rule #1 (a=b): burst must be an integer of at least 1"],
        );
    }
    // Products the scripts could not count exactly are refused.
    refused(
        "  - operation: {a: b}\n    creditLimit: 1000000000000\n    resetSeconds: 1d\n    algorithm: sliding\n",
        &["creditLimit × resetSeconds is too large for the sliding algorithm"],
    );
}

#[test]
fn limits_are_checked_with_their_index() {
    refused(
        "  - operation: {a: b}\n    label: api\n    limits: []\n",
        &["policy.test: rule #1 (label api): `limits` is empty"],
    );
    refused(
        "  - operation: {a: b}\n    creditLimit: 3\n    resetSeconds: 1\n    limits:\n      - {creditLimit: 1, resetSeconds: 1}\n",
        &[
            "rule #1 (a=b): `creditLimit` cannot stand beside `limits`",
            "rule #1 (a=b): `resetSeconds` cannot stand beside `limits`",
        ],
    );
    refused(
        "  - operation: {a: b}\n    actorField: ip\n    limits:\n      - {creditLimit: 1, resetSeconds: 1}\n",
        &["`actorField` cannot stand beside `limits`; set it on each limit"],
    );
    refused(
        "  - operation: {a: b}\n    limits:\n      - {creditLimit: 1, resetSeconds: 1}\n      - {creditLimit: 2, resetSeconds: 1, algorithm: nope}\n      - {resetSeconds: 1, algorithm: token_bucket, burst: 0}\n",
        &[
            "rule #1 (a=b): limits[1].algorithm must be one of window, fixed, sliding, token_bucket; found `nope`",
            "rule #1 (a=b): limits[2].creditLimit is required",
            "rule #1 (a=b): limits[2].burst must be an integer of at least 1",
        ],
    );
    refused(
        "  - operation: {a: b}\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, actorField: k}\n      - {creditLimit: 1, resetSeconds: 1, actorField: k}\n",
        &["limits[1] counts exactly what limits[0] counts"],
    );
    // Limit labels share the rules' label namespace.
    refused(
        "  - operation: {a: b}\n    label: api\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, label: api}\n",
        &["label api is already used by another label of this rule"],
    );
    refused(
        "  - operation: {a: b}\n    label: one\n    creditLimit: 1\n    resetSeconds: 1\n  - operation: {a: c}\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, label: one}\n",
        &["rule #2 (a=c): label one is already used by rule #1 (label one)"],
    );
    refused(
        "  - operation: {a: b}\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, label: \"bad label\"}\n",
        &["limits[0].label `bad label` must be 1 to 255 characters"],
    );
    // Unknown fields in a limit are errors with their path.
    let e = errors(
        r#"{"overrides": [{"operation": {"a": "b"}, "limits": [{"creditLimit": 1, "resetSeconds": 1, "rate": 3}]}], "default": {"creditLimit": 1, "resetSeconds": 1}}"#,
        Format::Json,
    );
    assert_has(
        &e,
        &["rule #1", "overrides[0].limits[0]", "unknown field `rate`"],
    );
}

#[test]
fn charge_is_each_or_all_or_nothing() {
    let e = errors(
        "charge: some\ndefault: {creditLimit: 1, resetSeconds: 1}\n",
        Format::Yaml,
    );
    assert_has(
        &e,
        &["charge must be `each` or `all-or-nothing`, found `some`"],
    );
    let p = parse_str(
        "charge: all-or-nothing\ndefault: {creditLimit: 1, resetSeconds: 1}\n",
        Format::Yaml,
        "p.yaml",
    )
    .unwrap();
    assert_eq!(p.charge, Charge::AllOrNothing);
    let p = parse_str(
        "default: {creditLimit: 1, resetSeconds: 1}\n",
        Format::Yaml,
        "p.yaml",
    )
    .unwrap();
    assert_eq!(p.charge, Charge::Each);
}

#[test]
fn ini_and_json_take_the_same_keys_as_yaml() {
    let yaml_text = r#"
charge: all-or-nothing
overrides:
  - operation: {path: "/api/*"}
    label: api
    limits:
      - {creditLimit: 40, resetSeconds: 1, algorithm: token_bucket, burst: 80, actorField: key, label: per-key}
      - {creditLimit: 120, resetSeconds: 1s, actorField: customer}
  - operation: {path: /s}
    creditLimit: 5
    resetSeconds: 1m
    algorithm: sliding
default: {creditLimit: 10, resetSeconds: 60, algorithm: fixed}
"#;
    let ini_text = "charge = all-or-nothing\n\
        [path=/api/*]\nlabel = api\n\
        limits.1.creditLimit = 40\nlimits.1.resetSeconds = 1\nlimits.1.algorithm = token_bucket\n\
        limits.1.burst = 80\nlimits.1.actorField = key\nlimits.1.label = per-key\n\
        limits.2.creditLimit = 120\nlimits.2.resetSeconds = 1s\nlimits.2.actorField = customer\n\
        [path=/s]\ncreditLimit = 5\nresetSeconds = 1m\nalgorithm = sliding\n\
        [default]\ncreditLimit = 10\nresetSeconds = 60\nalgorithm = fixed\n";
    let json_text = r#"{"charge": "all-or-nothing", "overrides": [
        {"operation": {"path": "/api/*"}, "label": "api", "limits": [
            {"creditLimit": 40, "resetSeconds": 1, "algorithm": "token_bucket", "burst": 80, "actorField": "key", "label": "per-key"},
            {"creditLimit": 120, "resetSeconds": "1s", "actorField": "customer"}]},
        {"operation": {"path": "/s"}, "creditLimit": 5, "resetSeconds": "1m", "algorithm": "sliding"}],
        "default": {"creditLimit": 10, "resetSeconds": 60, "algorithm": "fixed"}}"#;
    let y = parse_str(yaml_text, Format::Yaml, "p").unwrap();
    let i = parse_str(ini_text, Format::Ini, "p").unwrap();
    let j = parse_str(json_text, Format::Json, "p").unwrap();
    assert_eq!(y, i);
    assert_eq!(y, j);
    let api = &y.rules[0];
    assert!(api.multi);
    assert_eq!(api.limits.len(), 2);
    assert_eq!(api.limits[0].algorithm, Algorithm::TokenBucket);
    assert_eq!(api.limits[0].burst, 80);
    // burst defaults to the limit.
    assert_eq!(api.limits[1].burst, 120);
    assert_eq!(api.limits[1].algorithm, Algorithm::Window);
    assert_eq!(y.rules[1].first_limit().algorithm, Algorithm::Sliding);
    assert_eq!(y.rules[2].first_limit().algorithm, Algorithm::Fixed);
    // INI errors carry their line.
    let e = errors("[a=b]\nlimits.1.creditLimit = 1\nlimits.3.creditLimit = 1\n[default]\ncreditLimit=1\nresetSeconds=1\n", Format::Ini);
    assert_has(&e, &["line 3", "limits are numbered in order from 1"]);
    let e = errors("[a=b]\ncreditLimit = 1\nresetSeconds = 1\nalgorithm = nope\n[default]\ncreditLimit=1\nresetSeconds=1\n", Format::Ini);
    assert_has(&e, &["rule #1 (a=b): algorithm must be one of"]);
}

const POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*"}
    label: api
    limits:
      - {creditLimit: 40, resetSeconds: 1, algorithm: token_bucket, burst: 80, actorField: key, label: per-key}
      - {creditLimit: 120, resetSeconds: 1, algorithm: token_bucket, actorField: customer, label: per-customer}
default: {creditLimit: 10, resetSeconds: 1h, algorithm: sliding}
"#;

#[test]
fn check_and_explain_show_every_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_has(
        &text,
        &[
            "token bucket 40 per 1s, burst 80 + token bucket 120 per 1s, burst 120",
            "key + customer",
            "sliding 10 per 3600s",
        ],
    );
    let out = Command::new(common::binary())
        .arg("explain")
        .arg(&path)
        .args(["path=/api/x", "key=k1", "customer=c1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_has(
        &text,
        &[
            "2 limits, all must allow",
            "[per-key] token bucket 40 per 1s, burst 80; counter divvy:path=/api/*:key=k1:40:1:token_bucket",
            "[per-customer] token bucket 120 per 1s, burst 120; counter divvy:path=/api/*:customer=c1:120:1:token_bucket",
        ],
    );
}

#[test]
fn config_and_explain_endpoints_show_every_limit() {
    let server = common::Server::with_policy(POLICY, "yaml");
    let (status, text) = server.http("GET", "/config", "");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let limits = &v["rules"][0]["limits"];
    assert_eq!(limits.as_array().unwrap().len(), 2);
    assert_eq!(limits[0]["algorithm"], "token_bucket");
    assert_eq!(limits[0]["burst"], 80);
    assert_eq!(limits[1]["label"], "per-customer");
    assert_eq!(v["rules"][1]["algorithm"], "sliding");
    assert_eq!(v["charge"], "each");
    // Spend 3 of the key's credits, then explain: the counters show it.
    let answers = server.line_exchange(b"HIT path=/api/x key=k1 customer=c1\nHIT path=/api/x key=k1 customer=c1\nHIT path=/api/x key=k1 customer=c1\n");
    assert_eq!(answers.lines().count(), 3);
    let (status, text) = server.http("GET", "/explain?path=/api/x&key=k1&customer=c1", "");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let limits = &v["decider"]["limits"];
    assert_eq!(
        limits[0]["counterKey"],
        "divvy:path=/api/*:key=k1:40:1:token_bucket"
    );
    // Refill may have given back at most a credit or two since.
    let key_left = limits[0]["counter"]["remaining"].as_u64().unwrap();
    assert!((77..=80).contains(&key_left), "{key_left}");
    let customer_left = limits[1]["counter"]["remaining"].as_u64().unwrap();
    assert!((117..=120).contains(&customer_left), "{customer_left}");
}
