//! OpenTelemetry traces over OTLP, joined to the caller's (Envoy's) trace.
//!
//! Off unless `--otlp-endpoint` is set: then [`install`] builds one tracer
//! for the process and [`active`] returns it. Each request path asks
//! [`active`] once (one atomic load) and, when it is `None`, does no other
//! tracing work. Spans: the call ([`CallTrace`], a child of the caller's
//! `traceparent`/B3 span), the decision ([`CallTrace::decide`]), and the
//! Redis script call ([`store_span`], found through [`current`]). Finished
//! spans go out through a bounded queue that drops rather than waits
//! ([`export`]).

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span, SpanExporter as _};
use opentelemetry_sdk::Resource;
use thiserror::Error;

pub mod context;
pub mod export;
pub mod settings;

pub use context::parent_from_headers;
pub use settings::{OtlpProtocol, OtlpSettings, RootSampler, SamplerSetting};

use crate::observe::metrics::Metrics;

/// Tracing could not start.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The OTLP exporter refused its settings (an endpoint that is no URL).
    #[error("--otlp-endpoint {endpoint}: {message}")]
    Exporter {
        /// The endpoint given.
        endpoint: String,
        /// The exporter's complaint.
        message: String,
    },
    /// `install` ran twice in one process.
    #[error("tracing is already installed in this process")]
    AlreadyInstalled,
}

/// The process's tracer and what it needs beside it.
pub struct Tracing {
    tracer: SdkTracer,
    // Kept: dropping the provider would stop the tracer.
    _provider: SdkTracerProvider,
    queue: export::DroppingBatch,
    sampler: SamplerSetting,
    line_rate: f64,
}

static ACTIVE: OnceLock<Tracing> = OnceLock::new();

tokio::task_local! {
    /// The span a request's store call is a child of (its decision span),
    /// set only while a traced request decides.
    static CURRENT: SpanContext;
}

/// The process's tracing, if on.
#[inline]
pub fn active() -> Option<&'static Tracing> {
    ACTIVE.get()
}

/// The decision span of the traced request this task is deciding, if any.
#[inline]
pub fn current() -> Option<SpanContext> {
    active()?;
    CURRENT.try_with(SpanContext::clone).ok()
}

/// Starts tracing for this process with `s`; drops are counted in
/// `metrics`. Must run on the service's runtime (the export task is
/// spawned there).
pub fn install(s: &OtlpSettings, metrics: &Metrics) -> Result<(), TraceError> {
    if ACTIVE.get().is_some() {
        return Err(TraceError::AlreadyInstalled);
    }
    let mut exporter = exporter(s).map_err(|message| TraceError::Exporter {
        endpoint: s.endpoint.clone(),
        message,
    })?;
    let mut resource = Resource::builder().with_service_name(s.service_name.clone());
    if let Some(ns) = &s.service_namespace {
        resource = resource.with_attribute(KeyValue::new("service.namespace", ns.clone()));
    }
    if let Some(id) = &s.service_instance_id {
        resource = resource.with_attribute(KeyValue::new("service.instance.id", id.clone()));
    }
    let resource = resource.build();
    exporter.set_resource(&resource);
    let bounds = export::QueueBounds {
        max_queue: s.max_queue,
        max_batch: s.max_batch.max(1),
        delay: s.delay,
        export_timeout: s.export_timeout,
    };
    let counters = export::SpanCounters {
        dropped: metrics.trace_spans_dropped.clone(),
        exported: metrics.trace_spans_exported.clone(),
    };
    let queue = export::DroppingBatch::spawn(exporter, bounds, counters);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue.clone())
        .with_sampler(sampler(s.sampler))
        .with_resource(resource)
        .build();
    let tracing = Tracing {
        tracer: provider.tracer("divvy"),
        _provider: provider,
        queue,
        sampler: s.sampler,
        line_rate: s.sampler.line_rate(),
    };
    ACTIVE
        .set(tracing)
        .map_err(|_| TraceError::AlreadyInstalled)
}

/// Exports the spans still queued (at shutdown); waits at most `within`.
pub async fn flush(within: Duration) {
    if let Some(t) = active() {
        t.queue.flush(within).await;
    }
}

fn exporter(s: &OtlpSettings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match s.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(s.endpoint.clone())
            .with_timeout(s.export_timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(http_traces_url(&s.endpoint))
            .with_timeout(s.export_timeout)
            .build(),
    };
    built.map_err(|e| e.to_string())
}

/// OTLP/HTTP's traces URL from a base endpoint (as the variable
/// `OTEL_EXPORTER_OTLP_ENDPOINT` names it): `/v1/traces` added.
pub fn http_traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

fn sampler(s: SamplerSetting) -> Sampler {
    let root = |r: RootSampler| match r {
        RootSampler::AlwaysOn => Sampler::AlwaysOn,
        RootSampler::AlwaysOff => Sampler::AlwaysOff,
        RootSampler::Ratio(r) => Sampler::TraceIdRatioBased(r),
    };
    match s {
        SamplerSetting::AlwaysOn => Sampler::AlwaysOn,
        SamplerSetting::AlwaysOff => Sampler::AlwaysOff,
        SamplerSetting::Ratio(r) => Sampler::TraceIdRatioBased(r),
        SamplerSetting::ParentBased(r) => Sampler::ParentBased(Box::new(root(r))),
    }
}

/// One traced call: its span, ended when this is dropped.
pub struct CallTrace {
    span: Span,
    tracer: &'static SdkTracer,
}

impl Tracing {
    /// The span of a `ShouldRateLimit` call whose caller's span is
    /// `parent` (from its headers); `None` when the sampler leaves it out.
    pub fn rate_limit_call(&'static self, parent: Option<SpanContext>) -> Option<CallTrace> {
        // A call the sampler is sure to leave out costs no span at all.
        if !self
            .sampler
            .may_sample(parent.as_ref().map(SpanContext::is_sampled))
        {
            return None;
        }
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p),
            None => Context::new(),
        };
        let span = self
            .tracer
            .span_builder("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ])
            .start_with_context(&self.tracer, &cx);
        self.sampled(span)
    }

    /// The span of a batch of `hits` line-protocol HITs, a root of its
    /// own: only ratio samplers trace them, at their rate.
    pub fn line_batch(&'static self, hits: usize) -> Option<CallTrace> {
        if self.line_rate <= 0.0 {
            return None;
        }
        let span = self
            .tracer
            .span_builder("divvy.line/HIT")
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("divvy.hits", hits as i64)])
            .start_with_context(&self.tracer, &Context::new());
        self.sampled(span)
    }

    fn sampled(&'static self, span: Span) -> Option<CallTrace> {
        span.span_context().is_sampled().then_some(CallTrace {
            span,
            tracer: &self.tracer,
        })
    }
}

impl CallTrace {
    /// Runs `decide` inside a decision span (a child of the call's), which
    /// the store's spans find through [`current`].
    pub async fn decide<F: Future>(&mut self, decide: F) -> F::Output {
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let span = self
            .tracer
            .span_builder("divvy.decide")
            .with_kind(SpanKind::Internal)
            .start_with_context(self.tracer, &cx);
        let me = span.span_context().clone();
        let out = CURRENT.scope(me, decide).await;
        drop(span);
        out
    }

    /// Adds `attributes` to the call's span.
    pub fn record(&mut self, attributes: impl IntoIterator<Item = KeyValue>) {
        self.span.set_attributes(attributes);
    }

    /// Marks the call failed, with `message`.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.span
            .set_status(opentelemetry::trace::Status::error(message.into()));
    }
}

/// A finished store call of a traced request whose decision span is
/// `parent`: from `start` to `end`, with `attributes` (command, batch size,
/// slot).
pub fn store_span(
    parent: &SpanContext,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
) {
    let Some(t) = active() else {
        return;
    };
    let cx = Context::new().with_remote_span_context(parent.clone());
    let mut span = t
        .tracer
        .span_builder(name)
        .with_kind(SpanKind::Client)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&t.tracer, &cx);
    span.end_with_timestamp(end);
}
