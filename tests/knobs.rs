//! Knobs (live overrides of a rule's numbers) against the real binary and
//! real redis-server processes: auth, refused bodies, consumption carried
//! over, replicas sharing knobs through Redis, Redis failing, TTLs, reloads,
//! the CLI, /config, /explain and metrics.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis::Redis;
use common::{parse_ok, wait_until, Server};
use serde_json::Value;

const TOKEN: &str = "kn0b-T0ken-7f3a9c";
const BEARER: &str = "Bearer kn0b-T0ken-7f3a9c";

const POLICY: &str = r#"
overrides:
  - label: win
    operation: {k: win, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
  - label: fix
    operation: {k: fix, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
    algorithm: fixed
  - label: bucket
    operation: {k: bucket, who: "*"}
    actorField: who
    creditLimit: 5
    resetSeconds: 1h
    algorithm: token_bucket
  - label: multi
    operation: {k: multi}
    limits:
      - {label: multi-short, creditLimit: 3, resetSeconds: 1h}
      - {label: multi-long, creditLimit: 100, resetSeconds: 1d}
  - label: single-list
    operation: {k: single-list}
    limits:
      - {creditLimit: 2, resetSeconds: 1h}
  - label: free
    operation: {k: free}
    creditLimit: 5
    resetSeconds: 0
  - label: other
    operation: {k: other}
    creditLimit: 3
    resetSeconds: 1h
default:
  creditLimit: 100
  resetSeconds: 1h
"#;

/// A server on [`POLICY`] with extra `serve` arguments.
fn serve(extra: &[&str]) -> Server {
    Server::with_policy_args(POLICY, "yaml", extra)
}

/// A server on [`POLICY`] with the admin token (and extra arguments).
fn serve_token(extra: &[&str]) -> Server {
    let mut args = vec!["--admin-token", TOKEN];
    args.extend(extra);
    serve(&args)
}

/// An HTTP/1.1 request with an optional `Authorization` header value.
fn call(
    server: &Server,
    method: &str,
    path: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, String) {
    call_at(server.http, method, path, body, auth)
}

/// [`call`] by address (for other threads: a `Server` stays on its own).
fn call_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, String) {
    common::http_request(addr, method, path, body, auth)
}

/// `PUT /knobs/{label}` with the right token.
fn put(server: &Server, label: &str, body: &str) -> (u16, String) {
    call(
        server,
        "PUT",
        &format!("/knobs/{label}"),
        body,
        Some(BEARER),
    )
}

/// `PUT` that must succeed.
fn put_ok(server: &Server, label: &str, body: &str) -> Value {
    let (status, text) = put(server, label, body);
    assert_eq!(status, 200, "PUT /knobs/{label} {body}: {text}");
    serde_json::from_str(&text).expect("PUT answers JSON")
}

/// `DELETE /knobs/{label}` with the right token.
fn delete(server: &Server, label: &str) -> (u16, String) {
    call(
        server,
        "DELETE",
        &format!("/knobs/{label}"),
        "",
        Some(BEARER),
    )
}

fn get_json(server: &Server, path: &str) -> Value {
    let (status, text) = server.http("GET", path, "");
    assert_eq!(status, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
}

/// `GET /knobs`.
fn knobs(server: &Server) -> Value {
    get_json(server, "/knobs")
}

/// The listed knob of `label`, if any.
fn listed(server: &Server, label: &str) -> Option<Value> {
    knobs(server)["knobs"]
        .as_array()
        .expect("knobs is a list")
        .iter()
        .find(|k| k["label"] == label)
        .cloned()
}

/// `n` pipelined `HIT line` on one connection: `(allowed, credits)` each.
fn hits(server: &Server, line: &str, n: usize) -> Vec<(bool, u64)> {
    let input = format!("HIT {line}\n").repeat(n);
    let out = server.line_exchange(input.as_bytes());
    let answers: Vec<(bool, u64)> = out
        .lines()
        .map(|l| {
            let (a, c, _) = parse_ok(l);
            (a, c)
        })
        .collect();
    assert_eq!(answers.len(), n, "{out}");
    answers
}

/// One `HIT line`: `(allowed, credits, seconds)`.
fn hit(server: &Server, line: &str) -> (bool, u64, i64) {
    parse_ok(&server.line_exchange(format!("HIT {line}\n").as_bytes()))
}

/// `(true, n-1), (true, n-2), ..., (true, 0)`.
fn countdown(n: u64) -> Vec<(bool, u64)> {
    (0..n).rev().map(|left| (true, left)).collect()
}

/// Every sample of `/metrics`: `name{labels}` → value.
fn samples(server: &Server) -> BTreeMap<String, f64> {
    server.metric_samples()
}

fn changes(server: &Server, action: &str) -> f64 {
    samples(server)
        .get(&format!("divvy_knob_changes_total{{action=\"{action}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

/// Everything the server logged so far (after a short pause for stragglers).
fn drain_log(server: &Server) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(300));
    server.log.try_iter().collect()
}

/// Fixed windows are epoch-aligned: keep a test clear of an hour boundary.
fn clear_of_hour_boundary() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into_hour = now.as_secs() % 3600;
    if into_hour >= 3590 {
        std::thread::sleep(Duration::from_secs(3600 - into_hour + 1));
    }
}

// ---------------------------------------------------------------- 1. auth

#[test]
fn without_a_token_changes_are_forbidden_and_nothing_changes() {
    let server = serve(&[]);
    for (method, body) in [("PUT", r#"{"creditLimit": 0}"#), ("DELETE", "")] {
        // Even a bearer token is refused: the server has none configured.
        for auth in [None, Some(BEARER)] {
            let (status, text) = call(&server, method, "/knobs/win", body, auth);
            assert_eq!(status, 403, "{method} with {auth:?}: {text}");
            assert!(text.contains("--admin-token"), "{text}");
        }
    }
    let list = knobs(&server);
    assert_eq!(list["shared"], false);
    assert_eq!(list["knobs"], serde_json::json!([]));
    assert_eq!(hits(&server, "k=win who=a", 2), countdown(10)[..2]);
    assert_eq!(changes(&server, "refused"), 4.0);
    assert_eq!(changes(&server, "set"), 0.0);
}

#[test]
fn a_missing_or_wrong_token_is_401_the_right_one_200_and_no_log_shows_it() {
    let server = serve_token(&[]);
    let wrong = [
        None,
        Some("Bearer wrong"),
        Some("Bearer "),
        Some("kn0b-T0ken-7f3a9c"),
        Some("Basic kn0b-T0ken-7f3a9c"),
        Some("Bearer kn0b-T0ken-7f3a9"),
        Some("Bearer kn0b-T0ken-7f3a9cX"),
    ];
    for auth in wrong {
        let (status, text) = call(&server, "PUT", "/knobs/win", r#"{"creditLimit": 0}"#, auth);
        assert_eq!(status, 401, "PUT with {auth:?}: {text}");
        assert!(!text.contains(TOKEN), "{text}");
    }
    // Authorization comes first: a bad body or an unknown label without the
    // token is 401 too (it does not tell which labels exist).
    for (label, body) in [("win", "not json"), ("nosuch", r#"{"creditLimit": 1}"#)] {
        let (status, text) = call(&server, "PUT", &format!("/knobs/{label}"), body, None);
        assert_eq!(status, 401, "{label} {body}: {text}");
    }
    assert_eq!(knobs(&server)["knobs"], serde_json::json!([]));
    assert!(hit(&server, "k=win who=a").0);

    let v = put_ok(&server, "win", r#"{"creditLimit": 0}"#);
    assert_eq!(v["label"], "win");
    assert_eq!(v["set"]["creditLimit"], 0);
    assert_eq!(hit(&server, "k=win who=a"), (false, 0, -1));

    // A wrong token cannot delete it either.
    for auth in wrong {
        let (status, text) = call(&server, "DELETE", "/knobs/win", "", auth);
        assert_eq!(status, 401, "DELETE with {auth:?}: {text}");
    }
    assert!(listed(&server, "win").is_some());
    assert_eq!(hit(&server, "k=win who=b"), (false, 0, -1));
    let (status, text) = delete(&server, "win");
    assert_eq!(status, 200, "{text}");
    assert!(hit(&server, "k=win who=b").0);

    let log = drain_log(&server);
    assert!(
        log.iter().all(|l| !l.contains(TOKEN)),
        "the token is in the log:\n{}",
        log.join("\n")
    );
    let set_line = log
        .iter()
        .find(|l| l.contains("knob set"))
        .unwrap_or_else(|| panic!("no `knob set` line:\n{}", log.join("\n")));
    for needle in ["label=win", "old=", "new=creditLimit=0", "from=127.0.0.1:"] {
        assert!(set_line.contains(needle), "{needle} not in {set_line}");
    }
    let deleted = log
        .iter()
        .find(|l| l.contains("knob deleted"))
        .unwrap_or_else(|| panic!("no `knob deleted` line:\n{}", log.join("\n")));
    assert!(
        deleted.contains("label=win") && deleted.contains("from=127.0.0.1:"),
        "{deleted}"
    );
    assert!(
        log.iter()
            .filter(|l| l.contains("refused"))
            .all(|l| l.contains("from=127.0.0.1:")),
        "{}",
        log.join("\n")
    );
    // Nor anything the admin API shows.
    for path in ["/knobs", "/config", "/metrics", "/explain?k=win&who=a"] {
        let (_, text) = server.http("GET", path, "");
        assert!(!text.contains(TOKEN), "{path}: {text}");
    }
}

#[test]
fn the_token_can_come_from_the_environment_and_stays_out_of_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let server = Server::start_env(&path, &[], &[("DIVVY_ADMIN_TOKEN", TOKEN)]);
    let (status, _) = call(
        &server,
        "PUT",
        "/knobs/win",
        r#"{"creditLimit": 1}"#,
        Some("Bearer nope"),
    );
    assert_eq!(status, 401);
    put_ok(&server, "win", r#"{"creditLimit": 1}"#);
    assert_eq!(hits(&server, "k=win who=a", 2), vec![(true, 0), (false, 0)]);
    let log = drain_log(&server);
    assert!(log.iter().any(|l| l.contains("knob set")), "{log:?}");
    assert!(log.iter().all(|l| !l.contains(TOKEN)), "{log:?}");
}

// ---------------------------------------------------------- 2. bad input

#[test]
fn every_bad_request_is_refused_and_changes_nothing() {
    let server = serve_token(&[]);
    // A knob in force, which no refused request may replace or remove.
    put_ok(&server, "win", r#"{"creditLimit": 12}"#);
    let before = knobs(&server);
    let cases: &[(&str, &str, u16)] = &[
        ("win", r#"{"creditLimit": -1}"#, 400),
        ("win", r#"{"creditLimit": 1.5}"#, 400),
        ("win", r#"{"creditLimit": "5"}"#, 400),
        ("win", r#"{"creditLimit": null}"#, 400),
        ("win", r#"{"creditLimit": true}"#, 400),
        ("win", r#"{"creditLimit": 9007199254740992}"#, 400),
        ("win", r#"{"creditLimit": 99999999999999999999999}"#, 400),
        ("win", r#"{"resetSeconds": 0}"#, 400),
        ("win", r#"{"resetSeconds": "0s"}"#, 400),
        ("win", r#"{"resetSeconds": -30}"#, 400),
        ("win", r#"{"resetSeconds": "soon"}"#, 400),
        ("win", r#"{"resetSeconds": "30x"}"#, 400),
        ("win", r#"{"resetSeconds": ""}"#, 400),
        ("win", r#"{"creditLimit": 5, "ttlSeconds": 0}"#, 400),
        ("win", r#"{"creditLimit": 5, "ttlSeconds": -1}"#, 400),
        ("win", r#"{"creditLimit": 5, "ttlSeconds": "1h"}"#, 400),
        ("win", r#"{"ttlSeconds": 60}"#, 400),
        ("win", r#"{"creditLimit": 5, "creditLimt": 6}"#, 400),
        ("win", r#"{"limit": 5}"#, 400),
        ("win", r#"{}"#, 400),
        ("win", "", 400),
        ("win", "not json", 400),
        ("win", r#"{"creditLimit": 5"#, 400),
        ("win", "[1, 2]", 400),
        ("win", "5", 400),
        ("win", r#""creditLimit""#, 400),
        ("win", r#"{"burst": 20}"#, 400),
        ("fix", r#"{"burst": 20}"#, 400),
        ("bucket", r#"{"burst": 0}"#, 400),
        // Too large for a token bucket (burst × window in ms).
        ("bucket", r#"{"burst": 9007199254740991}"#, 400),
        // A rule that always allows cannot be given a counted limit without a window.
        ("free", r#"{"creditLimit": 7}"#, 400),
        // A rule label on a rule with several limits.
        ("multi", r#"{"creditLimit": 1}"#, 400),
        ("nosuch", r#"{"creditLimit": 1}"#, 404),
        ("multi-shorter", r#"{"creditLimit": 1}"#, 404),
        ("bad%20label", r#"{"creditLimit": 1}"#, 404),
    ];
    for (label, body, want) in cases {
        let (status, text) = put(&server, label, body);
        assert_eq!(status, *want, "PUT /knobs/{label} {body}: {text}");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("PUT /knobs/{label} {body}: not JSON ({e}): {text}"));
        assert!(
            v["error"].as_str().is_some_and(|m| !m.is_empty()),
            "PUT /knobs/{label} {body}: no error message: {text}"
        );
        assert_eq!(knobs(&server), before, "after PUT /knobs/{label} {body}");
    }
    // Deleting a knob that is not set, or of a label nobody has.
    for label in ["fix", "nosuch", "multi"] {
        let (status, text) = delete(&server, label);
        assert_eq!(status, 404, "DELETE /knobs/{label}: {text}");
        assert_eq!(knobs(&server), before, "after DELETE /knobs/{label}");
    }
    // Messages a person can act on.
    let (_, text) = put(&server, "multi", r#"{"creditLimit": 1}"#);
    assert!(
        text.contains("multi-short") && text.contains("multi-long"),
        "{text}"
    );
    let (_, text) = put(&server, "win", r#"{"burst": 20}"#);
    assert!(text.contains("token_bucket"), "{text}");
    // Decisions follow the one knob, and the rules no refused body touched.
    assert_eq!(hits(&server, "k=win who=a", 2), countdown(12)[..2]);
    assert_eq!(hits(&server, "k=fix who=a", 1), countdown(10)[..1]);
    assert_eq!(hits(&server, "k=bucket who=a", 1), countdown(5)[..1]);
    assert_eq!(hits(&server, "k=multi", 1), countdown(3)[..1]);
    assert_eq!(hit(&server, "k=free"), (true, 5, 0));
    let refused = (cases.len() + 3 + 2) as f64;
    assert_eq!(changes(&server, "refused"), refused);
    assert_eq!(changes(&server, "set"), 1.0);
}

// ------------------------------------------------ 3. consumption carried over

#[test]
fn window_raise_carries_consumption_over_lower_denies_delete_restores() {
    let server = serve_token(&[]);
    let mut first = countdown(10);
    first.push((false, 0));
    assert_eq!(hits(&server, "k=win who=a", 11), first);
    put_ok(&server, "win", r#"{"creditLimit": 20}"#);
    // Exactly 10 more in the same window, then denied.
    let mut more = countdown(10);
    more.push((false, 0));
    assert_eq!(hits(&server, "k=win who=a", 11), more);
    // The window did not restart.
    let (_, _, seconds) = hit(&server, "k=win who=a");
    assert!((3590..=3600).contains(&seconds), "{seconds}");
    // A fresh actor gets the knob's numbers.
    assert_eq!(hit(&server, "k=win who=b"), (true, 19, 3600));
    // Lowered below what is used: denied.
    put_ok(&server, "win", r#"{"creditLimit": 15}"#);
    assert!(!hit(&server, "k=win who=a").0);
    // Raised again: the difference (25 - 20 used).
    put_ok(&server, "win", r#"{"creditLimit": 25}"#);
    let mut five = countdown(5);
    five.push((false, 0));
    assert_eq!(hits(&server, "k=win who=a", 6), five);
    // Deleted: the rule's own 10 again (a is far past them, a new actor has 10).
    let (status, text) = delete(&server, "win");
    assert_eq!(status, 200, "{text}");
    assert!(!hit(&server, "k=win who=a").0);
    assert_eq!(hit(&server, "k=win who=c"), (true, 9, 3600));
    // b used 1 under the knob: of the rule's own 10, 9 were left before this hit.
    assert_eq!(hit(&server, "k=win who=b").1, 8);
    // creditLimit 0 denies at once, a fresh actor included.
    put_ok(&server, "win", r#"{"creditLimit": 0}"#);
    assert_eq!(hit(&server, "k=win who=d"), (false, 0, -1));
    assert_eq!(hit(&server, "k=win who=c"), (false, 0, -1));
    delete(&server, "win");
    assert_eq!(hit(&server, "k=win who=c").1, 8);
}

#[test]
fn fixed_window_counts_carry_over() {
    clear_of_hour_boundary();
    let server = serve_token(&[]);
    let mut first = countdown(10);
    first.push((false, 0));
    assert_eq!(hits(&server, "k=fix who=a", 11), first);
    put_ok(&server, "fix", r#"{"creditLimit": 20}"#);
    let mut more = countdown(10);
    more.push((false, 0));
    assert_eq!(hits(&server, "k=fix who=a", 11), more);
    put_ok(&server, "fix", r#"{"creditLimit": 15}"#);
    assert!(!hit(&server, "k=fix who=a").0);
    put_ok(&server, "fix", r#"{"creditLimit": 22}"#);
    assert_eq!(
        hits(&server, "k=fix who=a", 3),
        vec![(true, 1), (true, 0), (false, 0)]
    );
    delete(&server, "fix");
    assert!(!hit(&server, "k=fix who=a").0);
    assert_eq!(hit(&server, "k=fix who=b").1, 9);
    put_ok(&server, "fix", r#"{"creditLimit": 0}"#);
    assert_eq!(hit(&server, "k=fix who=b"), (false, 0, -1));
}

#[test]
fn token_bucket_burst_and_credit_limit_carry_over() {
    let server = serve_token(&[]);
    // Actor a: 5 of burst 5, then a knob burst 10 gives exactly 5 more.
    let mut first = countdown(5);
    first.push((false, 0));
    assert_eq!(hits(&server, "k=bucket who=a", 6), first);
    put_ok(&server, "bucket", r#"{"burst": 10}"#);
    let mut more = countdown(5);
    more.push((false, 0));
    assert_eq!(hits(&server, "k=bucket who=a", 6), more);
    // Lowered below what is used: denied.
    put_ok(&server, "bucket", r#"{"burst": 7}"#);
    assert!(!hit(&server, "k=bucket who=a").0);
    let (status, _) = delete(&server, "bucket");
    assert_eq!(status, 200);
    // Actor b: creditLimit raises the burst that follows it.
    assert_eq!(hits(&server, "k=bucket who=b", 6), first);
    put_ok(&server, "bucket", r#"{"creditLimit": 8}"#);
    let mut three = countdown(3);
    three.push((false, 0));
    assert_eq!(hits(&server, "k=bucket who=b", 4), three);
    put_ok(&server, "bucket", r#"{"creditLimit": 0}"#);
    assert_eq!(hit(&server, "k=bucket who=c"), (false, 0, -1));
    // resetSeconds 1: 5 credits a second instead of an hour. Actor d drains
    // its bucket; after more than a second it is full again (the rule's own
    // rate would have given back nothing).
    put_ok(&server, "bucket", r#"{"resetSeconds": 1}"#);
    assert_eq!(hits(&server, "k=bucket who=d", 6), first);
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(hits(&server, "k=bucket who=d", 5), countdown(5));
}

#[test]
fn a_limits_entry_label_sets_that_limit_only() {
    let server = serve_token(&[]);
    put_ok(&server, "multi-short", r#"{"creditLimit": 1}"#);
    assert_eq!(hits(&server, "k=multi", 2), vec![(true, 0), (false, 0)]);
    put_ok(&server, "multi-short", r#"{"creditLimit": 3}"#);
    assert_eq!(
        hits(&server, "k=multi", 3),
        vec![(true, 1), (true, 0), (false, 0)]
    );
    // The long limit still counts: a knob of 3 on it is spent by the 3 hits so far.
    delete(&server, "multi-short");
    put_ok(&server, "multi-long", r#"{"creditLimit": 3}"#);
    assert!(!hit(&server, "k=multi").0);
}

#[test]
fn a_rule_label_on_a_rule_written_with_one_limits_entry_applies() {
    // `single-list` is a rule label; its rule has one (unlabelled) `limits`
    // entry, so the PUT is accepted: it must then also decide.
    let server = serve_token(&[]);
    let v = put_ok(&server, "single-list", r#"{"creditLimit": 0}"#);
    assert_eq!(v["effective"]["creditLimit"], 0, "{v}");
    assert_eq!(listed(&server, "single-list").unwrap()["active"], true);
    let answer = hit(&server, "k=single-list");
    let explain = get_json(&server, "/explain?k=single-list");
    assert_eq!(
        answer,
        (false, 0, -1),
        "PUT /knobs/single-list {{\"creditLimit\":0}} answered 200 and GET /knobs lists it active, \
         but HIT k=single-list is still allowed; /explain decider: {}",
        explain["decider"]
    );
}

// ------------------------------------------------- 4. replicas through Redis

#[test]
fn a_knob_set_on_one_replica_applies_on_the_others_within_a_second() {
    let redis = Redis::start();
    let url = redis.url();
    let a = serve_token(&["--redis-url", &url]);
    let b = serve_token(&["--redis-url", &url]);
    assert_eq!(knobs(&a)["shared"], true);
    assert!(hit(&b, "k=win who=r").0);

    put_ok(&a, "win", r#"{"creditLimit": 0}"#);
    let stored = redis.cli(&["HGET", "divvy:knobs", "win"]);
    assert!(stored.contains("\"creditLimit\":0"), "{stored}");
    let delay = wait_until(Duration::from_millis(1500), || {
        hit(&b, "k=win who=r") == (false, 0, -1)
    });
    println!("knob set on A denied on B {delay:?} after the PUT's answer");
    assert!(
        delay.is_some(),
        "the knob set on A did not apply on B within 1.5 s"
    );

    // B lists it as set by A.
    let on_b = listed(&b, "win").expect("B lists the knob");
    let set_by = on_b["setBy"].as_str().unwrap();
    assert!(
        set_by.ends_with(&format!(":{}", a.pid())),
        "setBy {set_by}, A's pid {}",
        a.pid()
    );
    assert_eq!(knobs(&b)["shared"], true);
    assert_eq!(on_b["active"], true);

    // A replica started afterwards applies it from its first request.
    let c = serve_token(&["--redis-url", &url]);
    assert_eq!(hit(&c, "k=win who=new"), (false, 0, -1));
    assert!(listed(&c, "win").is_some());

    // Deleted on B: gone on A and C too.
    let (status, text) = delete(&b, "win");
    assert_eq!(status, 200, "{text}");
    assert_eq!(redis.cli(&["HEXISTS", "divvy:knobs", "win"]), "0");
    for (name, s) in [("A", &a), ("C", &c)] {
        let delay = wait_until(Duration::from_millis(1500), || hit(s, "k=win who=z").0);
        println!("knob deleted on B lifted on {name} after {delay:?}");
        assert!(
            delay.is_some(),
            "the delete did not reach {name} within 1.5 s"
        );
        assert!(listed(s, "win").is_none());
    }

    // Counters are shared too, so carried-over consumption is the cluster's.
    put_ok(&c, "other", r#"{"creditLimit": 4}"#);
    wait_until(Duration::from_millis(1500), || {
        listed(&a, "other").is_some() && listed(&b, "other").is_some()
    })
    .expect("knob reached A and B");
    let answers: Vec<bool> = [&a, &b, &c, &a, &b]
        .iter()
        .map(|s| hit(s, "k=other").0)
        .collect();
    assert_eq!(answers, vec![true, true, true, true, false]);
}

#[test]
fn a_ttl_knob_expires_on_every_replica_and_leaves_the_hash() {
    let redis = Redis::start();
    let url = redis.url();
    let a = serve_token(&["--redis-url", &url]);
    let b = serve_token(&["--redis-url", &url]);
    let v = put_ok(&a, "win", r#"{"creditLimit": 0, "ttlSeconds": 1}"#);
    let expires = v["expiresInSeconds"].as_f64().unwrap();
    assert!(expires > 0.0 && expires <= 1.0, "{v}");
    wait_until(Duration::from_millis(1500), || listed(&b, "win").is_some())
        .expect("B sees the knob");
    assert!(!hit(&a, "k=win who=t").0);
    for (name, s) in [("A", &a), ("B", &b)] {
        let gone = wait_until(Duration::from_secs(3), || {
            listed(s, "win").is_none() && hit(s, "k=win who=t").0
        });
        assert!(
            gone.is_some(),
            "the knob did not expire on {name} within 3 s"
        );
    }
    let gone = wait_until(Duration::from_secs(2), || {
        redis.cli(&["HEXISTS", "divvy:knobs", "win"]) == "0"
    });
    assert!(gone.is_some(), "the expired knob stays in divvy:knobs");
}

/// The knob `label` as `GET /knobs` at `addr` lists it.
fn listed_at(addr: SocketAddr, label: &str) -> Option<Value> {
    let (status, text) = call_at(addr, "GET", "/knobs", "", None);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["knobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["label"] == label)
        .cloned()
}

/// One `HIT line` on the line protocol at `addr`: allowed?
fn allowed_at(addr: SocketAddr, line: &str) -> bool {
    let mut s = std::net::TcpStream::connect(addr).expect("connect line");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("HIT {line}\n").as_bytes()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    parse_ok(&out).0
}

#[test]
fn a_replica_reads_its_own_writes_while_knobs_refresh_from_redis() {
    // After a PUT (or DELETE) answered 200, the same replica must list and
    // apply the new knob; the 250 ms refresh must never put back an older
    // copy it read from Redis before the change. Three writers, one label
    // each, so changes often overlap a refresh; stops at the first stale read.
    let redis = Redis::start();
    let a = serve_token(&["--redis-url", &redis.url()]);
    let (http, line) = (a.http, a.line);
    let deadline = Instant::now() + Duration::from_secs(8);
    let stale = std::sync::Mutex::new(Vec::<String>::new());
    let rounds = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for label in ["win", "fix", "other"] {
            let (stale, rounds) = (&stale, &rounds);
            scope.spawn(move || {
                let mut i = 0u64;
                while Instant::now() < deadline && stale.lock().unwrap().is_empty() {
                    i += 1;
                    rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let (status, text) = call_at(
                        http,
                        "PUT",
                        &format!("/knobs/{label}"),
                        &format!(r#"{{"creditLimit": {}}}"#, i % 2),
                        Some(BEARER),
                    );
                    assert_eq!(status, 200, "{text}");
                    let seen = listed_at(http, label).map(|k| k["set"]["creditLimit"].clone());
                    if seen != Some(Value::from(i % 2)) {
                        stale.lock().unwrap().push(format!(
                            "{label} round {i}: PUT creditLimit={} answered 200, then GET /knobs showed creditLimit {seen:?}",
                            i % 2
                        ));
                    }
                    if label == "win" && i.is_multiple_of(2) && allowed_at(line, &format!("k=win who=r{i}")) {
                        stale.lock().unwrap().push(format!(
                            "{label} round {i}: PUT creditLimit=0 answered 200, then a HIT was allowed"
                        ));
                    }
                    if i.is_multiple_of(3) {
                        let (status, text) =
                            call_at(http, "DELETE", &format!("/knobs/{label}"), "", Some(BEARER));
                        assert_eq!(status, 200, "{text}");
                        if let Some(k) = listed_at(http, label) {
                            stale.lock().unwrap().push(format!(
                                "{label} round {i}: DELETE answered 200, then GET /knobs still showed {k}"
                            ));
                        }
                    }
                }
            });
        }
    });
    let stale = stale.into_inner().unwrap();
    println!(
        "{} rounds of PUT/GET (and DELETE/GET) on one shared replica",
        rounds.into_inner()
    );
    assert!(
        stale.is_empty(),
        "stale knobs on the replica that made the change:\n{}",
        stale.join("\n")
    );
}

// -------------------------------------------------------- 5. Redis killed

#[test]
fn when_redis_dies_the_last_knobs_stay_in_force_and_changes_get_503() {
    let mut redis = Redis::start();
    let url = redis.url();
    let allow = serve_token(&["--redis-url", &url, "--on-store-failure", "allow"]);
    let local = serve_token(&["--redis-url", &url, "--on-store-failure", "local"]);
    put_ok(&allow, "win", r#"{"creditLimit": 0}"#);
    put_ok(&allow, "other", r#"{"creditLimit": 7}"#);
    put_ok(&allow, "fix", r#"{"creditLimit": 4}"#);
    for s in [&allow, &local] {
        wait_until(Duration::from_millis(1500), || {
            ["win", "other", "fix"]
                .iter()
                .all(|l| listed(s, l).is_some())
        })
        .expect("both replicas see the knobs");
    }
    redis.kill();
    // Several refresh periods pass with Redis gone.
    std::thread::sleep(Duration::from_millis(1000));
    for s in [&allow, &local] {
        let list = knobs(s);
        let labels: Vec<&str> = list["knobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["label"].as_str().unwrap())
            .collect();
        assert_eq!(labels, vec!["fix", "other", "win"], "{list}");
        assert_eq!(hit(s, "k=win who=x"), (false, 0, -1));
    }
    // allow: the store is down (every counted hit is allowed), with the knob's limit.
    for _ in 0..3 {
        let (allowed, credits, _) = hit(&allow, "k=other");
        assert!(allowed);
        assert_eq!(
            credits, 7,
            "the failure policy answers with the knob's limit"
        );
    }
    // local: a share (0.5) of the knob's limit 4, not of the rule's own 10.
    assert_eq!(
        hits(&local, "k=fix who=l", 3),
        vec![(true, 1), (true, 0), (false, 0)]
    );
    // Changes are refused: they would not reach the other replicas.
    for s in [&allow, &local] {
        let (status, text) = put(s, "win", r#"{"creditLimit": 50}"#);
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("Redis"), "{text}");
        let (status, text) = delete(s, "other");
        assert_eq!(status, 503, "{text}");
        // Nothing changed.
        assert_eq!(hit(s, "k=win who=x"), (false, 0, -1));
        assert_eq!(
            listed(s, "win").unwrap()["set"]["creditLimit"],
            0,
            "a refused change is not applied locally"
        );
        assert!(listed(s, "other").is_some());
    }
    // And after another while without Redis, still in force.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(hit(&allow, "k=win who=y"), (false, 0, -1));
    assert_eq!(hit(&allow, "k=other").1, 7);
}

// --------------------------------------------- 6. TTL, reload, inactive labels

#[test]
fn a_ttl_knob_expires_and_the_rule_applies_again() {
    let server = serve_token(&[]);
    let v = put_ok(&server, "win", r#"{"creditLimit": 0, "ttlSeconds": 1}"#);
    assert!(v["expiresInSeconds"].as_f64().unwrap() <= 1.0, "{v}");
    assert_eq!(hit(&server, "k=win who=a"), (false, 0, -1));
    let listed_ttl = listed(&server, "win").unwrap();
    assert!(listed_ttl["expiresInSeconds"].as_f64().unwrap() <= 1.0);
    let gone = wait_until(Duration::from_secs(3), || {
        listed(&server, "win").is_none() && hit(&server, "k=win who=a").0
    });
    assert!(gone.is_some(), "the 1 s knob did not expire within 3 s");
    assert_eq!(hit(&server, "k=win who=b"), (true, 9, 3600));
    // The refresh task counts the expiry (allow it one more period).
    let counted = wait_until(Duration::from_secs(1), || changes(&server, "expire") == 1.0);
    assert!(
        counted.is_some(),
        "expire counter: {}",
        changes(&server, "expire")
    );
    assert_eq!(samples(&server)["divvy_knobs"], 0.0);
    // A knob without ttl has none.
    put_ok(&server, "win", r#"{"creditLimit": 3}"#);
    assert!(listed(&server, "win").unwrap()["expiresInSeconds"].is_null());
    let log = drain_log(&server);
    assert!(
        log.iter()
            .any(|l| l.contains("knob expired") && l.contains("label=win")),
        "{log:?}"
    );
}

fn reload_policy(win_label: &str, marker: u64) -> String {
    format!(
        "overrides:\n  - label: {win_label}\n    operation: {{k: win, who: \"*\"}}\n    actorField: who\n    \
         creditLimit: 10\n    resetSeconds: 1h\n  - label: marker\n    operation: {{k: marker}}\n    \
         creditLimit: {marker}\n    resetSeconds: 0\ndefault: {{creditLimit: 100, resetSeconds: 1h}}\n"
    )
}

fn rename_over(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn wait_for_marker(server: &Server, marker: u64) {
    let seen = wait_until(Duration::from_secs(15), || {
        hit(server, "k=marker") == (true, marker, 0)
    });
    assert!(seen.is_some(), "policy with marker {marker} not in force");
}

#[test]
fn knobs_survive_a_reload_and_a_vanished_label_is_listed_inactive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, reload_policy("win", 1)).unwrap();
    let server = Server::start(&path, &["--admin-token", TOKEN]);
    put_ok(&server, "win", r#"{"creditLimit": 2}"#);
    assert_eq!(
        hits(&server, "k=win who=a", 3),
        vec![(true, 1), (true, 0), (false, 0)]
    );

    // Same label after a reload: still in force, counters intact.
    rename_over(&path, &reload_policy("win", 2));
    wait_for_marker(&server, 2);
    assert_eq!(listed(&server, "win").unwrap()["active"], true);
    assert!(!hit(&server, "k=win who=a").0);
    assert_eq!(hit(&server, "k=win who=b"), (true, 1, 3600));

    // The label leaves the policy: kept, listed inactive, applies to nothing.
    rename_over(&path, &reload_policy("renamed", 3));
    wait_for_marker(&server, 3);
    let k = listed(&server, "win").expect("the knob is kept");
    assert_eq!(k["active"], false, "{k}");
    assert_eq!(k["set"]["creditLimit"], 2);
    // `renamed` has the rule's own 10 and the same counter: a has used 2 of them.
    assert_eq!(hits(&server, "k=win who=a", 1), vec![(true, 7)]);
    // Its knob cannot be changed while nothing has the label.
    let (status, _) = put(&server, "win", r#"{"creditLimit": 5}"#);
    assert_eq!(status, 404);
    assert_eq!(listed(&server, "win").unwrap()["set"]["creditLimit"], 2);

    // The label comes back: the kept knob applies again.
    rename_over(&path, &reload_policy("win", 4));
    wait_for_marker(&server, 4);
    assert_eq!(listed(&server, "win").unwrap()["active"], true);
    assert!(!hit(&server, "k=win who=a").0);
    let (status, text) = delete(&server, "win");
    assert_eq!(status, 200, "{text}");
    assert_eq!(hits(&server, "k=win who=a", 1), vec![(true, 6)]);
}

// -------------------------------------------------------------- 7. the CLI

/// `divvy knob <args>` against `server`.
fn cli(server: &Server, args: &[&str], token: Option<&str>) -> (bool, String, String) {
    common::admin_client(server, "knob", "--admin-url", args, token)
}

#[test]
fn cli_sets_lists_and_deletes() {
    let server = serve_token(&[]);
    let (ok, out, err) = cli(
        &server,
        &[
            "set",
            "win",
            "creditLimit=5",
            "resetSeconds=30s",
            "--ttl",
            "1h",
        ],
        Some(TOKEN),
    );
    assert!(ok, "set failed: {out}{err}");
    let v: Value = serde_json::from_str(&out).expect("set prints JSON");
    assert_eq!(v["label"], "win");
    let k = listed(&server, "win").expect("set through the CLI");
    assert_eq!(k["set"]["creditLimit"], 5);
    assert_eq!(k["set"]["resetSeconds"], 30);
    let ttl = k["expiresInSeconds"].as_f64().unwrap();
    assert!(ttl > 3500.0 && ttl <= 3600.0, "{k}");
    assert_eq!(hit(&server, "k=win who=a"), (true, 4, 30));

    let (ok, out, err) = cli(&server, &["list"], None);
    assert!(ok, "list failed: {out}{err}");
    let v: Value = serde_json::from_str(&out).expect("list prints JSON");
    assert_eq!(v["knobs"][0]["label"], "win", "{out}");
    assert_eq!(v["knobs"][0]["set"]["creditLimit"], 5, "{out}");

    // Refusals exit non-zero and say why.
    let (ok, _, err) = cli(&server, &["set", "win", "creditLimit=1"], None);
    assert!(!ok, "set without a token succeeded");
    assert!(err.contains("401"), "{err}");
    let (ok, _, err) = cli(&server, &["set", "win", "creditLimit=-1"], Some(TOKEN));
    assert!(!ok);
    assert!(err.contains("400"), "{err}");
    let (ok, _, err) = cli(&server, &["set", "nosuch", "creditLimit=1"], Some(TOKEN));
    assert!(!ok);
    assert!(err.contains("404"), "{err}");
    let (ok, _, err) = cli(&server, &["set", "win", "creditLimit"], Some(TOKEN));
    assert!(!ok);
    assert!(err.contains("FIELD=VALUE"), "{err}");
    assert_eq!(listed(&server, "win").unwrap()["set"]["creditLimit"], 5);

    let (ok, out, err) = cli(&server, &["delete", "win"], Some(TOKEN));
    assert!(ok, "delete failed: {out}{err}");
    assert!(listed(&server, "win").is_none());
    let (ok, out, err) = cli(&server, &["delete", "win"], Some(TOKEN));
    assert!(!ok, "a second delete succeeded: {out}");
    assert!(err.contains("404"), "{err}");
    let (ok, out, _) = cli(&server, &["list"], None);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["knobs"], serde_json::json!([]));
}

// ------------------------------------------- 8. /config, /explain, metrics

#[test]
fn config_explain_and_metrics_show_the_knobs() {
    let server = serve_token(&[]);
    put_ok(
        &server,
        "win",
        r#"{"creditLimit": 20, "resetSeconds": "30s"}"#,
    );
    put_ok(&server, "multi-short", r#"{"creditLimit": 1}"#);
    put_ok(&server, "bucket", r#"{"burst": 9}"#);

    config_shows_the_knobs(&server);
    explain_shows_the_knobs(&server);

    // Explaining consumed nothing; the knob decides.
    assert_eq!(hit(&server, "k=win who=e"), (true, 19, 30));
    let explain = get_json(&server, "/explain?k=win&who=e");
    assert_eq!(explain["decider"]["counter"]["remaining"], 19);

    let m = samples(&server);
    assert_eq!(m["divvy_knob_changes_total{action=\"set\"}"], 3.0);
    assert_eq!(m["divvy_knobs"], 3.0);
    let (status, _) = put(&server, "win", r#"{"creditLimit": -5}"#);
    assert_eq!(status, 400);
    let (status, _) = call(&server, "PUT", "/knobs/win", r#"{"creditLimit": 5}"#, None);
    assert_eq!(status, 401);
    let (status, _) = delete(&server, "win");
    assert_eq!(status, 200);
    let (status, _) = delete(&server, "win");
    assert_eq!(status, 404);
    put_ok(&server, "bucket", r#"{"burst": 8}"#);
    let m = samples(&server);
    assert_eq!(m["divvy_knob_changes_total{action=\"set\"}"], 4.0);
    assert_eq!(m["divvy_knob_changes_total{action=\"delete\"}"], 1.0);
    assert_eq!(m["divvy_knob_changes_total{action=\"refused\"}"], 3.0);
    assert_eq!(m["divvy_knobs"], 2.0);
    assert!(m.contains_key("divvy_knobs_refreshed_timestamp_seconds"));
    // Back to the rule's own numbers in /config and /explain.
    let config = get_json(&server, "/config");
    let win = config["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == "win")
        .unwrap()["limits"][0]
        .clone();
    assert!(win["knob"].is_null(), "{win}");
    assert_eq!(win["effective"]["creditLimit"], 10, "{win}");
    let explain = get_json(&server, "/explain?k=win&who=f");
    assert_eq!(explain["decider"]["creditLimit"], 10);
}

/// `/config` shows each limit's own numbers, its knob and the effective
/// limit (knobs on win, multi's first limit and bucket's burst).
fn config_shows_the_knobs(server: &Server) {
    let config = get_json(server, "/config");
    let rule = |label: &str| -> Value {
        config["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["label"] == label)
            .cloned()
            .unwrap_or_else(|| panic!("no rule {label} in /config"))
    };
    let win = &rule("win")["limits"][0];
    assert_eq!(win["creditLimit"], 10, "{win}");
    assert_eq!(win["resetSeconds"], 3600, "{win}");
    assert_eq!(win["effective"]["creditLimit"], 20, "{win}");
    assert_eq!(win["effective"]["resetSeconds"], 30, "{win}");
    assert_eq!(win["knob"]["set"]["creditLimit"], 20, "{win}");
    assert_eq!(win["knob"]["set"]["resetSeconds"], 30, "{win}");
    let multi = rule("multi");
    assert_eq!(multi["limits"][0]["effective"]["creditLimit"], 1, "{multi}");
    assert_eq!(multi["limits"][0]["knob"]["set"]["creditLimit"], 1);
    assert!(multi["limits"][1]["knob"].is_null(), "{multi}");
    assert_eq!(multi["limits"][1]["effective"]["creditLimit"], 100);
    let bucket = &rule("bucket")["limits"][0];
    assert_eq!(bucket["effective"]["burst"], 9, "{bucket}");
    assert_eq!(bucket["effective"]["creditLimit"], 5, "{bucket}");
    let other = &rule("other")["limits"][0];
    assert!(other["knob"].is_null(), "{other}");
    assert_eq!(other["effective"]["creditLimit"], 3, "{other}");
}

/// `/explain` shows the effective limits and the knobs that set them.
fn explain_shows_the_knobs(server: &Server) {
    let explain = get_json(server, "/explain?k=win&who=e");
    let d = &explain["decider"];
    assert_eq!(d["label"], "win");
    assert_eq!(d["creditLimit"], 20, "{d}");
    assert_eq!(d["resetSeconds"], 30, "{d}");
    assert_eq!(d["limits"][0]["knob"]["set"]["creditLimit"], 20, "{d}");
    assert_eq!(d["counter"]["remaining"], 20, "{d}");
    let explain = get_json(server, "/explain?k=multi");
    let d = &explain["decider"];
    assert_eq!(d["limits"][0]["creditLimit"], 1, "{d}");
    assert_eq!(d["limits"][0]["knob"]["set"]["creditLimit"], 1, "{d}");
    assert!(d["limits"][1]["knob"].is_null(), "{d}");
    let explain = get_json(server, "/explain?k=other");
    assert!(explain["decider"]["limits"][0]["knob"].is_null());
    assert_eq!(explain["decider"]["creditLimit"], 3);
}
