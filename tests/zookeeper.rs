//! Aux rules from ZooKeeper against the real binary and a real ZooKeeper
//! (Debian's `zookeeper` package on a JRE): each test runs its own
//! ZooKeeper on a free loopback port with a private data dir, writes the
//! node with the `zookeeper-client` crate, and checks `GET /config`, the
//! metrics, the logs and real line-protocol decisions: rules from the node
//! go ahead of the file's in the node's order, invalid data is refused and
//! the previous aux rules stay, changes apply within 2 s, a deleted node
//! removes them, and the service keeps serving the last good set while
//! ZooKeeper is down and picks changes up again once it is back.
//!
//! The ZooKeeper launcher is tests/common/zookeeper.rs (the soak uses it
//! too).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::zookeeper::{block, ZooKeeper};
use common::{ask, desc, parse_ok, request, Server};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde_json::Value;

/// The node divvy reads by default.
const NODE: &str = "/ratelimiter/rules";
/// What divvy logs when it refuses the node's data.
const REFUSED: &str = "aux rules from ZooKeeper refused";
/// How soon a change of the node must be in force.
const CHANGE_BOUND: Duration = Duration::from_millis(2000);
/// Slack on top of [`CHANGE_BOUND`] for polling and a loaded machine.
const MARGIN: Duration = Duration::from_millis(300);

/// The policy file: `HIT k=a` answers `OK true 10 0`, `HIT k=b` answers
/// `OK true 20 0`, anything else `OK true 1000 0` (always-allow rules, so
/// the credits name the deciding rule and nothing is consumed).
const FILE_POLICY: &str = "\
overrides:
  - label: file-a
    operation: {k: a}
    creditLimit: 10
    resetSeconds: 0
  - label: file-b
    operation: {k: b}
    creditLimit: 20
    resetSeconds: 0
default: {label: file-default, creditLimit: 1000, resetSeconds: 0}
";
const FILE_LABELS: [&str; 3] = ["file-a", "file-b", "file-default"];

// ---------------------------------------------------------------- divvy

/// A divvy server on [`FILE_POLICY`] (or `policy`) with its policy file.
struct Divvy {
    server: Server,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// Serves `policy` with the aux rules from `hosts`, configured through the
/// `ZK_*` environment variables.
fn serve_env(policy: &str, hosts: &str) -> Divvy {
    serve(
        policy,
        &[],
        &[
            ("ZK_ENABLED_FOR_AUX_RULES", "true"),
            ("ZK_HOSTS_FOR_AUX_RULES", hosts),
        ],
    )
}

fn serve(policy: &str, args: &[&str], envs: &[(&str, &str)]) -> Divvy {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy).expect("policy");
    let server = Server::start_env(&path, args, envs);
    Divvy {
        server,
        path,
        _dir: dir,
    }
}

/// The rules of `GET /config`.
fn rules(server: &Server) -> Vec<Value> {
    let (status, body) = server.http("GET", "/config", "");
    assert_eq!(status, 200, "GET /config: {body}");
    let v: Value = serde_json::from_str(&body).expect("/config is JSON");
    v["rules"].as_array().expect("rules").clone()
}

/// The labels of the rules in force, in order (`-` for a rule without one).
fn labels(server: &Server) -> Vec<String> {
    rules(server)
        .iter()
        .map(|r| r["label"].as_str().unwrap_or("-").to_owned())
        .collect()
}

/// `aux` labels followed by the file's.
fn with_file(aux: &[&str]) -> Vec<String> {
    aux.iter()
        .chain(FILE_LABELS.iter())
        .map(|s| (*s).to_owned())
        .collect()
}

/// Polls `/config` until the labels are `want`; returns when that was seen.
fn wait_labels(server: &Server, want: &[String], within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let got = labels(server);
        if got == want {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "rules in force not {want:?} within {within:?}; last seen {got:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Checks each rule's position, label and creditLimit in `/config`: aux
/// rules come first, flagged `aux` and numbered in the node; the file's
/// rules keep their numbers in the file.
fn assert_config(server: &Server, want: &[(&str, u64)]) {
    let rules = rules(server);
    let got: Vec<(bool, u64, String, u64)> = rules
        .iter()
        .map(|r| {
            (
                r["aux"].as_bool().expect("aux"),
                r["position"].as_u64().expect("position"),
                r["label"].as_str().unwrap_or("-").to_owned(),
                r["creditLimit"].as_u64().expect("creditLimit"),
            )
        })
        .collect();
    let aux = want.iter().filter(|(l, _)| l.starts_with("aux")).count();
    let want: Vec<(bool, u64, String, u64)> = want
        .iter()
        .enumerate()
        .map(|(i, (l, c))| {
            let in_source = if i < aux { i } else { i - aux };
            (i < aux, in_source as u64 + 1, (*l).to_owned(), *c)
        })
        .collect();
    assert_eq!(got, want, "(aux, position, label, creditLimit) in /config");
}

/// One `HIT <pairs>` on the line protocol: `(allowed, credits, seconds)`.
fn hit(server: &Server, pairs: &str) -> (bool, u64, i64) {
    let answer = server.line_exchange(format!("HIT {pairs}\n").as_bytes());
    parse_ok(answer.lines().next().expect("one answer"))
}

/// The credits an always-allow rule answers for `HIT <pairs>`: names the rule
/// that decided.
fn marker(server: &Server, pairs: &str) -> u64 {
    let (allowed, credits, seconds) = hit(server, pairs);
    assert!(
        allowed && seconds == 0,
        "HIT {pairs}: not an always-allow answer ({allowed} {credits} {seconds})"
    );
    credits
}

/// A metric's value (a series without labels).
fn metric(server: &Server, name: &str) -> f64 {
    *server
        .metric_samples()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn wait_metric(server: &Server, name: &str, want: f64, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let got = metric(server, name);
        if got == want {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{name} not {want} within {within:?}; last seen {got}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The next log line containing `needle` (earlier lines are consumed).
fn wait_log(server: &Server, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match server.log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(_) => panic!("no log line with {needle:?} within {within:?}"),
        }
    }
}

/// `GET /readyz` status.
fn ready(server: &Server) -> u16 {
    server.http("GET", "/readyz", "").0
}

/// An always-allow aux rule: `(label, operation pairs, creditLimit)`.
type AuxRule<'a> = (&'a str, &'a [(&'a str, &'a str)], u64);

/// A JSON array of always-allow aux rules.
fn aux(rules: &[AuxRule<'_>]) -> String {
    let list: Vec<Value> = rules
        .iter()
        .map(|(label, op, credits)| {
            let operation: serde_json::Map<String, Value> = op
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
                .collect();
            serde_json::json!({
                "label": label,
                "operation": operation,
                "creditLimit": credits,
                "resetSeconds": 0,
            })
        })
        .collect();
    Value::Array(list).to_string()
}

fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).expect("rewrite policy");
}

// ---------------------------------------------------------------- tests

/// Rules from the node decide, stand ahead of the file's in the node's
/// order, and the metrics count them.
#[test]
fn aux_rules_apply_ahead_of_the_file_in_node_order() {
    let zk = ZooKeeper::start();
    // One counting rule (2 per hour) that shadows file-a for user u1, and two
    // overlapping always-allow rules: a HIT matching both is decided by the
    // first in the node (foxpass reversed the node's order).
    let data = r#"[
        {"label": "aux-user", "operation": {"k": "a", "user": "u1"}, "creditLimit": 2, "resetSeconds": 3600},
        {"label": "aux-first", "operation": {"k": "b", "u": "1"}, "creditLimit": 7, "resetSeconds": 0, "matchPolicy": "stop"},
        {"label": "aux-second", "operation": {"k": "b", "v": "1"}, "creditLimit": 8, "resetSeconds": 0}
    ]"#;
    zk.set(NODE, data);
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    wait_labels(
        s,
        &with_file(&["aux-user", "aux-first", "aux-second"]),
        Duration::from_secs(15),
    );
    assert_config(
        s,
        &[
            ("aux-user", 2),
            ("aux-first", 7),
            ("aux-second", 8),
            ("file-a", 10),
            ("file-b", 20),
            ("file-default", 1000),
        ],
    );
    let config = rules(s);
    assert_eq!(config[0]["resetSeconds"], 3600);
    assert_eq!(
        config[0]["operation"],
        serde_json::json!({"k": "a", "user": "u1"})
    );
    assert_eq!(config[5]["default"], true);

    first_in_node_order_decides(s);
    swapped_order_decides(&zk, s);
    readme_example_denies_in_any_domain(&zk, s);
}

/// The first set: aux-user counts for u1 ahead of file-a, the file decides
/// the rest, and of two matching aux rules the first in the node decides.
fn first_in_node_order_decides(s: &Server) {
    // The aux rule decides for the requests it matches, with its own counter.
    let (allowed, credits, seconds) = hit(s, "k=a user=u1");
    assert!(
        allowed && credits == 1 && (1..=3600).contains(&seconds),
        "first hit: {allowed} {credits} {seconds}"
    );
    let (allowed, credits, _) = hit(s, "k=a user=u1");
    assert!(allowed && credits == 0, "second hit: {allowed} {credits}");
    let (allowed, credits, _) = hit(s, "k=a user=u1");
    assert!(
        !allowed && credits == 0,
        "third hit is denied: {allowed} {credits}"
    );
    // The file's rules decide the rest.
    assert_eq!(marker(s, "k=a user=u2"), 10);
    assert_eq!(marker(s, "k=a"), 10);
    assert_eq!(marker(s, "k=b"), 20);
    assert_eq!(marker(s, "k=z"), 1000);
    // Node order: the first aux rule decides when both match.
    assert_eq!(marker(s, "k=b u=1 v=1"), 7);
    assert_eq!(marker(s, "k=b v=1 u=1"), 7);
    assert_eq!(marker(s, "k=b u=1"), 7);
    assert_eq!(marker(s, "k=b v=1"), 8);
    assert_eq!(marker(s, "k=b u=2 v=1"), 8);

    assert_eq!(metric(s, "divvy_aux_rules"), 3.0);
    assert_eq!(metric(s, "divvy_aux_rules_source_up"), 1.0);
    assert_eq!(metric(s, "divvy_aux_rules_refused_total"), 0.0);
    assert_eq!(ready(s), 200);
}

/// The same rules in the other order: the other one decides, and a rule
/// dropped from the node leaves the file's rule deciding again.
fn swapped_order_decides(zk: &ZooKeeper, s: &Server) {
    // The same rules in the other order: now the other one decides.
    let swapped = r#"[
        {"label": "aux-second", "operation": {"k": "b", "v": "1"}, "creditLimit": 8, "resetSeconds": 0},
        {"label": "aux-first", "operation": {"k": "b", "u": "1"}, "creditLimit": 7, "resetSeconds": 0}
    ]"#;
    zk.set(NODE, swapped);
    wait_labels(
        s,
        &with_file(&["aux-second", "aux-first"]),
        CHANGE_BOUND + MARGIN,
    );
    assert_eq!(marker(s, "k=b u=1 v=1"), 8);
    assert_eq!(marker(s, "k=b u=1"), 7);
    // aux-user is gone: file-a decides for u1 again.
    assert_eq!(marker(s, "k=a user=u1"), 10);
    assert_eq!(metric(s, "divvy_aux_rules"), 2.0);
}

/// The README's always-deny example: it denies acme's export over the
/// line protocol and Envoy requests of any domain.
fn readme_example_denies_in_any_domain(zk: &ZooKeeper, s: &Server) {
    // The README's example: an always-deny rule without resetSeconds.
    zk.set(
        NODE,
        r#"[{"operation": {"path": "/export", "customer": "acme"},
  "creditLimit": 0, "label": "block-acme-export"}]"#,
    );
    wait_labels(s, &with_file(&["block-acme-export"]), CHANGE_BOUND + MARGIN);
    for _ in 0..2 {
        let (allowed, credits, _) = hit(s, "path=/export customer=acme");
        assert!(!allowed && credits == 0, "acme's export is denied");
    }
    assert_eq!(marker(s, "path=/export customer=other"), 1000);
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0);
    // The aux rule (no domain) decides Envoy requests of any domain too.
    let codes = block(async {
        let mut client = s.client().await;
        let mut codes = Vec::new();
        for customer in ["acme", "other"] {
            let descriptor = desc(&[("path", "/export"), ("customer", customer)]);
            let r = ask(&mut client, request("any-domain", vec![descriptor])).await;
            codes.push(r.overall_code);
        }
        codes
    });
    assert_eq!(codes, [Code::OverLimit as i32, Code::Ok as i32]);
}

/// Invalid data is refused with an error log and a metric; the previous aux
/// rules stay in force, and a later valid set applies.
#[test]
fn invalid_data_keeps_the_previous_aux_rules() {
    let zk = ZooKeeper::start();
    zk.set(
        NODE,
        &aux(&[("aux-good", &[("k", "a"), ("user", "u1")], 5)]),
    );
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    let good = with_file(&["aux-good"]);
    wait_labels(s, &good, Duration::from_secs(15));
    assert_eq!(marker(s, "k=a user=u1"), 5);

    let bad = invalid_sets();
    for (i, (what, data, reason)) in bad.iter().enumerate() {
        zk.set(NODE, data);
        assert_refused(s, what, reason, i + 1, &good);
    }

    // A valid set after the refusals applies, and is not counted as refused.
    zk.set(NODE, &aux(&[("aux-new", &[("k", "a"), ("user", "u2")], 6)]));
    wait_labels(s, &with_file(&["aux-new"]), CHANGE_BOUND + MARGIN);
    assert_eq!(marker(s, "k=a user=u2"), 6);
    assert_eq!(marker(s, "k=a user=u1"), 10);
    assert_eq!(metric(s, "divvy_aux_rules_refused_total"), bad.len() as f64);
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0);
    assert_eq!(ready(s), 200);
}

/// Node data divvy must refuse: (what it is, the data, what the refusal
/// says).
fn invalid_sets() -> [(&'static str, String, &'static str); 8] {
    [
        ("not JSON", "this is not JSON".to_owned(), "not a JSON array"),
        (
            "a JSON object, not an array",
            r#"{"label": "x", "operation": {"k": "c"}, "creditLimit": 1, "resetSeconds": 0}"#.to_owned(),
            "not a JSON array",
        ),
        (
            "an unknown field",
            r#"[{"label": "aux-typo", "operation": {"k": "c"}, "creditLimit": 1, "resetSeconds": 0, "creditLimt": 2}]"#
                .to_owned(),
            "unknown field",
        ),
        (
            "an aux stop rule masked by an earlier aux stop rule",
            aux(&[
                ("aux-wide", &[("k", "c*")], 1),
                ("aux-narrow", &[("k", "cc")], 2),
            ]),
            "unreachable",
        ),
        (
            "an aux rule that makes a file rule unreachable",
            aux(&[("aux-a", &[("k", "a")], 1)]),
            "unreachable",
        ),
        (
            "a label the file uses",
            aux(&[("file-b", &[("k", "d")], 1)]),
            "already used",
        ),
        (
            "a label used twice in the node",
            aux(&[("aux-twice", &[("k", "d")], 1), ("aux-twice", &[("k", "e")], 1)]),
            "already used",
        ),
        (
            "an aux rule with an empty operation",
            r#"[{"label": "aux-everything", "creditLimit": 1, "resetSeconds": 0}]"#.to_owned(),
            "non-empty operation",
        ),
    ]
}

/// The `refused`-th refusal, of `what`: logged at error level with
/// `reason`, counted, and the previous aux rules (`good`, aux-good
/// deciding for u1) still in force.
fn assert_refused(s: &Server, what: &str, reason: &str, refused: usize, good: &[String]) {
    let line = wait_log(s, REFUSED, Duration::from_secs(5));
    println!("{what}: {line}");
    assert!(
        line.contains("ERROR"),
        "{what}: the refusal is logged at error level: {line}"
    );
    assert!(
        line.contains(reason),
        "{what}: the refusal says {reason:?}: {line}"
    );
    wait_metric(
        s,
        "divvy_aux_rules_refused_total",
        refused as f64,
        Duration::from_secs(2),
    );
    assert_eq!(labels(s), good, "{what}: the previous aux rules stay");
    assert_eq!(
        marker(s, "k=a user=u1"),
        5,
        "{what}: aux-good still decides"
    );
    assert_eq!(marker(s, "k=a"), 10, "{what}");
    assert_eq!(
        marker(s, "k=cc"),
        1000,
        "{what}: nothing of the refused set applies"
    );
    assert_eq!(
        marker(s, "k=d"),
        1000,
        "{what}: nothing of the refused set applies"
    );
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0, "{what}");
}

/// A change of the node is in force within 2 s (the node named by
/// `--zk-aux-rules-path`, configured through flags).
#[test]
fn a_change_applies_within_two_seconds() {
    let zk = ZooKeeper::start();
    let path = "/divvy/aux-rules";
    let v = |n: u64| aux(&[(&format!("aux-v{n}"), &[("k", "a"), ("user", "u1")], n)]);
    zk.set(path, &v(1));
    // Rules at the default path are not read when another path is configured.
    zk.set(
        NODE,
        &aux(&[("aux-default-path", &[("k", "b"), ("user", "u1")], 99)]),
    );
    let hosts = zk.hosts();
    let d = serve(
        FILE_POLICY,
        &[
            "--zk-enabled-for-aux-rules",
            "true",
            "--zk-hosts-for-aux-rules",
            &hosts,
            "--zk-aux-rules-path",
            path,
        ],
        &[],
    );
    let s = &d.server;
    wait_labels(s, &with_file(&["aux-v1"]), Duration::from_secs(15));
    assert_eq!(marker(s, "k=a user=u1"), 1);
    assert_eq!(marker(s, "k=b user=u1"), 20);

    let mut delays = Vec::new();
    for n in 2..=6 {
        let sent = zk.set(path, &v(n));
        let seen = wait_labels(
            s,
            &with_file(&[&format!("aux-v{n}")]),
            CHANGE_BOUND + MARGIN,
        );
        let delay = seen - sent;
        assert_eq!(marker(s, "k=a user=u1"), n);
        println!("change to aux-v{n} in force after {delay:?}");
        delays.push(delay);
        std::thread::sleep(Duration::from_millis(100));
    }
    // Two writes in quick succession: the last one wins.
    zk.set(path, &v(7));
    let sent = zk.set(path, &v(8));
    let seen = wait_labels(s, &with_file(&["aux-v8"]), CHANGE_BOUND + MARGIN);
    println!(
        "two quick writes: the second in force after {:?}",
        seen - sent
    );
    delays.push(seen - sent);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(labels(s), with_file(&["aux-v8"]));
    assert_eq!(marker(s, "k=a user=u1"), 8);

    let worst = delays.iter().max().unwrap();
    println!("delays {delays:?}, worst {worst:?}");
    assert!(
        *worst <= CHANGE_BOUND,
        "a change took {worst:?} (more than {CHANGE_BOUND:?}) to apply"
    );
    assert_eq!(marker(s, "k=b user=u1"), 20, "the default path is not read");
}

/// A missing node means no aux rules; creating it applies them, deleting it
/// removes them, creating it again applies the new ones.
#[test]
fn node_deleted_and_created_again() {
    let zk = ZooKeeper::start();
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    // No node (not even its parent): the file's rules only.
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(15));
    assert_eq!(labels(s), with_file(&[]));
    assert_eq!(metric(s, "divvy_aux_rules"), 0.0);
    assert_eq!(marker(s, "k=a user=u1"), 10);

    let sent = zk.set(NODE, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 3)]));
    let seen = wait_labels(s, &with_file(&["aux-one"]), CHANGE_BOUND + MARGIN);
    println!("node created: in force after {:?}", seen - sent);
    assert_eq!(marker(s, "k=a user=u1"), 3);
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0);

    let sent = zk.delete(NODE);
    let seen = wait_labels(s, &with_file(&[]), CHANGE_BOUND + MARGIN);
    println!("node deleted: aux rules gone after {:?}", seen - sent);
    assert_config(s, &[("file-a", 10), ("file-b", 20), ("file-default", 1000)]);
    assert_eq!(marker(s, "k=a user=u1"), 10);
    assert_eq!(metric(s, "divvy_aux_rules"), 0.0);
    assert_eq!(metric(s, "divvy_aux_rules_refused_total"), 0.0);

    // Later, created again (the parent too, after deleting it).
    zk.delete("/ratelimiter");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(labels(s), with_file(&[]));
    let sent = zk.set(NODE, &aux(&[("aux-two", &[("k", "b"), ("user", "u1")], 4)]));
    let seen = wait_labels(s, &with_file(&["aux-two"]), CHANGE_BOUND + MARGIN);
    println!("node created again: in force after {:?}", seen - sent);
    assert_eq!(marker(s, "k=b user=u1"), 4);
    assert_eq!(marker(s, "k=a user=u1"), 10);
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0);

    // An empty node, or an empty array, holds no aux rules.
    for (i, empty) in ["", "[]", " [ ]\n"].iter().enumerate() {
        zk.set(
            NODE,
            &aux(&[(&format!("aux-{i}"), &[("k", "b"), ("user", "u1")], 4)]),
        );
        wait_labels(s, &with_file(&[&format!("aux-{i}")]), CHANGE_BOUND + MARGIN);
        zk.set(NODE, empty);
        wait_labels(s, &with_file(&[]), CHANGE_BOUND + MARGIN);
        assert_eq!(metric(s, "divvy_aux_rules"), 0.0, "{empty:?}");
        assert_eq!(marker(s, "k=b user=u1"), 20, "{empty:?}");
    }
    assert_eq!(metric(s, "divvy_aux_rules_refused_total"), 0.0);
}

/// `host:port,host:port`: one server down, the other answers.
#[test]
fn several_hosts_one_of_them_down() {
    let zk = ZooKeeper::start();
    zk.set(NODE, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 3)]));
    let dead = format!("127.0.0.1:{}", common::stable_port());
    let d = serve_env(FILE_POLICY, &format!("{dead},{}", zk.hosts()));
    let s = &d.server;
    wait_labels(s, &with_file(&["aux-one"]), Duration::from_secs(15));
    assert_eq!(marker(s, "k=a user=u1"), 3);
    zk.set(NODE, &aux(&[("aux-two", &[("k", "a"), ("user", "u1")], 4)]));
    wait_labels(s, &with_file(&["aux-two"]), CHANGE_BOUND + MARGIN);
    assert_eq!(marker(s, "k=a user=u1"), 4);

    // Disabled (the default, or `false`): the node is not read.
    for enabled in [None, Some("false")] {
        let hosts = zk.hosts();
        let mut envs = vec![("ZK_HOSTS_FOR_AUX_RULES", hosts.as_str())];
        if let Some(v) = enabled {
            envs.push(("ZK_ENABLED_FOR_AUX_RULES", v));
        }
        let off = serve(FILE_POLICY, &[], &envs);
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(labels(&off.server), with_file(&[]), "enabled {enabled:?}");
        assert_eq!(marker(&off.server, "k=a user=u1"), 10);
    }
}

/// ZooKeeper killed: the last good aux rules stay in force and the service
/// stays ready; ZooKeeper back on the same port and data dir: a later change
/// applies again.
#[test]
fn zookeeper_down_keeps_the_last_good_rules_and_back_up_applies_changes() {
    let mut zk = ZooKeeper::start();
    zk.set(NODE, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 3)]));
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    wait_labels(s, &with_file(&["aux-one"]), Duration::from_secs(15));
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(5));

    short_outage(&mut zk, s);
    long_outage(&mut zk, s);
}

/// A short outage (shorter than the session): serving goes on, and a
/// change made once ZooKeeper is back applies.
fn short_outage(zk: &mut ZooKeeper, s: &Server) {
    zk.kill();
    let killed = Instant::now();
    while killed.elapsed() < Duration::from_secs(1) {
        assert_eq!(marker(s, "k=a user=u1"), 3, "the aux rule still decides");
        assert_eq!(ready(s), 200, "/readyz while ZooKeeper is down");
        std::thread::sleep(Duration::from_millis(100));
    }
    zk.launch();
    let sent = zk.set(NODE, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 2)]));
    let deadline = sent + Duration::from_secs(15);
    while rules(s)[0]["creditLimit"] != 2 {
        assert!(
            Instant::now() < deadline,
            "change after a short outage not in force within 15 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!(
        "short outage: change in force {:?} after the write",
        sent.elapsed()
    );
    zk.set(NODE, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 3)]));
    wait_labels(s, &with_file(&["aux-one"]), CHANGE_BOUND + MARGIN);
    let deadline = Instant::now() + CHANGE_BOUND + MARGIN;
    while marker(s, "k=a user=u1") != 3 {
        assert!(Instant::now() < deadline, "change back to 3 not in force");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A long outage: the session expires, the last good rules stay, and
/// divvy reconnects with backoff and watches the node again.
fn long_outage(zk: &mut ZooKeeper, s: &Server) {
    zk.kill();
    let killed = Instant::now();
    // Keep checking until divvy has noticed that ZooKeeper is gone (its
    // session expires after about 8 s), and a little beyond.
    let mut noticed = None;
    while killed.elapsed() < Duration::from_secs(25) {
        assert_eq!(
            marker(s, "k=a user=u1"),
            3,
            "the last good aux rule still decides"
        );
        assert_eq!(marker(s, "k=a"), 10);
        assert_eq!(ready(s), 200, "/readyz while ZooKeeper is down");
        assert_eq!(labels(s), with_file(&["aux-one"]));
        assert_eq!(metric(s, "divvy_aux_rules"), 1.0);
        if noticed.is_none() && metric(s, "divvy_aux_rules_source_up") == 0.0 {
            noticed = Some(killed.elapsed());
            println!("divvy_aux_rules_source_up 0 after {:?}", killed.elapsed());
        }
        if noticed.is_some_and(|t| killed.elapsed() > t + Duration::from_secs(1)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        noticed.is_some(),
        "divvy_aux_rules_source_up still 1 {:?} after ZooKeeper was killed",
        killed.elapsed()
    );

    zk.launch();
    let back = Instant::now();
    // The node is still there from before (same data dir).
    let sent = zk.set(NODE, &aux(&[("aux-two", &[("k", "a"), ("user", "u1")], 4)]));
    let seen = wait_labels(s, &with_file(&["aux-two"]), Duration::from_secs(20));
    println!(
        "ZooKeeper back: change in force {:?} after the write, {:?} after the restart",
        seen - sent,
        seen - back
    );
    assert_eq!(marker(s, "k=a user=u1"), 4);
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(5));
    // And watched again: the next change is quick.
    let sent = zk.set(
        NODE,
        &aux(&[("aux-three", &[("k", "a"), ("user", "u1")], 5)]),
    );
    let seen = wait_labels(s, &with_file(&["aux-three"]), CHANGE_BOUND + MARGIN);
    println!("next change after the reconnect: {:?}", seen - sent);
    assert_eq!(marker(s, "k=a user=u1"), 5);
    assert_eq!(ready(s), 200);
}

/// Started while ZooKeeper is down: the file's rules serve; when ZooKeeper
/// comes up with the node, its rules apply.
#[test]
fn started_while_zookeeper_is_down() {
    let mut zk = ZooKeeper::configure(common::stable_port());
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    assert_eq!(ready(s), 200);
    assert_eq!(labels(s), with_file(&[]));
    assert_eq!(marker(s, "k=a user=u1"), 10);
    assert_eq!(marker(s, "k=b"), 20);
    assert_eq!(metric(s, "divvy_aux_rules_source_up"), 0.0);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(ready(s), 200);
    assert_eq!(marker(s, "k=a user=u1"), 10);

    zk.launch();
    let up = Instant::now();
    zk.set(
        NODE,
        &aux(&[("aux-late", &[("k", "a"), ("user", "u1")], 6)]),
    );
    let seen = wait_labels(s, &with_file(&["aux-late"]), Duration::from_secs(20));
    println!("ZooKeeper up: aux rules in force after {:?}", seen - up);
    assert_eq!(marker(s, "k=a user=u1"), 6);
    assert_eq!(marker(s, "k=a"), 10);
    assert_eq!(metric(s, "divvy_aux_rules"), 1.0);
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(5));
}

/// A reload of the policy file keeps the aux rules in force ahead of the
/// new file's rules.
#[test]
fn a_file_reload_keeps_the_aux_rules_ahead() {
    let zk = ZooKeeper::start();
    let path = "/custom/aux";
    zk.set(path, &aux(&[("aux-one", &[("k", "a"), ("user", "u1")], 3)]));
    let hosts = zk.hosts();
    let d = serve(
        FILE_POLICY,
        &[],
        &[
            ("ZK_ENABLED_FOR_AUX_RULES", "true"),
            ("ZK_HOSTS_FOR_AUX_RULES", &hosts),
            ("ZK_AUX_RULES_PATH", path),
        ],
    );
    let s = &d.server;
    wait_labels(s, &with_file(&["aux-one"]), Duration::from_secs(15));

    // Reloads that do not fit the aux rules in force are refused: a label
    // the aux rules use, a file rule an aux rule masks.
    let conflicts = [
        FILE_POLICY.replace("label: file-b\n", "label: aux-one\n"),
        FILE_POLICY.replace(
            "overrides:\n",
            "overrides:\n  - label: file-new\n    operation: {k: a, user: u1, x: '1'}\n    \
             creditLimit: 1\n    resetSeconds: 0\n",
        ),
    ];
    for conflict in &conflicts {
        write_in_place(&d.path, conflict);
        let line = wait_log(s, "policy reload failed", Duration::from_secs(10));
        println!("{line}");
        assert!(line.contains("aux rules in force"), "{line}");
        assert_eq!(labels(s), with_file(&["aux-one"]));
        assert_eq!(marker(s, "k=b"), 20);
        assert_eq!(marker(s, "k=a user=u1"), 3);
    }
    let reloaded = FILE_POLICY.replace("creditLimit: 10\n", "creditLimit: 11\n");
    write_in_place(&d.path, &reloaded);
    let deadline = Instant::now() + Duration::from_secs(10);
    while marker(s, "k=a") != 11 {
        assert!(Instant::now() < deadline, "the reloaded file not in force");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_config(
        s,
        &[
            ("aux-one", 3),
            ("file-a", 11),
            ("file-b", 20),
            ("file-default", 1000),
        ],
    );
    assert_eq!(marker(s, "k=a user=u1"), 3);
    // And a later node change still applies on top of the reloaded file.
    zk.set(path, &aux(&[("aux-two", &[("k", "a"), ("user", "u1")], 4)]));
    wait_labels(s, &with_file(&["aux-two"]), CHANGE_BOUND + MARGIN);
    assert_eq!(marker(s, "k=a user=u1"), 4);
    assert_eq!(marker(s, "k=a"), 11);
}

/// The refusal messages name the node's rules as `aux rule #i`, as
/// `with_aux_rules` documents, so an operator looks in the node and not in
/// the policy file.
#[test]
fn refusals_name_aux_rules_as_aux_rules() {
    let zk = ZooKeeper::start();
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(15));
    let cases: [(&str, String, &str); 3] = [
        (
            "an aux rule masked by an earlier aux rule",
            aux(&[
                ("aux-wide", &[("k", "c*")], 1),
                ("aux-narrow", &[("k", "cc")], 2),
            ]),
            "aux rule #2",
        ),
        (
            "an aux rule masking a file rule",
            aux(&[("aux-a", &[("k", "a")], 1)]),
            "aux rule #1",
        ),
        (
            "an aux rule with a label of the file",
            aux(&[("file-b", &[("k", "d")], 1)]),
            "aux rule #1",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, data, name) in &cases {
        zk.set(NODE, data);
        let line = wait_log(s, REFUSED, Duration::from_secs(5));
        if !line.contains(name) {
            wrong.push(format!("{what}: no {name:?} in {line:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "refusals that do not name the aux rule:\n{}",
        wrong.join("\n")
    );
}

/// Node data refused because it did not fit the policy file applies once a
/// reload of the file makes it fit: a replica that was running then serves
/// the same rules as one started afterwards with the same file and node.
#[test]
fn refused_node_data_applies_once_the_file_fits_it() {
    let zk = ZooKeeper::start();
    let d = serve_env(FILE_POLICY, &zk.hosts());
    let s = &d.server;
    wait_metric(s, "divvy_aux_rules_source_up", 1.0, Duration::from_secs(15));
    // An aux rule taking the label of a file rule: refused.
    zk.set(NODE, &aux(&[("file-b", &[("k", "d")], 1)]));
    wait_log(s, REFUSED, Duration::from_secs(5));
    assert_eq!(labels(s), with_file(&[]));
    // The file renames its rule: the node's data fits now.
    let renamed = FILE_POLICY.replace("label: file-b\n", "label: file-bb\n");
    write_in_place(&d.path, &renamed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !labels(s).contains(&"file-bb".to_owned()) {
        assert!(Instant::now() < deadline, "the renamed file not in force");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A replica started now, on the same file and node, takes the node's rule.
    let fresh = serve_env(&renamed, &zk.hosts());
    let want: Vec<String> = ["file-b", "file-a", "file-bb", "file-default"]
        .iter()
        .map(|l| (*l).to_owned())
        .collect();
    wait_labels(&fresh.server, &want, Duration::from_secs(15));
    assert_eq!(marker(&fresh.server, "k=d"), 1);
    // The running replica should serve the same rules.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = labels(s);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the running replica still serves {got:?} 5 s after the file reload, while a replica \
             started on the same file and node serves {want:?}: the node's data, refused before \
             the reload, is never tried again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(marker(s, "k=d"), 1);
}
