//! Unit tests of `cli/ratelimit.rs`.

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

/// `REDIS_SENTINEL_AUTH`: the Sentinel nodes' own credentials, carried in
/// the URL's query and read back exactly (a space, a plus and an at sign).
#[test]
fn redis_sentinel_auth_reaches_the_sentinel_credentials() {
    let url_with = |auth: &'static str| {
        let (args, _) = serve_args(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,10.0.0.1:26379"),
            ("REDIS_AUTH", "a b+c"),
            ("REDIS_SENTINEL_AUTH", auth),
        ]))
        .expect("supported");
        let url = value_of(&args, "--redis-url").expect("a URL").to_owned();
        divvy::store::redis_url::parse_redis_url(&url, None).expect("parses")
    };
    let t = url_with("s p+w@d");
    assert_eq!(t.password.as_deref(), Some("a b+c"));
    assert_eq!(t.sentinel_credentials(), (None, Some("s p+w@d".into())));
    let t = url_with("sentinel-user:pw");
    assert_eq!(
        t.sentinel_credentials(),
        (Some("sentinel-user".into()), Some("pw".into()))
    );
    let t = url_with("");
    assert_eq!(t.sentinel_credentials(), (None, Some("a b+c".into())));
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
fn go_durations() {
    use std::time::Duration;
    for (text, want) in [
        ("0", Duration::ZERO),
        ("+0", Duration::ZERO),
        ("-0", Duration::ZERO),
        ("24h", Duration::from_secs(86_400)),
        ("1h30m", Duration::from_secs(5_400)),
        ("1.5h", Duration::from_secs(5_400)),
        ("90s", Duration::from_secs(90)),
        ("500ms", Duration::from_millis(500)),
        (".5s", Duration::from_millis(500)),
        ("1.s", Duration::from_secs(1)),
        ("2m0.5s", Duration::from_millis(120_500)),
        ("250us", Duration::from_micros(250)),
        ("250\u{b5}s", Duration::from_micros(250)),
        ("10ns", Duration::from_nanos(10)),
        ("2562047h", Duration::from_secs(2_562_047 * 3600)),
    ] {
        assert_eq!(go_duration(text), Ok(want), "{text}");
    }
    for (text, err) in [
        ("", GoDurationError::Invalid),
        ("soon", GoDurationError::Invalid),
        (".s", GoDurationError::Invalid),
        ("90", GoDurationError::MissingUnit),
        ("1h30", GoDurationError::MissingUnit),
        ("2d", GoDurationError::UnknownUnit("d".into())),
        ("-5s", GoDurationError::Negative),
        ("2562048h", GoDurationError::Overflow),
        (
            "99999999999999999999999999999999999999999h",
            GoDurationError::Overflow,
        ),
        // The whole part times the unit just fits u128; the fraction
        // tipped it over (a panic in debug, a wrapped value in release).
        ("94522879700260684295381835.9h", GoDurationError::Overflow),
        (
            "94522879700260684295381835.999999999999999999999h",
            GoDurationError::Overflow,
        ),
        // Beyond u128 in the integer part alone.
        (
            "999999999999999999999999999999999999999999999999ns",
            GoDurationError::Overflow,
        ),
        ("94522879700260684295381835h", GoDurationError::Overflow),
        // One nanosecond past Go's largest duration, in the fraction.
        ("9223372036.854775808s", GoDurationError::Overflow),
        ("2562047.9999h", GoDurationError::Overflow),
    ] {
        assert_eq!(go_duration(text), Err(err), "{text}");
    }
    // Go's largest duration exactly, the fraction's extra digits dropped.
    assert_eq!(
        go_duration("9223372036.854775807999999999999s"),
        Ok(Duration::from_nanos(i64::MAX as u64))
    );
    // Many terms, each in range, whose sum is not.
    for text in [
        "2562047h".repeat(2),
        "9223372036854775807ns".repeat(1000),
        "94522879700260684295381835.9h".repeat(50),
        "9223372036854775807ns1ns".to_owned(),
    ] {
        let err = GoDurationError::Overflow;
        assert_eq!(go_duration(&text), Err(err), "{text}");
    }
}

#[test]
fn connection_age_follows_envoyproxy_ratelimit() {
    let (args, mode) = serve_args(&env(&[])).expect("supported");
    assert_eq!(
        value_of(&args, "--grpc-max-connection-age"),
        Some("86400000ms")
    );
    assert_eq!(
        value_of(&args, "--grpc-max-connection-age-grace"),
        Some("3600000ms")
    );
    assert!(mode.ignored.is_empty());
    let (args, mode) = serve_args(&env(&[
        ("GRPC_MAX_CONNECTION_AGE", "2s"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1m30s"),
    ]))
    .expect("supported");
    assert_eq!(value_of(&args, "--grpc-max-connection-age"), Some("2000ms"));
    assert_eq!(
        value_of(&args, "--grpc-max-connection-age-grace"),
        Some("90000ms")
    );
    assert!(mode.ignored.is_empty(), "{:?}", mode.ignored);
    let (args, _) = serve_args(&env(&[
        ("GRPC_MAX_CONNECTION_AGE", "0"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1us"),
    ]))
    .expect("supported");
    assert_eq!(value_of(&args, "--grpc-max-connection-age"), Some("0ms"));
    assert_eq!(
        value_of(&args, "--grpc-max-connection-age-grace"),
        Some("1ms")
    );
    for var in ["GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"] {
        let err = serve_args(&env(&[(var, "soon")])).expect_err(var);
        assert_eq!(err.var, var);
        assert!(
            err.to_string().starts_with(&format!("{var}=soon: ")),
            "{err}"
        );
        assert!(err.to_string().contains("Go duration"), "{err}");
    }
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
