//! `--denied-body problem-json` and a rule's `deniedBody`, on the real binary
//! over gRPC: a denial's `raw_body` is the draft's `quota-exceeded` problem
//! and `response_headers_to_add` carries its content type; the policy it
//! names is the one `RateLimit-Policy` names.

mod common;

use common::{desc, request, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use serde_json::{json, Value};

const POLICY: &str = r#"
overrides:
  - label: api
    domain: test
    operation: {key: api}
    creditLimit: 1
    resetSeconds: 1h
  - label: quiet
    domain: test
    operation: {key: quiet}
    creditLimit: 0
    deniedBody: none
  - label: loud
    domain: test
    operation: {key: loud}
    creditLimit: 0
    deniedBody: problem-json
  - domain: test
    operation: {key: nameless}
    creditLimit: 1
    resetSeconds: 60
default: {creditLimit: 10, resetSeconds: 60}
"#;

const OVER: i32 = Code::OverLimit as i32;

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// The problem body of `r`, checked to be the draft's `quota-exceeded`
/// problem with its content type beside it.
fn problem(r: &RateLimitResponse) -> Value {
    assert_eq!(r.overall_code, OVER, "{r:?}");
    assert_eq!(
        header(r, "content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    let body: Value = serde_json::from_slice(&r.raw_body).expect("a JSON body");
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Quota Exceeded");
    assert_eq!(body["status"], 429);
    body
}

/// No body and no content type.
fn bare(r: &RateLimitResponse) {
    assert!(r.raw_body.is_empty(), "{r:?}");
    assert_eq!(header(r, "content-type"), None, "{r:?}");
}

/// The name `RateLimit-Policy` gives (`"api";q=1;w=3600` → `api`).
fn header_policy(r: &RateLimitResponse) -> String {
    let value = header(r, "RateLimit-Policy").expect("RateLimit-Policy");
    value
        .split(';')
        .next()
        .unwrap()
        .trim_matches('"')
        .to_owned()
}

#[tokio::test]
async fn the_flag_gives_denials_a_problem_body_that_a_rule_can_turn_off() {
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--denied-body",
            "problem-json",
            "--rate-limit-headers",
            "draft",
        ],
    );
    let mut client = server.client().await;
    let api = request("test", vec![desc(&[("key", "api")])]);
    // Allowed: statuses and headers only.
    let r = common::ask(&mut client, api.clone()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    bare(&r);

    let r = common::ask(&mut client, api).await;
    let body = problem(&r);
    assert_eq!(body["violated-policies"], json!(["api"]));
    assert_eq!(header_policy(&r), "api");
    let p = &body["policies"][0];
    assert_eq!((&p["policy"], &p["remaining"]), (&json!("api"), &json!(0)));
    let reset = p["reset"].as_u64().expect("reset");
    assert!((3590..=3600).contains(&reset), "{body}");
    assert_eq!(
        body["detail"],
        format!("Quota exceeded for api; retry in {reset} s.")
    );

    // A rule without a label: named as RateLimit-Policy names it.
    let nameless = request("test", vec![desc(&[("key", "nameless")])]);
    common::ask(&mut client, nameless.clone()).await;
    let r = common::ask(&mut client, nameless).await;
    assert_eq!(header_policy(&r), "rule-4");
    assert_eq!(problem(&r)["violated-policies"], json!(["rule-4"]));

    // `deniedBody: none` turns the body off for that rule's denials.
    let r = common::ask(
        &mut client,
        request("test", vec![desc(&[("key", "quiet")])]),
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    bare(&r);
    // Denied by both: only the rule that wants a body is named.
    let both = request(
        "test",
        vec![desc(&[("key", "quiet")]), desc(&[("key", "api")])],
    );
    let r = common::ask(&mut client, both).await;
    assert_eq!(problem(&r)["violated-policies"], json!(["api"]));
}

#[tokio::test]
async fn a_rule_asks_for_the_body_without_the_flag() {
    let server = Server::with_policy(POLICY, "yaml");
    let mut client = server.client().await;
    // Always deny: no reset, so no retry time.
    let r = common::ask(&mut client, request("test", vec![desc(&[("key", "loud")])])).await;
    let body = problem(&r);
    assert_eq!(body["violated-policies"], json!(["loud"]));
    assert_eq!(
        body["policies"],
        json!([{"policy": "loud", "remaining": 0}])
    );
    assert_eq!(body["detail"], "Quota exceeded for loud.");
    // Rules that say nothing follow the flag: no body.
    let api = request("test", vec![desc(&[("key", "api")])]);
    common::ask(&mut client, api.clone()).await;
    let r = common::ask(&mut client, api).await;
    assert_eq!(r.overall_code, OVER);
    bare(&r);
}

#[test]
fn a_denied_body_that_is_not_known_is_refused() {
    let out = std::process::Command::new(common::binary())
        .args(["serve", "--config", "x.yaml", "--denied-body", "html"])
        .output()
        .expect("run divvy");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'html'") && err.contains("problem-json"),
        "{err}"
    );
}
