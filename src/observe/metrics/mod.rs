//! Prometheus metrics (and the statsd mirror of divvy's own).
//!
//! Every label value comes from the config (a rule's label or domain
//! pattern) or from a fixed set (statuses, error codes, results), never from
//! request values, so the number of series stays bounded whatever clients
//! send. Rules without a label are counted under `rule_label=""`.

use std::time::Duration;

use prometheus::{Encoder, Histogram, IntCounter, IntCounterVec, IntGauge, Registry, TextEncoder};

use crate::observe::statsd;

mod build;
mod counters;
mod fair;
mod parts;
mod policy;
mod traffic;

use build::{counter, counter_vec, counter_vec_of, gauge, histogram};
pub use counters::{CounterResetMetrics, COUNTER_RESET_RESULTS};
pub use fair::FairMetrics;
pub use parts::{
    GlobalMetrics, GovernorMetrics, RlqsMetrics, SourceMetrics, StoreMetrics, TlsMetrics,
};
pub use policy::PolicyMetrics;
pub use traffic::TrafficMetrics;

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    /// `divvy_hits_total{status,rule_label}`: status accepted, rejected, canary-accepted, canary-rejected,
    /// shadow_mode (a shadow rule's would-be denial, also counted accepted).
    pub hits: IntCounterVec,
    /// `divvy_hit_duration_seconds`: time to decide one request (all its descriptors).
    pub hit_duration: Histogram,
    /// `divvy_tcp_connections_total`: open line-protocol connections (a gauge, as divvy named it).
    pub tcp_connections: IntGauge,
    /// `divvy_errors_total{code}`: errors answered (line `ERR` codes, gRPC invalid arguments).
    pub errors: IntCounterVec,
    /// `divvy_decisions_total{domain,rule_label,code}`: deciding-rule outcomes; domain is the rule's domain pattern.
    pub decisions: IntCounterVec,
    /// `divvy_reloads_total{result}`: policy reloads, success or failure.
    pub reloads: IntCounterVec,
    /// `divvy_rules_generation`: generation of the rules in force.
    pub generation: IntGauge,
    /// `divvy_rules`: number of rules in force.
    pub rules: IntGauge,
    /// `divvy_knob_changes_total{action}`: knobs set, deleted, expired, and refused changes.
    pub knob_changes: IntCounterVec,
    /// `divvy_admin_auth_failures_total{reason}`: admin requests refused for
    /// their token (missing, wrong, read_only: the read token on a change).
    pub admin_auth_failures: IntCounterVec,
    /// `divvy_knobs`: knobs in force.
    pub knobs: IntGauge,
    /// `divvy_knobs_refreshed_timestamp_seconds`: last successful run of the knob refresh task
    /// (with Redis: the last time the shared knobs were read).
    pub knobs_refreshed: IntGauge,
    /// The rule sources beside the policy file: ZooKeeper's aux rules, xDS.
    pub sources: SourceMetrics,
    /// `divvy_ratelimit_stats_total{key,stat}`: envoyproxy/ratelimit's
    /// per-descriptor stats (`stat`: total_hits, over_limit, near_limit,
    /// within_limit, shadow_mode; `key`: `<domain>.<key_value path>`).
    pub envoy_stats: IntCounterVec,
    envoy_keys: std::sync::RwLock<std::collections::HashSet<String>>,
    /// `divvy_rejected_total{reason}`: requests, connections and counters refused to keep work and memory bounded.
    pub rejected: IntCounterVec,
    /// `divvy_grpc_connections_aged_total`: gRPC connections sent GOAWAY at their age
    /// (`--grpc-max-connection-age`).
    pub grpc_connections_aged: IntCounter,
    /// The counter store, its circuit breaker and failure policy.
    pub store: StoreMetrics,
    /// Leases of global limits.
    pub global: GlobalMetrics,
    /// Governors.
    pub governor: GovernorMetrics,
    /// TLS on the gRPC and admin ports.
    pub tls: TlsMetrics,
    /// Envoy's Rate Limit Quota Service.
    pub rlqs: RlqsMetrics,
    /// Fair shares among a limit's active values.
    pub fair: FairMetrics,
    /// Rules' configured limits and overdraft charges.
    pub policy: PolicyMetrics,
    /// The traffic recorder (`serve --record`).
    pub traffic: TrafficMetrics,
    /// Counter resets (`DELETE /counters`).
    pub counters: CounterResetMetrics,
    /// `divvy_trace_spans_dropped_total{reason}`: spans not exported
    /// (queue_full: the export queue was full; export_failed: the collector
    /// refused or did not answer).
    pub trace_spans_dropped: IntCounterVec,
    /// `divvy_trace_spans_exported_total`: spans the collector accepted
    /// (the export task's sign of life).
    pub trace_spans_exported: IntCounter,
}

/// A rule's counters, looked up once when the rule set is compiled (a
/// label lookup per request costs a hash of every label value).
#[derive(Debug, Clone)]
pub struct RuleCounters {
    /// `divvy_hits_total` by status: accepted, rejected, canary-accepted, canary-rejected.
    pub hits: [IntCounter; 4],
    /// `divvy_decisions_total` for its domain and label: ok, over_limit.
    pub decisions: [IntCounter; 2],
}

impl RuleCounters {
    /// The counters of a rule with `label` and `domain`.
    pub fn new(m: &Metrics, label: Option<&str>, domain: Option<&str>) -> RuleCounters {
        let label = label.unwrap_or("");
        let domain = domain.unwrap_or("");
        let hit = |s: HitStatus| m.hits.with_label_values(&[s.as_str(), label]);
        let decided = |code: &str| m.decisions.with_label_values(&[domain, label, code]);
        RuleCounters {
            hits: [
                hit(HitStatus::Accepted),
                hit(HitStatus::Rejected),
                hit(HitStatus::CanaryAccepted),
                hit(HitStatus::CanaryRejected),
            ],
            decisions: [decided("ok"), decided("over_limit")],
        }
    }
}

/// Most distinct keys of `divvy_ratelimit_stats_total`.
pub const MAX_STATS_KEYS: usize = 10_000;

/// Every `reason` of `divvy_rejected_total` (all exported from the start):
/// a line over `--line-max-bytes`, a gRPC request with too many
/// descriptors or entries, a line connection over `--line-max-connections`,
/// a counter evicted by `--max-counters`, a gRPC request over
/// `--grpc-max-request-bytes`, an RLQS bucket over
/// `--rlqs-max-buckets-per-stream`, an RLQS bucket id over its bounds.
pub const REJECT_REASONS: [&str; 7] = [
    "line_too_long",
    "too_many_descriptors",
    "connection_limit",
    "eviction",
    "request_too_large",
    "rlqs_too_many_buckets",
    "rlqs_bucket_id_too_large",
];

/// Every `reason` of `divvy_shed_total` (all exported from the start): a
/// request that waited a quarter of its caller's timeout for its turn
/// (`queue`), or past the timeout less the margin (`deadline`).
pub const SHED_REASONS: [&str; 2] = ["queue", "deadline"];

/// The reasons of `divvy_admin_auth_failures_total`: no bearer token, a
/// token that is neither admin nor read token, the read token on a change.
pub const AUTH_FAILURE_REASONS: [&str; 3] = ["missing", "wrong", "read_only"];

/// `divvy_trace_spans_dropped_total{reason}`, every reason exported from the start.
fn trace_spans_dropped(r: &Registry) -> IntCounterVec {
    counter_vec_of(
        r,
        "divvy_trace_spans_dropped_total",
        "Trace spans not exported, by reason: queue_full (the bounded export queue was full), export_failed (the collector refused or did not answer)",
        "reason",
        &crate::observe::tracing_otlp::export::DROP_REASONS,
    )
}

/// `divvy_trace_spans_exported_total`.
fn trace_spans_exported(r: &Registry) -> IntCounter {
    counter(
        r,
        "divvy_trace_spans_exported_total",
        "Trace spans the OTLP collector accepted",
    )
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, in a registry of its own.
    pub fn new() -> Metrics {
        let r = Registry::new();
        Metrics {
            hits: counter_vec(
                &r,
                "divvy_hits_total",
                "Hits by outcome and rule label",
                &["status", "rule_label"],
            ),
            hit_duration: histogram(
                &r,
                "divvy_hit_duration_seconds",
                "Time to decide one request",
            ),
            tcp_connections: gauge(
                &r,
                "divvy_tcp_connections_total",
                "Open divvy line-protocol connections",
            ),
            errors: counter_vec(
                &r,
                "divvy_errors_total",
                "Errors answered, by code",
                &["code"],
            ),
            decisions: counter_vec(
                &r,
                "divvy_decisions_total",
                "Decisions by rule domain, rule label and code",
                &["domain", "rule_label", "code"],
            ),
            reloads: counter_vec(
                &r,
                "divvy_reloads_total",
                "Policy reloads by result",
                &["result"],
            ),
            generation: gauge(
                &r,
                "divvy_rules_generation",
                "Generation of the rules in force",
            ),
            rules: gauge(&r, "divvy_rules", "Number of rules in force"),
            knob_changes: counter_vec(
                &r,
                "divvy_knob_changes_total",
                "Knob changes by action: set, delete, expire, refused",
                &["action"],
            ),
            admin_auth_failures: counter_vec_of(
                &r,
                "divvy_admin_auth_failures_total",
                "Admin API requests refused for their token, by reason: missing, wrong, read_only (the read token on a knob change)",
                "reason",
                &AUTH_FAILURE_REASONS,
            ),
            knobs: gauge(&r, "divvy_knobs", "Knobs in force"),
            knobs_refreshed: gauge(
                &r,
                "divvy_knobs_refreshed_timestamp_seconds",
                "Unix time of the last successful knob refresh (with Redis: the last read of the shared knobs)",
            ),
            sources: SourceMetrics::new(&r),
            envoy_stats: counter_vec(
                &r,
                "divvy_ratelimit_stats_total",
                "envoyproxy/ratelimit's per-descriptor stats: key is <domain>.<key_value path> (values only with detailed_metric or value_to_metric; at most 10000 keys, then `overflow`), stat is total_hits, over_limit, near_limit, within_limit or shadow_mode",
                &["key", "stat"],
            ),
            envoy_keys: std::sync::RwLock::new(std::collections::HashSet::new()),
            rejected: counter_vec_of(
                &r,
                "divvy_rejected_total",
                "Requests, connections and counters refused to keep work and memory bounded, by reason",
                "reason",
                &REJECT_REASONS,
            ),
            grpc_connections_aged: counter(
                &r,
                "divvy_grpc_connections_aged_total",
                "gRPC connections sent GOAWAY at their age (--grpc-max-connection-age), to reconnect and rebalance",
            ),
            store: StoreMetrics::new(&r),
            global: GlobalMetrics::new(&r),
            governor: GovernorMetrics::new(&r),
            tls: TlsMetrics::new(&r),
            rlqs: RlqsMetrics::new(&r),
            fair: FairMetrics::new(&r),
            policy: PolicyMetrics::new(&r),
            traffic: TrafficMetrics::new(&r),
            counters: CounterResetMetrics::new(&r),
            trace_spans_dropped: trace_spans_dropped(&r),
            trace_spans_exported: trace_spans_exported(&r),
            registry: r,
        }
    }

    /// Every metric family, as collected now.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Counts one rule's outcome for a hit (and mirrors it to statsd).
    pub fn hit(&self, status: HitStatus, label: Option<&str>) {
        self.hits
            .with_label_values(&[status.as_str(), label.unwrap_or("")])
            .inc();
        self.hit_statsd(status, label);
    }

    /// The statsd mirror of [`Metrics::hit`] (nothing is formatted without statsd).
    pub fn hit_statsd(&self, status: HitStatus, label: Option<&str>) {
        if !statsd::enabled() {
            return;
        }
        statsd::count(&format!("hit.{}", status.as_str()));
        if let Some(label) = label {
            statsd::count(&format!("hit.{}.{label}", status.as_str()));
        }
    }

    /// Counts an error answered with `code`.
    pub fn error(&self, code: &str) {
        self.errors.with_label_values(&[code]).inc();
        statsd::count(&format!("error.{code}"));
    }

    /// `key` as a label value of `divvy_ratelimit_stats_total`, or
    /// `overflow` once [`MAX_STATS_KEYS`] distinct keys are in use (keys
    /// with request values must not grow the series without bound).
    pub fn envoy_stats_key<'a>(&self, key: &'a str) -> &'a str {
        // Shared for the usual case (a key seen before), exclusive to add one.
        if self
            .envoy_keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(key)
        {
            return key;
        }
        let mut keys = self
            .envoy_keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if keys.contains(key) {
            return key;
        }
        if keys.len() < MAX_STATS_KEYS {
            keys.insert(key.to_owned());
            return key;
        }
        "overflow"
    }

    /// Observes the time to decide one request.
    pub fn hit_time(&self, d: Duration) {
        self.hit_duration.observe(d.as_secs_f64());
        statsd::timing("hit", d);
    }

    /// Observes `d` as the time to decide each of `n` requests decided
    /// together (one update of the shared histogram).
    pub fn hit_times(&self, d: Duration, n: usize) {
        match n {
            0 => return,
            // One observation: a local histogram (an allocation and a flush
            // over every bucket) would cost more than it saves.
            1 => return self.hit_time(d),
            _ => {}
        }
        let local = self.hit_duration.local();
        for _ in 0..n {
            local.observe(d.as_secs_f64());
            statsd::timing("hit", d);
        }
        local.flush();
    }

    /// Adds `delta` to the open line-protocol connections.
    pub fn connections(&self, delta: i64) {
        self.tcp_connections.add(delta);
        statsd::gauge("connections", self.tcp_connections.get());
    }
}

/// A rule's outcome for one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitStatus {
    /// The deciding rule allowed it.
    Accepted,
    /// The deciding rule denied it.
    Rejected,
    /// A canary had credit.
    CanaryAccepted,
    /// A canary had none.
    CanaryRejected,
    /// A shadow rule would have denied it (and allowed it): envoyproxy/ratelimit's
    /// `shadow_mode` stat, counted besides the hit's `accepted`.
    Shadow,
}

impl HitStatus {
    /// divvy's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            HitStatus::Accepted => "accepted",
            HitStatus::Rejected => "rejected",
            HitStatus::CanaryAccepted => "canary-accepted",
            HitStatus::CanaryRejected => "canary-rejected",
            HitStatus::Shadow => "shadow_mode",
        }
    }
}
