//! divvy in Envoy Gateway's place: started as `/bin/ratelimit` with the
//! environment Envoy Gateway gives its rate-limit Deployment, configured
//! over xDS (mutual TLS 1.3) with `RateLimitConfig` resources shaped as
//! Envoy Gateway's translator builds them, behind a real Envoy configured as
//! Envoy Gateway configures it (`examples/envoy-gateway/envoy.yaml`: per-route
//! actions, `failure_mode_deny`, DRAFT_VERSION_03 headers, mutual TLS to
//! divvy). The cases are those of Envoy Gateway's end-to-end rate-limit
//! tests.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::envoy::{self, header};
use common::pki::{Ca, San};
use common::xds::{ControlPlane, Tls};
use common::{free_port, http_request, Server};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

const DOMAIN: &str = "default/eg/http";
const SERVER_NAME: &str = "envoy-ratelimit.envoy-gateway-system.svc.cluster.local";

fn route(name: &str) -> String {
    format!("httproute/default/{name}/rule/0/match/0/*")
}

/// A descriptor chain: each `(key, value)` nested in the one before, the
/// limit (and shadow mode) on the last.
fn chain(entries: &[(&str, &str)], rpu: u32, shadow: bool) -> RateLimitDescriptor {
    let (last, rest) = entries.split_last().expect("entries");
    let mut node = RateLimitDescriptor {
        key: last.0.to_owned(),
        value: last.1.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour as i32,
            requests_per_unit: rpu,
            ..Default::default()
        }),
        shadow_mode: shadow,
        ..Default::default()
    };
    for (k, v) in rest.iter().rev() {
        node = RateLimitDescriptor {
            key: (*k).to_owned(),
            value: (*v).to_owned(),
            descriptors: vec![node],
            ..Default::default()
        };
    }
    node
}

/// The listener's domain as Envoy Gateway's translator writes it for the
/// routes of examples/envoy-gateway/envoy.yaml.
fn gateway_config() -> RateLimitConfig {
    let r = |name: &str| route(name);
    let (h, hi, ci, c) = (r("header"), r("header-invert"), r("cidr-invert"), r("cidr"));
    let (m, p, q, cost, shadow) = (r("method"), r("path"), r("query"), r("cost"), r("shadow"));
    let shared = "default/shared/rule/0";
    let descriptors = vec![
        chain(
            &[
                (&h, &h),
                ("rule-0-match-0", "rule-0-match-0"),
                ("rule-0-match-1", "rule-0-match-1"),
            ],
            3,
            false,
        ),
        chain(
            &[(&hi, &hi), ("rule-0-match-0", "rule-0-match-0")],
            3,
            false,
        ),
        chain(
            &[(&ci, &ci), ("masked_remote_address", "invert:192.0.2.0/24")],
            2,
            false,
        ),
        chain(
            &[(&c, &c), ("masked_remote_address", "0.0.0.0/0")],
            3,
            false,
        ),
        chain(
            &[(&m, &m), ("rule-0-match-method", "rule-0-match-method")],
            3,
            false,
        ),
        chain(
            &[(&p, &p), ("rule-0-match-path", "rule-0-match-path")],
            3,
            false,
        ),
        chain(&[(&q, &q), ("rule-0-match-0", "rule-0-match-0")], 3, false),
        chain(&[(shared, shared)], 3, false),
        chain(&[(&cost, &cost)], 4, false),
        chain(&[(&shadow, &shadow)], 1, true),
    ];
    RateLimitConfig {
        name: DOMAIN.to_owned(),
        domain: DOMAIN.to_owned(),
        descriptors,
    }
}

/// Certificates as Envoy Gateway's certgen makes them: one CA; divvy's
/// server certificate for the rate-limit Service's name; Envoy's client
/// certificate; the control plane's server certificate and divvy's client
/// certificate to it.
struct Certs {
    dir: tempfile::TempDir,
    ca: Ca,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("envoy-gateway");
        common::pki::write(dir.path(), "ca.crt", &ca.pem);
        let issue = |name: &str, san: &str, serial| {
            ca.issue(&[San::Dns(san)], serial).write(dir.path(), name);
        };
        issue("ratelimit", SERVER_NAME, 1);
        issue("envoy", "envoy", 2);
        issue("envoy-gateway", "envoy-gateway", 3);
        issue("xds-client", "envoy-ratelimit", 4);
        Certs { dir, ca }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// divvy as `/bin/ratelimit` with Envoy Gateway's environment.
fn start_ratelimit(certs: &Certs, xds: &str, prometheus: &str) -> Server {
    let link = certs.dir.path().join("ratelimit");
    std::os::unix::fs::symlink(common::binary(), &link).unwrap();
    let mut command = Command::new(link);
    command.env_clear().envs([
        ("RUNTIME_ROOT", "/data".to_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.to_owned()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            certs.path("xds-client.crt"),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            certs.path("xds-client.key"),
        ),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", certs.path("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway".to_owned()),
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", certs.path("ratelimit.crt")),
        ("GRPC_SERVER_TLS_KEY", certs.path("ratelimit.key")),
        ("GRPC_SERVER_TLS_CA_CERT", certs.path("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_owned()),
        ("USE_PROMETHEUS", "true".to_owned()),
        ("PROMETHEUS_ADDR", prometheus.to_owned()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("GRPC_PORT", "0".to_owned()),
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", "0".to_owned()),
    ]);
    Server::spawn(command)
}

/// The example's lines that make its connections to divvy TLS 1.3 only.
const TLS13_MIN: &str = "            tls_minimum_protocol_version: TLSv1_3\n";
const TLS13_MAX: &str = "            tls_maximum_protocol_version: TLSv1_3\n";

/// examples/envoy-gateway/envoy.yaml as it stands.
fn example() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy-gateway/envoy.yaml");
    std::fs::read_to_string(path).unwrap()
}

/// examples/envoy-gateway/envoy.yaml with the test's certificates and ports.
fn start_envoy(certs: &Certs, divvy_grpc: u16, upstream: u16) -> envoy::Envoy {
    start_envoy_on(&example(), certs, divvy_grpc, upstream)
}

/// Envoy on `text` (the example or a variant of it) with the test's
/// certificates and ports.
fn start_envoy_on(text: &str, certs: &Certs, divvy_grpc: u16, upstream: u16) -> envoy::Envoy {
    let config: PathBuf = certs.dir.path().join("envoy.yaml");
    std::fs::write(
        &config,
        text.replace("CERTS/", &format!("{}/", certs.dir.path().display())),
    )
    .unwrap();
    envoy::start(
        &config,
        19000,
        &[10000],
        &[(8081, divvy_grpc), (9999, upstream)],
        &[],
    )
}

/// The counters of Envoy's TLS to divvy (`cluster.ratelimit_cluster.ssl.*`),
/// by the name after that prefix.
fn ssl_stats(proxy: &envoy::Envoy) -> Vec<(String, u64)> {
    let prefix = "cluster.ratelimit_cluster.ssl.";
    let (status, _, body) = envoy::get(proxy.admin, "/stats?filter=ratelimit_cluster.ssl.", &[])
        .expect("Envoy's admin answers");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter_map(|line| {
            let (name, value) = line.strip_prefix(prefix)?.split_once(": ")?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// One counter of [`ssl_stats`]; 0 when Envoy has not made it yet.
fn ssl_stat(stats: &[(String, u64)], name: &str) -> u64 {
    stats.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)
}

/// Status codes of `n` GETs of `path` with `headers`, and the last answer's
/// `x-ratelimit-limit`.
fn statuses(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> (Vec<u16>, Option<String>) {
    let mut codes = Vec::new();
    let mut limit = None;
    for _ in 0..n {
        let (status, h, _) = envoy::get(port, path, headers).expect("an answer through Envoy");
        codes.push(status);
        limit = header(&h, "x-ratelimit-limit").map(str::to_owned);
    }
    (codes, limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_cases_through_a_real_envoy() {
    let certs = Certs::new();
    let tls = Tls {
        cert: certs.ca.issue(&[San::Dns("envoy-gateway")], 5),
        client_ca: certs.ca.pem.clone(),
    };
    let plane = ControlPlane::start_tls(
        "127.0.0.1:0".parse().unwrap(),
        ("1".to_owned(), vec![gateway_config()]),
        tls,
    )
    .await;
    let prometheus = format!("127.0.0.1:{}", free_port());
    let server = start_ratelimit(&certs, &plane.addr.to_string(), &prometheus);
    let start = Instant::now();
    while !plane.requests().iter().any(|r| r.version_info == "1") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no ACK of version 1"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let upstream = envoy::upstream("ok");
    let proxy = start_envoy(&certs, server.grpc.port(), upstream);
    let port = proxy.ports[0];
    route_cases(port);
    tls13_only(&proxy);

    // The minimum without the maximum: Envoy's upstream default maximum is
    // TLS 1.2, so Envoy has no version to offer and fails the handshake on
    // its side (BoringSSL's NO_SUPPORTED_VERSIONS_ENABLED), before divvy
    // sees a ClientHello; failure_mode_deny answers 500.
    let min_only = example().replace(TLS13_MAX, "");
    let broken = start_envoy_on(&min_only, &certs, server.grpc.port(), upstream);
    assert_eq!(statuses(broken.ports[0], "/method", &[], 2).0, [500, 500]);
    let stats = ssl_stats(&broken);
    assert!(ssl_stat(&stats, "connection_error") >= 1, "{stats:?}");
    assert_eq!(ssl_stat(&stats, "handshake"), 0, "{stats:?}");
    drop(broken);

    over_limit_names(&prometheus);
}

/// Envoy Gateway's cases through Envoy `port`: header, inverted header,
/// CIDR, method, path, query parameter, a shared limit, a cost and shadow
/// mode.
fn route_cases(port: u16) {
    let limited3 = (vec![200, 200, 200, 429], Some("3, 3;w=3600".to_owned()));

    // Headers: every match limits; a partial match is not limited.
    let both = [("x-user-id", "one"), ("x-org-id", "acme")];
    assert_eq!(statuses(port, "/header", &both, 4), limited3);
    assert_eq!(
        statuses(port, "/header", &[("x-user-id", "one")], 5).0,
        [200; 5]
    );
    // Inverted header match: limited unless the header has the value.
    assert_eq!(
        statuses(port, "/header-invert", &[("x-org-id", "admin")], 5).0,
        [200; 5]
    );
    assert_eq!(
        statuses(port, "/header-invert", &[("x-org-id", "other")], 4),
        limited3
    );
    // CIDR, and an inverted CIDR the client is outside of.
    assert_eq!(statuses(port, "/cidr", &[], 4), limited3);
    let inverted = statuses(port, "/cidr-invert", &[], 3);
    assert_eq!(
        inverted,
        (vec![200, 200, 429], Some("2, 2;w=3600".to_owned()))
    );
    // Method, path and query parameter.
    assert_eq!(statuses(port, "/method", &[], 4), limited3);
    assert_eq!(statuses(port, "/path/other", &[], 5).0, [200; 5]);
    assert_eq!(statuses(port, "/path/limited", &[], 4), limited3);
    assert_eq!(statuses(port, "/query?user=bob", &[], 5).0, [200; 5]);
    assert_eq!(statuses(port, "/query?user=alice", &[], 4), limited3);
    // One limit shared by two routes.
    let (a, _) = statuses(port, "/shared-a", &[], 2);
    let (b, _) = statuses(port, "/shared-b", &[], 2);
    assert_eq!((a, b), (vec![200, 200], vec![200, 429]));
    // A cost of 2 against a limit of 4; shadow mode never denies.
    assert_eq!(statuses(port, "/cost", &[], 3).0, [200, 200, 429]);
    assert_eq!(statuses(port, "/shadow", &[], 3).0, [200, 200, 200]);
}

/// Every handshake of `proxy` with divvy was TLS 1.3: the example allows
/// no other.
fn tls13_only(proxy: &envoy::Envoy) {
    assert!(
        example().contains(&format!("{TLS13_MIN}{TLS13_MAX}")),
        "the example's tls_params are not TLS 1.3 only"
    );
    let stats = ssl_stats(proxy);
    assert!(ssl_stat(&stats, "handshake") >= 1, "{stats:?}");
    assert_eq!(
        ssl_stat(&stats, "versions.TLSv1.3"),
        ssl_stat(&stats, "handshake"),
        "{stats:?}"
    );
    assert_eq!(ssl_stat(&stats, "connection_error"), 0, "{stats:?}");
}

/// envoyproxy/ratelimit's names on `prometheus`, as Envoy Gateway's tests
/// query them.
fn over_limit_names(prometheus: &str) {
    let (status, text) = http_request(prometheus.parse().unwrap(), "GET", "/metrics", "", None);
    assert_eq!(status, 200);
    for key2 in [
        "masked_remote_address_0_0_0_0/0",
        "masked_remote_address_invert_192_0_2_0/24",
    ] {
        let found = text.lines().any(|l| {
            l.starts_with("ratelimit_service_rate_limit_over_limit{")
                && l.contains(&format!("key2=\"{key2}\""))
                && l.ends_with(" 1")
        });
        assert!(found, "no over_limit sample with key2={key2}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_fails_and_envoy_denies() {
    let certs = Certs::new();
    // Envoy presents a certificate divvy's CA never signed.
    let other = Ca::new("someone-else");
    other
        .issue(&[San::Dns("envoy")], 9)
        .write(certs.dir.path(), "envoy");
    let tls = Tls {
        cert: certs.ca.issue(&[San::Dns("envoy-gateway")], 5),
        client_ca: certs.ca.pem.clone(),
    };
    let plane = ControlPlane::start_tls(
        "127.0.0.1:0".parse().unwrap(),
        ("1".to_owned(), vec![gateway_config()]),
        tls,
    )
    .await;
    let prometheus = format!("127.0.0.1:{}", free_port());
    let server = start_ratelimit(&certs, &plane.addr.to_string(), &prometheus);
    let upstream = envoy::upstream("ok");
    let proxy = start_envoy(&certs, server.grpc.port(), upstream);
    // failure_mode_deny: the rate-limit call fails, Envoy answers 500.
    assert_eq!(statuses(proxy.ports[0], "/cidr", &[], 2).0, [500, 500]);
    // Because divvy refused Envoy's handshake, not for any other failure.
    let refused = server
        .metric_samples()
        .get("divvy_tls_handshake_failures_total{port=\"grpc\",reason=\"error\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(refused >= 1.0, "no refused handshake counted");
}
