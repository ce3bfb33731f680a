//! `--admin-read-token`: with it, the admin API answers only callers with the
//! read or the admin token, except health, readiness and metrics; the read
//! token never changes knobs. Against the real binary.

mod common;

use common::{http_exchange, Server};

const POLICY: &str = r#"
overrides:
  - label: win
    operation: {k: win}
    creditLimit: 10
    resetSeconds: 1h
default:
  creditLimit: 100
  resetSeconds: 0
"#;

const ADMIN: &str = "admin-secret-3f9a";
const READ: &str = "read-secret-77c1";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `(status, head, body)` of a request with an optional bearer token.
fn call(server: &Server, method: &str, path: &str, body: &str, token: Option<&str>) -> Status {
    let auth = token.map(bearer);
    let (status, head, body) = http_exchange(server.http, method, path, body, auth.as_deref());
    Status { status, head, body }
}

struct Status {
    status: u16,
    head: String,
    body: String,
}

/// Every route but the open ones, as (method, path, body).
const PROTECTED: [(&str, &str, &str); 9] = [
    ("GET", "/config", ""),
    ("GET", "/explain?k=win", ""),
    ("GET", "/knobs", ""),
    ("GET", "/global", ""),
    ("GET", "/governors", ""),
    ("GET", "/rlconfig", ""),
    (
        "POST",
        "/json",
        r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"win"}]}]}"#,
    ),
    // A route that does not exist yet is protected too: no token, no 404.
    ("GET", "/api/v1/anything", ""),
    // The dashboard's data; its shell (`/ui`) is open, below.
    ("GET", "/api/v1/overview", ""),
];

fn serve_with_read_token() -> Server {
    Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--admin-token",
            ADMIN,
            "--admin-read-token",
            READ,
            "--metrics-path",
            "/prom",
        ],
    )
}

#[test]
fn with_a_read_token_reads_need_a_token_and_open_paths_stay_open() {
    let server = serve_with_read_token();
    for (method, path, body) in PROTECTED {
        let missing = call(&server, method, path, body, None);
        assert_eq!(missing.status, 401, "{method} {path}: {}", missing.body);
        assert!(
            missing
                .head
                .to_ascii_lowercase()
                .contains("\r\nwww-authenticate: bearer"),
            "{method} {path}: {}",
            missing.head
        );
        let wrong = call(&server, method, path, body, Some("not-a-token"));
        assert_eq!(wrong.status, 403, "{method} {path}: {}", wrong.body);
    }
    for token in [READ, ADMIN] {
        for (method, path, body) in &PROTECTED[..7] {
            let ok = call(&server, method, path, body, Some(token));
            assert_eq!(ok.status, 200, "{method} {path}: {}", ok.body);
        }
        let unknown = call(&server, "GET", "/api/v1/anything", "", Some(token));
        assert_eq!(unknown.status, 404, "past the gate: {}", unknown.body);
        let overview = call(&server, "GET", "/api/v1/overview", "", Some(token));
        assert_eq!(overview.status, 200, "{}", overview.body);
    }
    let config = call(&server, "GET", "/config", "", Some(READ));
    assert!(config.body.contains(r#""label":"win""#), "{}", config.body);
    // The dashboard's shell holds no data: it loads, then asks for a token.
    let paths = [
        "/healthz",
        "/readyz",
        "/healthcheck",
        "/metrics",
        "/prom",
        "/ui",
        "/ui/app.js",
    ];
    for path in paths {
        let open = call(&server, "GET", path, "", None);
        assert_eq!(open.status, 200, "{path} without a token: {}", open.body);
        let wrong = call(&server, "GET", path, "", Some("not-a-token"));
        assert_eq!(
            wrong.status, 200,
            "{path} with a wrong token: {}",
            wrong.body
        );
    }
    let samples = server.metric_samples();
    let failures =
        |reason: &str| samples[&format!("divvy_admin_auth_failures_total{{reason=\"{reason}\"}}")];
    assert_eq!(failures("missing"), PROTECTED.len() as f64);
    assert_eq!(failures("wrong"), PROTECTED.len() as f64);
    assert_eq!(failures("read_only"), 0.0);
}

#[test]
fn the_read_token_can_not_change_knobs_and_the_admin_token_can() {
    let mut server = serve_with_read_token();
    let body = r#"{"creditLimit": 0}"#;
    let put = call(&server, "PUT", "/knobs/win", body, Some(READ));
    assert_eq!(put.status, 403, "{}", put.body);
    assert!(put.body.contains("read token"), "{}", put.body);
    let put = call(&server, "PUT", "/knobs/win", body, None);
    assert_eq!(put.status, 401, "{}", put.body);
    let put = call(&server, "PUT", "/knobs/win", body, Some("not-a-token"));
    assert_eq!(put.status, 403, "{}", put.body);
    let knobs = call(&server, "GET", "/knobs", "", Some(READ));
    assert!(knobs.body.contains(r#""knobs":[]"#), "{}", knobs.body);

    let put = call(&server, "PUT", "/knobs/win", body, Some(ADMIN));
    assert_eq!(put.status, 200, "{}", put.body);
    let knobs = call(&server, "GET", "/knobs", "", Some(READ));
    assert!(knobs.body.contains(r#""label":"win""#), "{}", knobs.body);
    let delete = call(&server, "DELETE", "/knobs/win", "", Some(READ));
    assert_eq!(delete.status, 403, "{}", delete.body);
    let delete = call(&server, "DELETE", "/knobs/win", "", Some(ADMIN));
    assert_eq!(delete.status, 200, "{}", delete.body);

    let samples = server.metric_samples();
    let read_only = samples[r#"divvy_admin_auth_failures_total{reason="read_only"}"#];
    assert_eq!(read_only, 2.0);
    assert!(server.terminate().success());
    // The process has exited: the log ends when its stderr closes.
    let log: Vec<String> = server
        .startup
        .iter()
        .cloned()
        .chain(server.log.iter())
        .collect();
    assert!(log.iter().any(|l| l.contains("knob set")), "{log:?}");
    for line in &log {
        assert!(
            !line.contains(ADMIN) && !line.contains(READ),
            "a token in the log: {line}"
        );
    }
}

#[test]
fn without_a_read_token_reads_stay_open() {
    let server = Server::with_policy_args(POLICY, "yaml", &["--admin-token", ADMIN]);
    for (method, path, body) in &PROTECTED[..7] {
        let open = call(&server, method, path, body, None);
        assert_eq!(open.status, 200, "{method} {path}: {}", open.body);
    }
    // Knob changes keep their own rule: a wrong token is 401.
    let put = call(
        &server,
        "PUT",
        "/knobs/win",
        r#"{"creditLimit": 0}"#,
        Some(READ),
    );
    assert_eq!(put.status, 401, "{}", put.body);
    assert!(
        put.head
            .to_ascii_lowercase()
            .contains("\r\nwww-authenticate: bearer"),
        "{}",
        put.head
    );
}

#[test]
fn the_read_token_may_come_from_divvy_admin_read_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let server = Server::start_env(&path, &[], &[("DIVVY_ADMIN_READ_TOKEN", READ)]);
    assert_eq!(call(&server, "GET", "/config", "", None).status, 401);
    assert_eq!(call(&server, "GET", "/config", "", Some(READ)).status, 200);
    // No admin token: knob changes stay disabled, for the read token too.
    let put = call(
        &server,
        "PUT",
        "/knobs/win",
        r#"{"creditLimit": 0}"#,
        Some(READ),
    );
    assert_eq!(put.status, 403, "{}", put.body);
    assert!(put.body.contains("--admin-token"), "{}", put.body);
}

#[test]
fn a_read_token_equal_to_the_admin_token_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["serve", "--config"])
        .arg(&path)
        .args(["--admin-token", ADMIN, "--admin-read-token", ADMIN])
        .args(["--http-addr", "127.0.0.1:0"])
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--admin-read-token must differ from --admin-token"),
        "{stderr}"
    );
    assert!(!stderr.contains(ADMIN), "{stderr}");
}

/// `divvy knob <args>` against `server` with `env`: (success, stdout, stderr).
fn knob_cli(server: &Server, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = std::process::Command::new(common::binary())
        .arg("knob")
        .args(args)
        .args(["--admin-url", &format!("http://{}", server.http)])
        .env_remove("DIVVY_ADMIN_TOKEN")
        .env_remove("DIVVY_ADMIN_READ_TOKEN")
        .env_remove("DIVVY_ADMIN_URL")
        .envs(env.iter().copied())
        .output()
        .expect("run divvy knob");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn knob_list_sends_the_read_token_and_set_needs_the_admin_token() {
    let server = serve_with_read_token();
    let (ok, _, err) = knob_cli(&server, &["list"], &[]);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = knob_cli(&server, &["list"], &[("DIVVY_ADMIN_READ_TOKEN", READ)]);
    assert!(ok, "{err}");
    assert!(out.contains("\"knobs\""), "{out}");
    let set = ["set", "win", "creditLimit=1"];
    let (ok, _, err) = knob_cli(&server, &set, &[("DIVVY_ADMIN_READ_TOKEN", READ)]);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, _, err) = knob_cli(&server, &set, &[("DIVVY_ADMIN_TOKEN", ADMIN)]);
    assert!(ok, "{err}");
    let (ok, out, err) = knob_cli(&server, &["list"], &[("DIVVY_ADMIN_TOKEN", ADMIN)]);
    assert!(ok && out.contains("\"win\""), "{out}{err}");
}
