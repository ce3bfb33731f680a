//! RLQS usage reports on an `overdraft: true` limit, against the real
//! binary (memory store) over real gRPC streams.
//!
//! What the code does: a usage report charges no counter at all. The hub
//! (src/server/rlqs/hub.rs) takes a report's allowed and denied counts as
//! demand (requests per second) and as `divvy_rlqs_reported_total`; each
//! assignment is the deciding limit's rate (`Limiter::bucket_limit`, which
//! reads rules and knobs, never a counter) divided among the streams. So
//! overdraft does not apply to RLQS: a report far past what is left takes
//! no debt (`GET /explain` shows none, `divvy_overdraft_charged_total`
//! counts nothing), the assignment is the whole limit's token bucket, the
//! same as a rule without overdraft gets, and a debt taken through
//! ShouldRateLimit does not shrink it either (docs/rlqs.md: "RLQS shares
//! and ShouldRateLimit counters are separate").

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{desc, Server};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::r#type::v3::TokenBucket;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value;

/// Two rules of 1,000 an hour per actor, one with overdraft, one without.
const POLICY: &str = r#"
overrides:
  - {domain: od, label: tokens, operation: {user: '*'}, actorField: user,
     creditLimit: 1000, resetSeconds: 1h, overdraft: true}
  - {domain: od, label: plain, operation: {account: '*'}, actorField: account,
     creditLimit: 1000, resetSeconds: 1h}
default: {creditLimit: 1, resetSeconds: 60}
"#;

/// What one report says of each bucket: five times the limit allowed.
const REPORTED: u64 = 5000;

/// A bucket's token bucket by its single `key`, from the actions of `r`.
fn token_buckets(r: &RateLimitQuotaResponse) -> HashMap<String, TokenBucket> {
    let mut out = HashMap::new();
    for a in &r.bucket_action {
        let Some(Action::QuotaAssignmentAction(q)) = &a.bucket_action else {
            continue;
        };
        let strategy = q
            .rate_limit_strategy
            .as_ref()
            .and_then(|s| s.strategy.as_ref());
        let (Some(id), Some(Strategy::TokenBucket(tb))) = (&a.bucket_id, strategy) else {
            continue;
        };
        for key in id.bucket.keys() {
            out.insert(key.clone(), *tb);
        }
    }
    out
}

/// Reads answers until buckets `user` and `account` both have a token
/// bucket; the latest of each.
async fn assignments(
    answers: &mut tonic::Streaming<RateLimitQuotaResponse>,
) -> HashMap<String, TokenBucket> {
    let mut got = HashMap::new();
    while !(got.contains_key("user") && got.contains_key("account")) {
        let next = tokio::time::timeout(Duration::from_secs(10), answers.message()).await;
        let r = match next {
            Ok(Ok(Some(r))) => r,
            other => panic!("no assignment within 10 s: {other:?}; so far {got:?}"),
        };
        got.extend(token_buckets(&r));
    }
    got
}

/// One report of [`REPORTED`] allowed requests on `user=dave` and
/// `account=dave`.
fn report() -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "od".to_owned(),
        bucket_quota_usages: vec![
            common::rlqs::usage("user", "dave", REPORTED, 0),
            common::rlqs::usage("account", "dave", REPORTED, 0),
        ],
    }
}

/// Tokens per second of `tb`.
fn per_second(tb: &TokenBucket) -> f64 {
    let tokens = tb.tokens_per_fill.as_ref().map_or(0, |t| t.value);
    let secs = tb.fill_interval.as_ref().map_or(0, |d| d.seconds);
    f64::from(tokens) / secs.max(1) as f64
}

/// `user=dave`'s counter as `GET /explain` shows it.
fn counter(server: &Server) -> Value {
    let (status, body) = server.http("GET", "/explain?domain=od&user=dave", "");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(v["decider"]["label"], "tokens", "{body}");
    v["decider"]["limits"][0]["counter"].clone()
}

/// A sample of the metrics, 0 when absent.
fn sample(server: &Server, name: &str) -> f64 {
    server.metric_samples().get(name).copied().unwrap_or(0.0)
}

/// A ShouldRateLimit charge of `n` on `user=dave`: its code and what is left.
async fn charge(server: &Server, n: u64) -> (i32, u32) {
    let mut d = desc(&[("user", "dave")]);
    d.hits_addend = Some(UInt64Value { value: n });
    common::one_status(server, "od", d).await
}

#[tokio::test]
async fn rlqs_reports_past_what_is_left_take_no_debt_and_keep_the_whole_rate() {
    let server = Server::with_policy(POLICY, "yaml");
    let (tx, mut answers) = common::rlqs::open_stream(server.grpc).await;
    tx.send(report()).await.expect("send");
    let first = assignments(&mut answers).await;
    // The whole limit as a token bucket: 1,000 tokens, 1,000 an hour.
    let od = &first["user"];
    assert_eq!(od.max_tokens, 1000, "{first:?}");
    let rate = per_second(od);
    assert!(
        (rate - 1000.0 / 3600.0).abs() < 0.01 * 1000.0 / 3600.0,
        "{first:?}"
    );
    assert_eq!(
        first["user"], first["account"],
        "overdraft changes the assignment"
    );

    // A second report: 10,000 reported in all on a limit of 1,000.
    tx.send(report()).await.expect("send");
    let allowed = "divvy_rlqs_reported_total{outcome=\"allowed\",rule=\"tokens\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sample(&server, allowed) < 2.0 * REPORTED as f64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reports were not counted: {:?}",
            server.metric_samples()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sample(&server, allowed), 2.0 * REPORTED as f64);
    let renewed = assignments(&mut answers).await;
    assert_eq!(
        renewed["user"], first["user"],
        "the reports shrank the assignment"
    );

    // No debt: the counter was never charged, and nothing counted past it.
    let c = counter(&server);
    assert_eq!(
        (c["open"].clone(), c["debt"].clone()),
        (false.into(), 0.into()),
        "{c}"
    );
    let past = "divvy_overdraft_charged_total{rule=\"tokens\"}";
    assert_eq!(sample(&server, past), 0.0);
    // ShouldRateLimit charges the untouched counter: 1,000 were left.
    assert_eq!(charge(&server, 300).await, (Code::Ok as i32, 700));

    // A debt taken through ShouldRateLimit stays there: after a recompute
    // (one a second; a changed assignment is pushed at once) and the
    // renewal a report brings, the assignment is still the whole rate.
    assert_eq!(charge(&server, 2500).await, (Code::Ok as i32, 0));
    assert_eq!(counter(&server)["debt"], 1800);
    assert_eq!(sample(&server, past), 1800.0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tx.send(report()).await.expect("send");
    let after_debt = assignments(&mut answers).await;
    assert_eq!(
        after_debt["user"], first["user"],
        "a counter's debt reached RLQS"
    );
}
