//! `ratelimit` mode: the process envoyproxy/ratelimit's users start
//! (`/bin/ratelimit`, or `divvy ratelimit`), configured by that project's
//! environment with its defaults, as Envoy Gateway starts it.
//!
//! The environment becomes `divvy serve` arguments ([`serve_args`]); a value
//! divvy cannot honour stops the start with a message naming the variable.
//! What divvy ignores is listed in [`IGNORED`] (and the README).

use std::collections::HashMap;

use thiserror::Error;

/// envoyproxy/ratelimit variables that are accepted and have no effect here.
pub const IGNORED: &[&str] = &[
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "STATS_FLUSH_INTERVAL",
    "EXTRA_TAGS",
    "DISABLE_STATS",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// A setting divvy cannot honour.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{var}={value}: {why}")]
pub struct Unsupported {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// Why, and what to do instead.
    pub why: String,
}

/// What `ratelimit` mode adds to `divvy serve`'s behaviour.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RatelimitMode {
    /// Answer ShouldRateLimit with an error while no configuration is loaded
    /// (envoyproxy/ratelimit's "no rate limit configuration loaded").
    pub error_without_config: bool,
    /// Start serving before the first xDS configuration arrives
    /// (`FORCE_START_WITHOUT_INITIAL_CONFIG`); otherwise wait for it.
    pub force_start: bool,
    /// `/healthcheck` fails until a configuration is loaded
    /// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub healthy_needs_config: bool,
    /// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH`, when `USE_PROMETHEUS` is true:
    /// envoyproxy/ratelimit's metric names served there.
    pub prometheus: Option<(String, String)>,
    /// `LOG_LEVEL`, as a tracing filter.
    pub log_level: String,
    /// The variables of [`IGNORED`] that are set (logged at start).
    pub ignored: Vec<String>,
}

/// The environment, looked up by name.
pub type Env = HashMap<String, String>;

fn get<'a>(env: &'a Env, var: &str, default: &'a str) -> &'a str {
    env.get(var).map_or(default, String::as_str)
}

fn flag(env: &Env, var: &str, default: bool) -> Result<bool, Unsupported> {
    match env.get(var).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if v.is_empty() => Ok(default),
        Some(v) => match v.as_str() {
            "1" | "t" | "true" => Ok(true),
            "0" | "f" | "false" => Ok(false),
            _ => Err(unsupported(var, &v, "not a boolean (true or false)")),
        },
    }
}

fn unsupported(var: &str, value: &str, why: &str) -> Unsupported {
    Unsupported {
        var: var.to_owned(),
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// `host:port` from a host and a port variable (a host of `0.0.0.0` binds all).
fn addr(env: &Env, host: &str, host_default: &str, port: &str, port_default: &str) -> String {
    let h = get(env, host, host_default);
    let h = if h.contains(':') && !h.starts_with('[') {
        format!("[{h}]")
    } else {
        h.to_owned()
    };
    format!("{h}:{}", get(env, port, port_default))
}

/// `divvy serve` arguments and the mode's extras for envoyproxy/ratelimit's
/// environment `env`.
pub fn serve_args(env: &Env) -> Result<(Vec<String>, RatelimitMode), Unsupported> {
    refuse_unsupported(env)?;
    let mut args: Vec<String> = vec!["serve".into()];
    let mut push = |a: &str, b: String| {
        args.push(a.to_owned());
        args.push(b);
    };
    push("--http-addr", addr(env, "HOST", "0.0.0.0", "PORT", "8080"));
    push(
        "--grpc-addr",
        addr(env, "GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081"),
    );
    // envoyproxy/ratelimit has no line protocol: loopback, a port of the kernel's choosing.
    push("--line-addr", "127.0.0.1:0".into());
    push(
        "--log-format",
        match get(env, "LOG_FORMAT", "text") {
            "json" => "json".into(),
            _ => "text".into(),
        },
    );
    config_args(env, &mut args)?;
    grpc_tls_args(env, &mut args)?;
    redis_args(env, &mut args)?;
    statsd_args(env, &mut args)?;
    let metrics_path = get(env, "PROMETHEUS_PATH", "/metrics");
    if !metrics_path.starts_with('/') || metrics_path.len() < 2 {
        return Err(unsupported(
            "PROMETHEUS_PATH",
            metrics_path,
            "a path such as /metrics",
        ));
    }
    let mode = RatelimitMode {
        error_without_config: true,
        force_start: flag(env, "FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        healthy_needs_config: flag(env, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
        prometheus: flag(env, "USE_PROMETHEUS", false)?.then(|| {
            let a = get(env, "PROMETHEUS_ADDR", ":9090");
            let a = if a.starts_with(':') {
                format!("0.0.0.0{a}")
            } else {
                a.to_owned()
            };
            (a, metrics_path.to_owned())
        }),
        log_level: get(env, "LOG_LEVEL", "WARN").to_ascii_lowercase(),
        ignored: IGNORED
            .iter()
            .filter(|v| env.contains_key(**v))
            .map(ToString::to_string)
            .collect(),
    };
    Ok((args, mode))
}

fn refuse_unsupported(env: &Env) -> Result<(), Unsupported> {
    let backend = get(env, "BACKEND_TYPE", "redis");
    if !backend.eq_ignore_ascii_case("redis") {
        return Err(unsupported(
            "BACKEND_TYPE",
            backend,
            "divvy counts in Redis or, without REDIS_URL, in its embedded memory store",
        ));
    }
    if let Some(uds) = env.get("GRPC_UDS").filter(|v| !v.is_empty()) {
        return Err(unsupported(
            "GRPC_UDS",
            uds,
            "gRPC is served on TCP only (GRPC_HOST, GRPC_PORT)",
        ));
    }
    for (var, why) in [
        ("REDIS_PERSECOND", "one Redis holds every counter; unset it"),
        (
            "MERGE_DOMAIN_CONFIG",
            "a domain is defined once; merge the files",
        ),
        (
            "USE_DOG_STATSD",
            "statsd output has divvy's names; unset it",
        ),
    ] {
        if flag(env, var, false)? {
            return Err(unsupported(var, "true", why));
        }
    }
    Ok(())
}

fn config_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    match get(env, "CONFIG_TYPE", "FILE")
        .to_ascii_uppercase()
        .as_str()
    {
        "FILE" => {
            let dir = std::path::Path::new(get(env, "RUNTIME_ROOT", "/srv/runtime_data/current"))
                .join(get(env, "RUNTIME_SUBDIRECTORY", ""))
                .join(get(env, "RUNTIME_APPDIRECTORY", "config"));
            args.extend(["--config".into(), dir.display().to_string()]);
        }
        "GRPC_XDS_SOTW" => {
            args.extend([
                "--xds-server".into(),
                get(env, "CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000").into(),
                "--xds-node-id".into(),
                get(env, "CONFIG_GRPC_XDS_NODE_ID", "default").into(),
                "--xds-node-metadata".into(),
                get(env, "CONFIG_GRPC_XDS_NODE_METADATA", "").into(),
                "--xds-headers".into(),
                get(env, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "").into(),
                "--xds-backoff-initial".into(),
                get(env, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s").into(),
                "--xds-backoff-max".into(),
                get(env, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s").into(),
            ]);
            if flag(env, "CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
                for (var, arg) in [
                    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-tls-ca"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--xds-tls-cert"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--xds-tls-key"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--xds-tls-san"),
                ] {
                    if let Some(v) = env.get(var).filter(|v| !v.is_empty()) {
                        args.extend([arg.into(), v.clone()]);
                    }
                }
            }
        }
        other => {
            return Err(unsupported("CONFIG_TYPE", other, "FILE or GRPC_XDS_SOTW"));
        }
    }
    Ok(())
}

fn grpc_tls_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    if !flag(env, "GRPC_SERVER_USE_TLS", false)? {
        return Ok(());
    }
    let ca = env
        .get("GRPC_CLIENT_TLS_CACERT")
        .or_else(|| env.get("GRPC_SERVER_TLS_CA_CERT"));
    for (value, arg) in [
        (env.get("GRPC_SERVER_TLS_CERT"), "--grpc-tls-cert"),
        (env.get("GRPC_SERVER_TLS_KEY"), "--grpc-tls-key"),
        (ca, "--grpc-tls-client-ca"),
        (env.get("GRPC_CLIENT_TLS_SAN"), "--grpc-tls-client-san"),
    ] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            args.extend([arg.into(), v.clone()]);
        }
    }
    Ok(())
}

/// `REDIS_URL` in envoyproxy/ratelimit's forms (`host:port`; Sentinel
/// `master,host:port,...`; Cluster `host:port,...`) as a divvy URL.
fn redis_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    let Some(url) = env.get("REDIS_URL").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let socket = get(env, "REDIS_SOCKET_TYPE", "unix");
    if !socket.eq_ignore_ascii_case("tcp") {
        return Err(unsupported(
            "REDIS_SOCKET_TYPE",
            socket,
            "divvy reaches Redis over TCP: set tcp",
        ));
    }
    let tls = flag(env, "REDIS_TLS", false)?;
    let auth = match env.get("REDIS_AUTH").filter(|v| !v.is_empty()) {
        Some(a) => format!("{}@", percent_user_pass(a)),
        None => String::new(),
    };
    let s = if tls { "s" } else { "" };
    let url = match get(env, "REDIS_TYPE", "SINGLE")
        .to_ascii_uppercase()
        .as_str()
    {
        "SINGLE" => format!("redis{s}://{auth}{url}"),
        "CLUSTER" => format!("redis{s}+cluster://{auth}{url}"),
        "SENTINEL" => {
            let (master, hosts) = url.split_once(',').ok_or_else(|| {
                unsupported(
                    "REDIS_URL",
                    url,
                    "Sentinel needs master,host:port[,host:port...]",
                )
            })?;
            format!("redis{s}+sentinel://{auth}{hosts}/{master}")
        }
        other => {
            return Err(unsupported(
                "REDIS_TYPE",
                other,
                "SINGLE, SENTINEL or CLUSTER",
            ))
        }
    };
    args.extend(["--redis-url".into(), url]);
    args.extend(["--over-limit-cache".into(), over_limit_entries(env)?]);
    if let Some(t) = env.get("REDIS_TIMEOUT").filter(|v| !v.is_empty()) {
        let ms = divvy::config::duration::parse_millis(t)
            .ok_or_else(|| unsupported("REDIS_TIMEOUT", t, "a duration such as 100ms or 2s"))?;
        args.extend(["--redis-timeout-ms".into(), ms.to_string()]);
    }
    Ok(())
}

/// `LOCAL_CACHE_SIZE_IN_BYTES` as over-limit cache entries: off (0) unless
/// set, as in envoyproxy/ratelimit; an entry costs about
/// [`OVER_LIMIT_ENTRY_BYTES`].
fn over_limit_entries(env: &Env) -> Result<String, Unsupported> {
    let bytes = get(env, "LOCAL_CACHE_SIZE_IN_BYTES", "0");
    let bytes: u64 = bytes
        .parse()
        .map_err(|_| unsupported("LOCAL_CACHE_SIZE_IN_BYTES", bytes, "a number of bytes"))?;
    Ok((bytes / OVER_LIMIT_ENTRY_BYTES).to_string())
}

/// What one over-limit cache entry costs, as `LOCAL_CACHE_SIZE_IN_BYTES` counts.
pub const OVER_LIMIT_ENTRY_BYTES: u64 = 64;

/// `user:pass` or a password alone, percent-encoded for a URL.
fn percent_user_pass(auth: &str) -> String {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    match auth.split_once(':') {
        Some((user, pass)) => format!("{}:{}", enc(user), enc(pass)),
        None => format!(":{}", enc(auth)),
    }
}

fn statsd_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    // On by default there, but only an explicit host is sent anything here.
    if flag(env, "USE_STATSD", true)? {
        if let Some(host) = env.get("STATSD_HOST").filter(|v| !v.is_empty()) {
            args.extend(["--statsd-host".into(), host.clone()]);
            args.extend([
                "--statsd-port".into(),
                get(env, "STATSD_PORT", "8125").into(),
            ]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        let i = args.iter().position(|a| a == flag)?;
        args.get(i + 1).map(String::as_str)
    }

    #[test]
    fn envoy_gateways_environment() {
        let (args, mode) = serve_args(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("LOG_LEVEL", "info"),
        ]))
        .expect("supported");
        assert_eq!(value_of(&args, "--xds-server"), Some("envoy-gateway:18001"));
        assert_eq!(value_of(&args, "--xds-node-id"), Some("envoy-ratelimit"));
        assert_eq!(value_of(&args, "--xds-tls-ca"), Some("/certs/ca.crt"));
        assert_eq!(
            value_of(&args, "--grpc-tls-client-ca"),
            Some("/certs/ca.crt")
        );
        assert_eq!(value_of(&args, "--grpc-addr"), Some("0.0.0.0:8081"));
        assert_eq!(value_of(&args, "--http-addr"), Some("0.0.0.0:8080"));
        assert_eq!(value_of(&args, "--config"), None);
        assert_eq!(value_of(&args, "--redis-url"), None, "memory store");
        assert!(mode.force_start);
        assert_eq!(
            mode.prometheus,
            Some(("0.0.0.0:19001".into(), "/metrics".into()))
        );
        assert_eq!(mode.log_level, "info");
    }

    #[test]
    fn files_and_redis_in_their_forms() {
        let (args, _) = serve_args(&env(&[
            ("RUNTIME_ROOT", "/srv"),
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,10.0.0.1:26379,10.0.0.2:26379"),
            ("REDIS_AUTH", "p@ss"),
            ("REDIS_TIMEOUT", "250ms"),
        ]))
        .expect("supported");
        assert_eq!(value_of(&args, "--config"), Some("/srv/rl/config"));
        assert_eq!(
            value_of(&args, "--redis-url"),
            Some("redis+sentinel://:p%40ss@10.0.0.1:26379,10.0.0.2:26379/mymaster")
        );
        assert_eq!(value_of(&args, "--redis-timeout-ms"), Some("250"));
        // No LOCAL_CACHE_SIZE_IN_BYTES: the over-limit cache is off, as there.
        assert_eq!(value_of(&args, "--over-limit-cache"), Some("0"));
    }

    #[test]
    fn local_cache_size_in_bytes_switches_the_over_limit_cache_on() {
        let redis = [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")];
        let with = |bytes: &'static str| {
            let mut vars = redis.to_vec();
            vars.push(("LOCAL_CACHE_SIZE_IN_BYTES", bytes));
            serve_args(&env(&vars))
        };
        let (args, _) = with("1048576").expect("supported");
        assert_eq!(value_of(&args, "--over-limit-cache"), Some("16384"));
        let err = with("a lot").expect_err("not a number");
        assert_eq!(err.var, "LOCAL_CACHE_SIZE_IN_BYTES");
    }

    #[test]
    fn unsupported_values_name_their_variable() {
        for (var, value) in [
            ("BACKEND_TYPE", "memcache"),
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("GRPC_UDS", "/tmp/rl.sock"),
            ("REDIS_PERSECOND", "true"),
            ("USE_PROMETHEUS", "maybe"),
        ] {
            let err = serve_args(&env(&[(var, value)])).expect_err(var);
            assert_eq!(err.var, var);
            assert!(err.to_string().starts_with(&format!("{var}=")), "{err}");
        }
        let unix = env(&[("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")]);
        assert_eq!(
            serve_args(&unix).expect_err("unix").var,
            "REDIS_SOCKET_TYPE"
        );
    }
}
