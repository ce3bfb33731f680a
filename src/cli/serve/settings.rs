//! `divvy serve`'s flags, else the variables they fall back to (divvy's,
//! envoyproxy/ratelimit's), resolved into the library's `Settings`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use divvy::app::Settings;
use divvy::limiter::envoy::EnvoySettings;
use divvy::observe::statsd::StatsdConfig;
use divvy::server::admin::auth::Tokens;
use divvy::sources::zookeeper::ZkOptions;
use divvy::store::redis_tls::RedisTls;
use divvy::store::redis_url::{parse_redis_url, RedisTarget};

use super::ServeArgs;

/// The flags, else the variables they fall back to, as [`Settings`].
pub(super) fn settings(args: &ServeArgs) -> anyhow::Result<Settings> {
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
        denied_body: args.denied_body,
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
        grpc_reflection: args.grpc_reflection,
        healthy_needs_config: mode.is_some_and(|m| m.healthy_needs_config),
        config_may_start_empty: mode.is_some(),
        wait_for_xds: mode.is_some_and(|m| !m.force_start),
        ready_awaits_xds: mode.is_none(),
        shutdown_delay: Duration::from_secs(args.shutdown_delay_seconds),
        metrics_path: args.metrics_path.clone(),
        tokens: admin_tokens(args)?,
        statsd: statsd(args),
        ratelimit_prometheus: mode.and_then(|m| m.prometheus.clone()),
        ratelimit_mapper: mode.and_then(|m| m.prometheus_mapper.clone()),
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
        global_fallback: Duration::from_millis(args.global_fallback_ms),
        global_floor: args.global_floor,
        rlqs_assignment_ttl: args.rlqs_assignment_ttl,
        rlqs_max_buckets_per_stream: args.rlqs_max_buckets_per_stream,
        record: args.record.clone(),
        record_max_bytes: args.record_max_bytes,
        otlp: args.otlp.settings()?,
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
