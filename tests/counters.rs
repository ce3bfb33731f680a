//! Counters for operators: `GET` and `DELETE /counters?rule=LABEL&actor=VALUE`
//! and `divvy counters get|reset`, against the real binary.
//!
//! Two replicas share one real `redis-server` with the over-limit cache on:
//! an actor exhausted on both keeps being denied from each replica's cache
//! even once Redis forgets the counter; a reset through one replica makes
//! both answer a fresh counter within a second, is logged and counted, and
//! a wrong token, a read token or a malformed query changes nothing.

mod common;

use std::time::Duration;

use common::redis::{Cluster, Redis};
use common::{http_request, parse_ok, wait_until, Server};
use serde_json::Value;

const ADMIN: &str = "counters-admin-secret";
const READ: &str = "counters-read-secret";

const POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*"}
    label: api
    creditLimit: 3
    resetSeconds: 1h
    actorField: user
  - operation: {path: /shared}
    label: shared
    creditLimit: 2
    resetSeconds: 1h
default: {creditLimit: 100, resetSeconds: 60}
"#;

fn serve(extra: &[&str]) -> Server {
    let mut args = vec!["--admin-token", ADMIN, "--admin-read-token", READ];
    args.extend(extra);
    Server::with_policy_args(POLICY, "yaml", &args)
}

/// `(allowed, remaining, reset seconds)` of one line-protocol HIT.
fn hit(server: &Server, pairs: &str) -> (bool, u64, i64) {
    parse_ok(&server.line_exchange(format!("HIT {pairs}\n").as_bytes()))
}

fn call(server: &Server, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let (status, body) = http_request(server.http, method, path, "", auth.as_deref());
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
    (status, v)
}

/// The one counter `GET /counters` answers for `query`.
fn counter(server: &Server, query: &str) -> Value {
    let (status, v) = call(server, "GET", &format!("/counters?{query}"), Some(READ));
    assert_eq!(status, 200, "{v}");
    let list = v["counters"].as_array().expect("counters");
    assert_eq!(list.len(), 1, "{v}");
    list[0].clone()
}

fn metric(server: &Server, sample: &str) -> f64 {
    server
        .metric_samples()
        .get(sample)
        .copied()
        .unwrap_or_else(|| panic!("no {sample} in /metrics"))
}

/// Everything the server logged so far (after a short pause for stragglers).
fn drain_log(server: &Server) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(300));
    server.log.try_iter().collect()
}

/// Exhausts alice on A (3 hits and a denial) and has B deny her too, so
/// both replicas' over-limit caches hold the denial.
fn exhaust_on_both(a: &Server, b: &Server) {
    for _ in 0..3 {
        assert!(hit(a, "path=/api/x user=alice").0);
    }
    assert!(!hit(a, "path=/api/x user=alice").0);
    assert!(!hit(b, "path=/api/y user=alice").0);
    for (name, s) in [("A", a), ("B", b)] {
        let c = counter(s, "rule=api&actor=alice");
        assert_eq!(c["overLimitCache"], true, "{name}: {c}");
        assert_eq!(
            (c["count"].as_u64(), c["remaining"].as_u64()),
            (Some(3), Some(0)),
            "{name}: {c}"
        );
    }
}

/// A's reset must reach `other` (whose cache denies alice) within a
/// second: its first HIT after that is a fresh counter's first.
fn fresh_on(other: &Server, name: &str) {
    fresh_for(other, name, "alice");
}

/// [`fresh_on`] for `actor`.
fn fresh_for(other: &Server, name: &str, actor: &str) {
    let mut answer = None;
    let delay = wait_until(Duration::from_secs(1), || {
        let a = hit(other, &format!("path=/api/z user={actor}"));
        answer = Some(a);
        a.0
    });
    println!("reset reached replica {name} {delay:?} after the DELETE's answer");
    assert!(
        delay.is_some(),
        "replica {name} still denies alice 1 s after the reset: {answer:?}"
    );
    assert_eq!(
        answer,
        Some((true, 2, 3600)),
        "replica {name}: not a fresh counter"
    );
}

#[test]
fn a_reset_on_one_replica_frees_the_actor_on_every_replica_within_a_second() {
    let redis = Redis::start();
    let url = redis.url();
    let a = serve(&["--redis-url", &url, "--over-limit-cache", "1000"]);
    let b = serve(&["--redis-url", &url, "--over-limit-cache", "1000"]);
    exhaust_on_both(&a, &b);
    let key = counter(&a, "rule=api&actor=alice")["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(redis.cli(&["EXISTS", &key]), "1");

    refused_calls_change_nothing(&a, &b, &redis);

    let before = metric(&a, "divvy_counter_resets_total{result=\"reset\"}");
    let (status, v) = call(&a, "DELETE", "/counters?rule=api&actor=alice", Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["reset"], true);
    assert_eq!(v["existed"], serde_json::json!([true]), "{v}");
    assert_eq!(v["counters"][0]["overLimitCache"], false, "{v}");
    assert_eq!(v["counters"][0]["count"], 0, "{v}");
    assert_eq!(redis.cli(&["EXISTS", &key]), "0");
    // A's own cache is dropped before it answers.
    fresh_on(&b, "B");
    let c = counter(&a, "rule=api&actor=alice");
    assert_eq!(
        (c["count"].as_u64(), c["overLimitCache"].as_bool()),
        (Some(1), Some(false)),
        "{c}"
    );
    assert_eq!(
        metric(&a, "divvy_counter_resets_total{result=\"reset\"}"),
        before + 1.0
    );

    let log = drain_log(&a);
    let line = log
        .iter()
        .find(|l| l.contains("counters reset"))
        .unwrap_or_else(|| panic!("no `counters reset` line:\n{}", log.join("\n")));
    common::assert_has(
        line,
        &["rule=api", "alice", &key, "from=127.0.0.1:", "admin token"],
    );
    assert!(
        log.iter().all(|l| !l.contains(ADMIN)),
        "the token is logged"
    );

    // And the other way round: reset on B, A answers fresh.
    exhaust_on_both_again(&a, &b);
    let (status, v) = call(&b, "DELETE", "/counters?rule=api&actor=alice", Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    fresh_on(&a, "A");

    // The issue's report: Redis emptied, both replicas still deny alice
    // from their caches; a reset frees her on both.
    exhaust_on_both_again(&a, &b);
    redis.cli(&["FLUSHALL"]);
    assert!(!hit(&a, "path=/api/x user=alice").0);
    assert!(!hit(&b, "path=/api/x user=alice").0);
    let (status, v) = call(&a, "DELETE", "/counters?rule=api&actor=alice", Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["existed"], serde_json::json!([false]), "{v}");
    fresh_on(&b, "B");
    assert!(b
        .metric_samples()
        .contains_key("divvy_counter_resets_polled_timestamp_seconds"));
}

/// Alice full again (used up on A), denied on both, both caches holding it.
/// For a second after a reset every poll drops its key's cached denial
/// again (HITs in flight may bring one back), so this waits that out first.
fn exhaust_on_both_again(a: &Server, b: &Server) {
    let repeat = Duration::from_millis(divvy::counters::resets::REPEAT_MS);
    std::thread::sleep(repeat + 2 * divvy::counters::resets::POLL_EVERY);
    while hit(a, "path=/api/x user=alice").0 {}
    assert!(!hit(b, "path=/api/x user=alice").0);
    for s in [a, b] {
        assert_eq!(counter(s, "rule=api&actor=alice")["overLimitCache"], true);
    }
}

/// A wrong token, the read token, no token, an unknown rule and a missing
/// actor are refused with a clear status, and alice stays denied on both.
fn refused_calls_change_nothing(a: &Server, b: &Server, redis: &Redis) {
    let keys_before = redis.cli(&["DBSIZE"]);
    let path = "/counters?rule=api&actor=alice";
    let refused_before = metric(a, "divvy_counter_resets_total{result=\"refused\"}");
    let (status, _) = call(a, "DELETE", path, Some("not-the-token"));
    assert_eq!(status, 403, "a wrong token");
    let (status, v) = call(a, "DELETE", path, None);
    assert_eq!(status, 401, "no token: {v}");
    let (status, v) = call(a, "DELETE", path, Some(READ));
    assert_eq!(status, 403, "the read token: {v}");
    assert_eq!(
        metric(a, "divvy_counter_resets_total{result=\"refused\"}"),
        refused_before + 1.0
    );
    let (status, v) = call(a, "DELETE", "/counters?rule=nope&actor=alice", Some(ADMIN));
    assert_eq!(status, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("nope"), "{v}");
    let (status, v) = call(a, "DELETE", "/counters?rule=api", Some(ADMIN));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("actor=VALUE"), "{v}");
    let (status, v) = call(a, "GET", "/counters?actor=alice", Some(READ));
    assert_eq!(status, 400, "{v}");
    assert_eq!(
        metric(a, "divvy_counter_resets_total{result=\"invalid\"}"),
        2.0
    );
    // Nothing changed: both still deny alice from their caches.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!hit(a, "path=/api/x user=alice").0);
    assert!(!hit(b, "path=/api/x user=alice").0);
    assert_eq!(redis.cli(&["DBSIZE"]), keys_before);
    for s in [a, b] {
        assert_eq!(counter(s, "rule=api&actor=alice")["overLimitCache"], true);
    }
}

#[test]
fn on_the_memory_store_a_reset_frees_the_actor_and_a_rule_without_actor_needs_none() {
    let a = serve(&[]);
    for _ in 0..3 {
        assert!(hit(&a, "path=/api/x user=carol").0);
    }
    assert!(!hit(&a, "path=/api/x user=carol").0);
    let c = counter(&a, "rule=api&actor=carol");
    assert_eq!(
        (c["count"].as_u64(), c["open"].as_bool()),
        (Some(3), Some(true)),
        "{c}"
    );
    assert_eq!(
        c["overLimitCache"],
        Value::Null,
        "no cache without Redis: {c}"
    );
    assert!(c["reset"].as_f64().unwrap() > 3500.0, "{c}");
    // Another actor's counter is untouched by carol's reset.
    assert!(hit(&a, "path=/api/x user=dave").0);
    let (status, v) = call(&a, "DELETE", "/counters?rule=api&actor=carol", Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["existed"], serde_json::json!([true]));
    assert_eq!(v["shared"], false);
    assert_eq!(hit(&a, "path=/api/x user=carol"), (true, 2, 3600));
    assert_eq!(hit(&a, "path=/api/x user=dave"), (true, 1, 3600));

    // A rule with one counter for everyone: no actor.
    for _ in 0..2 {
        assert!(hit(&a, "path=/shared").0);
    }
    let (status, v) = call(&a, "DELETE", "/counters?rule=shared&actor=x", Some(ADMIN));
    assert_eq!(status, 400, "{v}");
    assert!(!hit(&a, "path=/shared").0);
    let (status, v) = call(&a, "DELETE", "/counters?rule=shared", Some(ADMIN));
    assert_eq!(status, 200, "{v}");
    assert_eq!(hit(&a, "path=/shared"), (true, 1, 3600));
    assert_eq!(
        metric(&a, "divvy_counter_resets_total{result=\"reset\"}"),
        2.0
    );

    // A server without an admin token refuses every reset.
    let open = Server::with_policy(POLICY, "yaml");
    assert!(hit(&open, "path=/shared").0);
    let (status, v) = call(&open, "DELETE", "/counters?rule=shared", None);
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("--admin-token"),
        "{v}"
    );
    assert_eq!(hit(&open, "path=/shared"), (true, 0, 3600));
}

/// `divvy counters <args>` against `server`.
fn cli(server: &Server, args: &[&str], token: Option<&str>) -> (bool, String, String) {
    common::admin_client(server, "counters", "--server", args, token)
}

#[test]
fn divvy_counters_get_and_reset_talk_to_a_running_server() {
    let a = serve(&[]);
    for _ in 0..4 {
        hit(&a, "path=/api/x user=erin");
    }
    let (ok, out, err) = cli(&a, &["get", "--rule", "api", "--actor", "erin"], Some(READ));
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["counters"][0]["count"], 3, "{v}");

    let (ok, _, err) = cli(
        &a,
        &["reset", "--rule", "api", "--actor", "erin"],
        Some("wrong"),
    );
    assert!(!ok, "a wrong token succeeded");
    assert!(err.contains("403"), "{err}");
    assert!(!hit(&a, "path=/api/x user=erin").0);

    let (ok, _, err) = cli(&a, &["reset", "--rule", "api"], Some(ADMIN));
    assert!(!ok);
    assert!(err.contains("400") && err.contains("actor"), "{err}");

    let (ok, out, err) = cli(
        &a,
        &["reset", "--rule", "api", "--actor", "erin"],
        Some(ADMIN),
    );
    assert!(ok, "{err}");
    assert!(out.contains("\"reset\": true"), "{out}");
    assert_eq!(hit(&a, "path=/api/x user=erin"), (true, 2, 3600));
    // The token may be given as a flag too; the actor field by name.
    for _ in 0..3 {
        hit(&a, "path=/api/x user=erin");
    }
    let (ok, _, err) = cli(
        &a,
        &[
            "reset",
            "--rule",
            "api",
            "--field",
            "user=erin",
            "--token",
            ADMIN,
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(hit(&a, "path=/api/x user=erin"), (true, 2, 3600));
}

#[test]
fn on_a_redis_cluster_each_actor_is_reset_on_its_own_node() {
    let cluster = Cluster::start(3);
    let url = cluster.url();
    let a = serve(&["--redis-url", &url]);
    let b = serve(&["--redis-url", &url]);
    // Enough actors that their keys land on every node.
    let actors: Vec<String> = (0..6).map(|i| format!("user{i}")).collect();
    for actor in &actors {
        for _ in 0..3 {
            assert!(hit(&a, &format!("path=/api/x user={actor}")).0);
        }
        assert!(!hit(&b, &format!("path=/api/x user={actor}")).0);
        let q = format!("rule=api&actor={actor}");
        assert_eq!(counter(&b, &q)["overLimitCache"], true);
    }
    for actor in &actors {
        let path = format!("/counters?rule=api&actor={actor}");
        let (status, v) = call(&a, "DELETE", &path, Some(ADMIN));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["existed"], serde_json::json!([true]), "{actor}: {v}");
        fresh_for(&b, "B", actor);
    }
}
