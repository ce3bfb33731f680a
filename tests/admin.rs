//! The HTTP admin API, Prometheus metrics and statsd, against the real binary.

mod common;

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::{desc, request, Server};

const POLICY: &str = r#"
overrides:
  - label: edge-lab
    domain: "edge*"
    operation: {k: lab}
    creditLimit: 5
    resetSeconds: 1m
  - label: lab
    operation: {k: lab}
    creditLimit: 2
    resetSeconds: 1h
    comment: two per hour
  - label: watch
    matchPolicy: canary
    operation: {k: canary}
    creditLimit: 1
    resetSeconds: 1h
  - label: per-ip
    operation: {k: actor, ip: "*"}
    creditLimit: 5
    resetSeconds: 1h
    actorField: ip
  - operation: {k: nolabel}
    creditLimit: 0
default:
  creditLimit: 100
  resetSeconds: 0
"#;

fn serve() -> Server {
    Server::with_policy(POLICY, "yaml")
}

/// Every sample of `/metrics`: `name{labels}` → value.
fn samples(server: &Server) -> BTreeMap<String, f64> {
    server.metric_samples()
}

fn value(s: &BTreeMap<String, f64>, key: &str) -> f64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {s:#?}"))
}

#[test]
fn metrics_show_exact_counts_and_bounded_series() {
    let server = serve();
    let answers = server.line_exchange(
        b"HIT k=lab\nHIT k=lab\nHIT k=lab\nHIT k=canary\nHIT k=canary\nHIT k=nolabel\nHIT k=actor ip=1\nbogus\n\nHIT a\n",
    );
    assert_eq!(answers.lines().count(), 10, "{answers}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = rt.block_on(server.client());
    rt.block_on(client.should_rate_limit(request("edge", vec![desc(&[("k", "lab")])])))
        .unwrap();
    let err = rt
        .block_on(client.should_rate_limit(request("", vec![desc(&[("k", "lab")])])))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let s = samples(&server);
    assert_hits_and_errors(&s);
    assert_decisions_and_gauges(&s);
    a_flood_of_actors_adds_no_series(&server, &s);
}

/// The hits by rule label and status, and the errors by code, of the
/// metrics test's requests.
fn assert_hits_and_errors(s: &BTreeMap<String, f64>) {
    assert_eq!(
        value(s, r#"divvy_hits_total{rule_label="lab",status="accepted"}"#),
        2.0
    );
    assert_eq!(
        value(s, r#"divvy_hits_total{rule_label="lab",status="rejected"}"#),
        1.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_hits_total{rule_label="edge-lab",status="accepted"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_hits_total{rule_label="watch",status="canary-accepted"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_hits_total{rule_label="watch",status="canary-rejected"}"#
        ),
        1.0
    );
    // The canary's hits were decided by the default rule (no label), as was the nolabel rule's denial.
    assert_eq!(
        value(s, r#"divvy_hits_total{rule_label="",status="accepted"}"#),
        2.0
    );
    assert_eq!(
        value(s, r#"divvy_hits_total{rule_label="",status="rejected"}"#),
        1.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_hits_total{rule_label="per-ip",status="accepted"}"#
        ),
        1.0
    );
    assert_eq!(
        value(s, r#"divvy_errors_total{code="unknown-command"}"#),
        2.0
    );
    assert_eq!(value(s, r#"divvy_errors_total{code="unknown"}"#), 1.0);
    assert_eq!(
        value(s, r#"divvy_errors_total{code="invalid-argument"}"#),
        1.0
    );
}

/// The decisions by code, domain and rule label, and the gauges, of the
/// metrics test's requests.
fn assert_decisions_and_gauges(s: &BTreeMap<String, f64>) {
    assert_eq!(
        value(
            s,
            r#"divvy_decisions_total{code="ok",domain="",rule_label="lab"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_decisions_total{code="over_limit",domain="",rule_label="lab"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            s,
            r#"divvy_decisions_total{code="ok",domain="edge*",rule_label="edge-lab"}"#
        ),
        1.0
    );
    // Seven HIT lines and one gRPC descriptor were decided.
    assert_eq!(value(s, "divvy_hit_duration_seconds_count"), 8.0);
    assert_eq!(value(s, "divvy_rules_generation"), 1.0);
    assert_eq!(value(s, "divvy_rules"), 6.0);
    assert_eq!(value(s, "divvy_store_ready"), 1.0);
    assert_eq!(value(s, "divvy_tcp_connections_total"), 0.0);
}

/// A flood of distinct actor values adds no series to those of `s`.
fn a_flood_of_actors_adds_no_series(server: &Server, s: &BTreeMap<String, f64>) {
    let before: Vec<String> = s.keys().cloned().collect();
    let flood: String = (0..2000)
        .map(|i| format!("HIT k=actor ip=10.0.{}.{}\n", i / 256, i % 256))
        .collect();
    server.line_exchange(flood.as_bytes());
    let after = samples(server);
    let after_keys: Vec<String> = after.keys().cloned().collect();
    assert_eq!(before, after_keys);
    assert_eq!(
        value(
            &after,
            r#"divvy_hits_total{rule_label="per-ip",status="accepted"}"#
        ),
        2001.0
    );
}

#[test]
fn statsd_receives_divvy_names() {
    let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let port = receiver.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let server = Server::start_env(
        &path,
        &[],
        &[
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &port),
            ("STATSD_PREFIX", "divvy."),
        ],
    );
    server.line_exchange(b"HIT k=lab\nHIT k=lab\nHIT k=lab\nHIT k=canary\nnope\n");
    let mut want = vec![
        "divvy.hit.accepted:1|c",
        "divvy.hit.accepted.lab:1|c",
        "divvy.hit.rejected:1|c",
        "divvy.hit.rejected.lab:1|c",
        "divvy.hit.canary-accepted:1|c",
        "divvy.hit.canary-accepted.watch:1|c",
        "divvy.error.unknown-command:1|c",
        "divvy.connections:1|g",
        "divvy.connections:0|g",
    ];
    let mut timers = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 2048];
    while (!want.is_empty() || timers < 4) && Instant::now() < deadline {
        let Ok(n) = receiver.recv(&mut buf) else {
            continue;
        };
        for line in String::from_utf8_lossy(&buf[..n]).lines() {
            want.retain(|w| *w != line);
            if line.starts_with("divvy.hit:") && line.ends_with("|ms") {
                timers += 1;
            }
        }
    }
    assert!(want.is_empty(), "statsd lines not received: {want:?}");
    assert_eq!(timers, 4, "one hit timer per decided HIT");
}

#[test]
fn json_endpoint_answers_200_429_and_400() {
    let server = serve();
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"k","value":"lab"}]}]}"#;
    let (status, text) = server.http("POST", "/json", body);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(v["statuses"][0]["currentLimit"]["name"], "lab");
    let (status, _) = server.http("POST", "/json", body);
    assert_eq!(status, 200);
    let (status, text) = server.http("POST", "/json", body);
    assert_eq!(status, 429, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
    for (bad, needle) in [
        ("not json", "not valid JSON"),
        (r#"{"domain":"edge"}"#, "at least one descriptor"),
        (r#"{"domian":"edge"}"#, "unknown field `domian`"),
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
            "domain must not be empty",
        ),
    ] {
        let (status, text) = server.http("POST", "/json", bad);
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains(needle), "{bad}: {text}");
    }
}

#[test]
fn explain_consumes_nothing_and_config_shows_the_rules() {
    let server = serve();
    server.line_exchange(b"HIT k=lab\n");
    for _ in 0..3 {
        let (status, text) = server.http("GET", "/explain?k=lab", "");
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["decider"]["label"], "lab");
        assert_eq!(v["decider"]["counterKey"], "divvy:k=lab::2:3600");
        assert_eq!(v["decider"]["counter"]["remaining"], 1);
        assert_eq!(v["decider"]["comment"], "two per hour");
    }
    let (_, text) = server.http("GET", "/explain?k=lab&domain=edge-1", "");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["domain"], "edge-1");
    assert_eq!(v["decider"]["counterKey"], "divvy@edge*:k=lab::5:60");
    let (_, text) = server.http("GET", "/explain?k=canary", "");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["canaries"][0]["label"], "watch");
    assert_eq!(v["canaries"][0]["counter"]["open"], false);
    // Nothing was consumed by explaining.
    let answer = server.line_exchange(b"HIT k=lab\n");
    assert!(answer.starts_with("OK true 0 "), "{answer}");

    let (status, text) = server.http("GET", "/config", "");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["generation"], 1);
    assert_eq!(v["hash"].as_str().unwrap().len(), 64);
    assert!(v["source"].as_str().unwrap().ends_with("policy.yaml"));
    assert!(v["lastReloadError"].is_null());
    assert_eq!(v["rules"].as_array().unwrap().len(), 6);
    assert_eq!(v["rules"][3]["actorField"], "ip");
    assert!(v["loadedAt"].as_f64().unwrap() > 1.0e9);

    assert_eq!(server.http("GET", "/healthz", "").0, 200);
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
}

#[test]
fn ready_requires_store_follows_the_store_and_the_metrics_path_is_configurable() {
    // A Redis URL nothing answers on: the failure policy decides; with
    // --ready-requires-store, readiness is false.
    let port = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let server = Server::start_env(
        &path,
        &["--redis-url", &url, "--ready-requires-store"],
        &[("PROMETHEUS_METRICS_PATH", "/custom-metrics")],
    );
    let (status, text) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("counter store is failing"), "{text}");
    let (status, text) = server.http("GET", "/custom-metrics", "");
    assert_eq!(status, 200);
    assert!(text.contains("divvy_store_ready 0"), "{text}");
    // The gRPC health of the rate-limit service follows too; the process stays SERVING.
    assert_eq!(
        grpc_health(&server, "envoy.service.ratelimit.v3.RateLimitService"),
        2
    );
    assert_eq!(grpc_health(&server, ""), 1);
    // Redis appears; readiness follows.
    let _redis = common::redis::Redis::start_with_port(port);
    let deadline = Instant::now() + Duration::from_secs(15);
    while server.http("GET", "/readyz", "").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "not ready within 15 s of Redis answering"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    while grpc_health(&server, "envoy.service.ratelimit.v3.RateLimitService") != 1 {
        assert!(
            Instant::now() < deadline,
            "gRPC health not SERVING within 15 s of Redis answering"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The grpc.health.v1 status of `service` (1 SERVING, 2 NOT_SERVING).
fn grpc_health(server: &Server, service: &str) -> i32 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(server.grpc_health(service))
}

/// Redis killed under traffic: every replica would leave the Service at
/// once if readiness followed the store, so it does not: `/readyz` stays
/// 200 (saying the failure policy decides), the rate-limit service's gRPC
/// health stays SERVING, `divvy_store_ready` is 0, one log line says so,
/// and every request is decided by the failure policy (deny here).
#[test]
fn readiness_stays_while_the_failure_policy_answers_for_a_dead_redis() {
    let mut redis = common::redis::Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    // --ready-without-store is still accepted (a no-op now).
    let server = Server::start(
        &path,
        &[
            "--redis-url",
            &redis.url(),
            "--on-store-failure",
            "deny",
            "--ready-without-store",
        ],
    );
    assert_eq!(
        server.line_exchange(b"HIT k=actor ip=10.0.0.1\n"),
        "OK true 4 3600\n"
    );
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    redis.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .http("GET", "/metrics", "")
        .1
        .contains("divvy_store_ready 0")
    {
        let answer = server.line_exchange(b"HIT k=actor ip=10.0.0.1\n");
        assert!(
            answer.starts_with("OK false 0 "),
            "while the breaker opens: {answer}"
        );
        assert!(
            Instant::now() < deadline,
            "the store never reported failing"
        );
    }
    for _ in 0..10 {
        let (status, body) = server.http("GET", "/readyz", "");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("the failure policy decides"), "{body}");
        let answer = server.line_exchange(b"HIT k=actor ip=10.0.0.1\n");
        assert!(answer.starts_with("OK false 0 "), "{answer}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        grpc_health(&server, "envoy.service.ratelimit.v3.RateLimitService"),
        1
    );
    let logged = server
        .log
        .try_iter()
        .any(|l| l.contains("still ready, still answering"));
    assert!(logged, "no log line says the replica stays ready");
}

#[test]
fn sigterm_turns_readiness_false_during_the_shutdown_delay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let mut server = Server::start(&path, &["--shutdown-delay-seconds", "3"]);
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = server.http("GET", "/readyz", "");
        if status == 503 {
            assert!(body.contains("shutting down"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "readiness stayed true");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Still answering during the delay.
    assert_eq!(server.line_exchange(b"HIT\n"), "OK true 100 0\n");
    assert!(server.terminate().success());
}

#[test]
fn a_bad_metrics_path_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--metrics-path", "/healthz", "--http-addr", "127.0.0.1:0"])
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("metrics path `/healthz`"));
}
