//! `divvy serve`: its flags and the variables they fall back to, mapped
//! into the library's `Settings`; the service itself is `divvy::app::App`,
//! served until SIGTERM or SIGINT.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use divvy::app::{App, Settings};
use divvy::limiter::envoy::EnvoySettings;
use divvy::observe::statsd::StatsdConfig;
use divvy::server::admin::auth::Tokens;
use divvy::server::headers::HeaderStyle;
use divvy::sources::xds::{XdsOptions, XdsTls};
use divvy::sources::zookeeper::ZkOptions;
use divvy::store::failover::FailurePolicy;
use divvy::store::redis_tls::RedisTls;
use divvy::store::redis_url::{parse_redis_url, RedisTarget};
use tracing::info;

use super::ratelimit::RatelimitMode;
use super::tls::TlsArgs;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The policy file or directory (.yaml, .yml, .json or .ini files);
    /// optional with --xds-server (then the control plane's domains alone).
    #[arg(long, env = "DIVVY_CONFIG", required_unless_present = "xds_server")]
    config: Option<PathBuf>,
    /// Worker threads of the async runtime; default one per CPU the process
    /// may use (affinity and cgroup quota). With one, divvy runs on tokio's
    /// single-threaded scheduler.
    #[arg(long, env = "DIVVY_WORKER_THREADS", value_parser = parse_threads)]
    worker_threads: Option<NonZeroUsize>,
    /// Address of the Envoy RateLimitService (gRPC).
    #[arg(long, env = "DIVVY_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the divvy line protocol (TCP). Without it, divvy's `PORT`
    /// variable gives the port on 0.0.0.0; the default is 0.0.0.0:8321.
    #[arg(long, env = "DIVVY_LINE_ADDR")]
    line_addr: Option<SocketAddr>,
    /// Longest accepted line-protocol request, in bytes; longer lines get an ERR.
    #[arg(long, env = "DIVVY_LINE_MAX_BYTES", default_value_t = 16 * 1024)]
    line_max_bytes: usize,
    /// Most pipelined line-protocol requests decided together per connection.
    #[arg(long, env = "DIVVY_LINE_MAX_BATCH", default_value_t = 256)]
    line_max_batch: usize,
    /// Most concurrent gRPC streams (requests in flight) per HTTP/2 connection.
    #[arg(
        long,
        env = "DIVVY_GRPC_MAX_CONCURRENT_STREAMS",
        default_value_t = 1024
    )]
    grpc_max_concurrent_streams: u32,
    /// Largest gRPC request message, in bytes; larger ones get OUT_OF_RANGE.
    #[arg(long, env = "DIVVY_GRPC_MAX_REQUEST_BYTES", default_value_t = 1024 * 1024)]
    grpc_max_request_bytes: usize,
    /// Close a gRPC connection whose peer sends nothing for this many seconds.
    #[arg(long, env = "DIVVY_GRPC_IDLE_SECONDS", default_value_t = 3600)]
    grpc_idle_seconds: u64,
    /// Send an HTTP/2 PING every this many seconds (0: never); a peer that
    /// does not answer within 20 s is closed.
    #[arg(long, env = "DIVVY_GRPC_KEEPALIVE_SECONDS", default_value_t = 0)]
    grpc_keepalive_seconds: u64,
    /// Send GOAWAY on a gRPC connection once it is this old (each
    /// connection's age ±10%), so that clients reconnect and spread over new
    /// replicas: `500ms`, `30s`, `5m`, `24h`; 0: never.
    #[arg(long, env = "DIVVY_GRPC_MAX_CONNECTION_AGE", default_value = "0",
          value_parser = divvy::server::connections::parse_flag)]
    grpc_max_connection_age: Duration,
    /// After the GOAWAY of --grpc-max-connection-age, the time calls in
    /// flight have to finish before the connection is closed; 0: no limit.
    #[arg(long, env = "DIVVY_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "30s",
          value_parser = divvy::server::connections::parse_flag)]
    grpc_max_connection_age_grace: Duration,
    /// Most line-protocol connections open at once; one more gets an `ERR`
    /// line and is closed.
    #[arg(long, env = "DIVVY_LINE_MAX_CONNECTIONS", default_value_t = 10_000)]
    line_max_connections: usize,
    /// Most live counters in the memory store; when full, the least
    /// recently used are evicted (about 0.9 GiB at 74 bytes a counter).
    /// Under a memory limit, the lesser of this and what the limit holds.
    #[arg(long, env = "DIVVY_MAX_COUNTERS", default_value_t = 13_000_000)]
    max_counters: usize,
    /// The memory the process must stay under (`268435456`, `256Mi`, `1G`):
    /// the counters and the other bounded structures are sized to fit it,
    /// less a headroom for the process itself. Default: the cgroup's memory
    /// limit, if any; `0`: none.
    #[arg(long, env = "DIVVY_MEMORY_LIMIT", value_parser = parse_memory_limit)]
    memory_limit: Option<u64>,
    /// Counters known to be over their limit kept in a local cache (LRU) in
    /// front of Redis, each answered locally until the reset Redis returned
    /// (windows and fixed windows; 0: off).
    #[arg(long, env = "DIVVY_OVER_LIMIT_CACHE", default_value_t = 10_000)]
    over_limit_cache: usize,
    /// Close a line-protocol connection that sends nothing for this many seconds.
    #[arg(long, env = "DIVVY_LINE_IDLE_SECONDS", default_value_t = 600)]
    line_idle_seconds: u64,
    /// Keep counters in Redis, shared by every replica: redis://[user:pass@]host:port[/db],
    /// rediss://..., redis+cluster://host:port[,host:port...] or
    /// redis+sentinel://host:port[,host:port...]/master-name. Without it (and
    /// without divvy's REDIS_HOST), counters live in the embedded memory store.
    #[arg(long, env = "DIVVY_REDIS_URL")]
    redis_url: Option<String>,
    /// Use TLS to the counters' Redis even when --redis-url (or REDIS_HOST)
    /// does not say `rediss://`; envoyproxy/ratelimit's REDIS_TLS does the same.
    #[arg(long, env = "DIVVY_REDIS_TLS")]
    redis_tls: bool,
    /// PEM file of the certificate authorities that sign Redis's certificate
    /// (also REDIS_TLS_CACERT); without it, the system's trust store.
    #[arg(long, env = "DIVVY_REDIS_TLS_CA")]
    redis_tls_ca: Option<PathBuf>,
    /// PEM file of a client certificate for Redis (`tls-auth-clients yes`),
    /// with --redis-tls-key (also REDIS_TLS_CLIENT_CERT).
    #[arg(long, env = "DIVVY_REDIS_TLS_CERT")]
    redis_tls_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (also REDIS_TLS_CLIENT_KEY).
    #[arg(long, env = "DIVVY_REDIS_TLS_KEY")]
    redis_tls_key: Option<PathBuf>,
    /// Accept a Redis certificate that does not name the host connected to;
    /// its chain is still verified (also REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
    #[arg(long, env = "DIVVY_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    redis_tls_skip_hostname_verification: bool,
    /// Longest wait for one Redis command, in milliseconds; also how long a
    /// request without a deadline of its own (the line protocol) waits for
    /// Redis before the failure policy decides it.
    #[arg(long, env = "DIVVY_REDIS_TIMEOUT_MS", default_value_t = 100)]
    redis_timeout_ms: u64,
    /// Kept back from a caller's timeout (gRPC's `grpc-timeout`, Envoy's
    /// `x-envoy-expected-rq-timeout-ms`) to decide and answer, in
    /// milliseconds: the store is waited for until the timeout less this
    /// (half the timeout when it is shorter than twice this), then the
    /// failure policy decides.
    #[arg(long, env = "DIVVY_DEADLINE_MARGIN_MS", default_value_t = 5)]
    deadline_margin_ms: u64,
    /// Failed counter-store calls in a row that open the circuit breaker
    /// (an error, a timeout, a missed deadline or an abandoned call).
    #[arg(
        long,
        env = "DIVVY_BREAKER_FAILURES",
        default_value_t = divvy::store::breaker::DEFAULT_THRESHOLD,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    breaker_failures: u32,
    /// Most batched counter-script calls out at once on a single Redis
    /// server or Sentinel master (1 to 64). Requests waiting meanwhile share
    /// the next call: 1 (the default) makes calls largest and cheapest for
    /// Redis; a larger number lowers latency when Redis is far away.
    #[arg(
        long,
        env = "DIVVY_REDIS_BATCHES_IN_FLIGHT",
        default_value_t = divvy::store::redis::DEFAULT_BATCHES_IN_FLIGHT as u64,
        value_parser = clap::value_parser!(u64).range(1..=divvy::store::redis::MAX_BATCHES_IN_FLIGHT as u64)
    )]
    redis_batches_in_flight: u64,
    /// What requests get while Redis is failing: allow (fail open), deny
    /// (fail closed) or local (the embedded store with a share of each limit).
    #[arg(
        long,
        env = "DIVVY_ON_STORE_FAILURE",
        value_enum,
        default_value = "local"
    )]
    on_store_failure: FailurePolicy,
    /// With --on-store-failure local, the share of each limit a replica may
    /// grant on its own while Redis is failing.
    #[arg(long, env = "DIVVY_LOCAL_SHARE", default_value_t = 0.5)]
    local_share: f64,
    /// Address of the HTTP admin API (health, metrics, config, explain, /json).
    /// Without it, divvy's `HTTP_SERVICE_PORT` gives the port on 0.0.0.0; the
    /// default is 0.0.0.0:8080.
    #[arg(long, env = "DIVVY_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Path of the Prometheus metrics (also served at /metrics).
    #[arg(long, env = "PROMETHEUS_METRICS_PATH", default_value = "/metrics")]
    metrics_path: String,
    /// statsd host; with --statsd-port, divvy's metrics also go to statsd.
    #[arg(long, env = "STATSD_HOST")]
    statsd_host: Option<String>,
    /// statsd port.
    #[arg(long, env = "STATSD_PORT")]
    statsd_port: Option<u16>,
    /// Prepended to every statsd name as is (e.g. `divvy.`).
    #[arg(long, env = "STATSD_PREFIX", default_value = "")]
    statsd_prefix: String,
    /// Any non-empty value sends statsd over TCP instead of UDP.
    #[arg(long, env = "STATSD_USE_TCP")]
    statsd_use_tcp: Option<String>,
    /// Rate-limit headers for Envoy to add to responses: none, draft
    /// (RateLimit, RateLimit-Policy) or legacy (X-RateLimit-*); Retry-After on denial.
    #[arg(
        long,
        env = "DIVVY_RATE_LIMIT_HEADERS",
        value_enum,
        default_value = "none"
    )]
    rate_limit_headers: HeaderStyle,
    /// Make /readyz (and the gRPC health of the rate-limit service) fail
    /// while the counter store fails. By default a replica whose failure
    /// policy is deciding stays ready: it still answers every request.
    #[arg(long, env = "DIVVY_READY_REQUIRES_STORE")]
    ready_requires_store: bool,
    /// Accepted so that deployments that set it keep starting; it changes
    /// nothing (a replica stays ready while the store fails unless
    /// --ready-requires-store).
    #[arg(long, env = "DIVVY_READY_WITHOUT_STORE", hide = true)]
    ready_without_store: bool,
    /// Seconds between SIGTERM (readiness turns false) and closing the
    /// listeners, so load balancers stop sending first.
    #[arg(long, env = "DIVVY_SHUTDOWN_DELAY_SECONDS", default_value_t = 0)]
    shutdown_delay_seconds: u64,
    /// Log format on stderr.
    #[arg(long, env = "DIVVY_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Do not watch the policy file for changes (SIGHUP still reloads it).
    #[arg(long, env = "DIVVY_NO_WATCH")]
    no_watch: bool,
    /// How often expired counters are reclaimed from the memory store, in seconds.
    #[arg(long, env = "DIVVY_SWEEP_SECONDS", default_value_t = 5)]
    sweep_seconds: u64,
    /// The token that knob changes (`PUT`/`DELETE /knobs/...`) must carry as
    /// `Authorization: Bearer <token>`; without it, knob changes are refused.
    #[arg(long, env = "DIVVY_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// With it, every admin endpoint but /healthz, /readyz, /healthcheck and
    /// the metrics path needs `Authorization: Bearer <token>` with this token
    /// or the admin token; this one can not change knobs. Without it, reads
    /// are open.
    #[arg(long, env = "DIVVY_ADMIN_READ_TOKEN", hide_env_values = true)]
    admin_read_token: Option<String>,
    /// The Prometheus that governors query when the policy names none
    /// (`http://host:port`).
    #[arg(long, env = "PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// Read extra rules from a ZooKeeper node and put them ahead of the
    /// policy file's (foxpass's divvy fork): `true` or `false`.
    #[arg(
        long,
        env = "ZK_ENABLED_FOR_AUX_RULES",
        default_value_t = false,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    zk_enabled_for_aux_rules: bool,
    /// ZooKeeper servers for the aux rules, `host:port[,host:port...]`.
    #[arg(long, env = "ZK_HOSTS_FOR_AUX_RULES", default_value = "localhost:2199")]
    zk_hosts_for_aux_rules: String,
    /// The ZooKeeper node holding the aux rules (a JSON array of divvy rules).
    #[arg(long, env = "ZK_AUX_RULES_PATH", default_value = "/ratelimiter/rules")]
    zk_aux_rules_path: String,
    /// This deployment's region, for `scope: global` limits.
    #[arg(long, env = "DIVVY_REGION", default_value = "default")]
    region: String,
    /// The global store coordinating `scope: global` limits across regions
    /// (the --redis-url forms); never on the request path. Without it, a
    /// global limit is counted as a local token bucket.
    #[arg(long, env = "DIVVY_GLOBAL_URL")]
    global_url: Option<String>,
    /// How long a region's lease of a global limit lasts, in milliseconds.
    #[arg(long, env = "DIVVY_GLOBAL_LEASE_MS", default_value_t = 2000)]
    global_lease_ms: u64,
    /// The share of its last lease a region keeps while the global store fails.
    #[arg(long, env = "DIVVY_GLOBAL_FALLBACK_SHARE", default_value_t = 0.5)]
    global_fallback_share: f64,
    /// The smallest share of a global limit a region with demand gets (a fraction of the limit).
    #[arg(long, env = "DIVVY_GLOBAL_FLOOR", default_value_t = 0.01)]
    global_floor: f64,
    /// `assignment_time_to_live` of the Rate Limit Quota Service's
    /// assignments (`15s`, `1m`); renewed as reports arrive and every half TTL.
    #[arg(long, env = "DIVVY_RLQS_ASSIGNMENT_TTL", default_value = "15s", value_parser = parse_wait)]
    rlqs_assignment_ttl: Duration,
    /// Most buckets one Rate Limit Quota Service stream may report; reports
    /// of more are ignored (`divvy_rejected_total{reason="rlqs_too_many_buckets"}`).
    #[arg(
        long,
        env = "DIVVY_RLQS_MAX_BUCKETS_PER_STREAM",
        default_value_t = 1000
    )]
    rlqs_max_buckets_per_stream: usize,
    #[command(flatten)]
    xds: XdsArgs,
    /// envoyproxy/ratelimit's behaviour, when started as `ratelimit`.
    #[arg(skip)]
    ratelimit: Option<RatelimitMode>,
    /// TLS on the gRPC and admin ports.
    #[command(flatten)]
    tls: TlsArgs,
}

impl ServeArgs {
    /// These arguments with `ratelimit` mode's behaviour on.
    pub fn with_ratelimit_mode(mut self, mode: RatelimitMode) -> ServeArgs {
        self.ratelimit = Some(mode);
        self
    }
}

/// envoyproxy/ratelimit domains from an xDS control plane (Envoy Gateway's).
#[derive(clap::Args, Clone)]
pub struct XdsArgs {
    /// The control plane's address (`host:port` or a URL): an ADS stream of
    /// `RateLimitConfig` resources, added to the policy file's domains.
    #[arg(long, env = "DIVVY_XDS_SERVER")]
    pub xds_server: Option<String>,
    /// The node id this service gives the control plane.
    #[arg(long, env = "DIVVY_XDS_NODE_ID", default_value = "divvy")]
    pub xds_node_id: String,
    /// PEM CA bundle for the control plane's certificate (turns TLS on).
    #[arg(long, env = "DIVVY_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS to the control plane (turns TLS on).
    #[arg(long, env = "DIVVY_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert.
    #[arg(long, env = "DIVVY_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// The name the control plane's certificate must carry (default: its host).
    #[arg(long, env = "DIVVY_XDS_TLS_SAN")]
    pub xds_tls_san: Option<String>,
    /// Node metadata for the control plane, `key=value[,key=value...]`.
    #[arg(long, env = "DIVVY_XDS_NODE_METADATA", default_value = "")]
    pub xds_node_metadata: String,
    /// Extra headers on the xDS stream, `key:value[,key:value...]`.
    #[arg(long, env = "DIVVY_XDS_HEADERS", default_value = "")]
    pub xds_headers: String,
    /// First wait before reconnecting to the control plane (`500ms`, `10s`).
    #[arg(long, env = "DIVVY_XDS_BACKOFF_INITIAL", default_value = "500ms", value_parser = parse_wait)]
    pub xds_backoff_initial: Duration,
    /// Longest wait before reconnecting to the control plane.
    #[arg(long, env = "DIVVY_XDS_BACKOFF_MAX", default_value = "30s", value_parser = parse_wait)]
    pub xds_backoff_max: Duration,
}

/// A wait such as `500ms`, `10s` or `1m`.
fn parse_wait(text: &str) -> Result<Duration, String> {
    divvy::config::duration::parse_millis(text)
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a wait such as 500ms, 10s or 1m"))
}

/// `k=v,k2=v2` (or with `sep` `:`) as pairs; items without `sep` are skipped,
/// as envoyproxy/ratelimit skips them.
fn pairs(text: &str, sep: char) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|item| item.split_once(sep))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

impl XdsArgs {
    /// The client's options, when a control plane is set.
    pub fn options(&self) -> Option<XdsOptions> {
        let server = self.xds_server.clone()?;
        let tls_on = self.xds_tls_ca.is_some() || self.xds_tls_cert.is_some();
        Some(XdsOptions {
            server,
            node_id: self.xds_node_id.clone(),
            node_metadata: pairs(&self.xds_node_metadata, '='),
            headers: pairs(&self.xds_headers, ':'),
            tls: tls_on.then(|| XdsTls {
                ca: self.xds_tls_ca.clone(),
                cert: self.xds_tls_cert.clone(),
                key: self.xds_tls_key.clone(),
                san: self.xds_tls_san.clone(),
            }),
            backoff_initial: self.xds_backoff_initial,
            backoff_max: self.xds_backoff_max.max(self.xds_backoff_initial),
        })
    }
}

/// How logs are written.
#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn init_logging(format: LogFormat, level: Option<&str>) {
    // `ratelimit` mode's LOG_LEVEL, in logrus' names.
    let default = match level {
        None => "info",
        Some("panic" | "fatal" | "error") => "error",
        Some("warn" | "warning") => "warn",
        Some("debug") => "debug",
        Some("trace") => "trace",
        Some(_) => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DIVVY_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `--memory-limit`: a size as Kubernetes writes one.
fn parse_memory_limit(text: &str) -> Result<u64, String> {
    divvy::memory_budget::parse_size(text).map_err(|e| e.to_string())
}

/// `--worker-threads`: 1 to [`divvy::runtime::MAX_WORKER_THREADS`].
fn parse_threads(text: &str) -> Result<NonZeroUsize, String> {
    let max = divvy::runtime::MAX_WORKER_THREADS;
    text.parse::<usize>()
        .ok()
        .and_then(NonZeroUsize::new)
        .filter(|n| n.get() <= max)
        .ok_or_else(|| format!("`{text}` is not a thread count from 1 to {max}"))
}

/// `divvy serve`: maps the flags and the environment into [`Settings`],
/// builds the runtime, and serves until a shutdown signal.
pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let level = args.ratelimit.as_ref().map(|m| m.log_level.as_str());
    init_logging(args.log_format, level);
    if args.ready_without_store {
        info!("--ready-without-store (DIVVY_READY_WITHOUT_STORE) changes nothing: a replica stays ready while the store fails unless --ready-requires-store");
    }
    if let Some(mode) = args.ratelimit.as_ref().filter(|m| !m.ignored.is_empty()) {
        info!(variables = ?mode.ignored, "envoyproxy/ratelimit settings accepted and ignored");
    }
    let settings = settings(&args)?;
    let threads = divvy::runtime::worker_threads(args.worker_threads);
    let runtime = divvy::runtime::build(threads)?;
    // What was built, as the runtime reports it.
    info!(
        worker_threads = runtime.handle().metrics().num_workers(),
        scheduler = divvy::runtime::scheduler(runtime.handle()),
        "async runtime"
    );
    let served = runtime.block_on(async move {
        // Take SIGHUP over before anything slow (Redis) so an early one
        // cannot kill the process; the reloader acts on later ones.
        #[cfg(unix)]
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        App::build(settings).await?.serve(shutdown_signal()).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(served?)
}

/// The flags, else the variables they fall back to, as [`Settings`].
fn settings(args: &ServeArgs) -> anyhow::Result<Settings> {
    let redis_tls = redis_tls_settings(args)?;
    let redis = redis_target(args.redis_url.as_deref())?.map(|mut target| {
        target.tls |= redis_tls.forced;
        target
    });
    let global = match args.global_url.as_deref() {
        Some(url) => Some(redis_target(Some(url))?.context("--global-url names no Redis")?),
        None => None,
    };
    let env = |name: &str| std::env::var(name).ok();
    let mode = args.ratelimit.as_ref();
    let secs = |n: u64| Duration::from_secs(n.max(1));
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    Ok(Settings {
        replica: replica(),
        config: args.config.clone(),
        watch: !args.no_watch,
        grpc_addr: args.grpc_addr,
        line_addr: line_addr(args.line_addr)?,
        http_addr: http_addr(args.http_addr)?,
        grpc_tls: args.tls.grpc(&env)?,
        http_tls: args.tls.http()?,
        line_max_bytes: args.line_max_bytes,
        line_max_batch: args.line_max_batch,
        line_max_connections: args.line_max_connections,
        line_idle: secs(args.line_idle_seconds),
        grpc_max_concurrent_streams: args.grpc_max_concurrent_streams,
        grpc_max_request_bytes: args.grpc_max_request_bytes,
        grpc_idle: secs(args.grpc_idle_seconds),
        grpc_keepalive: nonzero(Duration::from_secs(args.grpc_keepalive_seconds)),
        grpc_max_connection_age: nonzero(args.grpc_max_connection_age),
        grpc_max_connection_age_grace: nonzero(args.grpc_max_connection_age_grace),
        rate_limit_headers: args.rate_limit_headers,
        envoy: envoy_settings(args),
        deadline_margin: Duration::from_millis(args.deadline_margin_ms),
        memory_limit: args.memory_limit,
        max_counters: args.max_counters,
        sweep: secs(args.sweep_seconds),
        over_limit_cache: args.over_limit_cache,
        redis,
        redis_tls: redis_tls.files,
        redis_timeout: Duration::from_millis(args.redis_timeout_ms.max(1)),
        redis_batches_in_flight: usize::try_from(args.redis_batches_in_flight)
            .unwrap_or(divvy::store::redis::DEFAULT_BATCHES_IN_FLIGHT),
        breaker_failures: args.breaker_failures,
        on_store_failure: args.on_store_failure,
        local_share: args.local_share,
        ready_requires_store: args.ready_requires_store,
        healthy_needs_config: mode.is_some_and(|m| m.healthy_needs_config),
        wait_for_xds: mode.is_some_and(|m| !m.force_start),
        shutdown_delay: Duration::from_secs(args.shutdown_delay_seconds),
        metrics_path: args.metrics_path.clone(),
        tokens: admin_tokens(args)?,
        statsd: statsd(args),
        ratelimit_prometheus: mode.and_then(|m| m.prometheus.clone()),
        zookeeper: args.zk_enabled_for_aux_rules.then(|| ZkOptions {
            hosts: args.zk_hosts_for_aux_rules.clone(),
            path: args.zk_aux_rules_path.clone(),
        }),
        xds: args.xds.options(),
        prometheus_url: args.prometheus_url.clone(),
        region: args.region.clone(),
        global,
        global_lease: Duration::from_millis(args.global_lease_ms),
        global_fallback_share: args.global_fallback_share,
        global_floor: args.global_floor,
        rlqs_assignment_ttl: args.rlqs_assignment_ttl,
        rlqs_max_buckets_per_stream: args.rlqs_max_buckets_per_stream,
    })
}

/// This process's name among the replicas: `$HOSTNAME:pid` (the pod's
/// name in Kubernetes).
fn replica() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// With `--statsd-host` and `--statsd-port`, metrics also go to statsd.
fn statsd(args: &ServeArgs) -> Option<StatsdConfig> {
    let (host, port) = (args.statsd_host.clone()?, args.statsd_port?);
    Some(StatsdConfig {
        host,
        port,
        prefix: args.statsd_prefix.clone(),
        tcp: args
            .statsd_use_tcp
            .as_deref()
            .is_some_and(|v| !v.is_empty()),
    })
}

/// The admin and read tokens (empty means unset); the same text for both
/// would give the read token write rights, so it is refused.
fn admin_tokens(args: &ServeArgs) -> anyhow::Result<Tokens> {
    let token = |t: &Option<String>| t.clone().filter(|t| !t.is_empty()).map(Arc::from);
    let tokens = Tokens {
        admin: token(&args.admin_token),
        read: token(&args.admin_read_token),
    };
    if tokens.admin.is_some() && tokens.admin == tokens.read {
        bail!("--admin-read-token must differ from --admin-token (the read token must not change knobs)");
    }
    Ok(tokens)
}

/// envoyproxy/ratelimit's settings from the environment, read once; in
/// `ratelimit` mode, answering an error while no configuration is loaded.
fn envoy_settings(args: &ServeArgs) -> EnvoySettings {
    let mut envoy = EnvoySettings::from_vars(|name| std::env::var(name).ok());
    envoy.error_without_config = args
        .ratelimit
        .as_ref()
        .is_some_and(|m| m.error_without_config);
    envoy
}

/// `--http-addr`, else `0.0.0.0:$HTTP_SERVICE_PORT` (divvy's variable), else `0.0.0.0:8080`.
fn http_addr(flag: Option<SocketAddr>) -> anyhow::Result<SocketAddr> {
    port_or(flag, "HTTP_SERVICE_PORT", 8080)
}

/// `flag`, else `0.0.0.0:$<var>`, else `0.0.0.0:<default>`.
fn port_or(flag: Option<SocketAddr>, var: &str, default: u16) -> anyhow::Result<SocketAddr> {
    if let Some(addr) = flag {
        return Ok(addr);
    }
    match std::env::var(var) {
        Ok(port) if !port.trim().is_empty() => {
            let port: u16 = port
                .trim()
                .parse()
                .with_context(|| format!("{var} must be a TCP port number, found `{port}`"))?;
            Ok(SocketAddr::from(([0, 0, 0, 0], port)))
        }
        _ => Ok(SocketAddr::from(([0, 0, 0, 0], default))),
    }
}

/// `--redis-url`, else divvy's `REDIS_HOST` and `REDIS_PORT`, else none
/// (the memory store). The password may come from `REDIS_PASSWORD`.
fn redis_target(flag: Option<&str>) -> anyhow::Result<Option<RedisTarget>> {
    let password = std::env::var("REDIS_PASSWORD").ok();
    let url = match flag {
        Some(url) => url.to_owned(),
        None => match std::env::var("REDIS_HOST") {
            Ok(host) if !host.trim().is_empty() => {
                let port = std::env::var("REDIS_PORT").unwrap_or_else(|_| "6379".into());
                let host = host.trim();
                if host.contains(':') {
                    format!("redis://[{host}]:{}", port.trim())
                } else {
                    format!("redis://{host}:{}", port.trim())
                }
            }
            _ => return Ok(None),
        },
    };
    Ok(Some(parse_redis_url(&url, password)?))
}

/// The Redis TLS flags, each falling back to envoyproxy/ratelimit's
/// variable of the same meaning.
struct RedisTlsSettings {
    /// `--redis-tls` or `REDIS_TLS`: TLS even without `rediss://`.
    forced: bool,
    files: RedisTls,
}

/// The flags (or their DIVVY_ variables), else envoyproxy/ratelimit's
/// `REDIS_TLS`, `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`,
/// `REDIS_TLS_CLIENT_KEY` and `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`.
fn redis_tls_settings(args: &ServeArgs) -> anyhow::Result<RedisTlsSettings> {
    let path = |flag: &Option<PathBuf>, var: &str| {
        flag.clone().or_else(|| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    };
    Ok(RedisTlsSettings {
        forced: args.redis_tls || env_bool("REDIS_TLS")?,
        files: RedisTls {
            ca: path(&args.redis_tls_ca, "REDIS_TLS_CACERT"),
            cert: path(&args.redis_tls_cert, "REDIS_TLS_CLIENT_CERT"),
            key: path(&args.redis_tls_key, "REDIS_TLS_CLIENT_KEY"),
            skip_hostname_verification: args.redis_tls_skip_hostname_verification
                || env_bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?,
        },
    })
}

/// A boolean variable as envoyproxy/ratelimit (Go's `strconv.ParseBool`)
/// reads it; unset or empty is false.
fn env_bool(var: &str) -> anyhow::Result<bool> {
    let Ok(value) = std::env::var(var) else {
        return Ok(false);
    };
    match value.trim() {
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        other => bail!("{var} must be true or false, found `{other}`"),
    }
}

/// `--line-addr`, else `0.0.0.0:$PORT` (divvy's variable), else `0.0.0.0:8321`.
fn line_addr(flag: Option<SocketAddr>) -> anyhow::Result<SocketAddr> {
    port_or(flag, "PORT", 8321)
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    info!("shutdown signal received");
}
