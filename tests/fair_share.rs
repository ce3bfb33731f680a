//! Fair shares (`fairShare: user`) through the real binary: a limit of
//! 100/s (token bucket, burst 100) on `site=partner` divided max-min fair
//! among the users asking, each user paced on its own connection (line
//! protocol, gRPC, HTTP through a real Envoy), with two replicas on one
//! real redis-server, under a flood of distinct users; and the config's
//! three syntaxes and its refusals through `divvy check`.
//!
//! Rates are measured over 10 s from 3 s after the load starts (the
//! issue's windows), by the requests sent in the window; every scenario
//! prints its figures (`--nocapture` shows them).

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::envoy::{upstream, Bootstrap};
use common::flood::{line_flood, mb, rss, RssWatch};
use common::pacer::{self, grpc_sender, http_sender, line_sender, Load, Outcome, Trace};
use common::redis::Redis;
use common::{binary, Server};

use divvy::config::{parse_str, Format};

/// The issue's policy: 100/s on `site=partner`, shared by `user`.
const POLICY: &str = r#"overrides:
  - operation: {site: partner, user: "*"}
    creditLimit: 100
    resetSeconds: 1
    algorithm: token_bucket
    burst: 100
    fairShare: user
    label: partner
default:
  creditLimit: 0
  resetSeconds: 0
"#;

/// Seconds of load before the measurement starts.
const WARM: f64 = 3.0;
/// Seconds measured.
const MEASURE: f64 = 10.0;

/// The paced scenarios measure rates: one at a time, even when the test
/// harness runs tests on several threads (the machine may have 2 cores).
static PACED: Mutex<()> = Mutex::new(());

fn paced() -> MutexGuard<'static, ()> {
    PACED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A line-protocol hit of `user` on the partner site.
fn hit(user: &str) -> String {
    format!("HIT site=partner user={user}")
}

/// One user's figures over a window: requests sent per second, admitted
/// per second, requests skipped by the pacer, failures.
#[derive(Debug, Default, Clone)]
struct Rates {
    asked: f64,
    admitted: f64,
    skipped: u64,
    failed: Vec<String>,
}

/// The traces' figures over `[from, to)`, summed by user (a user paced
/// on several replicas counts once), in the order users first appear;
/// printed with the total under `what`.
fn report(what: &str, traces: &[Trace], from: f64, to: f64) -> Vec<(String, Rates)> {
    let mut order: Vec<String> = Vec::new();
    let mut by_user: BTreeMap<String, Rates> = BTreeMap::new();
    for t in traces {
        let user = &t.load.user;
        if !by_user.contains_key(user) {
            order.push(user.clone());
        }
        let r = by_user.entry(user.clone()).or_default();
        r.asked += t.asked_rate(from, to);
        r.admitted += t.allowed_rate(from, to);
        r.skipped += t.skipped;
        r.failed.extend(t.failed(from, to));
    }
    println!("{what}: rates from {from:.0} s to {to:.0} s (per second)");
    let mut total = 0.0;
    let rates: Vec<(String, Rates)> = order
        .into_iter()
        .map(|u| {
            let r = by_user.remove(&u).unwrap();
            total += r.admitted;
            println!(
                "  user {u:>6}: asked {:6.1}, admitted {:6.1} ({:5.1} %); skipped by the pacer {}, failed {}{}",
                r.asked,
                r.admitted,
                100.0 * r.admitted / r.asked.max(1e-9),
                r.skipped,
                r.failed.len(),
                r.failed.first().map_or(String::new(), |f| format!(" (first: {f})")),
            );
            (u, r)
        })
        .collect();
    println!("  total admitted {total:.1}");
    rates
}

/// The admitted rate of `user` in `rates`.
fn admitted(rates: &[(String, Rates)], user: &str) -> f64 {
    rates
        .iter()
        .find(|(u, _)| u == user)
        .unwrap_or_else(|| panic!("no user {user} in {rates:?}"))
        .1
        .admitted
}

fn total(rates: &[(String, Rates)]) -> f64 {
    rates.iter().map(|(_, r)| r.admitted).sum()
}

/// Asserts no request of `rates` failed (neither allowed nor denied).
fn no_failures(what: &str, rates: &[(String, Rates)]) {
    for (u, r) in rates {
        assert!(
            r.failed.is_empty(),
            "{what}: user {u} failed: {:?}",
            r.failed
        );
    }
}

/// Asserts `got` is `want` ±10 %.
fn within_10_percent(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= want * 0.1,
        "{what}: admitted {got:.1}/s, not {want}/s ±10 %"
    );
}

/// The server's `divvy_fair_share_*` samples, one line.
fn fair_metrics(server: &Server) -> String {
    server
        .metric_samples()
        .into_iter()
        .filter(|(k, _)| k.starts_with("divvy_fair_share_") && !k.contains("alive"))
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Paces `loads` on the line protocol of `server`.
fn line_loads(server: &Server, loads: &[Load]) -> Vec<Trace> {
    let addr = server.line;
    pacer::run(loads, &|_, l| line_sender(addr, hit(&l.user)))
}

/// The four users of scenario 1, from the start to the end of the window.
fn thirty_to_eighty() -> Vec<Load> {
    [("a", 30.0), ("b", 40.0), ("c", 60.0), ("d", 80.0)]
        .iter()
        .map(|&(u, r)| Load::new(u, r, 0.0, WARM + MEASURE))
        .collect()
}

/// Scenario 1's assertions: each user 25/s ±10 %, the site ≤ 102/s.
fn check_equal_quarters(what: &str, rates: &[(String, Rates)]) {
    for (u, r) in rates {
        within_10_percent(&format!("{what}: user {u}"), r.admitted, 25.0);
    }
    let t = total(rates);
    assert!(t <= 102.0, "{what}: the site admitted {t:.1}/s");
}

#[test]
fn four_users_over_the_line_protocol_get_a_quarter_each() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    let traces = line_loads(&server, &thirty_to_eighty());
    let what = "line protocol, 30/40/60/80";
    let rates = report(what, &traces, WARM, WARM + MEASURE);
    println!("  {}", fair_metrics(&server));
    no_failures(what, &rates);
    check_equal_quarters(what, &rates);
}

#[test]
fn four_users_over_grpc_get_a_quarter_each() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    let addr = server.grpc;
    let traces = pacer::run(&thirty_to_eighty(), &|_, l| {
        grpc_sender(addr, "any", &[("site", "partner"), ("user", &l.user)])
    });
    let what = "gRPC, 30/40/60/80";
    let rates = report(what, &traces, WARM, WARM + MEASURE);
    println!("  {}", fair_metrics(&server));
    no_failures(what, &rates);
    check_equal_quarters(what, &rates);
}

#[test]
fn light_users_get_what_they_ask_beside_a_heavy_one() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    let end = WARM + MEASURE;
    let loads = [
        Load::new("heavy", 200.0, 0.0, end),
        Load::new("l1", 10.0, 0.0, end),
        Load::new("l2", 10.0, 0.0, end),
        Load::new("l3", 10.0, 0.0, end),
    ];
    let traces = line_loads(&server, &loads);
    let what = "one at 200/s, three at 10/s";
    let rates = report(what, &traces, WARM, end);
    println!("  {}", fair_metrics(&server));
    no_failures(what, &rates);
    for (u, r) in &rates[1..] {
        assert!(
            r.admitted >= 0.95 * r.asked,
            "{what}: light user {u} admitted {:.1}/s of {:.1}/s asked",
            r.admitted,
            r.asked
        );
    }
    within_10_percent(&format!("{what}: heavy"), admitted(&rates, "heavy"), 70.0);
}

#[test]
fn a_user_that_stops_gives_its_share_back_within_two_seconds() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    // d stops 3 s in; measured from 2 s after it stopped, over 10 s.
    let stop = WARM;
    let (from, to) = (stop + 2.0, stop + 2.0 + MEASURE);
    let loads = [
        Load::new("a", 30.0, 0.0, to),
        Load::new("b", 40.0, 0.0, to),
        Load::new("c", 80.0, 0.0, to),
        Load::new("d", 60.0, 0.0, stop),
    ];
    let traces = line_loads(&server, &loads);
    let what = "30/40/80/60, then the last stops";
    report(&format!("{what} (before the stop)"), &traces, 1.0, stop);
    let rates = report(&format!("{what} (after)"), &traces, from, to);
    println!("  {}", fair_metrics(&server));
    no_failures(what, &rates);
    let a = &rates[0].1;
    assert!(
        a.admitted >= 0.95 * a.asked,
        "{what}: a admitted {:.1}/s of {:.1}/s asked",
        a.admitted,
        a.asked
    );
    within_10_percent(&format!("{what}: b"), admitted(&rates, "b"), 35.0);
    within_10_percent(&format!("{what}: c"), admitted(&rates, "c"), 35.0);
}

#[test]
fn a_newcomer_on_a_saturated_site_gets_what_it_asks() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    // d arrives 3 s in, at 20/s; measured from 2 s after, over 10 s.
    let arrives = WARM;
    let (from, to) = (arrives + 2.0, arrives + 2.0 + MEASURE);
    let loads = [
        Load::new("a", 80.0, 0.0, to),
        Load::new("b", 80.0, 0.0, to),
        Load::new("c", 80.0, 0.0, to),
        Load::new("d", 20.0, arrives, to),
    ];
    let traces = line_loads(&server, &loads);
    let what = "three at 80/s, then one at 20/s";
    report(
        &format!("{what} (before it arrives)"),
        &traces,
        1.0,
        arrives,
    );
    report(
        &format!("{what} (its first 2 s)"),
        &traces,
        arrives,
        arrives + 2.0,
    );
    let rates = report(what, &traces, from, to);
    println!("  {}", fair_metrics(&server));
    no_failures(what, &rates);
    let d = admitted(&rates, "d");
    assert!(d >= 19.0, "{what}: the newcomer admitted {d:.1}/s");
}

#[test]
fn two_replicas_on_one_redis_share_by_the_deployments_demand() {
    let _one = paced();
    let redis = Redis::start();
    let policy = POLICY
        .replace("creditLimit: 100", "creditLimit: 90")
        .replace("burst: 100", "burst: 90");
    let args = ["--redis-url", &redis.url(), "--redis-timeout-ms", "10000"];
    let replicas = [
        Server::with_policy_args(&policy, "yaml", &args),
        Server::with_policy_args(&policy, "yaml", &args),
    ];
    replicas.iter().for_each(Server::wait_for_breaker_closed);
    let end = WARM + MEASURE;
    // (user, rate, replica)
    let plan = [
        ("a", 60.0, 0),
        ("b", 60.0, 1),
        ("c", 10.0, 0),
        ("c", 10.0, 1),
    ];
    let loads: Vec<Load> = plan
        .iter()
        .map(|&(u, r, _)| Load::new(u, r, 0.0, end))
        .collect();
    let addrs: Vec<_> = plan.iter().map(|&(_, _, i)| replicas[i].line).collect();
    let traces = pacer::run(&loads, &|i, l| line_sender(addrs[i], hit(&l.user)));
    let hashes = redis.cli(&["--scan", "--pattern", "divvy:fair:*"]);
    let what = "two replicas, limit 90/s: a 60/s on 1, b 60/s on 2, c 10/s on each";
    let rates = report(what, &traces, WARM, end);
    for (i, r) in replicas.iter().enumerate() {
        println!("  replica {}: {}", i + 1, fair_metrics(r));
        assert!(
            r.policy_decisions().is_empty(),
            "replica {}: the failure policy decided: {:?}",
            i + 1,
            r.policy_decisions()
        );
    }
    println!("  demand hashes in Redis: {hashes:?}");
    no_failures(what, &rates);
    let c = admitted(&rates, "c");
    assert!(c >= 19.0, "{what}: c admitted {c:.1}/s in all");
    within_10_percent(&format!("{what}: a"), admitted(&rates, "a"), 35.0);
    within_10_percent(&format!("{what}: b"), admitted(&rates, "b"), 35.0);
    let t = total(&rates);
    assert!(t <= 92.0, "{what}: the site admitted {t:.1}/s");
}

#[test]
fn a_flood_of_distinct_users_is_held_in_memory_and_by_the_limit() {
    const USERS: usize = 100_000;
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    let pid = server.pid();
    let before = rss(pid);
    let watch = RssWatch::start(pid);
    let started = Instant::now();
    let answers = line_flood(server.line, USERS, 4, &|i| hit(&format!("flood{i}")));
    let elapsed = started.elapsed().as_secs_f64();
    let (after, peak) = (rss(pid), watch.stop());
    let allowed = answers.iter().filter(|a| a.starts_with("OK true ")).count();
    let denied = answers
        .iter()
        .filter(|a| a.starts_with("OK false "))
        .count();
    let samples = server.metric_samples();
    let overflow = samples
        .get("divvy_fair_share_overflow_total{limit=\"partner\"}")
        .copied()
        .unwrap_or(0.0);
    let actors = samples
        .get("divvy_fair_share_actors{limit=\"partner\"}")
        .copied()
        .unwrap_or(0.0);
    // The site's token bucket: at most its burst plus its rate over the flood.
    let most = 100.0 + 100.0 * elapsed;
    let growth = peak.saturating_sub(before);
    println!(
        "flood: {USERS} distinct users in {elapsed:.1} s: {allowed} allowed (the bucket allows at most {most:.0}), {denied} denied; \
         RSS before {:.1} MiB, after {:.1} MiB, peak {:.1} MiB: growth {:.1} MiB; overflow {overflow}, actors {actors}",
        mb(before),
        mb(after),
        mb(peak),
        mb(growth),
    );
    assert_eq!(allowed + denied, USERS, "every hit answered OK true/false");
    assert!(
        growth <= 64 << 20,
        "RSS grew {:.1} MiB in the flood",
        mb(growth)
    );
    assert!(overflow > 0.0, "no overflow counted beyond maxActors");
    assert!(
        allowed as f64 <= most,
        "{allowed} allowed in {elapsed:.1} s: more than burst 100 + 100/s"
    );
}

#[test]
fn four_users_through_envoy_get_a_quarter_each() {
    let _one = paced();
    let server = Server::with_policy(POLICY, "yaml");
    let upstream = upstream("hello\n");
    // Envoy's defaults as the tests run it: a 20 ms deadline, failing closed.
    let envoy = Bootstrap::new("fair", "unused", "0.02s")
        .descriptor_headers(&[("x-site", "site"), ("x-user", "user")])
        .listener("ingress", "divvy")
        .divvy("divvy", None)
        .start(server.grpc.port(), upstream);
    let port = envoy.ports[0];
    let traces = pacer::run(&thirty_to_eighty(), &|_, l| {
        http_sender(port, "/", &[("x-site", "partner"), ("x-user", &l.user)])
    });
    let what = "HTTP through Envoy, 30/40/60/80";
    let rates = report(what, &traces, WARM, WARM + MEASURE);
    println!("  {}", fair_metrics(&server));
    check_equal_quarters(what, &rates);
}

/// Runs `divvy check` on `text` written as `policy.<ext>`: success, and
/// what it printed.
fn check(text: &str, ext: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("policy.{ext}"));
    std::fs::write(&path, text).unwrap();
    let out = Command::new(binary())
        .arg("check")
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The fair shares of every limit of `text`'s rules (the default's last).
fn fair_shares(text: &str, format: Format) -> Vec<Option<(String, Duration, usize)>> {
    let policy = parse_str(text, format, "policy").unwrap_or_else(|e| panic!("{e}\n{text}"));
    policy
        .rules
        .iter()
        .flat_map(|r| &r.limits)
        .map(|l| {
            l.fair_share
                .as_ref()
                .map(|f| (f.by.clone(), f.idle, f.max_actors))
        })
        .collect()
}

#[test]
fn fair_share_is_accepted_in_every_syntax_and_refused_with_its_problem() {
    let default = || Some(("user".to_owned(), Duration::from_secs(5), 10_000));
    let long = "overrides:\n  - operation: {site: partner, user: \"*\"}\n    creditLimit: 100\n    resetSeconds: 1\n    fairShare: {by: user, idle: 2s, maxActors: 50}\ndefault: {creditLimit: 0, resetSeconds: 0}\n";
    let json = r#"{"overrides": [{"operation": {"site": "partner", "user": "*"}, "creditLimit": 100, "resetSeconds": 1, "fairShare": {"by": "user", "idle": "500ms", "maxActors": 7}}, {"operation": {"site": "other", "user": "*"}, "creditLimit": 10, "resetSeconds": 1, "fairShare": "user"}], "default": {"creditLimit": 0, "resetSeconds": 0}}"#;
    let ini = "[site=partner user=*]\ncreditLimit = 100\nresetSeconds = 1\nfairShare = user\n\n[site=other user=*]\nlimits.1.creditLimit = 50\nlimits.1.resetSeconds = 1\nlimits.1.fairShare = user\nlimits.2.creditLimit = 1000\nlimits.2.resetSeconds = 60\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n";
    assert_eq!(fair_shares(POLICY, Format::Yaml), vec![default(), None]);
    assert_eq!(
        fair_shares(long, Format::Yaml),
        vec![Some(("user".to_owned(), Duration::from_secs(2), 50)), None]
    );
    assert_eq!(
        fair_shares(json, Format::Json),
        vec![
            Some(("user".to_owned(), Duration::from_millis(500), 7)),
            default(),
            None
        ]
    );
    assert_eq!(
        fair_shares(ini, Format::Ini),
        vec![default(), default(), None, None]
    );
    for (text, ext) in [
        (POLICY, "yaml"),
        (long, "yaml"),
        (json, "json"),
        (ini, "ini"),
    ] {
        let (ok, out) = check(text, ext);
        assert!(ok, "divvy check refused the {ext}:\n{text}\n{out}");
        assert!(
            out.contains("fair by user"),
            "divvy check's table names the fair share:\n{out}"
        );
    }

    let rule = |extra: &str, limit: u64, reset: u64| {
        format!(
            "overrides:\n  - operation: {{site: partner, user: \"*\"}}\n    creditLimit: {limit}\n    resetSeconds: {reset}\n    {extra}\ndefault: {{creditLimit: 0, resetSeconds: 0}}\n"
        )
    };
    let refused = [
        (
            rule("fairShare: team", 100, 1),
            "fairShare key `team` is not a key of the rule's operation (site, user)",
        ),
        (
            rule("fairShare: user", 0, 1),
            "fairShare needs a limit to share: creditLimit is 0",
        ),
        (
            rule("fairShare: user", 100, 0),
            "fairShare needs a limit to share: resetSeconds is 0",
        ),
        (
            rule("fairShare: {by: user, maxActors: 0}", 100, 1),
            "fairShare.maxActors must be an integer from 1 to 1000000, found 0",
        ),
        (
            rule("fairShare: {by: user, idle: abc}", 100, 1),
            "fairShare.idle must be a duration from 100ms to 1h (such as 5s), found abc",
        ),
        (
            "[site=partner user=*]\ncreditLimit = 100\nresetSeconds = 1\nfairShare = team\n\n[default]\ncreditLimit = 0\nresetSeconds = 0\n".to_owned(),
            "fairShare key `team` is not a key of the rule's operation",
        ),
    ];
    for (text, message) in &refused {
        let ext = if text.starts_with('[') { "ini" } else { "yaml" };
        let (ok, out) = check(text, ext);
        assert!(!ok, "divvy check accepted:\n{text}\n{out}");
        assert!(
            out.contains(message) && out.contains("rule #1"),
            "expected {message:?} for rule #1 in:\n{out}"
        );
    }
}

/// The pacer is what the rates rest on: a user's requests are sent at its
/// rate (checked against an unlimited rule).
#[test]
fn the_pacer_sends_at_the_rate_asked() {
    let _one = paced();
    let server = Server::with_policy("default: {creditLimit: 1, resetSeconds: 0}\n", "yaml");
    let loads = [
        Load::new("x", 50.0, 0.0, 2.0),
        Load::new("y", 200.0, 0.5, 2.0),
    ];
    let traces = line_loads(&server, &loads);
    let rates = report("pacer, unlimited", &traces, 0.0, 2.0);
    no_failures("pacer", &rates);
    // Every request due is sent or (far behind) skipped, none more.
    assert_eq!(traces[0].sent.len() as u64 + traces[0].skipped, 100);
    assert_eq!(traces[1].sent.len() as u64 + traces[1].skipped, 300);
    assert!(traces[1]
        .sent
        .iter()
        .all(|(t, o)| *t >= 0.5 && *o == Outcome::Allowed));
}
