//! The Grafana dashboard (helm/divvy/dashboards/divvy.json) against real
//! processes: every metric its queries name is one a running divvy exports,
//! with every label the queries use, and every query, run by a real
//! Prometheus scraping those divvy processes, parses and returns data.
//!
//! `dashboard_queries_name_only_what_a_running_divvy_exports` starts, on
//! free loopback ports:
//! - a redis-server as the global store of `scope: global` limits;
//! - divvy A (memory store, `--global-url` that Redis, `--admin-token`,
//!   `--sweep-seconds 1`): a policy with line-protocol rules, a global limit,
//!   an RLQS rule and a governor (`every: 200ms`, query `vector(1)`)
//!   reading the Prometheus below;
//! - divvy B with `--redis-url` a second redis-server, which the test
//!   pauses (SIGSTOP) after a first HIT: B's store calls time out, its
//!   breaker opens and the failure policy (`local`) decides;
//! - Prometheus (Debian's /usr/bin/prometheus) scraping A and B every
//!   500 ms as job `divvy`, and answering A's governor.
//!
//! It drives what makes the labelled families appear (the prometheus crate
//! exports a labelled family only once a child exists): allowed and denied
//! line-protocol HITs, an unknown command, HITs over the global limit, a
//! knob set through the admin API, a SIGHUP reload (success) and a bad
//! policy file (failure), an RLQS stream reporting allowed and denied
//! requests, HITs on B before and after its Redis is paused. Unlabelled
//! families (e.g. `divvy_counters_evicted_total`, `divvy_global_fallback`)
//! and `divvy_rejected_total`'s reasons are exported from the start; no
//! eviction or hostile traffic is driven, so those stay 0.
//!
//! Then:
//! 1. From every panel target's `expr` and every template variable's query,
//!    a small PromQL extractor (below) takes the metric names and the label
//!    names each selector, `by (...)`/`without (...)` clause and
//!    `label_values(...)` uses. Every name must be a sample name in the
//!    `/metrics` of A or B (`_bucket`/`_sum`/`_count` names are looked up
//!    as written, and their `# TYPE` must be a histogram), and every label
//!    must be on that name's samples — except `job` and `instance`, the
//!    target labels Prometheus adds at scrape time, which step 2 checks.
//!    No family is checked against the source or `# HELP` lines only: all
//!    of them come from running processes.
//! 2. Every expression, with the dashboard's variables replaced (`$job` by
//!    `divvy`, `$instance` and `$rule` by `.*`, `$__rate_interval` by 5s,
//!    `$__range` by 1m), is sent to the Prometheus that scrapes A and B: it
//!    must parse and return at least one series.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::prometheus::Prometheus;
use common::redis::Redis;
use common::Server;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use serde_json::Value;

const TOKEN: &str = "grafana-test-token";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ------------------------------------------------------------ the extractor

/// PromQL's aggregation operators (they take `by`/`without`).
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// PromQL's functions (an identifier followed by `(` must be one of these
/// or an aggregation: a misspelt function fails the test).
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count_over_time",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "max_over_time",
    "min_over_time",
    "predict_linear",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "sum_over_time",
    "time",
    "timestamp",
    "vector",
];

/// Binary operators, modifiers and keywords written as identifiers.
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "atan2"];

/// Clauses that take a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str,
    /// A number, a duration, a template variable, an operator character.
    Other(String),
    Open(char),
    Close(char),
}

fn tokens(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' || c == '`' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            assert!(i < chars.len(), "unterminated string in {expr:?}");
            i += 1;
            out.push(Token::Str);
        } else if c == '$' {
            // $name or ${name}: a Grafana variable, never a metric.
            let start = i;
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            out.push(Token::Other(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration such as 5m or 1h30m.
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Other(chars[start..i].iter().collect()));
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if "({[".contains(c) {
            out.push(Token::Open(c));
            i += 1;
        } else if ")}]".contains(c) {
            out.push(Token::Close(c));
            i += 1;
        } else {
            out.push(Token::Other(c.to_string()));
            i += 1;
        }
    }
    out
}

/// Index of the bracket closing the one opened at `open`.
fn closing(t: &[Token], open: usize, expr: &str) -> usize {
    let mut depth = 0;
    for (j, tok) in t.iter().enumerate().skip(open) {
        match tok {
            Token::Open(_) => depth += 1,
            Token::Close(_) => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced brackets in {expr:?}");
}

/// The identifiers of a `( a, b )` list starting at `open`, and the index
/// of its `)`.
fn label_list(t: &[Token], open: usize, expr: &str) -> (Vec<String>, usize) {
    assert_eq!(
        t.get(open),
        Some(&Token::Open('(')),
        "a label list in {expr:?}"
    );
    let end = closing(t, open, expr);
    let labels = t[open + 1..end]
        .iter()
        .filter_map(|tok| match tok {
            Token::Ident(l) => Some(l.clone()),
            Token::Other(c) if c == "," => None,
            other => panic!("{other:?} in a label list of {expr:?}"),
        })
        .collect();
    (labels, end)
}

/// Every metric an expression names, with the label names used with it:
/// in its selector, and in the `by`/`without` clauses of the aggregations
/// around it (`on`/`ignoring`/`group_*` lists count for every metric of the
/// expression). Panics on what it cannot read: an unknown function, a
/// selector without a metric name.
fn metrics_of(expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let t = tokens(expr);
    // (metric name, its token index, its selector's labels)
    let mut found: Vec<(String, usize, BTreeSet<String>)> = Vec::new();
    // (first token, last token, labels) of each aggregation's argument.
    let mut scoped: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let mut everywhere: Vec<String> = Vec::new();
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Token::Open('[') => {
                // A range or subquery: durations and variables only.
                i = closing(&t, i, expr) + 1;
            }
            Token::Open('{') => panic!("a selector without a metric name in {expr:?}"),
            Token::Ident(name) if LABEL_LISTS.contains(&name.as_str()) => {
                let (labels, end) = label_list(&t, i + 1, expr);
                if matches!(name.as_str(), "by" | "without") {
                    // `agg by (l) (arg)` or `agg (arg) by (l)`.
                    let arg = if i >= 1
                        && matches!(&t[i - 1], Token::Ident(a) if AGGREGATIONS.contains(&a.as_str()))
                    {
                        let close = closing(&t, end + 1, expr);
                        (end + 1, close)
                    } else if i >= 1 && t[i - 1] == Token::Close(')') {
                        let open = (0..i - 1)
                            .rev()
                            .find(|&o| t[o] == Token::Open('(') && closing(&t, o, expr) == i - 1)
                            .expect("an opening bracket");
                        assert!(
                            matches!(t.get(open.wrapping_sub(1)), Some(Token::Ident(a)) if AGGREGATIONS.contains(&a.as_str())),
                            "`{name}` after something that is not an aggregation in {expr:?}"
                        );
                        (open, i - 1)
                    } else {
                        panic!("`{name}` out of place in {expr:?}");
                    };
                    scoped.push((arg.0, arg.1, labels));
                } else {
                    everywhere.extend(labels);
                }
                i = end + 1;
            }
            Token::Ident(name) if t.get(i + 1) == Some(&Token::Open('(')) => {
                assert!(
                    AGGREGATIONS.contains(&name.as_str()) || FUNCTIONS.contains(&name.as_str()),
                    "`{name}(` is not a PromQL function in {expr:?}"
                );
                i += 1;
            }
            Token::Ident(name) if AGGREGATIONS.contains(&name.as_str()) => {
                // `sum by (...)` / `sum without (...)`: handled at the clause.
                i += 1;
            }
            Token::Ident(name) if KEYWORDS.contains(&name.as_str()) => i += 1,
            Token::Ident(name) => {
                let mut labels = BTreeSet::new();
                let at = i;
                i += 1;
                if t.get(i) == Some(&Token::Open('{')) {
                    let end = closing(&t, i, expr);
                    // label op "value" [, ...]
                    let mut k = i + 1;
                    while k < end {
                        match (&t[k], t.get(k + 1), t.get(k + 2)) {
                            (Token::Ident(l), Some(Token::Other(op)), _)
                                if op == "=" || op == "!" =>
                            {
                                labels.insert(l.clone());
                                // the operator's second character, then the value
                                k += 1;
                                while k < end && t[k] != Token::Str {
                                    k += 1;
                                }
                                k += 1;
                            }
                            (Token::Other(c), _, _) if c == "," => k += 1,
                            other => panic!("unreadable matcher {other:?} in {expr:?}"),
                        }
                    }
                    i = end + 1;
                }
                found.push((name.clone(), at, labels));
            }
            _ => i += 1,
        }
    }
    assert!(!found.is_empty(), "no metric in {expr:?}");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, at, mut labels) in found {
        for (from, to, scope) in &scoped {
            if (*from..=*to).contains(&at) {
                labels.extend(scope.iter().cloned());
            }
        }
        labels.extend(everywhere.iter().cloned());
        out.entry(name).or_default().extend(labels);
    }
    out
}

#[test]
fn the_extractor_reads_what_the_dashboard_writes() {
    let m = metrics_of(
        r#"sum by (rule_label) (rate(divvy_decisions_total{job=~"$job", code="over_limit"}[$__rate_interval])) / sum by (rule_label) (rate(divvy_hits_total{status!="x"}[5m]))"#,
    );
    let want: BTreeMap<String, BTreeSet<String>> = [
        ("divvy_decisions_total", &["rule_label", "job", "code"][..]),
        ("divvy_hits_total", &["rule_label", "status"][..]),
    ]
    .into_iter()
    .map(|(n, ls)| (n.to_owned(), ls.iter().map(|l| (*l).to_owned()).collect()))
    .collect();
    assert_eq!(m, want);
    let m = metrics_of(
        r#"histogram_quantile(0.99, sum(rate(a_seconds_bucket[1m])) by (le)) and on (instance) b == 1"#,
    );
    assert_eq!(
        m["a_seconds_bucket"],
        ["instance", "le"].map(String::from).into()
    );
    assert_eq!(m["b"], ["instance".to_owned()].into());
    let m = metrics_of("time() - max by (instance) (x_timestamp_seconds)");
    assert_eq!(m["x_timestamp_seconds"], ["instance".to_owned()].into());
    for bad in ["sum(rat(x[1m]))", r#"{__name__="x"}"#, "sum by (a) b"] {
        assert!(
            std::panic::catch_unwind(|| metrics_of(bad)).is_err(),
            "{bad:?} must not be read"
        );
    }
}

// ------------------------------------------------------------ the dashboard

/// Every query of the dashboard: panel targets' `expr`, then the template
/// variables' queries (`label_values(selector, label)` as the selector,
/// with `label` as a `by` label).
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("every target has an expr");
                let title = p["title"].as_str().unwrap_or("?");
                out.push((format!("panel {title:?} {}", t["refId"]), expr.to_owned()));
            }
            walk(p["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(dash["panels"].as_array().expect("panels"), &mut out);
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .expect("a variable's query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| {
                panic!(
                    "variable {}: only label_values(...) is read: {q}",
                    v["name"]
                )
            });
        let (selector, label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        out.push((
            format!("variable ${}", v["name"].as_str().unwrap_or("?")),
            format!("group by ({}) ({})", label.trim(), selector.trim()),
        ));
    }
    out
}

#[test]
fn the_dashboard_is_a_grafana_dashboard() {
    let dash = dashboard();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    assert_eq!(dash["uid"], "divvy");
    let vars: BTreeMap<&str, &Value> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for name in ["job", "instance"] {
        assert_eq!(vars[name]["type"], "query");
    }
    let mut ids = BTreeSet::new();
    let panels = dash["panels"].as_array().unwrap();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
        let g = &p["gridPos"];
        assert!(g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24);
    }
}

fn dashboard() -> Value {
    let path = root().join("helm/divvy/dashboards/divvy.json");
    let text = std::fs::read_to_string(&path).expect("helm/divvy/dashboards/divvy.json");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

// ------------------------------------------------------------ the exposition

/// What a `/metrics` exposition holds: each sample name with the label
/// names of its samples, and each family's `# TYPE`.
#[derive(Default)]
struct Exported {
    labels: BTreeMap<String, BTreeSet<String>>,
    types: BTreeMap<String, String>,
}

impl Exported {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split_whitespace();
                if let (Some(n), Some(t)) = (it.next(), it.next()) {
                    self.types.insert(n.to_owned(), t.to_owned());
                }
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let names = self.labels.entry(line[..name_end].to_owned()).or_default();
            if line[name_end..].starts_with('{') {
                // key="value",... with \" and \\ escapes in values.
                let mut rest = &line[name_end + 1..];
                while let Some(eq) = rest.find('=') {
                    names.insert(rest[..eq].trim_start_matches(',').trim().to_owned());
                    let mut chars = rest[eq + 2..].char_indices();
                    let mut end = 0;
                    while let Some((k, c)) = chars.next() {
                        match c {
                            '\\' => {
                                chars.next();
                            }
                            '"' => {
                                end = eq + 2 + k + 1;
                                break;
                            }
                            _ => {}
                        }
                    }
                    assert!(end > 0, "unterminated label value in {line:?}");
                    rest = &rest[end..];
                    if rest.starts_with('}') {
                        break;
                    }
                }
            }
        }
    }

    /// The family a sample name belongs to: `x` for `x_bucket`, `x_sum`,
    /// `x_count` when `x` is a histogram, else the name itself.
    fn family<'a>(&self, name: &'a str) -> &'a str {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if self.types.get(base).map(String::as_str) == Some("histogram") {
                    return base;
                }
            }
        }
        name
    }
}

// --------------------------------------------------------------- Prometheus

/// A Prometheus on 127.0.0.1 scraping `targets` every 500 ms as job
/// `divvy`, ready.
fn scraping(port: u16, targets: &[SocketAddr]) -> Prometheus {
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    Prometheus::start(
        port,
        &format!(
            "global: {{scrape_interval: 500ms, scrape_timeout: 400ms, evaluation_interval: 1s}}\n\
             scrape_configs:\n\
             \x20 - job_name: divvy\n\
             \x20   static_configs:\n\
             \x20     - targets: [{}]\n",
            targets.join(", ")
        ),
    )
}

/// An instant query: `Ok(number of series)` or `Err(Prometheus' error)`.
fn series(prometheus: &Prometheus, query: &str) -> Result<usize, String> {
    let body = format!("query={}", percent_encode(query));
    let (status, text) = post(prometheus.addr(), "/api/v1/query", &body).ok_or("no answer")?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{status}: {e}: {text}"))?;
    if v["status"] != "success" {
        return Err(format!("{status}: {}", v["error"]));
    }
    Ok(v["data"]["result"].as_array().map_or(0, Vec::len))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A form POST (a GET when `body` is empty): `(status, body)`, the body
/// de-chunked.
fn post(addr: SocketAddr, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let method = if body.is_empty() { "GET" } else { "POST" };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split(' ').nth(1)?.parse().ok()?;
    let (head, mut rest) = raw.split_once("\r\n\r\n")?;
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some((status, rest.to_owned()));
    }
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some((status, out));
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size + 2..)?;
    }
}

// -------------------------------------------------------------------- divvy

/// A's policy: rules for the line protocol (`api`: 2 a minute per actor),
/// a global limit, the RLQS domain, and a governed rule whose governor
/// reads `vector(1)` from the Prometheus at `prometheus`.
fn policy_a(prometheus: &str) -> String {
    format!(
        r#"
overrides:
  - operation: {{path: /api}}
    label: api
    actorField: who
    creditLimit: 2
    resetSeconds: 60
  - operation: {{site: "*"}}
    label: partner
    limits:
      - {{label: partner-global, actorField: site, scope: global, algorithm: token_bucket, creditLimit: 5, resetSeconds: 1, burst: 5}}
  - operation: {{path: /reindex}}
    label: reindex
    creditLimit: 10
    resetSeconds: 1
    algorithm: token_bucket
  - operation: {{user: "*"}}
    domain: rlqs
    label: per-user
    actorField: user
    creditLimit: 20
    resetSeconds: 1
    algorithm: token_bucket
    burst: 20
default: {{creditLimit: 0}}
governors:
  - rule: reindex
    query: 'vector(1)'
    prometheus: {prometheus}
    setpoint: 2
    every: 200ms
    min: 1
    max: 100
    breaker: {{above: 6}}
"#
    )
}

const POLICY_B: &str = r#"
overrides:
  - operation: {path: /api}
    label: api
    actorField: who
    creditLimit: 2
    resetSeconds: 60
default: {creditLimit: 0}
"#;

/// Reports one bucket (2 allowed, 1 denied) of user `u1` in domain `rlqs`
/// on a stream that stays open until the returned sender is dropped.
async fn rlqs_stream(grpc: SocketAddr) -> tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports> {
    let (tx, mut answers) = common::rlqs::open_stream(grpc).await;
    tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
    tx.send(RateLimitQuotaUsageReports {
        domain: "rlqs".to_owned(),
        bucket_quota_usages: vec![common::rlqs::usage("user", "u1", 2, 1)],
    })
    .await
    .expect("send");
    tx
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// A metric name's uses: the queries naming it, and for each label used
/// with it, the queries using that label.
#[derive(Default)]
struct Uses {
    by: Vec<String>,
    labels: BTreeMap<String, Vec<String>>,
}

/// Every name and label the dashboard's queries use that `exported` lacks.
fn missing(used: &BTreeMap<String, Uses>, exported: &Exported) -> Vec<String> {
    let mut out = Vec::new();
    for (name, uses) in used {
        let Some(have) = exported.labels.get(name) else {
            out.push(format!(
                "{name} (used by {}) is not exported",
                uses.by.join(", ")
            ));
            continue;
        };
        for (l, by) in &uses.labels {
            if l != "job" && l != "instance" && !have.contains(l) {
                out.push(format!(
                    "{name} has no label {l:?} (it has {have:?}; used by {})",
                    by.join(", ")
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queries_name_only_what_a_running_divvy_exports() {
    let started = Instant::now();
    let queries = dashboard_queries(&dashboard());
    let used = uses_of(&queries);
    println!(
        "{} queries name {} metrics: {:?}",
        queries.len(),
        used.len(),
        used.keys().collect::<Vec<_>>()
    );
    let procs = Processes::start();
    let stream = procs.drive().await;

    // 1. Every name and label in the /metrics of A or B.
    let exported = wait_until_exported(&used, [&procs.a, &procs.b]).await;
    let mut families = BTreeSet::new();
    for name in used.keys() {
        if name != exported.family(name) {
            assert_eq!(exported.types[exported.family(name)], "histogram");
        }
        families.insert(exported.family(name));
    }
    println!(
        "{} families, all exported with the labels used ({:.1} s): {families:?}",
        families.len(),
        started.elapsed().as_secs_f64()
    );

    // 2. Every query through the Prometheus scraping A and B.
    let answered = wait_until_answered(&procs.prometheus, &queries).await;
    println!(
        "{answered} queries return data through Prometheus; {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    drop(stream);
}

/// Per metric the queries name: where, and with which labels.
fn uses_of(queries: &[(String, String)]) -> BTreeMap<String, Uses> {
    let mut used: BTreeMap<String, Uses> = BTreeMap::new();
    for (whence, expr) in queries {
        for (name, labels) in metrics_of(expr) {
            let uses = used.entry(name).or_default();
            uses.by.push(whence.clone());
            for l in labels {
                uses.labels.entry(l).or_default().push(whence.clone());
            }
        }
    }
    used
}

/// Divvy A (memory store, a global limit, a governor, knobs, reloads,
/// RLQS), divvy B (Redis store, to be paused), their redis-servers, and a
/// Prometheus scraping both.
struct Processes {
    a: Server,
    b: Server,
    path_a: std::path::PathBuf,
    text_a: String,
    regional: Redis,
    prometheus: Prometheus,
    _global: Redis,
    _dir: tempfile::TempDir,
}

impl Processes {
    fn start() -> Processes {
        let global = Redis::start();
        let prometheus_port = common::stable_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let path_a = dir.path().join("a.yaml");
        let text_a = policy_a(&format!("http://127.0.0.1:{prometheus_port}"));
        std::fs::write(&path_a, &text_a).expect("policy A");
        let a = Server::start(
            &path_a,
            &[
                "--admin-token",
                TOKEN,
                "--global-url",
                &global.url(),
                "--global-lease-ms",
                "500",
                "--sweep-seconds",
                "1",
            ],
        );
        let path_b = dir.path().join("b.yaml");
        std::fs::write(&path_b, POLICY_B).expect("policy B");
        let regional = Redis::start();
        let b = Server::start(
            &path_b,
            &[
                "--redis-url",
                &regional.url(),
                "--on-store-failure",
                "local",
                "--breaker-failures",
                "2",
                "--redis-timeout-ms",
                "50",
            ],
        );
        let prometheus = scraping(prometheus_port, &[a.http, b.http]);
        Processes {
            a,
            b,
            path_a,
            text_a,
            regional,
            prometheus,
            _global: global,
            _dir: dir,
        }
    }

    /// The traffic. On A: allowed and denied HITs, an unknown command
    /// (divvy_errors_total{code}), a global limit used past its quota, the
    /// reindex rule, a knob, a reload that succeeds and one that fails, an
    /// RLQS stream (returned: it stays open until dropped). On B: HITs the
    /// failure policy decides once its Redis is paused.
    async fn drive(&self) -> tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports> {
        let (a, b) = (&self.a, &self.b);
        let mut lines = String::new();
        for who in ["x", "x", "x", "y"] {
            lines.push_str(&format!("HIT path=/api who={who}\n"));
        }
        for _ in 0..10 {
            lines.push_str("HIT site=acme\nHIT path=/reindex\n");
        }
        lines.push_str("BOGUS\n");
        let answers = a.line_exchange(lines.as_bytes());
        assert!(
            answers.contains("OK true") && answers.contains("OK false"),
            "{answers}"
        );
        // B: one HIT through Redis, then Redis paused (SIGSTOP): calls time
        // out, the breaker opens and the failure policy decides.
        let answers = b.line_exchange(b"HIT path=/api who=x\n");
        assert!(answers.starts_with("OK true"), "{answers}");
        self.regional.pause();
        // One connection's pipelined HITs share a store call: one HIT each.
        for _ in 0..3 {
            let answers = b.line_exchange(b"HIT path=/api who=x\n");
            assert!(answers.starts_with("OK "), "{answers}");
        }
        common::admin_ok(a.http, "PUT", "/knobs/api", r#"{"creditLimit": 3}"#, TOKEN);
        self.reload_then_break().await;
        rlqs_stream(self.a.grpc).await
    }

    /// A reload that succeeds (a changed file, and SIGHUP: identical
    /// content is not reloaded), then a policy file that fails.
    async fn reload_then_break(&self) {
        let a = &self.a;
        std::fs::write(&self.path_a, format!("{}# changed\n", self.text_a))
            .expect("changed policy");
        signal(a.pid(), "-HUP");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !a
            .metric_samples()
            .contains_key("divvy_reloads_total{result=\"success\"}")
        {
            assert!(
                Instant::now() < deadline,
                "no successful reload after SIGHUP"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::fs::write(&self.path_a, "overrides: [this is not a policy\n").expect("bad policy");
        signal(a.pid(), "-HUP");
    }
}

/// The union of what `servers` export, once it holds every name and label
/// `used` (polled for 15 s: the global lease task, the governor and the
/// RLQS allocation run on their own).
async fn wait_until_exported(used: &BTreeMap<String, Uses>, servers: [&Server; 2]) -> Exported {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut exported = Exported::default();
        for s in servers {
            let (status, text) = common::http_request(s.http, "GET", "/metrics", "", None);
            assert_eq!(status, 200);
            exported.add(&text);
        }
        let gaps = missing(used, &exported);
        if gaps.is_empty() {
            return exported;
        }
        assert!(
            Instant::now() < deadline,
            "the dashboard names what the running divvy processes do not export:\n{}",
            gaps.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (15 s at most) until every query, its variables filled in,
/// parses and returns data in `prometheus` (job and instance are
/// Prometheus' target labels); the number of queries.
async fn wait_until_answered(prometheus: &Prometheus, queries: &[(String, String)]) -> usize {
    let substituted: Vec<(String, String)> = queries
        .iter()
        .map(|(whence, q)| {
            let q = q
                .replace("$__rate_interval", "5s")
                .replace("$__range", "1m")
                .replace("$job", "divvy")
                .replace("$instance", ".*")
                .replace("$rule", ".*");
            assert!(!q.contains('$'), "a variable left in {q}");
            (whence.clone(), q)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut empty = Vec::new();
        for (whence, q) in &substituted {
            match series(prometheus, q) {
                Ok(0) => empty.push(format!("{whence}: no series for {q}")),
                Ok(_) => {}
                Err(e) => panic!("{whence}: Prometheus refuses {q}: {e}"),
            }
        }
        if empty.is_empty() {
            return substituted.len();
        }
        assert!(
            Instant::now() < deadline,
            "queries without data in Prometheus:\n{}\n{}",
            empty.join("\n"),
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
