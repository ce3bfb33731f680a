//! `divvy replay` against the real server: traffic recorded by `serve
//! --record`, replayed under the same policy, gives the server's own counts;
//! under a tighter one, the requests it would deny. And `matchPolicy: shadow`
//! on the real server: it never denies, and says what it would have denied.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{ask, binary, desc, parse_ok, request, Server};

/// Each path has its own rule; `search` and the default are shared by every
/// client (their counts do not depend on how the connections interleave).
const SAME: &str = r#"
overrides:
  - operation: {path: /api}
    label: api
    creditLimit: 50
    resetSeconds: 3600
    actorField: ip
  - operation: {path: /login}
    label: login
    creditLimit: 5
    resetSeconds: 3600
    actorField: ip
  - operation: {path: /search}
    label: search
    creditLimit: 300
    resetSeconds: 3600
default: {label: rest, creditLimit: 1000, resetSeconds: 3600}
"#;

const RULES: [(&str, &str); 4] = [
    ("/api", "api"),
    ("/login", "login"),
    ("/search", "search"),
    ("/other", "rest"),
];

const ACTORS: usize = 8;
const HITS_PER_ACTOR: usize = 1250;

/// Per rule label: (allowed, denied).
type Counts = BTreeMap<String, (u64, u64)>;

/// One actor's HITs on a connection of its own, pipelined in batches;
/// the server's answers counted per rule (the path names the rule).
fn actor(line: std::net::SocketAddr, n: usize) -> Counts {
    let mut s = TcpStream::connect(line).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut reader = BufReader::new(s.try_clone().expect("clone"));
    let mut counts = Counts::new();
    let paths: Vec<usize> = (0..HITS_PER_ACTOR)
        .map(|i| (i * 7 + n) % RULES.len())
        .collect();
    for batch in paths.chunks(50) {
        let text: String = batch
            .iter()
            .map(|&p| format!("HIT path={} ip=10.0.0.{n}\n", RULES[p].0))
            .collect();
        s.write_all(text.as_bytes()).expect("send");
        for &p in batch {
            let mut answer = String::new();
            reader.read_line(&mut answer).expect("answer");
            let (allowed, _, _) = parse_ok(&answer);
            let c = counts.entry(RULES[p].1.to_owned()).or_default();
            if allowed {
                c.0 += 1;
            } else {
                c.1 += 1;
            }
        }
    }
    counts
}

/// `divvy replay` with `args`: its output (it must succeed).
fn replay(args: &[&str]) -> String {
    let out = Command::new(binary())
        .arg("replay")
        .args(args)
        .output()
        .expect("run divvy replay");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "divvy replay failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The replay table's rows: label → its numbers (allowed, denied, shadow[, old ...]).
fn table(text: &str) -> BTreeMap<String, Vec<u64>> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_owned();
            let numbers: Option<Vec<u64>> = words.map(|w| w.parse().ok()).collect();
            numbers.filter(|n| n.len() >= 3).map(|n| (name, n))
        })
        .collect()
}

#[test]
fn replayed_traffic_gives_the_servers_counts_and_a_tighter_policy_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("traffic.log");
    let same = dir.path().join("same.yaml");
    std::fs::write(&same, SAME).unwrap();
    let record_arg = record.to_str().unwrap();
    let mut server = Server::start(&same, &["--record", record_arg]);
    let line = server.line;
    let threads: Vec<_> = (0..ACTORS)
        .map(|n| std::thread::spawn(move || actor(line, n)))
        .collect();
    let mut served = Counts::new();
    for t in threads {
        for (rule, (a, d)) in t.join().expect("actor") {
            let c = served.entry(rule).or_default();
            c.0 += a;
            c.1 += d;
        }
    }
    let total: u64 = served.values().map(|(a, d)| a + d).sum();
    assert_eq!(total, (ACTORS * HITS_PER_ACTOR) as u64);
    // Every rule both allowed and denied: the comparison below means something.
    assert!(served.values().all(|&(a, d)| a > 0 && d > 0), "{served:?}");
    assert!(server.terminate().success());
    let recorded = std::fs::read_to_string(&record).unwrap();
    assert_eq!(recorded.lines().count(), ACTORS * HITS_PER_ACTOR);

    let text = replay(&["--policy", same.to_str().unwrap(), record_arg]);
    assert!(text.contains("replayed 10000 requests"), "{text}");
    assert!(text.contains("0 malformed lines skipped"), "{text}");
    let rows = table(&text);
    for (rule, &(allowed, denied)) in &served {
        assert_eq!(rows[rule][..2], [allowed, denied], "rule {rule}:\n{text}");
    }

    tighter_policy_shows_its_changes(dir.path(), &same, &record, &served);
}

/// The same traffic under tighter limits: each rule denies more, and the
/// requests that change are listed, allowed then, denied now.
fn tighter_policy_shows_its_changes(dir: &Path, same: &Path, record: &Path, served: &Counts) {
    let tighter = dir.join("tighter.yaml");
    let text = SAME
        .replace("creditLimit: 50\n", "creditLimit: 20\n")
        .replace("creditLimit: 5\n", "creditLimit: 2\n")
        .replace("creditLimit: 300\n", "creditLimit: 100\n");
    std::fs::write(&tighter, text).unwrap();
    let out = replay(&[
        "--policy",
        tighter.to_str().unwrap(),
        "--against",
        same.to_str().unwrap(),
        record.to_str().unwrap(),
    ]);
    let rows = table(&out);
    let mut more_denied = 0;
    for (rule, &(allowed, denied)) in served {
        let row = &rows[rule];
        // New: allowed, denied, shadow; old: allowed, denied, shadow.
        assert_eq!(row[3..5], [allowed, denied], "old side of {rule}:\n{out}");
        if rule != "rest" {
            assert!(row[1] > denied, "{rule} denies more:\n{out}");
        }
        more_denied += row[1] - denied;
    }
    assert!(
        out.contains(&format!("changed decisions: {more_denied}\n")),
        "{out}"
    );
    let examples: Vec<&str> = out.lines().filter(|l| l.starts_with("  line ")).collect();
    assert_eq!(examples.len(), 10, "{out}");
    assert!(out.contains("    old: allowed by "), "{out}");
    assert!(out.contains("    new: denied by "), "{out}");
}

const SHADOW: &str = r#"
overrides:
  - operation: {path: /login}
    label: login
    matchPolicy: shadow
    creditLimit: 2
    resetSeconds: 3600
    actorField: ip
default: {label: rest, creditLimit: 1000, resetSeconds: 3600}
"#;

#[test]
fn a_shadow_rule_never_denies_and_shows_what_it_would_have_denied() {
    let server = Server::with_policy(SHADOW, "yaml");
    let answers = server.line_exchange(b"HIT path=/login ip=a\n".repeat(5).as_slice());
    let fates: Vec<bool> = answers.lines().map(|l| parse_ok(l).0).collect();
    assert_eq!(fates, [true; 5], "{answers}");
    let samples = server.metric_samples();
    let shadow = samples
        .iter()
        .find(|(k, _)| {
            k.starts_with("divvy_hits_total{")
                && k.contains("status=\"shadow_mode\"")
                && k.contains("rule_label=\"login\"")
        })
        .map(|(_, v)| *v);
    assert_eq!(shadow, Some(3.0));
    let (status, explain) = server.http("GET", "/explain?path=/login&ip=a", "");
    assert_eq!(status, 200, "{explain}");
    let v: serde_json::Value = serde_json::from_str(&explain).unwrap();
    assert_eq!(v["decider"]["matchPolicy"], "shadow", "{explain}");
    assert_eq!(v["decider"]["shadow"], true);
    assert_eq!(v["decider"]["wouldDeny"], true);
    let (status, rule) = server.http("GET", "/api/v1/rules/login", "");
    assert_eq!(status, 200, "{rule}");
    let v: serde_json::Value = serde_json::from_str(&rule).unwrap();
    assert_eq!(v["matchPolicy"], "shadow", "{rule}");
    assert_eq!(v["shadowDenials"], 3, "{rule}");
    // Its history counts the hits allowed, as they were.
    assert_eq!(v["deniedPerSecond"], 0.0, "{rule}");
}

#[test]
fn envoy_requests_are_recorded_as_json_lines_and_the_file_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("traffic.log");
    let record_arg = record.to_str().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, SAME).unwrap();
    let mut server = Server::start(
        &policy,
        &["--record", record_arg, "--record-max-bytes", "4096"],
    );
    // About 10 KB of HITs: the file is rotated on the way.
    let hits = b"HIT path=/api ip=c\n".repeat(300);
    assert_eq!(server.line_exchange(&hits).lines().count(), 300);
    let body = r#"{"domain":"web","descriptors":[{"entries":[{"key":"path","value":"/login"},{"key":"ip","value":"b"}]}]}"#;
    for _ in 0..2 {
        let (status, answer) = server.http("POST", "/json", body);
        assert_eq!(status, 200, "{answer}");
    }
    // gRPC is recorded as the `POST /json` body that asks the same.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = server.client().await;
        let d = desc(&[("path", "/login"), ("ip", "b")]);
        let answer = ask(&mut client, request("web", vec![d])).await;
        assert_eq!(answer.overall_code, 1, "{answer:?}");
    });
    assert!(server.terminate().success());
    let now = std::fs::read_to_string(&record).unwrap();
    let old = std::fs::read_to_string(dir.path().join("traffic.log.1")).unwrap();
    assert!(
        now.len() <= 4096 && old.len() <= 4096,
        "{} and {} bytes",
        now.len(),
        old.len()
    );
    // The Envoy requests came last: the newest file ends with them, as bodies
    // `POST /json` takes (two sent as JSON, one over gRPC).
    let sent: serde_json::Value = serde_json::from_str(body).unwrap();
    for l in now.lines().rev().take(3) {
        let (stamp, json) = l.split_once(' ').expect("a stamped line");
        assert!(stamp.parse::<u64>().is_ok(), "{l}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(json).unwrap(),
            sent
        );
    }
    let out = replay(&["--policy", policy.to_str().unwrap(), record_arg]);
    assert!(out.contains("0 malformed lines skipped"), "{out}");
    assert_eq!(table(&out)["login"][..3], [3, 0, 0], "{out}");
}
