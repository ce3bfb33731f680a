//! The Helm chart, linted and rendered offline with Helm's own engine for
//! several value sets, every manifest checked against Kubernetes schemas
//! (tests/helm/check_chart.py, in the venv tests/run-all.sh installs).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The documents the chart renders with `values` (a JSON object), through
/// check_chart.py's `--render`.
fn render(values: &str) -> Vec<Value> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".tools/venv/bin/python");
    assert!(
        python.exists(),
        "the Python venv is missing at {}; run `bash tests/run-all.sh`",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root.join("tests/helm/check_chart.py"))
        .args(["--render", values])
        .output()
        .expect("run check_chart.py --render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("rendered documents as JSON")
}

/// The rendered ConfigMaps labelled `grafana_dashboard`.
fn dashboard_config_maps(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter(|d| d["metadata"]["labels"].get("grafana_dashboard").is_some())
        .collect()
}

/// Off by default: no dashboard ConfigMap. Enabled: one ConfigMap with
/// the label Grafana's sidecar looks for, the namespace and annotations
/// asked for, and helm/divvy/dashboards/divvy.json as its data, intact.
#[test]
fn grafana_dashboard_config_map_is_opt_in_and_carries_the_dashboard() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let defaults = render("{}");
    assert!(defaults.iter().any(|d| d["kind"] == "Deployment"));
    assert_eq!(
        dashboard_config_maps(&defaults).len(),
        0,
        "the dashboard ConfigMap must be off by default"
    );
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("helm/divvy/dashboards/divvy.json"))
            .expect("dashboards/divvy.json"),
    )
    .expect("dashboards/divvy.json is JSON");
    let docs = render(
        r#"{"grafanaDashboard": {"enabled": true, "namespace": "monitoring", "annotations": {"grafana_folder": "divvy"}}}"#,
    );
    let maps = dashboard_config_maps(&docs);
    assert_eq!(maps.len(), 1, "one dashboard ConfigMap: {maps:?}");
    let map = maps[0];
    let meta = &map["metadata"];
    assert_eq!(meta["labels"]["grafana_dashboard"], "1");
    assert_eq!(meta["namespace"], "monitoring");
    assert_eq!(meta["annotations"]["grafana_folder"], "divvy");
    assert_eq!(meta["name"], "divvy-dashboard");
    let data = map["data"]["divvy.json"]
        .as_str()
        .expect("data divvy.json is a string");
    let carried: Value = serde_json::from_str(data).expect("the ConfigMap's divvy.json is JSON");
    assert_eq!(carried, file, "the ConfigMap must carry the file unchanged");
    assert_eq!(carried["uid"], "divvy");
    // The rules' ConfigMap is still there beside it.
    assert!(docs
        .iter()
        .any(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "divvy"));
    // Helm merges labels with the default; null removes the default (a
    // sidecar that looks for another label).
    let docs = render(
        r#"{"grafanaDashboard": {"enabled": true, "labels": {"dashboards": "divvy", "grafana_dashboard": null}}}"#,
    );
    let map = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "divvy-dashboard")
        .expect("dashboard ConfigMap");
    assert_eq!(map["metadata"]["labels"]["dashboards"], "divvy");
    assert!(map["metadata"]["labels"].get("grafana_dashboard").is_none());
    assert!(map["metadata"].get("namespace").is_none());
}

#[test]
fn chart_lints_renders_and_validates() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(".tools/venv/bin/python");
    assert!(
        python.exists(),
        "the Python venv is missing at {}; run `bash tests/run-all.sh` (it installs helm-python-sdk and kubernetes-validate)",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root.join("tests/helm/check_chart.py"))
        .output()
        .expect("run check_chart.py");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for set in [
        "defaults",
        "redis-with-secret",
        "admin-tokens-from-secret",
        "admin-token-only",
        "autoscaling-and-servicemonitor",
        "registry-image",
        "grafana-dashboard",
    ] {
        assert!(text.contains(&format!("ok: {set}:")), "{text}");
    }
    // The default image is the one scripts/build-image.sh tags: divvy:<Cargo version>.
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.contains(&format!("image divvy:{version}\n")),
        "the chart's default image is not divvy:{version}:\n{text}"
    );
}

/// The chart's appVersion (the default image tag) is the crate's version.
#[test]
fn chart_app_version_is_the_crate_version() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let chart = std::fs::read_to_string(root.join("helm/divvy/Chart.yaml")).expect("Chart.yaml");
    let app_version = chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"'))
        .expect("Chart.yaml has an appVersion");
    assert_eq!(
        app_version,
        env!("CARGO_PKG_VERSION"),
        "helm/divvy/Chart.yaml appVersion must be the version in Cargo.toml (the image tag)"
    );
}
