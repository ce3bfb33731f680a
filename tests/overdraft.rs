//! `overdraft: true` on the real binary over gRPC, on the memory store, one
//! Redis and a Redis Cluster: a check-only call (a descriptor's
//! `hits_addend` 0) before each request and a charge after it; a charge
//! larger than what is left is applied in full, leaving a debt; another
//! user's counter is untouched; a denied group (a rule of several limits)
//! takes no debt; `divvy_overdraft_charged_total` counts what each rule
//! charged past what was left; a `scope: global` overdraft limit charges
//! its region's lease past what is left and its refill pays the debt back.

mod common;

use common::redis::{Cluster, Redis};
use common::{desc, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use std::time::Instant;

const POLICY: &str = r#"
overrides:
  - domain: od
    label: tokens
    operation: {user: '*'}
    actorField: user
    creditLimit: 1000
    resetSeconds: 1h
    overdraft: true
  - domain: od
    label: team-tokens
    operation: {team: '*'}
    limits:
      - {creditLimit: 1000, resetSeconds: 1h, overdraft: true, actorField: team}
      - {creditLimit: 100000, resetSeconds: 1h, algorithm: fixed, actorField: team}
default: {creditLimit: 1, resetSeconds: 60}
"#;

/// The store a server counts in; its Redis processes live as long as it.
enum Store {
    Memory,
    Redis(Redis),
    Cluster(Cluster),
}

impl Store {
    fn serve(&self) -> Server {
        let url = match self {
            Store::Memory => return Server::with_policy(POLICY, "yaml"),
            Store::Redis(r) => r.url(),
            Store::Cluster(c) => c.url(),
        };
        let args = ["--redis-url", &url, "--on-store-failure", "deny"];
        Server::with_policy_args(POLICY, "yaml", &args)
    }
}

/// `key=value` with its own `hits_addend` (0: check only).
fn hits(key: &str, value: &str, n: u64) -> RateLimitDescriptor {
    let mut d = desc(&[(key, value)]);
    d.hits_addend = Some(UInt64Value { value: n });
    d
}

/// `key=value` giving `n` credits back.
fn refund(key: &str, value: &str, n: u64) -> RateLimitDescriptor {
    let mut d = hits(key, value, n);
    d.is_negative_hits = true;
    d
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// One descriptor's answer: its code and the credits left.
async fn send(server: &Server, d: RateLimitDescriptor) -> (i32, u32) {
    common::one_status(server, "od", d).await
}

/// The debt `GET /explain` shows on the counter of `key=value`.
fn debt(server: &Server, key: &str, value: &str) -> u64 {
    let (status, body) = server.http("GET", &format!("/explain?domain=od&{key}={value}"), "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["decider"]["limits"][0]["counter"]["debt"]
        .as_u64()
        .unwrap_or_else(|| panic!("no debt in {body}"))
}

/// The acceptance sequences of issue 54, then a group's debt.
async fn scenario(store: Store) {
    let server = store.serve();
    // A check before each request, a charge of 300 after it.
    let mut checks = Vec::new();
    for _ in 0..6 {
        let (code, _) = send(&server, hits("user", "alice", 0)).await;
        checks.push(code);
        if code == OK {
            assert_eq!(send(&server, hits("user", "alice", 300)).await.0, OK);
        }
    }
    assert_eq!(checks, [OK, OK, OK, OK, OVER, OVER]);
    // In debt (200): nothing left, and `GET /explain` shows the debt.
    assert_eq!(send(&server, hits("user", "alice", 0)).await, (OVER, 0));
    assert_eq!(debt(&server, "user", "alice"), 200);
    // A first charge of 2,500: allowed, then denied; another user untouched.
    assert_eq!(send(&server, hits("user", "bob", 2500)).await, (OK, 0));
    assert_eq!(send(&server, hits("user", "bob", 0)).await.0, OVER);
    assert_eq!(send(&server, hits("user", "bob", 1)).await.0, OVER);
    assert_eq!(send(&server, hits("user", "carol", 0)).await, (OK, 1000));
    // Bob's debt is 1,501 (the denied hit of 1 was charged on its own):
    // 1,600 given back leaves 99.
    assert_eq!(debt(&server, "user", "bob"), 1501);
    assert_eq!(debt(&server, "user", "carol"), 0);
    assert_eq!(send(&server, refund("user", "bob", 1600)).await, (OK, 99));

    // A rule of two limits: 2,500 overdraws the first (a debt of 1,500).
    assert_eq!(send(&server, hits("team", "red", 2500)).await.0, OK);
    // Denied by the first limit: the group charges nothing, not even the
    // second limit, so no debt is added.
    assert_eq!(send(&server, hits("team", "red", 300)).await.0, OVER);
    // 1,600 given back leaves the first limit 100: admitted again.
    assert_eq!(send(&server, refund("team", "red", 1600)).await.0, OK);
    assert_eq!(send(&server, hits("team", "red", 0)).await.0, OK);

    // Past what was left: alice 200, bob 1,500 then 1; the team 1,500.
    let samples = server.metric_samples();
    let past = |rule: &str| {
        samples
            .get(&format!("divvy_overdraft_charged_total{{rule=\"{rule}\"}}"))
            .copied()
    };
    assert_eq!(past("tokens"), Some(1701.0), "{samples:?}");
    assert_eq!(past("team-tokens"), Some(1500.0), "{samples:?}");
    // Each rule's configured limit, for dashboards.
    let limit = samples.get("divvy_rule_limit{rule=\"tokens\"}").copied();
    let window = samples
        .get("divvy_rule_limit_window_seconds{rule=\"tokens\"}")
        .copied();
    assert_eq!((limit, window), (Some(1000.0), Some(3600.0)), "{samples:?}");

    // The dashboard's rule page: the same figure, and the counters last
    // overdrawn (bob's most recent, paid back by the refund) with their debts.
    let (status, body) = server.http("GET", "/api/v1/rules/tokens", "");
    assert_eq!(status, 200, "{body}");
    let rule: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let od = &rule["overdraft"];
    assert_eq!(od["chargedPastLeft"], 1701, "{body}");
    let debts: Vec<(String, u64)> = od["counters"]
        .as_array()
        .unwrap_or_else(|| panic!("no counters in {body}"))
        .iter()
        .map(|c| {
            let key = c["counterKey"].as_str().unwrap_or_default().to_owned();
            (key, c["debt"].as_u64().unwrap_or(u64::MAX))
        })
        .collect();
    assert_eq!(debts.len(), 2, "{body}");
    assert!(debts[0].0.contains("bob") && debts[0].1 == 0, "{body}");
    assert!(debts[1].0.contains("alice") && debts[1].1 == 200, "{body}");
}

#[tokio::test]
async fn memory() {
    scenario(Store::Memory).await;
}

#[tokio::test]
async fn redis() {
    scenario(Store::Redis(Redis::start())).await;
}

/// A `scope: global` overdraft limit: usage is charged against the
/// region's lease (a token bucket at the lease's rate), past what is left,
/// and the debt is paid back by the lease's refill.
#[tokio::test]
async fn a_global_limit_charges_its_lease_past_what_is_left() {
    const GLOBAL: &str = r#"
overrides:
  - {domain: od, label: global-tokens, operation: {site: '*'}, actorField: site, scope: global,
     algorithm: token_bucket, creditLimit: 100, resetSeconds: 1, burst: 100, overdraft: true}
default: {creditLimit: 1, resetSeconds: 60}
"#;
    let global = Redis::start();
    let url = global.url();
    let args = [
        "--global-url",
        &url,
        "--global-lease-ms",
        "1000",
        "--region",
        "r1",
    ];
    let server = Server::with_policy_args(GLOBAL, "yaml", &args);
    // Wait for a lease of the whole rate (the only region), checking only.
    let start = std::time::Instant::now();
    while send(&server, hits("site", "a", 0)).await != (OK, 100) {
        assert!(start.elapsed().as_secs() < 15, "no full lease after 15 s");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // 450 charged on a lease of 100 (burst 100): admitted, a debt of 350.
    assert_eq!(send(&server, hits("site", "a", 450)).await, (OK, 0));
    let charged = Instant::now();
    assert_eq!(send(&server, hits("site", "a", 0)).await.0, OVER);
    let samples = server.metric_samples();
    let past = samples.get("divvy_overdraft_charged_total{rule=\"global-tokens\"}");
    assert_eq!(past.copied(), Some(350.0), "{samples:?}");
    // The refill (100/s) pays the debt back in 3.5 s, then something is left.
    while send(&server, hits("site", "a", 0)).await.0 != OK {
        assert!(
            charged.elapsed().as_secs() < 15,
            "the debt was never paid back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let waited = charged.elapsed().as_secs_f64();
    println!("a debt of 350 on a lease of 100/s was paid back after {waited:.2} s");
    assert!(waited >= 3.0, "paid back too soon: {waited:.2} s");
}

#[tokio::test]
async fn cluster() {
    scenario(Store::Cluster(Cluster::start(3))).await;
}
