//! `ratelimit` mode: the binary started as envoyproxy/ratelimit's
//! `/bin/ratelimit`, configured by that project's environment only, here
//! as Envoy Gateway starts it (xDS from a control plane, memory store,
//! Prometheus names on their own port).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::xds::ControlPlane;
use common::{desc, free_port, http_request, request, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as RateLimitDescriptorV3;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::Channel;

fn gateway_config() -> RateLimitConfig {
    RateLimitConfig {
        name: "default/eg/http".to_owned(),
        domain: "default/eg/http".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: "default/ratelimit-all-ips/rule/0/match/0".to_owned(),
            value: "default/ratelimit-all-ips/rule/0/match/0".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                key: "masked_remote_address".to_owned(),
                value: "0.0.0.0/0".to_owned(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: 2,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_ratelimit_with_envoy_gateways_environment() {
    let dir = tempfile::tempdir().unwrap();
    let xds_port = free_port();
    let prometheus = format!("127.0.0.1:{}", free_port());
    let command = gateway_command(dir.path(), xds_port, &prometheus);
    let server = Server::spawn(command);
    let mut client = server.client().await;
    let domain = "default/eg/http";
    let ask = || {
        let mut d = desc(&[
            (
                "default/ratelimit-all-ips/rule/0/match/0",
                "default/ratelimit-all-ips/rule/0/match/0",
            ),
            ("masked_remote_address", "0.0.0.0/0"),
        ]);
        d.hits_addend = None;
        request(domain, vec![d])
    };

    // Before any configuration: envoyproxy/ratelimit's error.
    let err = client
        .should_rate_limit(ask())
        .await
        .expect_err("no config yet");
    assert_eq!(err.code(), tonic::Code::Unknown);
    assert_eq!(err.message(), "no rate limit configuration loaded");
    assert_eq!(
        server.http("GET", "/healthcheck", "").0,
        500,
        "unhealthy without config"
    );
    // It cannot answer yet, so it is not ready either.
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("no rate-limit configuration loaded"),
        "{body}"
    );

    // The control plane comes up: its configuration applies.
    let addr: SocketAddr = format!("127.0.0.1:{xds_port}").parse().unwrap();
    let _plane = ControlPlane::start(addr, ("1".to_owned(), vec![gateway_config()])).await;
    let start = Instant::now();
    let first = loop {
        match client.should_rate_limit(ask()).await {
            Ok(r) => break r.into_inner(),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no configuration after 10 s: {e}"),
        }
    };
    let second = client.should_rate_limit(ask()).await.unwrap().into_inner();
    let third = client.should_rate_limit(ask()).await.unwrap().into_inner();
    let codes = [first.overall_code, second.overall_code, third.overall_code];
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over]);
    assert_eq!(server.http("GET", "/healthcheck", "").0, 200);
    assert_eq!(server.http("GET", "/readyz", "").0, 200);

    prometheus_names(&prometheus, domain);
}

/// The binary as envoyproxy/ratelimit, with the environment Envoy Gateway
/// gives it: rules over xDS (SotW) from `xds_port`, Prometheus metrics on
/// `prometheus`, healthy once a configuration is loaded.
fn gateway_command(dir: &Path, xds_port: u16, prometheus: &str) -> Command {
    let mut command = common::as_ratelimit(dir);
    command.envs([
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            &format!("127.0.0.1:{xds_port}"),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "200ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "400ms"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", prometheus),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
    ]);
    command
}

/// envoyproxy/ratelimit's metric names on PROMETHEUS_ADDR (`prometheus`)
/// after the three calls in `domain` and the one refused before any
/// configuration.
fn prometheus_names(prometheus: &str, domain: &str) {
    let (status, text) = http_request(prometheus.parse().unwrap(), "GET", "/metrics", "", None);
    assert_eq!(status, 200);
    let key1 = "default/ratelimit-all-ips/rule/0/match/0_default/ratelimit-all-ips/rule/0/match/0";
    let line = format!(
        "ratelimit_service_rate_limit_over_limit{{domain=\"{domain}\",key1=\"{key1}\",key2=\"masked_remote_address_0_0_0_0/0\"}} 1"
    );
    assert!(text.contains(&line), "{line} not in:\n{text}");
    assert!(
        text.contains("ratelimit_service_config_load_success 1"),
        "{text}"
    );
    // The calls, counted and timed as the default mapping names them (the
    // three answered calls; the one refused before any config is too).
    let calls = "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}";
    assert!(text.contains(calls), "{text}");
    let timed = "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}";
    assert!(text.contains(timed), "{text}");
}

/// Without HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, envoyproxy/ratelimit's
/// `/healthcheck` is OK before any configuration; `/readyz` is not, since
/// every call would be answered with an error, as `POST /json` is too.
#[test]
fn before_any_config_health_is_ok_readiness_is_not_and_json_errs() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::as_ratelimit(dir.path());
    command.envs([
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            &format!("127.0.0.1:{}", free_port()),
        ),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ]);
    command.envs(common::RATELIMIT_ON_LOOPBACK);
    let server = Server::spawn(command);
    assert_eq!(server.http("GET", "/healthcheck", "").0, 200);
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    // POST /json answers as ShouldRateLimit does: the same error.
    let request = r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}"#;
    let (status, body) = server.http("POST", "/json", request);
    assert_ne!(status, 200, "{body}");
    assert!(
        body.contains("no rate limit configuration loaded"),
        "{body}"
    );
}

#[test]
fn a_setting_divvy_cannot_honour_stops_the_start_naming_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::as_ratelimit(dir.path());
    let out = command
        .env("BACKEND_TYPE", "memcache")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("BACKEND_TYPE=memcache"), "{stderr}");
}

/// `PROMETHEUS_MAPPER_YAML`: the series on `PROMETHEUS_ADDR` take the
/// names and labels of a custom statsd_exporter mapping (a glob, a regex,
/// a drop, the calls' counter and response-time histogram); a file that is
/// no mapping stops the start naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_mapper_yaml_renames_the_series() {
    let dir = tempfile::tempdir().unwrap();
    let root = one_an_hour(dir.path());
    let mapper = dir.path().join("mapper.yaml");
    std::fs::write(
        &mapper,
        r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.*"
    name: "team_ratelimit_${3}"
    labels: {app_domain: "$1", descriptor: "$2"}
  - match: "ratelimit_server.*.total_requests"
    name: "team_calls"
    labels: {method: "$1"}
  - match: "ratelimit_server.*.response_time"
    match_metric_type: observer
    name: "team_call_seconds"
  - match: "ratelimit\\.service\\.config_load_(.*)"
    match_type: regex
    action: drop
"#,
    )
    .unwrap();
    let prometheus = format!("127.0.0.1:{}", free_port());
    let env = |command: &mut std::process::Command| {
        command.envs(common::RATELIMIT_ON_LOOPBACK).envs([
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
        ]);
    };
    let mut command = common::as_ratelimit(dir.path());
    env(&mut command);
    command.env("PROMETHEUS_MAPPER_YAML", &mapper);
    let server = Server::spawn(command);
    let mut client = server.client().await;
    for _ in 0..3 {
        let ask = request("api", vec![desc(&[("user", "ann")])]);
        client.should_rate_limit(ask).await.expect("answer");
    }
    let (status, text) = http_request(prometheus.parse().unwrap(), "GET", "/metrics", "", None);
    assert_eq!(status, 200);
    for line in [
        "team_ratelimit_over_limit{app_domain=\"api\",descriptor=\"user\"} 2",
        "team_ratelimit_total_hits{app_domain=\"api\",descriptor=\"user\"} 3",
        "team_calls{method=\"ShouldRateLimit\"} 3",
        "team_call_seconds_count 3",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    assert!(
        text.contains("team_call_seconds_bucket{le=\"+Inf\"} 3"),
        "{text}"
    );
    // The default names are gone, and so are the dropped config loads.
    assert!(!text.contains("ratelimit_service_rate_limit_"), "{text}");
    assert!(!text.contains("config_load"), "{text}");
    drop(server);

    // A file that is no mapping: the start stops, naming the variable.
    std::fs::write(&mapper, "mappings: [{match: 'a.*', colour: red}]").unwrap();
    let again = dir.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    let mut command = common::as_ratelimit(&again);
    env(&mut command);
    let out = command
        .env("PROMETHEUS_MAPPER_YAML", &mapper)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PROMETHEUS_MAPPER_YAML="), "{stderr}");
    assert!(stderr.contains("unknown field"), "{stderr}");
}

/// A policy directory for `RUNTIME_ROOT`: domain `api`, `user` at 1 an hour.
fn one_an_hour(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    root
}

/// `ratelimit` mode on the policy under `root` with `envs` added; `dir`
/// holds the binary's link (one per process) and is its working directory.
fn ratelimit_with(dir: &Path, root: &Path, envs: &[(&str, &str)]) -> Server {
    std::fs::create_dir_all(dir).unwrap();
    let mut command = common::as_ratelimit(dir);
    command
        .current_dir(dir)
        .envs(common::RATELIMIT_ON_LOOPBACK)
        .envs([
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ])
        .envs(envs.iter().copied());
    Server::spawn(command)
}

/// The overall code and each descriptor's code for `descriptors` in `api`.
async fn codes(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptorV3>,
) -> (Code, Vec<i32>) {
    let r = client
        .should_rate_limit(request("api", descriptors))
        .await
        .expect("answer")
        .into_inner();
    let each = r.statuses.iter().map(|s| s.code).collect();
    (Code::try_from(r.overall_code).unwrap(), each)
}

/// `QUOTA_MODE`: every descriptor is a quota descriptor, so a request is
/// over only when all of its descriptors are, and one without a limit
/// counts as within its quota (envoyproxy/ratelimit's `service/ratelimit.go`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_is_over_only_when_every_descriptor_is() {
    let dir = tempfile::tempdir().unwrap();
    let root = one_an_hour(dir.path());
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    for (quota_mode, with_no_limit) in [("true", Code::Ok), ("false", Code::OverLimit)] {
        let link = dir.path().join(format!("quota-mode-{quota_mode}"));
        let server = ratelimit_with(&link, &root, &[("QUOTA_MODE", quota_mode)]);
        let mut client = server.client().await;
        let ann_bob = || vec![desc(&[("user", "ann")]), desc(&[("user", "bob")])];
        assert_eq!(
            codes(&mut client, ann_bob()).await,
            (Code::Ok, vec![ok, ok])
        );
        assert_eq!(
            codes(&mut client, ann_bob()).await,
            (Code::OverLimit, vec![over, over]),
            "QUOTA_MODE={quota_mode}: both over"
        );
        let ann_other = vec![desc(&[("user", "ann")]), desc(&[("other", "x")])];
        assert_eq!(
            codes(&mut client, ann_other).await,
            (with_no_limit, vec![over, ok]),
            "QUOTA_MODE={quota_mode}: one over, one without a limit"
        );
    }
}

/// One call for `user=ann` in `api`: the overall code and what remains.
async fn ann(server: &Server) -> (Code, u32) {
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("api", vec![desc(&[("user", "ann")])]))
        .await
        .expect("answer")
        .into_inner();
    (
        Code::try_from(r.overall_code).unwrap(),
        r.statuses[0].limit_remaining,
    )
}

/// `CACHE_KEY_PREFIX` starts every counter key: deployments on one Redis
/// with different prefixes count apart, with the same prefix together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_key_prefix_keeps_deployments_apart_on_one_redis() {
    let redis = common::redis::Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let root = one_an_hour(dir.path());
    let address = format!("127.0.0.1:{}", redis.port);
    let start = |name: &str, prefix: &str| {
        let env = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", address.as_str()),
            ("CACHE_KEY_PREFIX", prefix),
        ];
        ratelimit_with(&dir.path().join(name), &root, &env)
    };
    let team_a = start("a", "team-a:");
    assert_eq!(ann(&team_a).await, (Code::Ok, 0));
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(
        keys.lines().any(|k| k.starts_with("team-a:divvy-rl:api")),
        "no key with the prefix in {keys:?}"
    );
    let team_b = start("b", "team-b:");
    assert_eq!(ann(&team_b).await, (Code::Ok, 0), "team-b counts apart");
    let team_a_again = start("a-again", "team-a:");
    assert_eq!(
        ann(&team_a_again).await,
        (Code::OverLimit, 0),
        "the same prefix shares the counter"
    );
}

/// envoyproxy/ratelimit's deploy: `RUNTIME_ROOT` is a symlink swapped to a
/// new directory. The swap is noticed without a signal, and so is an edit
/// in the new directory afterwards (the watch follows the swap). The root
/// is given relative to the working directory, as a link one level deep.
#[test]
fn a_swap_of_the_runtime_root_symlink_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let version = |name: &str, per_hour: u32| {
        let config = dir.path().join(name).join("ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        let yaml = format!(
            "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {per_hour}}}\n"
        );
        let tmp = config.join(".api.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, config.join("api.yaml")).unwrap();
    };
    let current = dir.path().join("current");
    version("v1", 1);
    std::os::unix::fs::symlink("v1", &current).unwrap();
    // A relative RUNTIME_ROOT, from the working directory.
    let server = ratelimit_with(dir.path(), Path::new("current"), &[]);
    let limit_becomes = |per_hour: u32| {
        let want = format!("api.user: unit=HOUR requests_per_unit={per_hour},");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, text) = server.http("GET", "/rlconfig", "");
            if text.contains(&want) {
                return;
            }
            assert!(Instant::now() < deadline, "no `{want}` in:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    limit_becomes(1);
    // Past the second look at the files a start takes (debounced, at most 1 s).
    std::thread::sleep(Duration::from_millis(1500));
    version("v2", 5);
    let next = dir.path().join("current.next");
    std::os::unix::fs::symlink("v2", &next).unwrap();
    std::fs::rename(&next, &current).unwrap();
    limit_becomes(5);
    version("v2", 7);
    limit_becomes(7);
}

/// A configuration directory with no file yet (an empty ConfigMap) starts
/// the service, as envoyproxy/ratelimit starts, instead of stopping it:
/// unready, calls answered with their "no rate limit configuration loaded",
/// until a file appears and is loaded without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_configuration_directory_waits_for_its_first_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let server = ratelimit_with(&dir.path().join("bin"), &root, &[]);
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    let mut client = server.client().await;
    let ask = || request("api", vec![desc(&[("user", "ann")])]);
    let err = client
        .should_rate_limit(ask())
        .await
        .expect_err("no configuration yet");
    assert!(
        err.message().contains("no rate limit configuration loaded"),
        "{err:?}"
    );
    one_an_hour(dir.path());
    let deadline = Instant::now() + Duration::from_secs(15);
    let limit = loop {
        if let Ok(r) = client.should_rate_limit(ask()).await {
            break r.into_inner().statuses[0].current_limit.clone();
        }
        assert!(Instant::now() < deadline, "the new file was not loaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(limit.map(|l| l.requests_per_unit), Some(1));
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
}
