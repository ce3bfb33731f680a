//! The Helm chart, linted and rendered offline with Helm's own engine for
//! several value sets, every manifest checked against Kubernetes schemas
//! (tests/helm/check_chart.py, in the venv tests/run-all.sh installs).

use std::path::PathBuf;
use std::process::Command;

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
