//! Usage budgets end to end (issue 54): examples/usage-budgets/ through a
//! real Envoy 1.40 whose upstream reports its usage in `x-usage-tokens`.
//! Check-then-charge: a check-only call on the request path and, when the
//! stream is done, a charge of the reported usage, on the memory store and
//! on Redis (two replicas behind two Envoys, one user's requests
//! alternating); the same answers from an envoyproxy/ratelimit file, in
//! `serve` and in ratelimit mode, also with the descriptors Envoy Gateway's
//! translator writes. Reserve-then-settle: 20 reservations
//! racing at the gRPC level (memory, and Redis through two replicas), then
//! through Envoy.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::envoy::{self, Envoy};
use common::redis::Redis;
use common::{desc, request, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = Code::Ok as i32;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/usage-budgets")
        .join(name)
}

/// An HTTP/1.1 upstream answering 200 to every request with an
/// `x-usage-tokens` header of the request's `x-usage` (the usage a model
/// server would report), on its own thread.
fn usage_upstream() -> u16 {
    envoy::upstream_with("ok", |head| {
        let usage = head.iter().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("x-usage")
                .then(|| v.trim().to_owned())
        });
        usage.map_or(String::new(), |u| format!("x-usage-tokens: {u}\r\n"))
    })
}

/// Envoy on the example bootstrap `name`, asking divvy at `divvy` and
/// forwarding to `upstream`; its listener is `ports[0]`.
fn start_envoy(name: &str, divvy: u16, upstream: u16) -> Envoy {
    envoy::start(
        &example(name),
        9901,
        &[10000],
        &[(8081, divvy), (8088, upstream)],
        &[],
    )
}

/// Envoy on the check-then-charge example in front of `server`, with an
/// upstream of its own.
fn check_then_charge_envoy(server: &Server) -> Envoy {
    start_envoy(
        "envoy-check-then-charge.yaml",
        server.grpc.port(),
        usage_upstream(),
    )
}

/// `user=<user>` with its own `hits_addend` (0: check only).
fn hits(user: &str, n: u64) -> RateLimitDescriptor {
    let mut d = desc(&[("user", user)]);
    d.hits_addend = Some(UInt64Value { value: n });
    d
}

/// `user=<user>` giving `n` back.
fn refund(user: &str, n: u64) -> RateLimitDescriptor {
    let mut d = hits(user, n);
    d.is_negative_hits = true;
    d
}

/// Envoy Gateway's shape: its domain (the listener's) and the route's
/// descriptor entry, then the rule's client selector (`x-user-id`).
const EG_DOMAIN: &str = "default/eg/http";
const EG_ROUTE: &str = "httproute/default/llm/rule/0/match/0/*";

/// A check-only descriptor of `user` in `domain`: `user=<user>`, or in
/// Envoy Gateway's shape the route's entry then `rule-0-match-0=<user>`.
fn check(domain: &str, user: &str) -> RateLimitDescriptor {
    if domain != EG_DOMAIN {
        return hits(user, 0);
    }
    let mut d = desc(&[(EG_ROUTE, EG_ROUTE), ("rule-0-match-0", user)]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    d
}

/// What `user` has left in `domain`, by a check-only call.
async fn left(server: &Server, domain: &str, user: &str) -> u32 {
    let mut client = server.client().await;
    let answer = common::ask(&mut client, request(domain, vec![check(domain, user)])).await;
    answer.statuses[0].limit_remaining
}

/// Waits until `user` has `want` left: Envoy's stream-done call is made
/// after the answer, so the charge lands a moment later.
async fn wait_left(server: &Server, domain: &str, user: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = left(server, domain, user).await;
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{user} has {now} left, not {want}, 10 s after the response"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` requests of `user` whose upstream reports `usage` each, the i-th
/// through `routes[i % len]` (an Envoy listener and the divvy replica to
/// read the budget from); after each 200 the charge is awaited. The
/// statuses.
async fn requests(routes: &[(u16, &Server)], domain: &str, user: &str, usages: &[u32]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for (i, usage) in usages.iter().enumerate() {
        let (port, server) = routes[i % routes.len()];
        let before = left(server, domain, user).await;
        let headers = [("x-user-id", user), ("x-usage", &usage.to_string())];
        let (status, _, body) = envoy::get(port, "/", &headers).expect("an answer through Envoy");
        assert!(status == 200 || status == 429, "{status}: {body}");
        if status == 200 {
            wait_left(server, domain, user, before.saturating_sub(*usage)).await;
        }
        statuses.push(status);
    }
    statuses
}

/// The acceptance sequences of check-then-charge on 1,000 an hour through
/// `routes`: 300 a response, a first usage of 2,500, and a user at 10 a
/// response untouched by the others' debts.
async fn check_then_charge(routes: &[(u16, &Server)]) {
    check_then_charge_in(routes, "budget").await;
}

/// [`check_then_charge`] in `domain`.
async fn check_then_charge_in(routes: &[(u16, &Server)], domain: &str) {
    let server = routes[0].1;
    let alice = requests(routes, domain, "alice", &[300; 6]).await;
    assert_eq!(alice, [200, 200, 200, 200, 429, 429]);
    // 1,200 charged: a debt of 200, nothing left.
    assert_eq!(left(server, domain, "alice").await, 0);
    let bob = requests(routes, domain, "bob", &[2500, 10, 10]).await;
    assert_eq!(bob, [200, 429, 429]);
    let carol = requests(routes, domain, "carol", &[10; 5]).await;
    assert_eq!(carol, [200; 5]);
    assert_eq!(left(server, domain, "carol").await, 950);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_charge_through_envoy_on_memory() {
    let server = Server::start(&example("policy.yaml"), &[]);
    let proxy = check_then_charge_envoy(&server);
    check_then_charge(&[(proxy.ports[0], &server)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_then_charge_through_two_envoys_on_redis() {
    let redis = Redis::start();
    let args = ["--redis-url", &redis.url(), "--on-store-failure", "deny"];
    let a = Server::start(&example("policy.yaml"), &args);
    let b = Server::start(&example("policy.yaml"), &args);
    let upstream = usage_upstream();
    let envoy_a = start_envoy("envoy-check-then-charge.yaml", a.grpc.port(), upstream);
    let envoy_b = start_envoy("envoy-check-then-charge.yaml", b.grpc.port(), upstream);
    check_then_charge(&[(envoy_a.ports[0], &a), (envoy_b.ports[0], &b)]).await;
}

/// 20 calls at once, the i-th a request of `descriptors()` in `domain` to
/// `servers[i % len]`: how many were answered OK.
async fn race(
    servers: &[&Server],
    domain: &str,
    descriptors: impl Fn() -> Vec<RateLimitDescriptor>,
) -> usize {
    let mut calls = Vec::new();
    for i in 0..20 {
        let mut client = servers[i % servers.len()].client().await;
        let req = request(domain, descriptors());
        calls.push(tokio::spawn(async move {
            common::ask(&mut client, req).await.overall_code == OK
        }));
    }
    let mut ok = 0;
    for call in calls {
        if call.await.expect("a call") {
            ok += 1;
        }
    }
    ok
}

/// 20 reservations of 100 racing against 1,000 through `servers`, then
/// settled at 60 each; then 20 check-then-charge requests racing.
async fn reservations_race(servers: &[&Server]) {
    let server = servers[0];
    // 20 reservations of 100 racing against 1,000: 10 fit.
    let admitted = race(servers, "reserve", || vec![hits("dave", 100)]).await;
    println!("reserve-then-settle: {admitted} of 20 reservations admitted");
    assert_eq!(admitted, 10);
    assert_eq!(left(server, "reserve", "dave").await, 0);
    // Each admitted request settles: 100 back, then its real usage of 60,
    // in one call.
    let mut settles = Vec::new();
    for i in 0..admitted {
        let mut client = servers[i % servers.len()].client().await;
        let req = request("reserve", vec![refund("dave", 100), hits("dave", 60)]);
        settles.push(tokio::spawn(async move {
            common::ask(&mut client, req).await.overall_code
        }));
    }
    for settle in settles {
        assert_eq!(settle.await.unwrap(), OK);
    }
    // The counter holds exactly the real usage: 10 × 60 = 600 of 1,000.
    let after = left(server, "reserve", "dave").await;
    println!("reserve-then-settle: {after} left after settling");
    assert_eq!(after, 1000 - 60 * admitted as u32);

    // Check-then-charge under the same race: every check passes before any
    // charge lands, and the 20 charges of 60 leave a debt of 200.
    let checked = race(servers, "budget", || vec![hits("erin", 0)]).await;
    assert_eq!(checked, 20);
    race(servers, "budget", || vec![hits("erin", 60)]).await;
    assert_eq!(left(server, "budget", "erin").await, 0);
    let mut client = server.client().await;
    let give_back = |n| request("budget", vec![refund("erin", n)]);
    let answer = common::ask(&mut client, give_back(200)).await;
    assert_eq!(answer.statuses[0].limit_remaining, 0, "a debt of 200 paid");
    let answer = common::ask(&mut client, give_back(1)).await;
    assert_eq!(answer.statuses[0].limit_remaining, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_race_at_the_grpc_level() {
    let server = Server::start(&example("policy.yaml"), &[]);
    reservations_race(&[&server]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_race_on_redis_through_two_replicas() {
    let redis = Redis::start();
    let args = ["--redis-url", &redis.url(), "--on-store-failure", "deny"];
    let a = Server::start(&example("policy.yaml"), &args);
    let b = Server::start(&example("policy.yaml"), &args);
    reservations_race(&[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_then_settle_through_envoy() {
    let server = Server::start(&example("policy.yaml"), &[]);
    let proxy = start_envoy(
        "envoy-reserve-then-settle.yaml",
        server.grpc.port(),
        usage_upstream(),
    );
    let port = proxy.ports[0];
    let headers = [
        ("x-user-id", "frank"),
        ("x-max-tokens", "100"),
        ("x-usage", "60"),
    ];
    // Each admitted request reserves 100 and settles at 60: 16 fit (the
    // 16th finds exactly 100 left), the 17th finds 40.
    let mut statuses = Vec::new();
    for k in 1..=17u32 {
        let (status, _, body) = envoy::get(port, "/", &headers).expect("an answer");
        statuses.push(status);
        assert!(status == 200 || status == 429, "{status}: {body}");
        if status == 200 {
            wait_left(&server, "reserve", "frank", 1000 - 60 * k).await;
        }
    }
    let mut want = vec![200; 16];
    want.push(429);
    assert_eq!(statuses, want);
    // Envoy makes the stream-done call for the denied request too (without
    // the example's `settled` entry it gave 100 back that was never
    // reserved: 140 left); with no upstream answer there is no usage, so the
    // example sends neither the refund nor the charge. That call is made
    // when the 429 is sent; once the charge of a later request landed, frank
    // still has 40.
    let george = [
        ("x-user-id", "george"),
        ("x-max-tokens", "100"),
        ("x-usage", "7"),
    ];
    let (status, _, _) = envoy::get(port, "/", &george).expect("an answer");
    assert_eq!(status, 200);
    wait_left(&server, "reserve", "george", 993).await;
    assert_eq!(left(&server, "reserve", "frank").await, 40);
}

/// An envoyproxy/ratelimit file of 1,000 an hour per user, domain budget.
const RATELIMIT_FILE: &str = "domain: budget
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_file_through_envoy_in_serve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("budget.yaml"), RATELIMIT_FILE).unwrap();
    let server = Server::start(dir.path(), &[]);
    let proxy = check_then_charge_envoy(&server);
    let routes = [(proxy.ports[0], &server)];
    check_then_charge(&routes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_file_through_envoy_in_ratelimit_mode() {
    let (_dir, server) = in_ratelimit_mode("budget.yaml", RATELIMIT_FILE);
    let proxy = check_then_charge_envoy(&server);
    let routes = [(proxy.ports[0], &server)];
    check_then_charge(&routes).await;
}

/// divvy started as `ratelimit` with envoyproxy/ratelimit's environment,
/// its config directory holding `text` as `file` (the directory lives as
/// long as the handle returned).
fn in_ratelimit_mode(file: &str, text: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join(file), text).unwrap();
    let mut command = common::as_ratelimit(dir.path());
    command.envs(common::RATELIMIT_ON_LOOPBACK).envs([
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ]);
    (dir, Server::spawn(command))
}

/// The Envoy Gateway listener's domain as a file: the route's entry, then
/// the rule's `x-user-id`, 1,000 an hour (what its translator sends over
/// xDS for a rule with `cost.request` 0 and `cost.response` from metadata).
const GATEWAY_FILE: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/llm/rule/0/match/0/*
    value: httproute/default/llm/rule/0/match/0/*
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: hour, requests_per_unit: 1000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_shape_in_ratelimit_mode() {
    let (dir, server) = in_ratelimit_mode("gateway.yaml", GATEWAY_FILE);
    // The example's Envoy with the descriptors Envoy Gateway's translator
    // writes: the route's generic key, then the selector's header.
    let user = "- request_headers: { header_name: x-user-id, descriptor_key: user }";
    let gateway = format!(
        "- generic_key: {{ descriptor_key: {EG_ROUTE:?}, descriptor_value: {EG_ROUTE:?} }}
                      - request_headers: {{ header_name: x-user-id, descriptor_key: rule-0-match-0 }}"
    );
    let text = std::fs::read_to_string(example("envoy-check-then-charge.yaml")).unwrap();
    assert_eq!(text.matches(user).count(), 2);
    let text = text
        .replace(user, &gateway)
        .replace("domain: budget", &format!("domain: {EG_DOMAIN}"));
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, text).unwrap();
    let proxy = envoy::start(
        &path,
        9901,
        &[10000],
        &[(8081, server.grpc.port()), (8088, usage_upstream())],
        &[],
    );
    check_then_charge_in(&[(proxy.ports[0], &server)], EG_DOMAIN).await;
}
