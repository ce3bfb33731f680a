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
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
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
    /// The text of `PROMETHEUS_MAPPER_YAML`'s file (statsd_exporter
    /// mappings that rename the series served there), checked at start.
    pub prometheus_mapper: Option<String>,
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

/// `PROMETHEUS_MAPPER_YAML`'s file, read and parsed now so a bad one stops
/// the start with its reason.
fn mapper_text(env: &Env) -> Result<Option<String>, Unsupported> {
    const VAR: &str = "PROMETHEUS_MAPPER_YAML";
    let path = get(env, VAR, "").trim();
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| unsupported(VAR, path, &format!("cannot read it: {e}")))?;
    divvy::observe::statsd_mapper::Mapper::parse(&text)
        .map_err(|e| unsupported(VAR, path, &e.to_string()))?;
    Ok(Some(text))
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
    connection_age_args(env, &mut args)?;
    redis_args(env, &mut args)?;
    statsd_args(env, &mut args)?;
    tracing_env::tracing_args(env, &mut args)?;
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
        prometheus_mapper: mapper_text(env)?,
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

/// `GRPC_MAX_CONNECTION_AGE` and `_GRACE` (Go durations; there, 24h and
/// 1h by default, and 0 is no limit) as divvy's flags, whose `0` means the same.
fn connection_age_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    for (var, default, flag) in [
        (
            "GRPC_MAX_CONNECTION_AGE",
            "24h",
            "--grpc-max-connection-age",
        ),
        (
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            "1h",
            "--grpc-max-connection-age-grace",
        ),
    ] {
        let value = env
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .unwrap_or(default);
        let d = go_duration(value).map_err(|e| {
            unsupported(
                var,
                value,
                &format!("{e}; a Go duration such as 24h, 1h30m or 90s"),
            )
        })?;
        // In milliseconds, a non-zero duration never rounded down to 0 (off).
        let ms = d.as_millis().max(u128::from(!d.is_zero()));
        args.extend([flag.into(), format!("{ms}ms")]);
    }
    Ok(())
}

/// Why a value is not a Go duration.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GoDurationError {
    /// Not `[-+]?([0-9]*(\.[0-9]*)?unit)+` (nor `0`).
    #[error("not a duration")]
    Invalid,
    /// A number without a unit (`90` rather than `90s`).
    #[error("a number without a unit (ns, us, ms, s, m or h)")]
    MissingUnit,
    /// A unit Go does not know.
    #[error("unknown unit `{0}` (ns, us, ms, s, m or h)")]
    UnknownUnit(String),
    /// Below zero: no age can be.
    #[error("negative")]
    Negative,
    /// Beyond Go's largest duration (about 292 years).
    #[error("too long")]
    Overflow,
}

/// A duration in the forms Go's `time.ParseDuration` takes: `0`, or numbers
/// (with an optional fraction) each followed by a unit, such as `1h30m`,
/// `1.5h`, `90s` or `500ms`; negative ones are refused.
pub fn go_duration(text: &str) -> Result<std::time::Duration, GoDurationError> {
    let rest = match text.as_bytes().first() {
        Some(b'-') if text != "-0" => return Err(GoDurationError::Negative),
        Some(b'-' | b'+') => &text[1..],
        _ => text,
    };
    if rest == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(GoDurationError::Invalid);
    }
    let mut nanos: u128 = 0;
    let mut rest = rest;
    while !rest.is_empty() {
        let (part, tail) = go_duration_part(rest)?;
        nanos = nanos.checked_add(part).ok_or(GoDurationError::Overflow)?;
        rest = tail;
    }
    // Go's durations are signed 64-bit nanoseconds.
    if nanos > i64::MAX as u128 {
        return Err(GoDurationError::Overflow);
    }
    Ok(std::time::Duration::from_nanos(nanos as u64))
}

/// One `number unit` at the start of `text`: its nanoseconds and the rest.
fn go_duration_part(text: &str) -> Result<(u128, &str), GoDurationError> {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let whole_len = digits(text);
    let (whole, rest) = text.split_at(whole_len);
    let (frac, rest) = match rest.strip_prefix('.') {
        Some(r) => r.split_at(digits(r)),
        None => ("", rest),
    };
    if whole.is_empty() && frac.is_empty() {
        return Err(GoDurationError::Invalid);
    }
    let unit_len = rest
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(rest.len());
    let (unit, rest) = rest.split_at(unit_len);
    let scale: u128 = match unit {
        "" => return Err(GoDurationError::MissingUnit),
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => return Err(GoDurationError::UnknownUnit(other.to_owned())),
    };
    // Every step checked: a huge number is the overflow error, never a
    // panic (debug) or a wrapped value (release).
    let overflow = || GoDurationError::Overflow;
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| overflow())?
    };
    let mut nanos = whole.checked_mul(scale).ok_or_else(overflow)?;
    // The fraction's first 18 digits: finer than a nanosecond of any unit.
    let frac = &frac[..frac.len().min(18)];
    if !frac.is_empty() {
        let f: u128 = frac.parse().map_err(|_| overflow())?;
        let part = f
            .checked_mul(scale)
            .and_then(|p| p.checked_div(10u128.checked_pow(frac.len() as u32)?))
            .ok_or_else(overflow)?;
        nanos = nanos.checked_add(part).ok_or_else(overflow)?;
    }
    // Go's bound per term too, so no sum of terms comes near u128's.
    if nanos > i64::MAX as u128 {
        return Err(overflow());
    }
    Ok((nanos, rest))
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
            let query = sentinel_auth_query(env);
            format!("redis{s}+sentinel://{auth}{hosts}/{master}{query}")
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
    match auth.split_once(':') {
        Some((user, pass)) => format!("{}:{}", encode(user), encode(pass)),
        None => format!(":{}", encode(auth)),
    }
}

/// `REDIS_SENTINEL_AUTH` (`password` or `username:password`, the Sentinel
/// nodes' own) as a Sentinel URL's query; empty when unset.
fn sentinel_auth_query(env: &Env) -> String {
    let Some(auth) = env.get("REDIS_SENTINEL_AUTH").filter(|v| !v.is_empty()) else {
        return String::new();
    };
    match auth.split_once(':') {
        Some((user, pass)) => format!(
            "?sentinelUsername={}&sentinelPassword={}",
            encode(user),
            encode(pass)
        ),
        None => format!("?sentinelPassword={}", encode(auth)),
    }
}

/// `text` percent-encoded for a URL: every byte but letters and digits.
fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
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

mod tracing_env;

#[cfg(test)]
#[path = "ratelimit_tests.rs"]
mod tests;
