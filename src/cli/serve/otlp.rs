//! `divvy serve`'s tracing flags, each falling back to OpenTelemetry's
//! variable of the same meaning.

use std::time::Duration;

use anyhow::{bail, Context};
use divvy::observe::tracing_otlp::settings::parse_sampler;
use divvy::observe::tracing_otlp::{OtlpProtocol, OtlpSettings};

/// OTLP tracing: off unless an endpoint is given.
#[derive(clap::Args, Clone)]
pub struct OtlpArgs {
    /// The OTLP collector's URL (`http://collector:4317` for gRPC,
    /// `http://collector:4318` for HTTP); turns tracing on.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    #[arg(
        long,
        env = "OTEL_EXPORTER_OTLP_PROTOCOL",
        default_value = "http/protobuf"
    )]
    pub otlp_protocol: String,
    /// The spans' `service.name`.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "divvy")]
    pub otlp_service_name: String,
    /// The spans' `service.namespace`.
    #[arg(long, env = "DIVVY_OTLP_SERVICE_NAMESPACE")]
    pub otlp_service_namespace: Option<String>,
    /// The spans' `service.instance.id`.
    #[arg(long, env = "DIVVY_OTLP_SERVICE_INSTANCE_ID")]
    pub otlp_service_instance_id: Option<String>,
    /// always_on, always_off, traceidratio, parentbased_always_on,
    /// parentbased_always_off or parentbased_traceidratio.
    #[arg(
        long,
        env = "OTEL_TRACES_SAMPLER",
        default_value = "parentbased_always_on"
    )]
    pub otlp_sampler: String,
    /// The ratio of the ratio samplers (0 to 1).
    #[arg(long, env = "OTEL_TRACES_SAMPLER_ARG")]
    pub otlp_sampler_arg: Option<String>,
    /// Most finished spans waiting for export; more are dropped and counted.
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = 2048)]
    pub otlp_max_queue_size: usize,
    /// Most spans in one export.
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value_t = 512)]
    pub otlp_max_export_batch_size: usize,
    /// Longest wait before a partial batch is exported, in milliseconds.
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value_t = 5000)]
    pub otlp_schedule_delay_ms: u64,
    /// Longest wait for one export, in milliseconds.
    #[arg(long, env = "OTEL_BSP_EXPORT_TIMEOUT", default_value_t = 30_000)]
    pub otlp_export_timeout_ms: u64,
}

impl OtlpArgs {
    /// The tracing settings; `None` without an endpoint (an empty one too).
    pub fn settings(&self) -> anyhow::Result<Option<OtlpSettings>> {
        let Some(endpoint) = self.otlp_endpoint.as_deref().map(str::trim) else {
            return Ok(None);
        };
        if endpoint.is_empty() {
            return Ok(None);
        }
        // The exporters are built without TLS: an https:// collector would
        // fail every export, so it is refused at start instead.
        if !endpoint.starts_with("http://") {
            bail!("--otlp-endpoint must be an http:// URL (TLS to the collector is not supported), found `{endpoint}`");
        }
        let protocol = match self.otlp_protocol.trim() {
            "grpc" => OtlpProtocol::Grpc,
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            other => bail!("--otlp-protocol must be grpc or http/protobuf, found `{other}`"),
        };
        let sampler = parse_sampler(Some(&self.otlp_sampler), self.otlp_sampler_arg.as_deref())
            .context("--otlp-sampler")?;
        let nonempty = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        Ok(Some(OtlpSettings {
            protocol,
            service_name: self.otlp_service_name.clone(),
            service_namespace: nonempty(&self.otlp_service_namespace),
            service_instance_id: nonempty(&self.otlp_service_instance_id),
            sampler,
            max_queue: self.otlp_max_queue_size.max(1),
            max_batch: self.otlp_max_export_batch_size.max(1),
            delay: Duration::from_millis(self.otlp_schedule_delay_ms.max(1)),
            export_timeout: Duration::from_millis(self.otlp_export_timeout_ms.max(1)),
            ..OtlpSettings::new(endpoint)
        }))
    }
}
