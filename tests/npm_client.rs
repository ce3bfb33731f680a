//! The official npm client, `@button/divvy-client` 1.0.1, against the real
//! binary. The test command (tests/run-all.sh) installs Node.js and the
//! client into `.tools/npm` (ignored by git); without them this test fails
//! with instructions rather than skipping.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::Server;

fn client_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/.tools/npm/node_modules"
    ))
}

#[test]
fn official_npm_client_sees_divvy_answers() {
    let modules = client_dir();
    assert!(
        modules.join("@button/divvy-client/package.json").exists(),
        "the npm client is not installed in {}; run `bash tests/run-all.sh` (it installs it)",
        modules.display()
    );
    let server = Server::with_policy(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.yaml"))
            .unwrap(),
        "yaml",
    );
    let ops = r#"{
      "sequential": [
        {"method": "GET", "path": "/pantry/cookies/oat", "ip": "192.168.1.1"},
        {"method": "GET", "path": "/pantry/cookies/oat", "ip": "192.168.1.1"},
        {"method": "GET", "path": "/pantry/cookies/oat", "ip": "192.168.1.1"},
        {"method": "GET", "path": "/pantry/cookies/oat", "ip": "192.168.1.1"},
        {"method": "GET", "path": "/pantry/cookies/oat", "ip": "4.3.2.1"},
        {"method": "GET", "path": "/printer/status"},
        {"path": "/admin/users"},
        {"method": "POST", "path": "/printer/print", "user": 42, "ip": "4.3.2.1"}
      ],
      "pipelined": [
        {"method": "GET", "path": "/printer/supplies"},
        {"method": "GET", "path": "/printer/supplies"},
        {"method": "GET", "path": "/printer/supplies"},
        {"method": "GET", "path": "/printer/supplies"},
        {"method": "GET", "path": "/printer/supplies"}
      ]
    }"#;
    let mut child = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/npm/hit-sequence.js"
        ))
        .arg(server.line.ip().to_string())
        .arg(server.line.port().to_string())
        .env("NODE_PATH", &modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node must be installed (tests/run-all.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(ops.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<(bool, i64, i64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["isAllowed"].as_bool().unwrap(),
                v["currentCredit"].as_i64().unwrap(),
                v["nextResetSeconds"].as_i64().unwrap(),
            )
        })
        .collect();
    // Windows just opened report their full length (or a second less if a
    // second boundary passed); compare credits and decisions exactly.
    let expected: Vec<(bool, i64, i64)> = vec![
        (true, 2, 3600),
        (true, 1, 3600),
        (true, 0, 3600),
        (false, 0, 3600),
        (true, 2, 3600),
        (true, 1, 0),
        (false, 0, -1),
        (true, 59, 60),
        (true, 99, 60),
        (true, 98, 60),
        (true, 97, 60),
        (true, 96, 60),
        (true, 95, 60),
    ];
    assert_eq!(got.len(), expected.len(), "{got:?}");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!((g.0, g.1), (e.0, e.1), "hit {i}: {got:?}");
        if e.2 <= 0 {
            assert_eq!(g.2, e.2, "hit {i}");
        } else {
            assert!(g.2 == e.2 || g.2 == e.2 - 1, "hit {i}: reset {}", g.2);
        }
    }
}
