//! envoyproxy/ratelimit domains over xDS: the real binary subscribed to a
//! control plane in the test (an ADS server, state of the world), which
//! sends `RateLimitConfig` resources as Envoy Gateway builds them.

mod common;

use std::time::{Duration, Instant};

use common::xds::ControlPlane;
use common::{ask, desc, request, Server};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::Channel;

/// A divvy policy beside the xDS domains (its rules decide other domains).
const POLICY: &str = "default: {creditLimit: 100, resetSeconds: 60}\n";

/// Envoy Gateway's shape: a domain per listener, a `generic_key` per route
/// rule holding the rule's descriptors.
fn gateway(domain: &str, routes: &[(&str, u32)]) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.to_owned(),
        domain: domain.to_owned(),
        descriptors: routes
            .iter()
            .map(|&(route, rpu)| RateLimitDescriptor {
                key: "generic_key".to_owned(),
                value: route.to_owned(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: rpu,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    }
}

async fn codes(client: &mut RateLimitServiceClient<Channel>, route: &str, n: usize) -> Vec<i32> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = ask(client, request("eg", vec![desc(&[("generic_key", route)])])).await;
        out.push(r.overall_code);
    }
    out
}

fn metric(server: &Server, name: &str) -> f64 {
    server.metric_samples().get(name).copied().unwrap_or(0.0)
}

/// Polls until `name` reaches `at_least`; how long that took.
async fn until_metric(server: &Server, name: &str, at_least: f64) -> Duration {
    let start = Instant::now();
    while metric(server, name) < at_least {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name} did not reach {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

const ACCEPTED: &str = "divvy_xds_updates_total{result=\"accepted\"}";
const REJECTED: &str = "divvy_xds_updates_total{result=\"rejected\"}";
const OK: i32 = Code::Ok as i32;
/// The rate-limit service's name in grpc.health.v1.
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_updates_apply_bad_ones_are_nacked_and_the_last_set_outlives_the_control_plane() {
    let plane = ControlPlane::start(
        "127.0.0.1:0".parse().unwrap(),
        ("v1".to_owned(), vec![gateway("eg", &[("route-a", 2)])]),
    )
    .await;
    let addr = plane.addr;
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--xds-server",
            &addr.to_string(),
            "--xds-node-id",
            "envoy-ratelimit",
        ],
    );
    until_metric(&server, ACCEPTED, 1.0).await;
    let mut client = server.client().await;
    assert_eq!(codes(&mut client, "route-a", 3).await, [OK, OK, OVER]);
    let first = &plane.requests()[0];
    assert_eq!(
        first.node.as_ref().map(|n| n.id.as_str()),
        Some("envoy-ratelimit")
    );
    assert_eq!(first.type_url, common::xds::TYPE);

    // A new version: a new route's limit applies once it is ACKed.
    plane.set((
        "v2".to_owned(),
        vec![gateway("eg", &[("route-a", 2), ("route-b", 1)])],
    ));
    let took = until_metric(&server, ACCEPTED, 2.0).await;
    println!(
        "xDS update v2 applied {} ms after it was sent",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1), "the update took {took:?}");
    assert_eq!(codes(&mut client, "route-b", 2).await, [OK, OVER]);
    // Where the domain came from, on the admin API.
    let (_, config) = server.http("GET", "/config", "");
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["domains"][0]["source"], "xds:eg@v2", "{config}");
    let (_, rlconfig) = server.http("GET", "/rlconfig", "");
    assert!(rlconfig.contains("# eg from xds:eg@v2\n"), "{rlconfig}");
    assert!(
        rlconfig.contains("eg.generic_key_route-b: unit=HOUR requests_per_unit=1"),
        "{rlconfig}"
    );
    let ack = reply(&plane, |r| r.version_info == "v2").await;
    assert!(ack.error_detail.is_none(), "v2 is ACKed");

    // An invalid version (a unit of UNKNOWN) is NACKed; v2 keeps applying.
    let mut bad = gateway("eg", &[("route-c", 5)]);
    bad.descriptors[0].rate_limit.as_mut().unwrap().unit = RateLimitUnit::Unknown as i32;
    plane.set(("v3".to_owned(), vec![bad]));
    until_metric(&server, REJECTED, 1.0).await;
    let nack = reply(&plane, |r| r.error_detail.is_some()).await;
    let detail = nack.error_detail.expect("error_detail").message;
    assert_eq!(
        nack.version_info, "v2",
        "a NACK names the last good version"
    );
    assert!(detail.contains("UNKNOWN"), "{detail}");
    assert_eq!(codes(&mut client, "route-b", 1).await, [OVER]);
    assert_eq!(
        codes(&mut client, "route-c", 1).await,
        [OK],
        "no limit: v3 not in force"
    );

    // The control plane goes away: decisions go on with v2, health stays.
    plane.kill();
    until_stream_down(&server).await;
    assert_eq!(codes(&mut client, "route-a", 1).await, [OVER]);
    assert_eq!(server.http("GET", "/healthcheck", "").0, 200);

    // It comes back on the same address with a new version: resubscribed.
    let plane = ControlPlane::start(
        addr,
        ("v4".to_owned(), vec![gateway("eg", &[("route-c", 1)])]),
    )
    .await;
    until_metric(&server, ACCEPTED, 3.0).await;
    assert_eq!(codes(&mut client, "route-c", 2).await, [OK, OVER]);
    assert_eq!(metric(&server, "divvy_xds_stream_up"), 1.0);
    drop(plane);
}

/// The first request the control plane received that `matches` (waiting
/// for it: the client counts an update before its reply arrives).
async fn reply(
    plane: &ControlPlane,
    matches: impl Fn(&DiscoveryRequest) -> bool,
) -> DiscoveryRequest {
    let start = Instant::now();
    loop {
        if let Some(r) = plane.requests().into_iter().find(|r| matches(r)) {
            return r;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no such request");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until_stream_down(server: &Server) {
    let start = Instant::now();
    while metric(server, "divvy_xds_stream_up") != 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the stream stayed up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_the_policy_directory_defines_is_refused_over_xds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("eg.yaml"),
        "domain: eg\ndescriptors:\n  - key: generic_key\n    value: route-a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let plane = ControlPlane::start(
        "127.0.0.1:0".parse().unwrap(),
        ("v1".to_owned(), vec![gateway("eg", &[("route-a", 5)])]),
    )
    .await;
    let server = Server::start(dir.path(), &["--xds-server", &plane.addr.to_string()]);
    until_metric(&server, REJECTED, 1.0).await;
    let nack = reply(&plane, |r| r.error_detail.is_some()).await;
    let detail = nack.error_detail.expect("error_detail").message;
    assert!(detail.contains("duplicate domain 'eg'"), "{detail}");
    let mut client = server.client().await;
    assert_eq!(
        codes(&mut client, "route-a", 2).await,
        [OK, OVER],
        "the file's limit of 1"
    );
}

/// `serve --xds-server`: a replica is unready (`/readyz` 503 with the
/// reason, `/healthcheck` 500, gRPC health NOT_SERVING) until
/// the control plane's first configuration is installed, since until then
/// its xDS domains would be answered by the policy file's rules; then ready,
/// and still ready once the control plane is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_unready_until_the_first_xds_configuration_is_installed() {
    let port = common::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &["--xds-server", &addr.to_string(), "--xds-node-id", "n1"],
    );
    // No control plane yet: the replica serves but is not ready.
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("xDS control plane"), "{body}");
    let (status, _) = server.http("GET", "/healthcheck", "");
    assert_eq!(status, 500, "/healthcheck follows readiness");
    assert_eq!(server.grpc_health(RLS).await, 2, "NOT_SERVING");

    let plane =
        ControlPlane::start(addr, ("v1".to_owned(), vec![gateway("eg", &[("r", 2)])])).await;
    until_metric(&server, ACCEPTED, 1.0).await;
    let ready = common::wait_until(Duration::from_secs(5), || {
        server.http("GET", "/readyz", "").0 == 200
    });
    assert!(
        ready.is_some(),
        "ready once the first configuration is in force"
    );
    // The gRPC health follows within its 250 ms poll.
    let mut serving = false;
    for _ in 0..40 {
        if server.grpc_health(RLS).await == 1 {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(serving, "the gRPC health says SERVING once ready");
    let mut client = server.client().await;
    assert_eq!(codes(&mut client, "r", 3).await, [OK, OK, OVER]);

    // The control plane goes away: the configuration in force stays, and
    // so does readiness (only the first configuration is awaited), through
    // the failed reconnections that follow (the first backoff is 500 ms).
    assert_eq!(metric(&server, "divvy_xds_stream_up"), 1.0);
    plane.kill();
    until_stream_down(&server).await;
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        tokio::time::sleep(wait).await;
        let (status, body) = server.http("GET", "/readyz", "");
        assert_eq!(status, 200, "still ready without the control plane: {body}");
        assert_eq!(server.grpc_health(RLS).await, 1, "still SERVING");
        let answered = codes(&mut client, "r", 1).await;
        assert_eq!(answered, [OVER], "its limits still hold");
    }
}
