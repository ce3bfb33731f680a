//! `divvy serve`: its flags and the variables they fall back to, mapped
//! into the library's `Settings`; the service itself is `divvy::app::App`,
//! served until SIGTERM or SIGINT.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use divvy::app::App;
use divvy::config::DeniedBody;
use divvy::server::headers::HeaderStyle;
use divvy::store::failover::FailurePolicy;
use tracing::info;

use super::ratelimit::RatelimitMode;
use super::tls::TlsArgs;

mod otlp;
mod settings;
mod xds;

pub use xds::XdsArgs;

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
    /// The body Envoy returns with a denial: none (Envoy's own) or
    /// problem-json (an application/problem+json quota-exceeded body naming
    /// the violated policies); a rule's deniedBody overrides it.
    #[arg(long, env = "DIVVY_DENIED_BODY", value_enum, default_value = "none")]
    denied_body: DeniedBody,
    /// Make /readyz (and the gRPC health of the rate-limit service) fail
    /// while the counter store fails. By default a replica whose failure
    /// policy is deciding stays ready: it still answers every request.
    #[arg(long, env = "DIVVY_READY_REQUIRES_STORE")]
    ready_requires_store: bool,
    /// Serve gRPC reflection (grpc.reflection v1 and v1alpha) on the gRPC
    /// port, so grpcurl can list and call the services without proto files.
    #[arg(long, env = "DIVVY_GRPC_REFLECTION")]
    grpc_reflection: bool,
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
    /// How long after its last lease lapses a region cut off from the global
    /// store keeps that share, in milliseconds (then the floor); the global
    /// store holds the share back from the other regions for as long, and a
    /// dead region's share goes to the others this long after its lease.
    #[arg(long, env = "DIVVY_GLOBAL_FALLBACK_MS", default_value_t = 2000)]
    global_fallback_ms: u64,
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
    /// Record every request to this file as `divvy replay` reads it
    /// (`<unix-ms> <request>` a line), off the request path: a full queue
    /// drops lines (`divvy_record_lines_total{result="dropped"}`). Off by default.
    #[arg(long, env = "DIVVY_RECORD")]
    record: Option<PathBuf>,
    /// Size of the --record file (`64Mi`, `1G`, bytes) past which it is moved
    /// to FILE.1 (replacing it) and a new one begun.
    #[arg(long, env = "DIVVY_RECORD_MAX_BYTES", default_value = "64Mi",
          value_parser = parse_memory_limit)]
    record_max_bytes: u64,
    #[command(flatten)]
    xds: XdsArgs,
    /// envoyproxy/ratelimit's behaviour, when started as `ratelimit`.
    #[arg(skip)]
    ratelimit: Option<RatelimitMode>,
    /// TLS on the gRPC and admin ports.
    #[command(flatten)]
    tls: TlsArgs,
    /// OTLP tracing.
    #[command(flatten)]
    otlp: otlp::OtlpArgs,
}

impl ServeArgs {
    /// These arguments with `ratelimit` mode's behaviour on.
    pub fn with_ratelimit_mode(mut self, mode: RatelimitMode) -> ServeArgs {
        self.ratelimit = Some(mode);
        self
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

/// A wait such as `500ms`, `10s` or `1m`.
fn parse_wait(text: &str) -> Result<Duration, String> {
    divvy::config::duration::parse_millis(text)
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a wait such as 500ms, 10s or 1m"))
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
    let settings = settings::settings(&args)?;
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
        // SIGTERM is taken over before any listener opens: a signal sent as
        // soon as the replica is ready must drain it, not kill it.
        let shutdown = shutdown_signal();
        App::build(settings).await?.serve(shutdown).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(served?)
}

/// Completes on SIGINT or SIGTERM; the SIGTERM handler is installed when
/// this is called (it needs the runtime), not when the future is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        match term {
            Some(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        info!("shutdown signal received");
    }
}
