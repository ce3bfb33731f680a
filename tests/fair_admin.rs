//! What operators see of fair shares on the real binary: `GET /fair`
//! (paged, behind the read token), `GET /explain`'s share and demand,
//! `divvy explain --server`, the dashboard's rule page and the metrics.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_has, binary, http_request, Server};

const POLICY: &str = "overrides:
  - label: partner
    operation: {site: partner, user: \"*\"}
    creditLimit: 100
    resetSeconds: 1
    algorithm: token_bucket
    fairShare: user
default: {creditLimit: 0}
";

const READ: &str = "read-token-0123456789";

fn get(s: &Server, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = http_request(s.http, "GET", path, "", Some(&format!("Bearer {READ}")));
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, v)
}

#[test]
fn fair_shares_are_listed_explained_and_counted() {
    let s = Server::with_policy_args(POLICY, "yaml", &["--admin-read-token", READ]);
    let hits: String = (0..30)
        .map(|i| format!("HIT site=partner user=u{}\n", i % 3))
        .collect();
    let answers = s.line_exchange(hits.as_bytes());
    assert_eq!(
        answers.lines().filter(|l| l.starts_with("OK true")).count(),
        30,
        "{answers}"
    );
    // The recompute task runs every 250 ms.
    std::thread::sleep(Duration::from_millis(600));

    let (status, _) = http_request(s.http, "GET", "/fair?rule=partner", "", None);
    assert_eq!(status, 401, "the read token guards /fair");
    let (status, v) = get(&s, "/fair?rule=partner&perPage=2");
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["active"].as_u64(), v["pages"].as_u64()),
        (Some(3), Some(2)),
        "{v}"
    );
    let values = v["values"].as_array().cloned().unwrap_or_default();
    assert_eq!(values.len(), 2, "{v}");
    assert_eq!(values[0]["value"], "u0");
    let share = values[0]["shareRate"].as_f64().unwrap_or(0.0);
    assert!(share > 0.0 && share <= 100.0, "{v}");
    let (_, page2) = get(&s, "/fair?rule=partner&perPage=2&page=2");
    assert_eq!(page2["values"][0]["value"], "u2", "{page2}");
    assert_eq!(get(&s, "/fair").0, 400);
    assert_eq!(get(&s, "/fair?rule=nope").0, 404);

    let (_, explain) = get(&s, "/explain?site=partner&user=u1");
    let fair = &explain["decider"]["limits"][0]["fairShare"];
    assert_eq!(
        (fair["by"].as_str(), fair["value"].as_str()),
        (Some("user"), Some("u1")),
        "{explain}"
    );
    assert!(
        fair["shareRate"].as_f64().is_some() && fair["demandRate"].as_f64().is_some(),
        "{explain}"
    );

    let (_, rule) = get(&s, "/api/v1/rules/partner");
    assert_eq!(rule["fair"]["active"].as_u64(), Some(3), "{rule}");

    let metrics = s.metric_samples();
    assert_eq!(
        metrics.get("divvy_fair_share_actors{limit=\"partner\"}"),
        Some(&3.0),
        "{metrics:?}"
    );

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, POLICY).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(binary())
        .args([
            "explain",
            file.to_str().unwrap_or_default(),
            "site=partner",
            "user=u1",
        ])
        .args(["--server", &format!("http://{}", s.http)])
        .env("DIVVY_ADMIN_READ_TOKEN", READ)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_has(&text, &["fair share by user", "user=u1 has a share of"]);
}
