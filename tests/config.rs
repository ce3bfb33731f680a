//! Config loading: every validation error class, the three syntaxes giving
//! identical decisions, and `divvy check` on the real binary.

mod common;

use common::assert_has;

use std::process::Command;
use std::sync::Arc;

use divvy::config::{load_file, parse_str, ConfigError, Format};
use divvy::limiter::{Hit, Limiter, Request};
use divvy::rules::{Operation, RuleSet};
use divvy::store::MemoryStore;

/// Every message the config produces, one string.
fn errors(text: &str, format: Format) -> String {
    match parse_str(text, format, "policy.test") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn yaml_errors(text: &str) -> String {
    errors(text, Format::Yaml)
}

const DEFAULT: &str = "default: {creditLimit: 1, resetSeconds: 60}\n";

fn with_default(rules: &str) -> String {
    format!("overrides:\n{rules}{DEFAULT}")
}

#[test]
fn unknown_fields_are_errors_in_every_syntax() {
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    creditLimt: 3\n    resetSeconds: 60\n",
    ));
    assert_has(
        &e,
        &[
            "policy.test",
            "rule #1",
            "unknown field `creditLimt`",
            "line 3",
        ],
    );
    let e = errors(
        r#"{"overrides": [{"operation": {"a": "b"}, "creditLimit": 1, "resetSeconds": 1, "lable": "x"}], "default": {"creditLimit": 1, "resetSeconds": 1}}"#,
        Format::Json,
    );
    assert_has(&e, &["rule #1", "unknown field `lable`"]);
    let e = errors(
        "[a=b]\ncreditlimit = 3\n[default]\ncreditLimit = 1\nresetSeconds = 1\n",
        Format::Ini,
    );
    assert_has(&e, &["line 2", "unknown field `creditlimit`"]);
    let e = yaml_errors("overrides: []\ndefault: {creditLimit: 1, resetSeconds: 60}\nextra: 1\n");
    assert_has(&e, &["unknown field `extra`"]);
}

#[test]
fn a_default_rule_is_required_and_must_be_plain() {
    let e =
        yaml_errors("overrides:\n  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n");
    assert_has(&e, &["must end with a default rule"]);
    let e = errors("[a=b]\ncreditLimit = 1\nresetSeconds = 1\n", Format::Ini);
    assert_has(&e, &["must end with a default rule"]);
    let e = yaml_errors("default: {operation: {a: b}, creditLimit: 1, resetSeconds: 1}\n");
    assert_has(&e, &["the default rule (#1)", "empty operation"]);
    let e = yaml_errors("default: {domain: api, creditLimit: 1, resetSeconds: 1}\n");
    assert_has(&e, &["the default rule", "cannot name one"]);
    let e = yaml_errors("default: {matchPolicy: canary, creditLimit: 1, resetSeconds: 1}\n");
    assert_has(&e, &["cannot be a canary"]);
    // In INI the default must be the last section.
    let e = errors(
        "[default]\ncreditLimit = 1\nresetSeconds = 1\n[a=b]\ncreditLimit = 1\nresetSeconds = 1\n",
        Format::Ini,
    );
    assert_has(&e, &["line 4", "[default] section must be the last"]);
}

#[test]
fn numbers_are_checked() {
    let cases = [
        (
            "creditLimit: -1\n    resetSeconds: 60",
            "creditLimit must be a non-negative integer, found -1",
        ),
        ("creditLimit: 1.5\n    resetSeconds: 60", "found 1.5"),
        ("creditLimit: lots\n    resetSeconds: 60", "found `lots`"),
        ("resetSeconds: 60", "creditLimit is required"),
        (
            "creditLimit: 3",
            "resetSeconds is required when creditLimit > 0",
        ),
        (
            "creditLimit: 3\n    resetSeconds: -5",
            "resetSeconds must be",
        ),
        ("creditLimit: 3\n    resetSeconds: 1w", "found `1w`"),
        ("creditLimit: 3\n    resetSeconds: 2.5", "found 2.5"),
    ];
    for (fields, needle) in cases {
        let e = yaml_errors(&with_default(&format!(
            "  - label: n1\n    operation: {{a: b}}\n    {fields}\n"
        )));
        assert_has(&e, &["policy.test", "rule #1 (label n1)", needle]);
    }
    // A whole-number float (divvy JSON files may say 3.0) is a whole number.
    parse_str(
        r#"{"default": {"creditLimit": 3.0, "resetSeconds": 60.0}}"#,
        Format::Json,
        "ok.json",
    )
    .unwrap();
    // Numbers in an operation would be rewritten by YAML: they must be quoted.
    let e = yaml_errors(&with_default(
        "  - operation: {v: 1.10}\n    creditLimit: 1\n    resetSeconds: 1\n",
    ));
    assert_has(
        &e,
        &[
            "rule #1",
            "operation value of `v` is the number 1.1",
            "quote it",
        ],
    );
    // INI numbers are text, parsed strictly.
    let e = errors(
        "[a=b]\ncreditLimit = 3x\nresetSeconds = 1\n[default]\ncreditLimit = 0\n",
        Format::Ini,
    );
    assert_has(&e, &["rule #1 (a=b)", "found `3x`"]);
    // creditLimit 0 needs no window; a positive limit with resetSeconds 0 is always-allow.
    parse_str(&with_default("  - operation: {a: b}\n    creditLimit: 0\n  - operation: {a: c}\n    creditLimit: 5\n    resetSeconds: 0\n"), Format::Yaml, "ok").unwrap();
}

#[test]
fn match_policy_labels_and_domains_are_checked() {
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n    matchPolicy: canery\n",
    ));
    assert_has(
        &e,
        &[
            "rule #1 (a=b)",
            "matchPolicy must be `stop`, `canary` or `shadow`, found `canery`",
        ],
    );
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    label: \"has space\"\n    creditLimit: 1\n    resetSeconds: 1\n",
    ));
    assert_has(&e, &["label `has space` must be 1 to 255 characters"]);
    let long = "x".repeat(256);
    let e = yaml_errors(&with_default(&format!(
        "  - operation: {{a: b}}\n    label: {long}\n    creditLimit: 1\n    resetSeconds: 1\n"
    )));
    assert_has(&e, &["must be 1 to 255 characters"]);
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    label: dup\n    creditLimit: 1\n    resetSeconds: 1\n  - operation: {a: c}\n    label: dup\n    creditLimit: 1\n    resetSeconds: 1\n",
    ));
    assert_has(
        &e,
        &["rule #2 (label dup)", "already used by rule #1 (label dup)"],
    );
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    domain: \"\"\n    creditLimit: 1\n    resetSeconds: 1\n",
    ));
    assert_has(&e, &["domain must not be empty"]);
    let e = yaml_errors(&with_default(
        "  - operation: {a: b}\n    domain: \"a:b\"\n    creditLimit: 1\n    resetSeconds: 1\n",
    ));
    assert_has(&e, &["domain `a:b` must not contain `:`"]);
}

#[test]
fn unreachable_rules_are_reported_with_both_rules() {
    let rule = |op: &str, extra: &str| {
        format!("  - operation: {op}\n    creditLimit: 1\n    resetSeconds: 1\n{extra}")
    };
    // Exact duplicate.
    let e = yaml_errors(&with_default(&(rule("{a: b}", "") + &rule("{a: b}", ""))));
    assert_has(
        &e,
        &["rule #2 (a=b) is unreachable", "earlier stop rule #1 (a=b)"],
    );
    // An earlier broader glob.
    let e = yaml_errors(&with_default(
        &(rule("{path: \"/a/*\"}", "") + &rule("{path: \"/a/b/*\"}", "")),
    ));
    assert_has(
        &e,
        &[
            "rule #2 (path=/a/b/*) is unreachable",
            "rule #1 (path=/a/*)",
        ],
    );
    // An earlier rule whose keys are a subset.
    let e = yaml_errors(&with_default(
        &(rule("{method: GET}", "") + &rule("{method: GET, path: /x}", "")),
    ));
    assert_has(&e, &["rule #2 (method=GET path=/x) is unreachable"]);
    // `*` (present) covers any value of the same key.
    let e = yaml_errors(&with_default(
        &(rule("{ip: \"*\"}", "") + &rule("{ip: 10.0.0.1, x: y}", "")),
    ));
    assert_has(&e, &["rule #2 (ip=10.0.0.1 x=y) is unreachable"]);
    // A catch-all stop rule before the default masks the default: the default is not last in effect.
    let e = yaml_errors(&with_default(&rule("{}", "")));
    assert_has(&e, &["the default rule (#2) is unreachable", "rule #1"]);
    // A broader domain glob masks a narrower domain.
    let e = yaml_errors(&with_default(
        &(rule("{a: b}", "    domain: \"team-*\"\n") + &rule("{a: b}", "    domain: team-blue\n")),
    ));
    assert_has(&e, &["rule #2 (a=b, domain team-blue) is unreachable"]);
    // Every unreachable rule is reported, not just the first.
    let e = yaml_errors(&with_default(
        &(rule("{a: b}", "") + &rule("{a: b}", "") + &rule("{a: b, c: d}", "")),
    ));
    assert_has(
        &e,
        &[
            "rule #2 (a=b) is unreachable",
            "rule #3 (a=b c=d) is unreachable",
        ],
    );
}

#[test]
fn reachable_rules_are_never_rejected() {
    let rule = |op: &str, extra: &str| {
        format!("  - operation: {op}\n    creditLimit: 1\n    resetSeconds: 1\n{extra}")
    };
    let ok = [
        // Canaries never mask.
        rule("{a: b}", "    matchPolicy: canary\n") + &rule("{a: b}", ""),
        // A narrower rule first, the broader one later.
        rule("{path: /a/b}", "") + &rule("{path: \"/a/*\"}", ""),
        // More keys first.
        rule("{a: b, c: d}", "") + &rule("{a: b}", ""),
        // Different domains, or a domain rule before a domain-less one.
        rule("{a: b}", "    domain: api\n") + &rule("{a: b}", "    domain: web\n"),
        rule("{a: b}", "    domain: api\n") + &rule("{a: b}", ""),
        // Globs that overlap without inclusion.
        rule("{p: \"a*\"}", "") + &rule("{p: \"*b\"}", ""),
        rule("{p: \"a*b\"}", "") + &rule("{p: \"a*\"}", ""),
    ];
    for rules in ok {
        let text = with_default(&rules);
        parse_str(&text, Format::Yaml, "ok.yaml").unwrap_or_else(|e| panic!("{text}\n{e}"));
    }
}

#[test]
fn syntax_errors_and_files() {
    assert_has(&yaml_errors("overrides: [\n"), &["policy.test"]);
    assert_has(&yaml_errors("   \n"), &["empty"]);
    assert_has(
        &errors("{\"overrides\": ", Format::Json),
        &["policy.test", "line 1"],
    );
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("policy.toml");
    std::fs::write(&odd, "x").unwrap();
    assert!(matches!(
        load_file(&odd),
        Err(ConfigError::UnknownFormat { .. })
    ));
    let missing = dir.path().join("missing.yaml");
    let e = load_file(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert_has(&e.to_string(), &["missing.yaml", "cannot read"]);
    let bad_utf8 = dir.path().join("bad.yaml");
    std::fs::write(
        &bad_utf8,
        b"default: {creditLimit: 1, resetSeconds: 1, comment: \xff}\n",
    )
    .unwrap();
    assert_has(
        &load_file(&bad_utf8).unwrap_err().to_string(),
        &["bad.yaml", "UTF-8"],
    );
}

#[test]
fn divvy_json_without_extensions_loads() {
    // The original's JSON shape: `actorField: ""` means no actor, default with `operation: {}`.
    let text = r#"{
      "overrides": [
        {"operation": {"method": "GET", "path": "/status"}, "creditLimit": 1000, "resetSeconds": 60, "actorField": "", "comment": "x"},
        {"operation": {"method": "GET", "path": "/pantry/cookies/*", "ip": "*"}, "creditLimit": 3, "resetSeconds": 3600, "actorField": "ip"}
      ],
      "default": {"operation": {}, "creditLimit": 0, "resetSeconds": 0, "actorField": "", "comment": "Default deny!"}
    }"#;
    let policy = parse_str(text, Format::Json, "divvy.json").unwrap();
    assert_eq!(policy.rules.len(), 3);
    assert_eq!(policy.rules[0].first_limit().actor_field, None);
    assert_eq!(
        policy.rules[1].first_limit().actor_field.as_deref(),
        Some("ip")
    );
}

/// Requests covering every rule of config/example.yaml, in both line-protocol and Envoy form.
/// A request: its domain (none for a line-protocol HIT) and its pairs.
type Sample = (Option<&'static str>, Vec<(&'static str, &'static str)>);

fn sample_requests() -> Vec<Sample> {
    let mut out = Vec::new();
    let line: Vec<Vec<(&str, &str)>> = vec![
        vec![("method", "GET"), ("path", "/status")],
        vec![
            ("method", "GET"),
            ("path", "/pantry/cookies/special-cookie"),
            ("ip", "1.1.1.1"),
        ],
        vec![
            ("method", "GET"),
            ("path", "/pantry/cookies/oat"),
            ("ip", "1.1.1.1"),
        ],
        vec![
            ("method", "GET"),
            ("path", "/pantry/cookies/oat"),
            ("ip", "2.2.2.2"),
        ],
        vec![
            ("method", "GET"),
            ("path", "/pantry/jam"),
            ("ip", "1.1.1.1"),
        ],
        vec![("method", "GET"), ("path", "/printer/status")],
        vec![("method", "GET"), ("path", "/printer/supplies")],
        vec![
            ("method", "POST"),
            ("path", "/printer/print"),
            ("user", "ann"),
            ("ip", "3.3.3.3"),
        ],
        vec![
            ("method", "POST"),
            ("path", "/printer/print"),
            ("ip", "3.3.3.3"),
        ],
        vec![("path", "/admin/users")],
        vec![("path", "/login"), ("remote_address", "9.9.9.9")],
        vec![("something", "else")],
    ];
    for _ in 0..7 {
        for pairs in &line {
            out.push((None, pairs.clone()));
            out.push((Some("edge"), pairs.clone()));
        }
        out.push((Some("edge"), vec![("path", "/api/v1/x"), ("user_id", "u1")]));
        out.push((Some("edge"), vec![("remote_address", "8.8.8.8")]));
        out.push((
            Some("edge"),
            vec![("path", "/search"), ("remote_address", "8.8.8.8")],
        ));
    }
    // Bursts on two keys of one customer: the key's burst, then the customer's.
    for key in ["k1", "k2", "k3", "k4"] {
        for _ in 0..90 {
            out.push((
                Some("edge"),
                vec![("path", "/v2/items"), ("api_key", key), ("customer", "c1")],
            ));
        }
    }
    out
}

#[tokio::test]
async fn yaml_json_and_ini_examples_give_identical_decisions() {
    let root = env!("CARGO_MANIFEST_DIR");
    let load =
        |name: &str| load_file(std::path::Path::new(&format!("{root}/config/{name}"))).unwrap();
    let yaml = load("example.yaml");
    let json = load("example.json");
    let ini = load("example.ini");
    // Same rules, field by field (the source file name aside).
    assert_eq!(yaml.rules, json.rules);
    assert_eq!(yaml.rules, ini.rules);
    // One frozen clock: token buckets refill with time, and the three must see the same.
    struct Frozen(std::time::Duration);
    impl divvy::store::memory::Clock for Frozen {
        fn now(&self) -> std::time::Duration {
            self.0
        }
    }
    let clock = Arc::new(Frozen(std::time::Duration::from_secs(1_700_000_000)));
    let limiters: Vec<Limiter> = [yaml, json, ini]
        .into_iter()
        .map(|p| {
            Limiter::new(
                RuleSet::new(p),
                Arc::new(MemoryStore::with_clock(clock.clone())),
            )
        })
        .collect();
    let mut transcripts = vec![Vec::new(); 3];
    for (domain, pairs) in sample_requests() {
        for (limiter, transcript) in limiters.iter().zip(transcripts.iter_mut()) {
            let hit = Hit::one(Operation::from_pairs(pairs.iter().copied()));
            let hits = [hit];
            let verdict = limiter.decide(&Request::hits(domain, &hits)).await.unwrap();
            let d = verdict.into_decisions().expect("decided by divvy rules");
            let item = &d.items[0];
            transcript.push((
                item.decider.rule,
                item.decider.allowed,
                item.decider.remaining,
                item.decider.counter_key.clone(),
                item.canaries
                    .iter()
                    .map(|c| (c.rule, c.allowed))
                    .collect::<Vec<_>>(),
            ));
        }
    }
    assert_eq!(transcripts[0], transcripts[1]);
    assert_eq!(transcripts[0], transcripts[2]);
    // And the transcript is not trivial: denials happened, and several rules decided.
    assert!(transcripts[0].iter().any(|t| !t.1));
    let deciders: std::collections::BTreeSet<usize> = transcripts[0].iter().map(|t| t.0).collect();
    assert!(deciders.len() >= 12, "{deciders:?}");
    // The API rule: 80 per key (its burst), then the customer's 240 in all.
    let api: Vec<bool> = transcripts[0][transcripts[0].len() - 360..]
        .iter()
        .map(|t| t.1)
        .collect();
    let per_key: Vec<usize> = api
        .chunks(90)
        .map(|c| c.iter().filter(|a| **a).count())
        .collect();
    assert_eq!(per_key, vec![80, 80, 80, 0]);
}

#[test]
fn check_command_lists_every_error_or_summarises() {
    let out = Command::new(common::binary())
        .args([
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.yaml"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_has(
        &text,
        &[
            "OK, 15 rules",
            "token bucket 40 per 1s, burst 80 + token bucket 120 per 1s, burst 240",
            "sliding 30 per 60s",
            "cookies-per-ip",
            "edge-login",
            "always deny",
        ],
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "overrides:\n  - operation: {a: b}\n    creditLimit: -1\n  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n    matchPolicy: nope\n",
    )
    .unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert_has(
        &text,
        &[
            "bad.yaml",
            "must end with a default rule",
            "rule #1 (a=b): creditLimit must be a non-negative integer",
            "rule #3 (a=b): matchPolicy must be",
        ],
    );
}

#[test]
fn explain_command_names_rule_canaries_and_counter() {
    let out = Command::new(common::binary())
        .args([
            "explain",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.ini"),
            "method=GET",
            "path=/pantry/cookies/special-cookie",
            "ip=192.168.1.1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_has(
        &text,
        &[
            "decides: rule #3 (label cookies-per-ip)",
            "divvy:ip=* method=GET path=/pantry/cookies/*:192.168.1.1:3:3600",
            "canary:  rule #2 (label special-cookie-canary)",
        ],
    );
}

#[test]
fn fair_share_is_read_in_every_syntax_and_checked() {
    use std::time::Duration;
    let fair = |text: &str, format: Format| {
        let policy = parse_str(text, format, "fair").unwrap_or_else(|e| panic!("{text}\n{e}"));
        policy.rules[0]
            .limits
            .iter()
            .map(|l| l.fair_share.clone())
            .collect::<Vec<_>>()
    };
    let short = fair(
        &with_default("  - operation: {site: p, user: '*'}\n    creditLimit: 100\n    resetSeconds: 1\n    fairShare: user\n"),
        Format::Yaml,
    );
    let f = short[0].clone().unwrap_or_else(|| panic!("no fairShare"));
    assert_eq!(
        (f.by.as_str(), f.idle, f.max_actors),
        ("user", Duration::from_secs(5), 10_000)
    );
    let long = fair(
        &with_default("  - operation: {site: p, user: '*'}\n    limits:\n      - {creditLimit: 100, resetSeconds: 1, fairShare: {by: user, idle: 500ms, maxActors: 7}}\n      - {creditLimit: 1000, resetSeconds: 60}\n"),
        Format::Yaml,
    );
    let f = long[0].clone().unwrap_or_else(|| panic!("no fairShare"));
    assert_eq!((f.idle, f.max_actors), (Duration::from_millis(500), 7));
    assert!(long[1].is_none());
    let json = fair(
        r#"{"overrides": [{"operation": {"site": "p", "user": "*"}, "creditLimit": 10, "resetSeconds": 1, "fairShare": {"by": "user"}}], "default": {"creditLimit": 1, "resetSeconds": 60}}"#,
        Format::Json,
    );
    assert_eq!(json[0].as_ref().map(|f| f.by.as_str()), Some("user"));
    let ini = fair(
        "[site=p user=*]\ncreditLimit = 10\nresetSeconds = 1\nfairShare = user\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
        Format::Ini,
    );
    assert_eq!(ini[0].as_ref().map(|f| f.by.as_str()), Some("user"));
    let ini = fair(
        "[site=p user=*]\nlimits.1.creditLimit = 10\nlimits.1.resetSeconds = 1\nlimits.1.fairShare = user\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
        Format::Ini,
    );
    assert_eq!(ini[0].as_ref().map(|f| f.by.as_str()), Some("user"));

    let rule =
        |extra: &str| with_default(&format!("  - operation: {{site: p, user: '*'}}\n{extra}"));
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 10\n    resetSeconds: 1\n    fairShare: team\n",
        )),
        &["fairShare key `team` is not a key of the rule's operation (site, user)"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 0\n    resetSeconds: 1\n    fairShare: user\n",
        )),
        &["fairShare needs a limit to share"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 10\n    resetSeconds: 0\n    fairShare: user\n",
        )),
        &["fairShare needs a limit to share"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 10\n    resetSeconds: 1\n    fairShare: {by: user, maxActors: 0}\n",
        )),
        &["fairShare.maxActors must be an integer from 1 to 1000000, found 0"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 10\n    resetSeconds: 1\n    fairShare: {by: user, idle: abc}\n",
        )),
        &["fairShare.idle must be a duration from 100ms to 1h (such as 5s), found abc"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    creditLimit: 10\n    resetSeconds: 1\n    fairShare: {by: user, every: 1s}\n",
        )),
        &["unknown field `every`"],
    );
    assert_has(
        &yaml_errors(&rule(
            "    limits:\n      - {creditLimit: 10, resetSeconds: 1}\n    fairShare: user\n",
        )),
        &["`fairShare` cannot stand beside `limits`"],
    );
}

#[test]
fn denied_body_is_read_in_every_syntax_and_checked() {
    use divvy::config::DeniedBody;
    let first = |text: &str, format: Format| {
        let policy = parse_str(text, format, "body").unwrap_or_else(|e| panic!("{text}\n{e}"));
        (policy.rules[0].denied_body, policy.rules[1].denied_body)
    };
    let yaml = first(
        &with_default("  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n    deniedBody: problem-json\n"),
        Format::Yaml,
    );
    assert_eq!(yaml, (Some(DeniedBody::ProblemJson), None));
    let json = first(
        r#"{"overrides": [{"operation": {"a": "b"}, "creditLimit": 1, "resetSeconds": 1, "deniedBody": "none"}], "default": {"creditLimit": 1, "resetSeconds": 60, "deniedBody": "problem-json"}}"#,
        Format::Json,
    );
    assert_eq!(
        json,
        (Some(DeniedBody::None), Some(DeniedBody::ProblemJson))
    );
    let ini = first(
        "[a=b]\ncreditLimit = 1\nresetSeconds = 1\ndeniedBody = problem-json\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
        Format::Ini,
    );
    assert_eq!(ini, (Some(DeniedBody::ProblemJson), None));

    assert_has(
        &yaml_errors(&with_default(
            "  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n    deniedBody: html\n",
        )),
        &[
            "rule #1 (a=b)",
            "deniedBody must be `none` or `problem-json`, found `html`",
        ],
    );
    assert_has(
        &errors(
            "[a=b]\ncreditLimit = 1\nresetSeconds = 1\ndeniedBody = problem_json\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
            Format::Ini,
        ),
        &["deniedBody must be `none` or `problem-json`, found `problem_json`"],
    );
}

#[test]
fn overdraft_is_read_in_every_syntax_and_checked() {
    let overdrafts = |text: &str, format: Format| {
        let policy = parse_str(text, format, "over").unwrap_or_else(|e| panic!("{text}\n{e}"));
        policy
            .rules
            .iter()
            .map(|r| r.limits.iter().map(|l| l.overdraft).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let yaml = overdrafts(
        &with_default("  - operation: {a: b}\n    creditLimit: 1000\n    resetSeconds: 1h\n    overdraft: true\n  - operation: {a: c}\n    limits:\n      - {creditLimit: 10, resetSeconds: 1, overdraft: true}\n      - {creditLimit: 1000, resetSeconds: 1h, algorithm: token_bucket}\n"),
        Format::Yaml,
    );
    assert_eq!(yaml, [vec![true], vec![true, false], vec![false]]);
    let policy = parse_str(
        &with_default("  - operation: {a: b}\n    creditLimit: 1000\n    resetSeconds: 1h\n    overdraft: true\n"),
        Format::Yaml,
        "over",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        policy.rules[0].limits[0].describe(),
        "1000 per 3600s, overdraft"
    );
    let json = overdrafts(
        r#"{"overrides": [{"operation": {"a": "b"}, "creditLimit": 1, "resetSeconds": 1, "overdraft": false}], "default": {"creditLimit": 1, "resetSeconds": 60, "overdraft": true}}"#,
        Format::Json,
    );
    assert_eq!(json, [vec![false], vec![true]]);
    let ini = overdrafts(
        "[a=b]\ncreditLimit = 1\nresetSeconds = 1\noverdraft = true\n[a=c]\nlimits.1.creditLimit = 5\nlimits.1.resetSeconds = 1\nlimits.2.creditLimit = 9\nlimits.2.resetSeconds = 9\nlimits.2.overdraft = true\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
        Format::Ini,
    );
    assert_eq!(ini, [vec![true], vec![false, true], vec![false]]);

    assert_has(
        &yaml_errors(&with_default(
            "  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 1\n    overdraft: yes please\n",
        )),
        &["rule #1 (a=b)", "overdraft must be true or false, found `yes please`"],
    );
    assert_has(
        &yaml_errors(&with_default(
            "  - operation: {a: b}\n    limits:\n      - {creditLimit: 1, resetSeconds: 1, overdraft: 1}\n",
        )),
        &["limits[0].overdraft must be true or false, found 1"],
    );
    assert_has(
        &errors(
            "[a=b]\ncreditLimit = 1\nresetSeconds = 1\noverdraft = on\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
            Format::Ini,
        ),
        &["overdraft must be true or false, found `on`"],
    );
    assert_has(
        &yaml_errors(&with_default(
            "  - operation: {a: b}\n    overdraft: true\n    limits:\n      - {creditLimit: 1, resetSeconds: 1}\n",
        )),
        &["`overdraft` cannot stand beside `limits`; set it on each limit"],
    );
}

#[test]
fn match_policy_shadow_is_accepted_in_every_syntax() {
    let texts = [
        (
            "overrides:\n  - operation: {a: b}\n    matchPolicy: shadow\n    creditLimit: 1\n    resetSeconds: 60\ndefault: {creditLimit: 1, resetSeconds: 60}\n",
            Format::Yaml,
        ),
        (
            r#"{"overrides": [{"operation": {"a": "b"}, "matchPolicy": "shadow", "creditLimit": 1, "resetSeconds": 60}], "default": {"creditLimit": 1, "resetSeconds": 60}}"#,
            Format::Json,
        ),
        (
            "[a=b]\nmatchPolicy = shadow\ncreditLimit = 1\nresetSeconds = 60\n[default]\ncreditLimit = 1\nresetSeconds = 60\n",
            Format::Ini,
        ),
    ];
    for (text, format) in texts {
        let policy = parse_str(text, format, "policy.test").expect("shadow is a matchPolicy");
        assert_eq!(policy.rules[0].match_policy.as_str(), "shadow");
    }
    // A shadow rule decides as a stop rule: a later rule it covers is unreachable.
    let e = yaml_errors(&with_default(
        "  - operation: {a: \"*\"}\n    matchPolicy: shadow\n    creditLimit: 1\n    resetSeconds: 60\n  - operation: {a: b}\n    creditLimit: 1\n    resetSeconds: 60\n",
    ));
    assert_has(&e, &["unreachable"]);
    // `divvy check` counts it apart, `divvy explain` says it never denies.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(&path, texts[0].0).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(common::binary())
            .args(args)
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    assert_has(
        &run(&["check"]),
        &["(0 stop, 0 canary, 1 shadow, 1 default)"],
    );
    let explained = Command::new(common::binary())
        .args(["explain"])
        .arg(&path)
        .arg("a=b")
        .output()
        .unwrap();
    assert_has(
        &String::from_utf8_lossy(&explained.stdout),
        &["(shadow: never denies"],
    );
}
