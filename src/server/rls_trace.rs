//! A traced `ShouldRateLimit` call: its span is a child of the span Envoy
//! names in the call's `traceparent` (or B3) headers, carries the domain,
//! the answer's code and the deciding rules' labels, and holds the
//! decision's span (and through it the store's).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use opentelemetry::{KeyValue, StringValue, Value};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::rls::{respond_traced, ResponseStyle};
use crate::limiter::{Limiter, Verdict};
use crate::observe::tracing_otlp::{parent_from_headers, CallTrace, Tracing};

/// Most rule labels recorded on one call's span.
const MAX_LABELS: usize = 32;

/// Decides `request` as [`super::rls::respond`] does, inside a call span
/// when the sampler keeps it.
pub(super) async fn call(
    tracing: &'static Tracing,
    limiter: &Limiter,
    style: ResponseStyle,
    request: Request<RateLimitRequest>,
    deadline: Option<Instant>,
) -> Result<Response<RateLimitResponse>, Status> {
    let headers = request.metadata();
    let parent = parent_from_headers(|name| headers.get(name).and_then(|v| v.to_str().ok()));
    let mut trace = tracing.rate_limit_call(parent);
    let request = request.into_inner();
    if let Some(t) = trace.as_mut() {
        t.record([KeyValue::new("divvy.domain", request.domain.clone())]);
    }
    let answer = respond_traced(limiter, style, request, deadline, trace.as_mut()).await;
    if let Some(t) = trace.as_mut() {
        match &answer {
            Ok(response) => t.record([KeyValue::new("divvy.code", code_name(response))]),
            Err(status) => {
                t.record([KeyValue::new("rpc.grpc.status_code", status.code() as i64)]);
                t.fail(status.message().to_owned());
            }
        }
    }
    answer.map(Response::new)
}

fn code_name(response: &RateLimitResponse) -> &'static str {
    match Code::try_from(response.overall_code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// Records on the call's span which engine decided and the labels of the
/// rules (or envoyproxy/ratelimit limits) that decided its descriptors.
pub(super) fn record_verdict(trace: &mut CallTrace, verdict: &Verdict) {
    let (engine, labels): (&str, Vec<StringValue>) = match verdict {
        Verdict::Divvy(decisions) => (
            "divvy",
            decisions
                .items
                .iter()
                .take(MAX_LABELS)
                .map(|d| decisions.rule(&d.decider).name().to_owned().into())
                .collect(),
        ),
        Verdict::Envoy(statuses) => (
            "envoy_ratelimit",
            statuses
                .iter()
                .take(MAX_LABELS)
                .map(|s| {
                    s.current
                        .as_ref()
                        .map_or(String::new(), |c| c.name.clone())
                        .into()
                })
                .collect(),
        ),
        Verdict::NoRules => ("none", Vec::new()),
        Verdict::NoConfig => ("no_config", Vec::new()),
    };
    trace.record([
        KeyValue::new("divvy.engine", engine),
        KeyValue::new("divvy.rule_labels", Value::Array(labels.into())),
    ]);
}
