//! `--grpc-reflection`: gRPC's own Python reflection client (what grpcurl
//! does: `list`, then a call built from the fetched descriptors, with no
//! Envoy proto files) against the real binary; without the flag the server
//! describes nothing.

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;

const POLICY: &str = "overrides:\n  - {domain: api, operation: {user: '*'}, actorField: user, creditLimit: 2, resetSeconds: 60}\ndefault: {creditLimit: 100, resetSeconds: 60}\n";

/// Runs tests/grpcurl/reflect.py against `server`: (success, stdout, stderr).
fn reflect(server: &Server, hits: u32) -> (bool, String, String) {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpcurl/reflect.py");
    let out = Command::new(python)
        .arg(script)
        .arg(server.grpc.to_string())
        .args(["api", "user=ann", &hits.to_string()])
        .output()
        .expect("python from tests/run-all.sh's venv (grpcio-reflection)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_reflection_client_lists_and_calls_should_rate_limit() {
    let server = Server::with_policy_args(POLICY, "yaml", &["--grpc-reflection"]);
    let (ok, out, err) = reflect(&server, 1);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let services: Vec<&str> = v["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    for s in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&s), "{s} not in {services:?}");
    }
    let status = &v["answer"]["statuses"][0];
    assert_eq!(v["answer"]["overallCode"], "OK", "{out}");
    assert_eq!(status["limitRemaining"], 1, "{out}");
    assert_eq!(status["currentLimit"]["requestsPerUnit"], 2, "{out}");
    // Two more hits: over the limit, as any client would see it.
    let (ok, out, err) = reflect(&server, 2);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["answer"]["overallCode"], "OVER_LIMIT", "{out}");
}

#[test]
fn without_the_flag_nothing_is_described() {
    let server = Server::with_policy(POLICY, "yaml");
    let (ok, _, err) = reflect(&server, 1);
    assert!(!ok, "reflection answered without --grpc-reflection");
    assert!(
        err.contains("UNIMPLEMENTED") || err.contains("Unimplemented"),
        "{err}"
    );
}
