//! Every setting of a running service, resolved: the command line and the
//! environment (divvy's and envoyproxy/ratelimit's) are read in `cli/` only
//! and mapped into one [`Settings`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::DeniedBody;
use crate::limiter::envoy::EnvoySettings;
use crate::observe::statsd::StatsdConfig;
use crate::server::admin::auth::Tokens;
use crate::server::headers::HeaderStyle;
use crate::server::tls::TlsFiles;
use crate::sources::xds::XdsOptions;
use crate::sources::zookeeper::ZkOptions;
use crate::store::failover::FailurePolicy;
use crate::store::redis_tls::RedisTls;
use crate::store::redis_url::RedisTarget;

/// What `divvy serve` (and `ratelimit` mode) runs with; each field is one
/// flag or variable, its default that of the command line.
/// (No `Debug`: it holds the admin tokens.)
#[derive(Clone)]
pub struct Settings {
    /// This process among the replicas (`host:pid`): who set a knob, who
    /// holds a lease, whose RLQS shares.
    pub replica: String,
    /// The policy file or directory (`None`: no policy; xDS domains alone).
    pub config: Option<PathBuf>,
    /// A policy directory with no file yet starts the service with no
    /// configuration, loaded once files appear (ratelimit mode, as
    /// envoyproxy/ratelimit starts); otherwise it stops the start.
    pub config_may_start_empty: bool,
    /// Watch the policy file for changes (SIGHUP reloads it either way).
    pub watch: bool,
    /// The Envoy RateLimitService's (gRPC) address.
    pub grpc_addr: SocketAddr,
    /// The divvy line protocol's address.
    pub line_addr: SocketAddr,
    /// The HTTP admin API's address.
    pub http_addr: SocketAddr,
    /// TLS on the gRPC port.
    pub grpc_tls: Option<TlsFiles>,
    /// TLS (HTTPS) on the admin port.
    pub http_tls: Option<TlsFiles>,
    /// Longest line-protocol request, in bytes.
    pub line_max_bytes: usize,
    /// Most pipelined line-protocol requests decided together per connection.
    pub line_max_batch: usize,
    /// Most line-protocol connections open at once.
    pub line_max_connections: usize,
    /// A line-protocol connection that sends nothing for this long is closed.
    pub line_idle: Duration,
    /// Most concurrent gRPC streams per HTTP/2 connection.
    pub grpc_max_concurrent_streams: u32,
    /// Largest gRPC request message, in bytes.
    pub grpc_max_request_bytes: usize,
    /// A gRPC connection whose peer sends nothing for this long is closed.
    pub grpc_idle: Duration,
    /// HTTP/2 PING interval (`None`: never).
    pub grpc_keepalive: Option<Duration>,
    /// GOAWAY at this age, ±10% per connection (`None`: never).
    pub grpc_max_connection_age: Option<Duration>,
    /// After that GOAWAY, how long calls in flight may take (`None`: no limit).
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// Rate-limit headers for Envoy to add.
    pub rate_limit_headers: HeaderStyle,
    /// The body of a denial (a denying rule's `deniedBody` overrides it).
    pub denied_body: DeniedBody,
    /// envoyproxy/ratelimit's settings for the domains its files define.
    pub envoy: EnvoySettings,
    /// Kept back from a caller's timeout to decide and answer.
    pub deadline_margin: Duration,
    /// The memory the process must stay under (`None`: the cgroup's limit,
    /// if any; `Some(0)`: none).
    pub memory_limit: Option<u64>,
    /// Most live counters in the memory store (before the memory budget).
    pub max_counters: usize,
    /// How often the memory store reclaims expired counters.
    pub sweep: Duration,
    /// Counters known to be over their limit cached in front of Redis (0: off).
    pub over_limit_cache: usize,
    /// The counters' Redis (`None`: the embedded memory store), password included.
    pub redis: Option<RedisTarget>,
    /// TLS files for Redis (the counters' and the global store's).
    pub redis_tls: RedisTls,
    /// Longest wait for one Redis command.
    pub redis_timeout: Duration,
    /// Batched script calls out at once on one Redis server.
    pub redis_batches_in_flight: usize,
    /// Failed store calls in a row that open the circuit breaker.
    pub breaker_failures: u32,
    /// What requests get while Redis fails.
    pub on_store_failure: FailurePolicy,
    /// With `local`, the share of each limit a replica grants alone.
    pub local_share: f64,
    /// Unready while the counter store fails.
    pub ready_requires_store: bool,
    /// Serve gRPC reflection on the gRPC port.
    pub grpc_reflection: bool,
    /// `/healthcheck` fails until a configuration is loaded.
    pub healthy_needs_config: bool,
    /// Serve nothing until the xDS control plane's first configuration.
    pub wait_for_xds: bool,
    /// Unready until the xDS control plane's first configuration is
    /// installed (`serve --xds`; ratelimit mode's health follows
    /// envoyproxy/ratelimit's instead).
    pub ready_awaits_xds: bool,
    /// Between a shutdown signal (unready) and closing the listeners.
    pub shutdown_delay: Duration,
    /// Path of the Prometheus metrics (also served at /metrics).
    pub metrics_path: String,
    /// The admin and read tokens.
    pub tokens: Tokens,
    /// Where divvy's metrics also go, if anywhere.
    pub statsd: Option<StatsdConfig>,
    /// envoyproxy/ratelimit's metric names served at this address and path.
    pub ratelimit_prometheus: Option<(String, String)>,
    /// statsd_exporter mappings for those names (`PROMETHEUS_MAPPER_YAML`).
    pub ratelimit_mapper: Option<String>,
    /// Aux rules from ZooKeeper.
    pub zookeeper: Option<ZkOptions>,
    /// envoyproxy/ratelimit domains from an xDS control plane.
    pub xds: Option<XdsOptions>,
    /// The Prometheus governors query when the policy names none.
    pub prometheus_url: Option<String>,
    /// This deployment's region, for `scope: global` limits.
    pub region: String,
    /// The global store coordinating `scope: global` limits (`None`: local buckets).
    pub global: Option<RedisTarget>,
    /// How long a region's lease of a global limit lasts.
    pub global_lease: Duration,
    /// The share of its last lease a region keeps while the global store fails.
    pub global_fallback_share: f64,
    /// How long after its last lease lapses a region keeps that share
    /// (then the floor); the global store holds it back for as long.
    pub global_fallback: Duration,
    /// The smallest share of a global limit a region with demand gets.
    pub global_floor: f64,
    /// `assignment_time_to_live` of RLQS assignments.
    pub rlqs_assignment_ttl: Duration,
    /// Most buckets one RLQS stream may report.
    pub rlqs_max_buckets_per_stream: usize,
    /// `--record`: the file every request is recorded to, if any.
    pub record: Option<PathBuf>,
    /// `--record-max-bytes`: the size past which that file is rotated.
    pub record_max_bytes: u64,
    /// OTLP tracing (`None`: off, and no tracing work per request).
    pub otlp: Option<crate::observe::tracing_otlp::OtlpSettings>,
}

impl Default for Settings {
    /// The command line's defaults.
    fn default() -> Settings {
        let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
        Settings {
            replica: format!("localhost:{}", std::process::id()),
            config: None,
            config_may_start_empty: false,
            watch: true,
            grpc_addr: any(8081),
            line_addr: any(8321),
            http_addr: any(8080),
            grpc_tls: None,
            http_tls: None,
            line_max_bytes: 16 * 1024,
            line_max_batch: 256,
            line_max_connections: 10_000,
            line_idle: Duration::from_secs(600),
            grpc_max_concurrent_streams: 1024,
            grpc_max_request_bytes: 1024 * 1024,
            grpc_idle: Duration::from_secs(3600),
            grpc_keepalive: None,
            grpc_max_connection_age: None,
            grpc_max_connection_age_grace: Some(Duration::from_secs(30)),
            rate_limit_headers: HeaderStyle::None,
            denied_body: DeniedBody::None,
            envoy: EnvoySettings::default(),
            deadline_margin: crate::server::deadline::DEFAULT_MARGIN,
            memory_limit: None,
            max_counters: 13_000_000,
            sweep: Duration::from_secs(5),
            over_limit_cache: 10_000,
            redis: None,
            redis_tls: RedisTls::default(),
            redis_timeout: Duration::from_millis(100),
            redis_batches_in_flight: crate::store::redis::DEFAULT_BATCHES_IN_FLIGHT,
            breaker_failures: crate::store::breaker::DEFAULT_THRESHOLD,
            on_store_failure: FailurePolicy::Local,
            local_share: 0.5,
            ready_requires_store: false,
            grpc_reflection: false,
            healthy_needs_config: false,
            wait_for_xds: false,
            ready_awaits_xds: false,
            shutdown_delay: Duration::ZERO,
            metrics_path: "/metrics".into(),
            tokens: Tokens::default(),
            statsd: None,
            ratelimit_prometheus: None,
            ratelimit_mapper: None,
            zookeeper: None,
            xds: None,
            prometheus_url: None,
            region: "default".into(),
            global: None,
            global_lease: Duration::from_millis(2000),
            global_fallback_share: 0.5,
            global_fallback: Duration::from_millis(2000),
            global_floor: 0.01,
            rlqs_assignment_ttl: Duration::from_secs(15),
            rlqs_max_buckets_per_stream: 1000,
            record: None,
            record_max_bytes: crate::observe::traffic::DEFAULT_MAX_BYTES,
            otlp: None,
        }
    }
}
