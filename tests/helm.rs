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
        "image-digest",
        "grafana-dashboard",
        "tls",
        "network-policy",
        "prometheus-rule",
        "headless-priority-extras",
        "openshift-security",
        "config-yaml",
        "config-json",
        "config-json-string",
        "config-ini",
        "config-ratelimit",
        "config-ratelimit-string",
        "default-config-json",
        "default-config-ini",
        "default-config-ratelimit",
        "durations-and-sizes",
    ] {
        assert!(
            text.contains(&format!("ok: {set}: lint clean")),
            "value set {set} not checked:\n{text}"
        );
    }
    assert!(
        text.contains("valid for Kubernetes 1.30.0 and 1.35.0"),
        "both Kubernetes versions must be checked:\n{text}"
    );
    // Values the chart must refuse, each with an error naming the problem
    // (typos through values.schema.json, which Helm's engine applies).
    for refused in [
        "typo-replicaCout",
        "typo-onFailure-dney",
        "typo-tls-enabled",
        "bad-configFormat",
        "config-a-list",
        "ini-config-a-map",
        "ini-config-no-section",
        "json-config-not-json",
        "yaml-config-a-list",
        "ratelimit-config-no-domain",
        "ratelimit-under-yaml",
        "file-name-disagrees",
        "bad-duration",
        "duration-compound",
        "duration-decimal",
        "duration-decimal-seconds",
        "scrape-interval-decimal",
        "memory-lowercase-mi",
        "memory-integer",
        "grpc-client-ca-without-tls",
        "grpc-client-san-without-ca",
        "network-peer-empty",
    ] {
        assert!(
            text.contains(&format!("ok: refused: {refused}:")),
            "{refused} was not refused:\n{text}"
        );
    }
    assert!(
        text.contains("ok: alerts: 7 alerts name only metrics divvy exports"),
        "{text}"
    );
    assert!(
        text.contains("label matchers name labels and values divvy's source writes"),
        "the alerts' label values must be checked against src/:\n{text}"
    );
    // The default image is the one scripts/build-image.sh tags: divvy:<Cargo version>.
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.contains(&format!("image divvy:{version}\n")),
        "the chart's default image is not divvy:{version}:\n{text}"
    );
}

/// A helm render error for `values` (the chart must refuse them).
fn render_error(values: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join(".tools/venv/bin/python"))
        .arg(root.join("tests/helm/check_chart.py"))
        .args(["--render", values])
        .output()
        .expect("run check_chart.py --render");
    assert!(!out.status.success(), "{values} rendered");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The schema names the misspelt key or the value outside its set.
#[test]
fn typos_fail_rendering_naming_the_key() {
    for (values, named) in [
        (r#"{"replicaCout": 2}"#, "replicaCout"),
        (r#"{"redis": {"onFailure": "dney"}}"#, "/redis/onFailure"),
        (r#"{"tls": {"enabled": true}}"#, "'enabled'"),
        (
            r#"{"configFormat": "ini", "config": {"default": {"creditLimit": 1}}}"#,
            "configFormat is ini",
        ),
    ] {
        let err = render_error(values);
        assert!(err.contains(named), "{values}: {err}");
    }
}

/// The rendered Deployment and the rules ConfigMap's data.
fn deployment_and_rules(docs: &[Value]) -> (&Value, Vec<(String, String)>) {
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let rules = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "divvy")
        .expect("the rules ConfigMap");
    let data = rules["data"]
        .as_object()
        .expect("ConfigMap data")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("string data").to_owned()))
        .collect();
    (deployment, data)
}

/// The container's arguments.
fn args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect()
}

/// Lays `data` out in `dir` as the kubelet mounts a ConfigMap: the files in
/// a timestamped directory, `..data` linking to it, and each name a link
/// through `..data`.
fn mount_like_kubelet(dir: &std::path::Path, data: &[(String, String)]) {
    let stamped = dir.join("..2025_01_01_00_00_00.000000001");
    std::fs::create_dir(&stamped).expect("mkdir");
    for (name, text) in data {
        std::fs::write(stamped.join(name), text).expect("write a ConfigMap file");
    }
    std::os::unix::fs::symlink(stamped.file_name().unwrap(), dir.join("..data")).expect("..data");
    for (name, _) in data {
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).expect("link");
    }
}

/// Renders `values`, mounts the rules as the pod would, and runs
/// `divvy check` on the path the Deployment's `--config` names: its output,
/// whether it succeeded, and the rules' files.
fn check_rendered(values: &str) -> (bool, String, Vec<(String, String)>) {
    let docs = render(values);
    let (deployment, data) = deployment_and_rules(&docs);
    let config = args(deployment)
        .into_iter()
        .find_map(|a| a.strip_prefix("--config=").map(str::to_owned))
        .expect("--config");
    let relative = config
        .strip_prefix("/etc/divvy")
        .expect("--config under the rules' mount /etc/divvy");
    let dir = tempfile::tempdir().expect("temp dir");
    mount_like_kubelet(dir.path(), &data);
    let path = format!("{}{relative}", dir.path().display());
    let out = Command::new(env!("CARGO_BIN_EXE_divvy"))
        .args(["check", &path])
        .output()
        .expect("run divvy check");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text, data)
}

/// Every syntax the chart writes parses in that syntax: the default rules in
/// each format, and configs given as maps and as strings, checked by the
/// real binary on the path the pods read.
#[test]
fn rendered_configs_pass_divvy_check() {
    let ratelimit = r#"{"domain": "edge", "descriptors": [{"key": "remote_address", "rate_limit": {"unit": "second", "requests_per_unit": 10}}]}"#;
    let cases = [
        ("{}".to_owned(), "per-client"),
        (r#"{"configFormat": "json"}"#.to_owned(), "per-client"),
        (r#"{"configFormat": "ini"}"#.to_owned(), "per-client"),
        (r#"{"configFormat": "ratelimit"}"#.to_owned(), "envoyproxy/ratelimit domain edge"),
        (
            r#"{"config": {"overrides": [{"label": "api", "operation": {"path": "/api/*"}, "creditLimit": 100, "resetSeconds": "1m"}], "default": {"creditLimit": 1, "resetSeconds": 0}}}"#.to_owned(),
            "api",
        ),
        (
            r#"{"configFormat": "json", "config": {"overrides": [{"label": "json-rule", "operation": {"path": "/x"}, "creditLimit": 3, "resetSeconds": 60}], "default": {"creditLimit": 1, "resetSeconds": 0}}}"#.to_owned(),
            "json-rule",
        ),
        (
            r#"{"configFileName": "rules.json", "config": "{\"overrides\": [{\"label\": \"json-text\", \"operation\": {\"k\": \"v\"}, \"creditLimit\": 2, \"resetSeconds\": 5}], \"default\": {\"creditLimit\": 1, \"resetSeconds\": 0}}"}"#.to_owned(),
            "json-text",
        ),
        (
            r#"{"configFormat": "ini", "config": "[method=GET path=/status]\nlabel = ini-status\ncreditLimit = 1000\nresetSeconds = 60\n\n[default]\ncreditLimit = 1\nresetSeconds = 0\n"}"#.to_owned(),
            "ini-status",
        ),
        (
            format!(r#"{{"configFormat": "ratelimit", "config": {ratelimit}}}"#),
            "envoyproxy/ratelimit domain edge",
        ),
        (
            r#"{"configFormat": "ratelimit", "configFileName": "mongo.yml", "config": "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit: {unit: second, requests_per_unit: 500}\n"}"#.to_owned(),
            "envoyproxy/ratelimit domain mongo_cps",
        ),
    ];
    for (values, expect) in cases {
        let (ok, text, _) = check_rendered(&values);
        assert!(ok, "divvy check refused what {values} renders:\n{text}");
        assert!(
            text.contains(expect),
            "{values}: divvy check's summary lacks {expect:?}:\n{text}"
        );
    }
}

/// A config given replaces the chart's example wholesale: nothing of the
/// default rules (overrides, default, the per-client rule) is left beside
/// an envoyproxy/ratelimit file or a YAML policy of one's own.
#[test]
fn a_given_config_replaces_the_default_rules() {
    let (_, _, defaults) = check_rendered("{}");
    assert!(defaults[0].1.contains("per-client"), "{defaults:?}");
    let (ok, text, data) = check_rendered(
        r#"{"configFormat": "ratelimit", "config": {"domain": "edge", "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}]}}"#,
    );
    assert!(ok, "{text}");
    assert_eq!(data.len(), 1, "one file: {data:?}");
    assert_eq!(data[0].0, "ratelimit.yaml");
    for leftover in ["overrides", "default", "per-client", "creditLimit"] {
        assert!(
            !data[0].1.contains(leftover),
            "{leftover} left over: {}",
            data[0].1
        );
    }
    assert!(!text.contains("per-client"), "{text}");
    let (ok, text, data) =
        check_rendered(r#"{"config": {"default": {"creditLimit": 9, "resetSeconds": 60}}}"#);
    assert!(ok, "{text}");
    assert!(!data[0].1.contains("overrides"), "{}", data[0].1);
    assert!(!data[0].1.contains("per-client"), "{}", data[0].1);
}

/// The check is real: a config of the right syntax but a wrong rule
/// renders (the chart does not know divvy's rules) and `divvy check`
/// refuses it, as the helm test pod would.
#[test]
fn divvy_check_refuses_a_bad_rendered_config() {
    let (ok, text, _) = check_rendered(r#"{"config": {"default": {"creditLimit": "lots"}}}"#);
    assert!(!ok, "divvy check accepted a bad rule:\n{text}");
    let (ok, text, _) = check_rendered(
        r#"{"configFormat": "ratelimit", "config": {"domain": "edge", "descriptors": [{"key": "k", "rate_limit": {"unit": "fortnight", "requests_per_unit": 1}}]}}"#,
    );
    assert!(
        !ok,
        "divvy check accepted a bad envoyproxy/ratelimit unit:\n{text}"
    );
}

/// TLS Secrets are mounted as directories, the flags name the files in
/// them, the probes switch to HTTPS, and the helm test pod verifies the
/// admin certificate with the Secret's CA.
#[test]
fn tls_values_mount_secrets_and_switch_probes_to_https() {
    let docs = render(
        r#"{"tls": {"grpc": {"secretName": "grpc-tls", "clientCaSecretName": "envoy-ca", "clientCaKey": "bundle.pem"}, "admin": {"secretName": "admin-tls"}}}"#,
    );
    let (deployment, _) = deployment_and_rules(&docs);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let given = args(deployment);
    for flag in [
        "--grpc-tls-cert=/etc/divvy-tls/grpc/tls.crt",
        "--grpc-tls-key=/etc/divvy-tls/grpc/tls.key",
        "--grpc-tls-client-ca=/etc/divvy-tls/grpc-client-ca/bundle.pem",
        "--http-tls-cert=/etc/divvy-tls/admin/tls.crt",
        "--http-tls-key=/etc/divvy-tls/admin/tls.key",
    ] {
        assert!(given.iter().any(|a| a == flag), "{flag} missing: {given:?}");
    }
    for mount in container["volumeMounts"].as_array().unwrap() {
        assert!(mount.get("subPath").is_none(), "subPath mount: {mount}");
    }
    let volumes = pod["volumes"].as_array().unwrap();
    for secret in ["grpc-tls", "envoy-ca", "admin-tls"] {
        assert!(
            volumes.iter().any(|v| v["secret"]["secretName"] == secret),
            "{secret} not mounted: {volumes:?}"
        );
    }
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
    let test = docs
        .iter()
        .find(|d| d["kind"] == "Pod")
        .expect("the helm test pod");
    let probe_args = test["spec"]["containers"][0]["args"].to_string();
    assert!(
        probe_args.contains("https://divvy.divvy.svc:8080/readyz"),
        "{probe_args}"
    );
    assert!(
        probe_args.contains("--ca=/etc/divvy-tls/admin/ca.crt"),
        "{probe_args}"
    );
    // Without TLS: plain HTTP everywhere, no TLS flags.
    let docs = render("{}");
    let (deployment, _) = deployment_and_rules(&docs);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTP");
    assert!(!args(deployment).iter().any(|a| a.contains("tls")));
}

/// The container's memory limit reaches divvy through the downward API,
/// unless memoryLimit says otherwise.
#[test]
fn memory_limit_comes_from_the_downward_api() {
    let docs = render("{}");
    let (deployment, _) = deployment_and_rules(&docs);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let memory = env
        .iter()
        .find(|e| e["name"] == "DIVVY_MEMORY_LIMIT")
        .expect("DIVVY_MEMORY_LIMIT");
    let field = &memory["valueFrom"]["resourceFieldRef"];
    assert_eq!(field["containerName"], "divvy");
    assert_eq!(field["resource"], "limits.memory");
    let docs = render(r#"{"memoryLimit": "300Mi"}"#);
    let (deployment, _) = deployment_and_rules(&docs);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains(r#""name":"DIVVY_MEMORY_LIMIT","value":"300Mi""#),
        "{env}"
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

/// Kills the child when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The arguments the chart renders are ones `divvy serve` takes: the
/// rendered command line (addresses moved to loopback, the rules mounted in
/// a temp dir as the kubelet does, the memory limit in bytes as the
/// downward API gives it) serves, and `divvy probe` finds /readyz ready,
/// as the helm test pod does.
#[test]
fn the_rendered_command_line_serves() {
    let values = r#"{"configFormat": "ratelimit", "readinessRequiresStore": true, "extraArgs": ["--max-counters=100000"]}"#;
    let docs = render(values);
    let (deployment, data) = deployment_and_rules(&docs);
    let dir = tempfile::tempdir().expect("temp dir");
    mount_like_kubelet(dir.path(), &data);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let args: Vec<String> = args(deployment)
        .into_iter()
        .map(|a| match a.split_once('=') {
            Some(("--config", path)) => format!(
                "--config={}",
                path.replacen("/etc/divvy", &dir.path().display().to_string(), 1)
            ),
            Some((flag @ ("--grpc-addr" | "--line-addr"), _)) => format!("{flag}=127.0.0.1:0"),
            Some(("--http-addr", _)) => format!("--http-addr=127.0.0.1:{port}"),
            _ => a,
        })
        .collect();
    assert!(
        args.iter().any(|a| a == "--ready-requires-store"),
        "{args:?}"
    );
    // The log goes to a file: a pipe nobody reads could fill and stall it.
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_divvy"))
        .args(&args)
        .env("DIVVY_MEMORY_LIMIT", "268435456")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start divvy serve");
    let mut child = Killed(child);
    let url = format!("http://127.0.0.1:{port}/readyz");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_divvy"))
            .args(["probe", "--timeout", "1s", &url])
            .output()
            .expect("run divvy probe");
        if out.status.success() {
            break;
        }
        if let Some(status) = child.0.try_wait().expect("wait") {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("divvy serve {args:?} exited ({status}):\n{log}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz not ready within 20 s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The rendered container's environment variable `name`.
fn env_var<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing"))
}

/// The schema takes for durations and sizes exactly what divvy's parsers
/// take (src/config/duration.rs parse_millis, src/memory_budget.rs
/// parse_size): no compound or decimal durations, no lowercase `mi`, and
/// memoryLimit only as a string (Helm renders a large YAML integer as a
/// float, 2.68435456e+08, which divvy refuses).
#[test]
fn values_take_only_durations_and_sizes_divvy_parses() {
    for (values, named) in [
        (
            r#"{"grpc": {"maxConnectionAge": "1h30m"}}"#,
            "/grpc/maxConnectionAge",
        ),
        (
            r#"{"grpc": {"maxConnectionAge": "1.5m"}}"#,
            "/grpc/maxConnectionAge",
        ),
        (
            r#"{"grpc": {"maxConnectionAgeGrace": "0.5s"}}"#,
            "/grpc/maxConnectionAgeGrace",
        ),
        (
            r#"{"grpc": {"maxConnectionAgeGrace": "5us"}}"#,
            "/grpc/maxConnectionAgeGrace",
        ),
        (r#"{"memoryLimit": "256mi"}"#, "/memoryLimit"),
        (r#"{"memoryLimit": "1g"}"#, "/memoryLimit"),
        (r#"{"memoryLimit": 268435456}"#, "/memoryLimit"),
        (
            r#"{"serviceMonitor": {"interval": "1.5m"}}"#,
            "/serviceMonitor/interval",
        ),
    ] {
        let err = render_error(values);
        assert!(err.contains(named), "{values}: {err}");
    }
    for (age, grace) in [("0", "0"), ("90", "500ms"), ("5m", "30s"), ("2h", "1d")] {
        let docs = render(&format!(
            r#"{{"grpc": {{"maxConnectionAge": "{age}", "maxConnectionAgeGrace": "{grace}"}}}}"#
        ));
        let (deployment, _) = deployment_and_rules(&docs);
        let given = args(deployment);
        assert!(
            given.contains(&format!("--grpc-max-connection-age={age}")),
            "{given:?}"
        );
        assert!(
            given.contains(&format!("--grpc-max-connection-age-grace={grace}")),
            "{given:?}"
        );
    }
    for size in ["256Mi", "268435456", "1G", "0.5Gi", "256MiB", "512k"] {
        let docs = render(&format!(r#"{{"memoryLimit": "{size}"}}"#));
        let (deployment, _) = deployment_and_rules(&docs);
        let memory = env_var(deployment, "DIVVY_MEMORY_LIMIT");
        assert_eq!(memory["value"], size, "{memory}");
        assert!(memory.get("valueFrom").is_none(), "{memory}");
    }
}

/// A config string reaches the ConfigMap byte for byte, as the cluster
/// gets it (check_chart.py splits and trims documents as Helm does): with
/// a first line that starts with spaces or not, with no, one or several
/// final newlines, trailing spaces or CRLF line ends.
#[test]
fn config_strings_reach_the_config_map_exactly() {
    let json = r#"{"default": {"creditLimit": 1, "resetSeconds": 0}}"#;
    let ini = "[default]\ncreditLimit = 1\nresetSeconds = 0";
    for lead in ["", "  ", "\t", "\n  "] {
        for tail in ["", "\n", "\n\n", "\n\n\n", "  ", "\n  \n", "\r\n"] {
            for (format, body) in [("json", json), ("ini", ini)] {
                let config = format!("{lead}{body}{tail}");
                let values = serde_json::json!({"configFormat": format, "config": config});
                let docs = render(&values.to_string());
                let (_, data) = deployment_and_rules(&docs);
                assert_eq!(data.len(), 1, "{data:?}");
                assert_eq!(
                    data[0].1, config,
                    "{format} config {config:?} changed in the ConfigMap"
                );
            }
        }
    }
    // Maps and the example rules end in one newline.
    for values in [
        "{}",
        r#"{"configFormat": "json"}"#,
        r#"{"config": {"default": {"creditLimit": 1}}}"#,
    ] {
        let docs = render(values);
        let (_, data) = deployment_and_rules(&docs);
        assert!(
            data[0].1.ends_with('\n') && !data[0].1.ends_with("\n\n"),
            "{values}: {:?}",
            data[0].1
        );
    }
    // divvy reads the indented text as the pods would.
    let (ok, text, _) = check_rendered(
        r#"{"configFormat": "json", "config": "  {\"overrides\": [{\"label\": \"indented\", \"operation\": {\"k\": \"v\"}, \"creditLimit\": 2, \"resetSeconds\": 5}], \"default\": {\"creditLimit\": 1, \"resetSeconds\": 0}}\n"}"#,
    );
    assert!(ok && text.contains("indented"), "{text}");
}

/// A gRPC client CA (or client SAN) without what it needs is refused when
/// rendering, naming the missing value, instead of rendering a pod divvy
/// refuses to start (or one that takes any client).
#[test]
fn grpc_client_ca_and_san_need_grpc_tls() {
    for (values, named) in [
        (
            r#"{"tls": {"grpc": {"clientCaSecretName": "envoy-ca"}}}"#,
            "tls.grpc.clientCaSecretName needs tls.grpc.secretName",
        ),
        (
            r#"{"tls": {"grpc": {"clientCaSecretName": "envoy-ca", "clientSan": "envoy"}, "admin": {"secretName": "admin-tls"}}}"#,
            "tls.grpc.clientCaSecretName needs tls.grpc.secretName",
        ),
        (
            r#"{"tls": {"grpc": {"clientSan": "envoy"}}}"#,
            "tls.grpc.clientSan needs tls.grpc.clientCaSecretName",
        ),
        (
            r#"{"tls": {"grpc": {"secretName": "grpc-tls", "clientSan": "envoy"}}}"#,
            "tls.grpc.clientSan needs tls.grpc.clientCaSecretName",
        ),
    ] {
        let err = render_error(values);
        assert!(err.contains(named), "{values}: {err}");
    }
    // Each alone with what it needs renders.
    let docs = render(
        r#"{"tls": {"grpc": {"secretName": "grpc-tls", "clientCaSecretName": "envoy-ca", "clientSan": "envoy"}}}"#,
    );
    let given = args(deployment_and_rules(&docs).0);
    assert!(
        given.iter().any(|a| a == "--grpc-tls-client-san=envoy"),
        "{given:?}"
    );
}

/// divvy sizes its counters to limits.memory and uses it, so the default
/// memory request equals the limit (no eviction as a Burstable pod that
/// went over its request).
#[test]
fn default_memory_request_equals_the_limit() {
    let docs = render("{}");
    let (deployment, _) = deployment_and_rules(&docs);
    let resources = &deployment["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert!(resources["limits"]["memory"].is_string(), "{resources}");
    assert_eq!(
        resources["requests"]["memory"], resources["limits"]["memory"],
        "{resources}"
    );
}

/// Runs tests/helm/alerts.test.yaml with `promtool test rules` against the
/// rendered PrometheusRule's groups (annotations left out), with the
/// expression of `replace` (an alert name) swapped for another first.
fn promtool_alert_tests(replace: Option<(&str, &str)>) -> (bool, String) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let docs = render(r#"{"prometheusRule": {"enabled": true}}"#);
    let mut spec = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule")["spec"]
        .clone();
    for group in spec["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            rule.as_object_mut().unwrap().remove("annotations");
            if let Some((alert, expr)) = replace {
                if rule["alert"] == alert {
                    rule["expr"] = Value::String(expr.to_owned());
                }
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("rules.json"), spec.to_string()).expect("rules.json");
    std::fs::copy(
        root.join("tests/helm/alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .expect("copy alerts.test.yaml");
    let out = Command::new("promtool")
        .current_dir(dir.path())
        .args(["test", "rules", "alerts.test.yaml"])
        .output()
        .expect("run promtool (Debian's prometheus package, which tests/run-all.sh installs)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The reload and xDS alerts fire while the last attempt failed and stop
/// at the next success or a restart (promtool, on series of several pods'
/// histories); the review's expression, which kept firing 15 minutes past
/// a successful reload, fails the same tests.
#[test]
fn alerts_fire_while_the_last_config_change_failed() {
    let (ok, text) = promtool_alert_tests(None);
    assert!(ok, "{text}");
    let (ok, text) = promtool_alert_tests(Some((
        "DivvyConfigReloadFailing",
        r#"increase(divvy_reloads_total{result="failure"}[15m]) > 0"#,
    )));
    assert!(!ok, "the old reload alert passed the scenarios:\n{text}");
}
