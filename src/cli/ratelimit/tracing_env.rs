//! envoyproxy/ratelimit's tracing variables as `divvy serve`'s OTLP flags:
//! `TRACING_ENABLED` (off by default: then no span is sent whatever
//! `OTEL_EXPORTER_OTLP_ENDPOINT` says), `TRACING_EXPORTER_PROTOCOL`
//! (`http` by default, or `grpc`), `TRACING_SERVICE_NAME` (`RateLimit`),
//! `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`,
//! `TRACING_SAMPLING_RATE` (1: a trace-id ratio), and the collector at
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (else OpenTelemetry's localhost default).

use super::{flag, get, unsupported, Env, Unsupported};

/// Appends the OTLP flags `env` asks for to `args`.
pub(super) fn tracing_args(env: &Env, args: &mut Vec<String>) -> Result<(), Unsupported> {
    let mut push = |a: &str, b: String| {
        args.push(a.to_owned());
        args.push(b);
    };
    if !flag(env, "TRACING_ENABLED", false)? {
        // An empty endpoint turns tracing off, whatever the variable says.
        push("--otlp-endpoint", String::new());
        return Ok(());
    }
    let protocol = get(env, "TRACING_EXPORTER_PROTOCOL", "http").trim();
    let (protocol, port) = match protocol.to_ascii_lowercase().as_str() {
        "" | "http" => ("http/protobuf", 4318),
        "grpc" => ("grpc", 4317),
        _ => {
            return Err(unsupported(
                "TRACING_EXPORTER_PROTOCOL",
                protocol,
                "http or grpc",
            ))
        }
    };
    let endpoint = env
        .get("OTEL_EXPORTER_OTLP_ENDPOINT")
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| format!("http://localhost:{port}"));
    // The Go exporter takes `host:port` without a scheme too (an https://
    // endpoint is refused by `serve`'s flag check).
    let endpoint = if endpoint.contains("://") {
        endpoint
    } else {
        format!("http://{endpoint}")
    };
    let rate = get(env, "TRACING_SAMPLING_RATE", "1").trim();
    if !rate.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r)) {
        return Err(unsupported(
            "TRACING_SAMPLING_RATE",
            rate,
            "a ratio from 0 to 1",
        ));
    }
    push("--otlp-endpoint", endpoint);
    push("--otlp-protocol", protocol.to_owned());
    push(
        "--otlp-service-name",
        get(env, "TRACING_SERVICE_NAME", "RateLimit").to_owned(),
    );
    for (var, arg) in [
        ("TRACING_SERVICE_NAMESPACE", "--otlp-service-namespace"),
        ("TRACING_SERVICE_INSTANCE_ID", "--otlp-service-instance-id"),
    ] {
        if let Some(v) = env.get(var).filter(|v| !v.trim().is_empty()) {
            push(arg, v.clone());
        }
    }
    push("--otlp-sampler", "traceidratio".into());
    push("--otlp-sampler-arg", rate.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(vars: &[(&str, &str)]) -> Result<Vec<String>, Unsupported> {
        let env: Env = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut args = Vec::new();
        tracing_args(&env, &mut args).map(|()| args)
    }

    #[test]
    fn off_unless_enabled_even_with_an_endpoint() {
        let got = args(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
        assert_eq!(got, ["--otlp-endpoint", ""]);
    }

    #[test]
    fn enabled_maps_every_variable() {
        let got = args(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("TRACING_SERVICE_NAMESPACE", "gw"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("TRACING_SAMPLING_RATE", "0.5"),
        ])
        .unwrap()
        .join(" ");
        assert_eq!(
            got,
            "--otlp-endpoint http://collector:4317 --otlp-protocol grpc --otlp-service-name rl \
             --otlp-service-namespace gw --otlp-service-instance-id pod-1 \
             --otlp-sampler traceidratio --otlp-sampler-arg 0.5"
        );
    }

    #[test]
    fn defaults_and_refusals() {
        let got = args(&[("TRACING_ENABLED", "1")]).unwrap().join(" ");
        assert!(got.starts_with("--otlp-endpoint http://localhost:4318 --otlp-protocol http/protobuf --otlp-service-name RateLimit"), "{got}");
        assert!(args(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "zipkin")
        ])
        .is_err());
        assert!(args(&[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "2")]).is_err());
        assert!(args(&[("TRACING_ENABLED", "maybe")]).is_err());
    }
}
