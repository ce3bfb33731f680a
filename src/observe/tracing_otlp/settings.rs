//! What tracing runs with: where spans go, how they are sampled, and the
//! export queue's bounds (the OpenTelemetry variables' names and defaults).

use std::time::Duration;

use thiserror::Error;

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (the collector's port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, `POST /v1/traces`).
    HttpProtobuf,
}

/// The sampler (`OTEL_TRACES_SAMPLER`, with `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerSetting {
    /// Every call.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// This share of the trace ids (0 to 1).
    Ratio(f64),
    /// Follow the caller's decision; calls without a caller decide by the
    /// inner sampler.
    ParentBased(RootSampler),
}

/// A parent-based sampler's decision for calls without a parent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RootSampler {
    /// Every root call.
    AlwaysOn,
    /// No root call.
    AlwaysOff,
    /// This share of the root calls' trace ids.
    Ratio(f64),
}

impl SamplerSetting {
    /// Whether a call whose caller sampled it (`Some(true)`), did not
    /// (`Some(false)`) or sent no trace (`None`) can be sampled: `false`
    /// only where the sampler's answer is sure to be no.
    pub fn may_sample(self, parent_sampled: Option<bool>) -> bool {
        match (self, parent_sampled) {
            (SamplerSetting::AlwaysOff, _) => false,
            (SamplerSetting::ParentBased(_), Some(sampled)) => sampled,
            (SamplerSetting::ParentBased(RootSampler::AlwaysOff), None) => false,
            _ => true,
        }
    }

    /// The share of line-protocol requests traced: they carry no caller's
    /// trace, so only a ratio sampler traces them, at its rate.
    pub fn line_rate(self) -> f64 {
        match self {
            SamplerSetting::Ratio(r) | SamplerSetting::ParentBased(RootSampler::Ratio(r)) => r,
            _ => 0.0,
        }
    }
}

/// A sampler name or argument that is not one of OpenTelemetry's.
#[derive(Debug, Error, PartialEq)]
pub enum SamplerError {
    /// An unknown sampler name.
    #[error("OTEL_TRACES_SAMPLER `{0}`: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio")]
    Unknown(String),
    /// A ratio that is not a number from 0 to 1.
    #[error("OTEL_TRACES_SAMPLER_ARG `{0}`: expected a ratio from 0 to 1")]
    Ratio(String),
}

/// The sampler named `name` (default `parentbased_always_on`) with the
/// ratio `arg` (default 1) where it takes one.
pub fn parse_sampler(
    name: Option<&str>,
    arg: Option<&str>,
) -> Result<SamplerSetting, SamplerError> {
    let ratio = || match arg.map(str::trim).filter(|a| !a.is_empty()) {
        None => Ok(1.0),
        Some(a) => a
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| SamplerError::Ratio(a.to_owned())),
    };
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    Ok(match name.unwrap_or("parentbased_always_on") {
        "always_on" => SamplerSetting::AlwaysOn,
        "always_off" => SamplerSetting::AlwaysOff,
        "traceidratio" => SamplerSetting::Ratio(ratio()?),
        "parentbased_always_on" => SamplerSetting::ParentBased(RootSampler::AlwaysOn),
        "parentbased_always_off" => SamplerSetting::ParentBased(RootSampler::AlwaysOff),
        "parentbased_traceidratio" => SamplerSetting::ParentBased(RootSampler::Ratio(ratio()?)),
        other => return Err(SamplerError::Unknown(other.to_owned())),
    })
}

/// Tracing's settings; `None` of these in the service's settings: off.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpSettings {
    /// The collector's base URL (`http://host:4317`); with OTLP/HTTP,
    /// `/v1/traces` is added unless it is there.
    pub endpoint: String,
    /// gRPC or HTTP with protobuf.
    pub protocol: OtlpProtocol,
    /// `service.name`.
    pub service_name: String,
    /// `service.namespace`, if set.
    pub service_namespace: Option<String>,
    /// `service.instance.id`, if set.
    pub service_instance_id: Option<String>,
    /// Which calls are traced.
    pub sampler: SamplerSetting,
    /// Most finished spans waiting for export; more are dropped and counted
    /// (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queue: usize,
    /// Most spans in one export (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub max_batch: usize,
    /// Longest wait before a partial batch goes (`OTEL_BSP_SCHEDULE_DELAY`).
    pub delay: Duration,
    /// Longest wait for one export (`OTEL_BSP_EXPORT_TIMEOUT`).
    pub export_timeout: Duration,
}

impl OtlpSettings {
    /// Settings for `endpoint` with OpenTelemetry's defaults.
    pub fn new(endpoint: impl Into<String>) -> OtlpSettings {
        OtlpSettings {
            endpoint: endpoint.into(),
            protocol: OtlpProtocol::Grpc,
            service_name: "divvy".into(),
            service_namespace: None,
            service_instance_id: None,
            sampler: SamplerSetting::ParentBased(RootSampler::AlwaysOn),
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_millis(5000),
            export_timeout: Duration::from_millis(30_000),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_by_name() {
        assert_eq!(
            parse_sampler(None, None),
            Ok(SamplerSetting::ParentBased(RootSampler::AlwaysOn))
        );
        assert_eq!(
            parse_sampler(Some("traceidratio"), Some("0.25")),
            Ok(SamplerSetting::Ratio(0.25))
        );
        assert_eq!(
            parse_sampler(Some("parentbased_traceidratio"), None),
            Ok(SamplerSetting::ParentBased(RootSampler::Ratio(1.0)))
        );
        assert!(matches!(
            parse_sampler(Some("sometimes"), None),
            Err(SamplerError::Unknown(_))
        ));
        assert!(matches!(
            parse_sampler(Some("traceidratio"), Some("2")),
            Err(SamplerError::Ratio(_))
        ));
    }

    #[test]
    fn calls_sure_to_be_left_out_are_known_before_any_span() {
        let parent_based = SamplerSetting::ParentBased(RootSampler::AlwaysOn);
        assert!(parent_based.may_sample(Some(true)));
        assert!(!parent_based.may_sample(Some(false)));
        assert!(parent_based.may_sample(None));
        let off_at_root = SamplerSetting::ParentBased(RootSampler::AlwaysOff);
        assert!(!off_at_root.may_sample(None));
        assert!(!SamplerSetting::AlwaysOff.may_sample(Some(true)));
        assert!(SamplerSetting::Ratio(0.5).may_sample(Some(false)));
    }

    #[test]
    fn only_ratio_samplers_trace_line_requests() {
        assert_eq!(SamplerSetting::Ratio(0.1).line_rate(), 0.1);
        assert_eq!(
            SamplerSetting::ParentBased(RootSampler::Ratio(0.5)).line_rate(),
            0.5
        );
        assert_eq!(SamplerSetting::AlwaysOn.line_rate(), 0.0);
    }
}
