//! Envoy's `RateLimitService` v3 (`ShouldRateLimit`) over gRPC.
//!
//! A thin adapter: [`respond`] (or [`to_hits`] alone) validates a
//! `RateLimitRequest` and moves its descriptors into limiter hits (one per
//! descriptor, the last repeated key winning), the limiter decides, and
//! [`to_response`] formats the answer. In `current_limit`, a window that is
//! not exactly one Envoy unit is `UNKNOWN`, with the exact window in `name`
//! (`per 90s`); an always-allow rule has none, an always-deny rule reports
//! `requests_per_unit` 0 (README, "Envoy's RateLimitService"). A denial may
//! carry a problem body ([`super::problem`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::headers::{rate_limit_headers, HeaderStyle};
use super::{problem, rls_envoy, rls_trace};
use crate::config::DeniedBody;
use crate::limiter::{
    Decisions, Descriptor, Hit, LimitOverride, Limiter, Outcome, Request as Decide, Reset, Verdict,
};
use crate::observe::metrics::Metrics;
use crate::observe::tracing_otlp::CallTrace;
use crate::rules::Rule;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// Most descriptors accepted in one request (Envoy sends a handful): one
/// request cannot hold a shared store for long.
pub const MAX_DESCRIPTORS: usize = 256;
/// Most entries accepted in one descriptor.
pub const MAX_ENTRIES: usize = 256;

/// What an answer carries besides its statuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseStyle {
    /// Rate-limit headers for Envoy to add.
    pub headers: HeaderStyle,
    /// The body of a denial (a denying rule's `deniedBody` overrides it).
    pub denied_body: DeniedBody,
}

/// The gRPC service.
pub struct RlsService {
    limiter: Arc<Limiter>,
    style: ResponseStyle,
    /// Kept back from a caller's timeout to answer in time.
    margin: Duration,
}

impl RlsService {
    /// A service deciding with `limiter`, answering in `style` (headers,
    /// denial bodies).
    pub fn new(limiter: Arc<Limiter>, style: ResponseStyle) -> RlsService {
        RlsService {
            limiter,
            style,
            margin: super::deadline::DEFAULT_MARGIN,
        }
    }

    /// Keeps `margin` of each caller's timeout to decide and answer.
    pub fn with_deadline_margin(mut self, margin: Duration) -> RlsService {
        self.margin = margin;
        self
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // The deadline counts from the arrival (stamped by the outermost
        // layer), not from now: the request may have waited its turn.
        let arrived = request
            .extensions()
            .get::<super::arrival::Arrived>()
            .map_or_else(Instant::now, |a| a.0);
        let deadline = super::deadline::caller_timeout(request.metadata().as_ref())
            .map(|timeout| super::deadline::store_deadline(arrived, timeout, self.margin));
        // Tracing off: this load is all the tracing work a call does.
        if let Some(tracing) = crate::observe::tracing_otlp::active() {
            // Boxed: the untraced call's future stays as small as before.
            let call = rls_trace::call(tracing, &self.limiter, self.style, request, deadline);
            return Box::pin(call).await;
        }
        respond(&self.limiter, self.style, request.into_inner(), deadline)
            .await
            .map(Response::new)
    }
}

/// Decides `request` and shapes the answer: the limiter picks the engine
/// (the envoyproxy/ratelimit file that defines the domain, else the divvy
/// rules, else "no limit"); this adapter only translates in and out.
/// Shared by gRPC and `POST /json`. The request is validated whole first.
/// The store is waited for until `deadline` at most; then the failure
/// policy decides. `style` says what the answer carries besides statuses.
pub fn respond(
    limiter: &Limiter,
    style: ResponseStyle,
    request: RateLimitRequest,
    deadline: Option<Instant>,
) -> impl Future<Output = Result<RateLimitResponse, Status>> + Send + '_ {
    respond_traced(limiter, style, request, deadline, None)
}

/// [`respond`], the decision inside `trace`'s decision span when traced
/// (its deciding rules recorded on the call's span).
pub(super) async fn respond_traced(
    limiter: &Limiter,
    style: ResponseStyle,
    request: RateLimitRequest,
    deadline: Option<Instant>,
    mut trace: Option<&mut CallTrace>,
) -> Result<RateLimitResponse, Status> {
    let envoy = limiter.envoy();
    let metrics = &*limiter.telemetry().metrics;
    if let Some(recorder) = crate::observe::traffic::active() {
        recorder.record(super::json::format_request(&request).as_bytes());
    }
    let (one, many);
    // Most requests carry one descriptor: held in place, not in a Vec.
    let descriptors: &[Descriptor] = match validate_one(&request, metrics) {
        Some(d) => {
            one = [d.inspect_err(|_| metrics.error("invalid-argument"))?];
            &one
        }
        None => {
            many =
                validate(&request, metrics).inspect_err(|_| metrics.error("invalid-argument"))?;
            &many
        }
    };
    let ask = Decide::envoy(&request.domain, descriptors).until(deadline);
    let decide = limiter.decide(&ask);
    let verdict = match trace.as_deref_mut() {
        None => decide.await,
        Some(t) => Box::pin(t.decide(decide)).await,
    }
    .map_err(|e| {
        metrics.error("unavailable");
        Status::unavailable(e.to_string())
    })?;
    if let Some(t) = trace {
        rls_trace::record_verdict(t, &verdict);
    }
    Ok(match verdict {
        Verdict::Envoy(statuses) => {
            rls_envoy::response(&request, &statuses, envoy, style.denied_body)
        }
        Verdict::NoRules => rls_envoy::no_limit(&request),
        Verdict::NoConfig if envoy.error_without_config => {
            metrics.error("service-error");
            return Err(Status::unknown("no rate limit configuration loaded"));
        }
        Verdict::NoConfig => rls_envoy::no_limit(&request),
        Verdict::Divvy(decisions) => {
            let response = divvy_response(style, &decisions);
            decisions.recycle();
            response
        }
    })
}

/// The answer to a request the divvy rules decided: statuses, headers in
/// `style`, and on a denial the problem body a denying rule (else `style`)
/// asks for, with its content type.
fn divvy_response(style: ResponseStyle, decisions: &Decisions) -> RateLimitResponse {
    let mut response = to_response(decisions);
    let header = |key: String, value: String| HeaderValue {
        key,
        value,
        ..Default::default()
    };
    response.response_headers_to_add = rate_limit_headers(style.headers, decisions)
        .into_iter()
        .map(|(key, value)| header(key, value))
        .collect();
    if response.overall_code == Code::OverLimit as i32 {
        if let Some(body) = problem::for_decisions(style.denied_body, decisions) {
            response.raw_body = body;
            let content_type = header("content-type".into(), problem::CONTENT_TYPE.into());
            response.response_headers_to_add.push(content_type);
        }
    }
    response
}

/// Validates a request and turns its descriptors into hits (what
/// [`respond`] does before deciding; the service itself goes through
/// `respond`); requests refused for their size are counted in `metrics`.
pub fn to_hits(request: RateLimitRequest, metrics: &Metrics) -> Result<Vec<Hit>, Status> {
    Ok(validate(&request, metrics)?
        .iter()
        .map(Descriptor::hit)
        .collect())
}

/// What a valid descriptor asks besides its entries.
struct Terms {
    cost: u64,
    refund: bool,
    limit_override: Option<LimitOverride>,
}

/// Checks the whole request (domain, descriptor and entry counts, keys,
/// overrides); when it is valid, its descriptors in the limiter's shape,
/// borrowing their entries. Requests refused for their size are counted in
/// `metrics`.
fn validate<'r>(
    request: &'r RateLimitRequest,
    metrics: &Metrics,
) -> Result<Vec<Descriptor<'r>>, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit request must carry at least one descriptor",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        metrics
            .rejected
            .with_label_values(&["too_many_descriptors"])
            .inc();
        return Err(Status::invalid_argument(format!(
            "rate limit request carries {} descriptors; at most {MAX_DESCRIPTORS} are accepted",
            request.descriptors.len()
        )));
    }
    // Request-level hits_addend: 0 (unset) counts as 1.
    let request_cost = u64::from(request.hits_addend.max(1));
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| descriptor(i, d, request_cost, metrics))
        .collect()
}

/// [`validate`] for a request of one descriptor with a domain (`None` for
/// any other request, which `validate` checks).
fn validate_one<'r>(
    request: &'r RateLimitRequest,
    metrics: &Metrics,
) -> Option<Result<Descriptor<'r>, Status>> {
    match &request.descriptors[..] {
        [d] if !request.domain.is_empty() => Some(descriptor(
            0,
            d,
            u64::from(request.hits_addend.max(1)),
            metrics,
        )),
        _ => None,
    }
}

/// Descriptor `index` in the limiter's shape, borrowing its entries.
fn descriptor<'d>(
    index: usize,
    d: &'d RateLimitDescriptor,
    request_cost: u64,
    metrics: &Metrics,
) -> Result<Descriptor<'d>, Status> {
    let t = terms(index, d, request_cost, metrics)?;
    Ok(Descriptor {
        entries: d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect(),
        cost: t.cost,
        refund: t.refund,
        limit_override: t.limit_override,
    })
}

fn terms(
    index: usize,
    d: &RateLimitDescriptor,
    request_cost: u64,
    metrics: &Metrics,
) -> Result<Terms, Status> {
    if d.entries.is_empty() {
        return Err(Status::invalid_argument(format!(
            "descriptor {index} has no entries"
        )));
    }
    if d.entries.len() > MAX_ENTRIES {
        metrics
            .rejected
            .with_label_values(&["too_many_descriptors"])
            .inc();
        return Err(Status::invalid_argument(format!(
            "descriptor {index} has {} entries; at most {MAX_ENTRIES} are accepted",
            d.entries.len()
        )));
    }
    if let Some(e) = d.entries.iter().find(|e| e.key.is_empty()) {
        return Err(Status::invalid_argument(format!(
            "descriptor {index} has an entry with an empty key (value {:?})",
            e.value
        )));
    }
    let limit_override = match &d.limit {
        None => None,
        Some(o) => {
            let unit = RateLimitUnit::try_from(o.unit).unwrap_or(RateLimitUnit::Unknown);
            let reset_seconds = override_seconds(unit).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "descriptor {index}: limit override needs a known unit (SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)"
                ))
            })?;
            Some(LimitOverride {
                credit_limit: u64::from(o.requests_per_unit),
                reset_seconds,
            })
        }
    };
    Ok(Terms {
        cost: d.hits_addend.map_or(request_cost, |v| v.value),
        refund: d.is_negative_hits,
        limit_override,
    })
}

fn override_seconds(unit: RateLimitUnit) -> Option<u64> {
    match unit {
        RateLimitUnit::Second => Some(1),
        RateLimitUnit::Minute => Some(60),
        RateLimitUnit::Hour => Some(3600),
        RateLimitUnit::Day => Some(86_400),
        RateLimitUnit::Month => Some(30 * 86_400),
        RateLimitUnit::Year => Some(365 * 86_400),
        RateLimitUnit::Unknown => None,
    }
}

/// The Envoy unit that is exactly `seconds` long, if any.
pub fn unit_for(seconds: u64) -> Option<Unit> {
    match seconds {
        1 => Some(Unit::Second),
        60 => Some(Unit::Minute),
        3600 => Some(Unit::Hour),
        86_400 => Some(Unit::Day),
        604_800 => Some(Unit::Week),
        2_592_000 => Some(Unit::Month),
        31_536_000 => Some(Unit::Year),
        _ => None,
    }
}

/// Formats decisions as Envoy's response.
pub fn to_response(decisions: &Decisions) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = decisions
        .items
        .iter()
        .map(|d| status(decisions.rule(&d.decider), &d.decider))
        .collect();
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..Default::default()
    }
}

fn status(rule: &Rule, o: &Outcome) -> DescriptorStatus {
    let name = rule.name();
    let current_limit = match o.reset {
        Reset::Unlimited => None,
        _ => Some(match unit_for(o.reset_seconds) {
            Some(unit) => RateLimit {
                name: name.to_owned(),
                requests_per_unit: saturate(o.credit_limit),
                unit: unit as i32,
            },
            None => RateLimit {
                name: format!("{name} per {}s", o.reset_seconds),
                requests_per_unit: saturate(o.credit_limit),
                unit: Unit::Unknown as i32,
            },
        }),
    };
    DescriptorStatus {
        code: if o.allowed { Code::Ok } else { Code::OverLimit } as i32,
        current_limit,
        limit_remaining: saturate(o.remaining),
        duration_until_reset: match o.reset {
            Reset::After(d) => Some(pb_duration(d)),
            Reset::Never | Reset::Unlimited => None,
        },
        quota: None,
    }
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
