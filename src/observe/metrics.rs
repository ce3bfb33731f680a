//! Prometheus metrics (and the statsd mirror of divvy's own).
//!
//! Every label value comes from the config (a rule's label or domain
//! pattern) or from a fixed set (statuses, error codes, results), never from
//! request values, so the number of series stays bounded whatever clients
//! send. Rules without a label are counted under `rule_label=""`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::observe::statsd;

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    /// `divvy_hits_total{status,rule_label}`: status accepted, rejected, canary-accepted, canary-rejected.
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

/// The reasons of `divvy_admin_auth_failures_total`: no bearer token, a
/// token that is neither admin nor read token, the read token on a change.
pub const AUTH_FAILURE_REASONS: [&str; 3] = ["missing", "wrong", "read_only"];

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric name");
    g
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric name");
    g
}

fn histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let buckets = vec![
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ];
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric name");
    h
}

/// The counter store, its circuit breaker and failure policy.
pub struct StoreMetrics {
    /// `divvy_counters`: live counters in the memory store (as of its last sweep).
    pub counters: IntGauge,
    /// `divvy_counters_evicted_total`: counters the memory store evicted to stay under `--max-counters`.
    pub counters_evicted: IntCounter,
    /// `divvy_store_errors_total`: failed store calls.
    pub errors: IntCounter,
    /// `divvy_store_duration_seconds`: time of one store call (all counters of a request).
    pub duration: Histogram,
    /// `divvy_failure_policy_activations_total{policy}`: times the circuit breaker opened.
    pub failure_activations: IntCounterVec,
    /// `divvy_failure_policy_decisions_total{policy,reason}`: counters decided by the
    /// failure policy; reason deadline, timeout, connection or breaker_open.
    pub failure_decisions: IntCounterVec,
    /// `divvy_store_failures_total{reason}`: store calls counted toward the breaker;
    /// reason deadline, timeout, connection or abandoned.
    pub failures: IntCounterVec,
    /// `divvy_store_breaker_state`: 0 closed, 1 open, 2 half-open.
    pub breaker_state: IntGauge,
    /// `divvy_store_ready`: 1 while the configured store is in use, 0 while a failure policy stands in.
    pub ready: IntGauge,
    /// `divvy_over_limit_cache_hits_total`: counters answered by the over-limit cache, without a store call.
    pub over_limit_cache_hits: IntCounter,
    /// `divvy_memory_budget_bytes`: the memory limit in force (`--memory-limit` or the cgroup's; 0: none).
    pub memory_budget: IntGauge,
    /// `divvy_max_counters`: the memory store's cap in force (the lesser of `--max-counters` and the budget's).
    pub max_counters: IntGauge,
}

/// Leases of global limits.
pub struct GlobalMetrics {
    /// `divvy_global_lease_rate{limit}`: this region's leased rate (credits/s) of a global limit.
    pub lease: GaugeVec,
    /// `divvy_global_demand_rate{limit}`: this region's measured demand (credits/s) of a global limit.
    pub demand: GaugeVec,
    /// `divvy_global_admitted_total{limit}`: hits a global limit allowed in this process.
    pub admitted: IntCounterVec,
    /// `divvy_global_fallback`: 1 while the global store fails and conservative quotas decide.
    pub fallback: IntGauge,
    /// `divvy_global_renewals_total{result}`: lease renewals, ok or failed.
    pub renewals: IntCounterVec,
    /// `divvy_global_alive_timestamp_seconds`: last step of the lease task.
    pub alive: IntGauge,
}

/// The rule sources beside the policy file.
pub struct SourceMetrics {
    /// `divvy_aux_rules`: aux rules (from ZooKeeper) in force.
    pub aux_rules: IntGauge,
    /// `divvy_aux_rules_refused_total`: aux rule sets refused as invalid.
    pub aux_rules_refused: IntCounter,
    /// `divvy_aux_rules_source_up`: 1 while the aux rules' source (ZooKeeper) answers.
    pub aux_rules_source_up: IntGauge,
    /// `divvy_xds_updates_total{result}`: xDS updates `accepted` (ACKed) and
    /// `rejected` (NACKed, the previous set kept).
    pub xds_updates: IntCounterVec,
    /// `divvy_xds_stream_up`: 1 while the xDS stream to the control plane is open.
    pub xds_stream_up: IntGauge,
}

impl SourceMetrics {
    fn new(r: &Registry) -> SourceMetrics {
        let aux_rules_refused = IntCounter::new(
            "divvy_aux_rules_refused_total",
            "Aux rule sets refused as invalid (the previous ones stay)",
        )
        .expect("static metric definition");
        r.register(Box::new(aux_rules_refused.clone()))
            .expect("unique metric name");
        SourceMetrics {
            aux_rules: gauge(r, "divvy_aux_rules", "Aux rules (from ZooKeeper) in force"),
            aux_rules_refused,
            aux_rules_source_up: gauge(
                r,
                "divvy_aux_rules_source_up",
                "1 while the aux rules' source (ZooKeeper) answers",
            ),
            xds_updates: counter_vec(
                r,
                "divvy_xds_updates_total",
                "xDS updates of rate-limit configuration: accepted (ACKed) or rejected (NACKed; the previous set stays)",
                &["result"],
            ),
            xds_stream_up: gauge(
                r,
                "divvy_xds_stream_up",
                "1 while the xDS stream to the control plane is open",
            ),
        }
    }
}

/// Envoy's Rate Limit Quota Service.
pub struct RlqsMetrics {
    /// `divvy_rlqs_streams`: open RLQS streams.
    pub streams: IntGauge,
    /// `divvy_rlqs_buckets`: buckets of every open RLQS stream.
    pub buckets: IntGauge,
    /// `divvy_rlqs_reported_total{rule,outcome}`: requests Envoy reported as allowed or denied, by deciding rule.
    pub reported: IntCounterVec,
    /// `divvy_rlqs_assignments_total{kind}`: actions sent: token_bucket, allow_all, deny_all, abandon.
    pub assignments: IntCounterVec,
    /// `divvy_rlqs_allocated_timestamp_seconds`: last run of the RLQS allocation task.
    pub allocated: IntGauge,
    /// `divvy_rlqs_replica_renewals_total{result}`: renewals of this replica's shares through Redis (ok, failed).
    pub replica_renewals: IntCounterVec,
}

impl RlqsMetrics {
    fn new(r: &Registry) -> RlqsMetrics {
        RlqsMetrics {
            streams: gauge(r, "divvy_rlqs_streams", "Open RLQS streams"),
            buckets: gauge(r, "divvy_rlqs_buckets", "Buckets of every open RLQS stream"),
            reported: counter_vec(
                r,
                "divvy_rlqs_reported_total",
                "Requests Envoy's rate_limit_quota filter reported, by deciding rule and outcome (allowed, denied)",
                &["rule", "outcome"],
            ),
            replica_renewals: counter_vec(
                r,
                "divvy_rlqs_replica_renewals_total",
                "Renewals of this replica's shares of RLQS limits through Redis, by result (ok, failed)",
                &["result"],
            ),
            assignments: counter_vec(
                r,
                "divvy_rlqs_assignments_total",
                "RLQS bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon)",
                &["kind"],
            ),
            allocated: gauge(
                r,
                "divvy_rlqs_allocated_timestamp_seconds",
                "Last run of the RLQS allocation task (epoch seconds)",
            ),
        }
    }
}

/// Governors.
pub struct GovernorMetrics {
    /// `divvy_governor_measurement{rule}`: the last load a governor read (absent before the first).
    pub measurement: GaugeVec,
    /// `divvy_governor_output{rule}`: the creditLimit a governor last set.
    pub output: GaugeVec,
    /// `divvy_governor_setpoint{rule}`: the load a governor holds.
    pub setpoint: GaugeVec,
    /// `divvy_governor_breaker_open{rule}`: 1 while a governor's breaker is open.
    pub breaker_open: GaugeVec,
    /// `divvy_governor_leader{rule}`: 1 while this replica holds the governor's lease (it governs), 0 while idle.
    pub leader: GaugeVec,
    /// `divvy_governor_queries_total{rule,result}`: Prometheus queries by result (ok, error, empty, stale, nan).
    pub queries: IntCounterVec,
}

impl StoreMetrics {
    fn new(r: &Registry) -> StoreMetrics {
        let ready = gauge(
            r,
            "divvy_store_ready",
            "1 while the configured counter store is in use, 0 while a failure policy decides",
        );
        ready.set(1);
        StoreMetrics {
            counters: gauge(
                r,
                "divvy_counters",
                "Live counters in the memory store (as of its last sweep)",
            ),
            counters_evicted: counter(
                r,
                "divvy_counters_evicted_total",
                "Counters the memory store evicted (least recently used first) to stay under --max-counters",
            ),
            memory_budget: gauge(
                r,
                "divvy_memory_budget_bytes",
                "The memory limit in force (--memory-limit or the cgroup's; 0: none)",
            ),
            max_counters: gauge(
                r,
                "divvy_max_counters",
                "The memory store's cap in force: the lesser of --max-counters and what the memory budget holds",
            ),
            over_limit_cache_hits: counter(
                r,
                "divvy_over_limit_cache_hits_total",
                "Counters known to be over their limit answered by the over-limit cache, without a call to Redis",
            ),
            errors: counter(
                r,
                "divvy_store_errors_total",
                "Failed counter store calls",
            ),
            duration: histogram(
                r,
                "divvy_store_duration_seconds",
                "Time of one counter store call",
            ),
            failure_activations: counter_vec(
                r,
                "divvy_failure_policy_activations_total",
                "Times the store circuit breaker opened",
                &["policy"],
            ),
            failure_decisions: counter_vec(
                r,
                "divvy_failure_policy_decisions_total",
                "Counters decided by the failure policy, by policy and reason",
                &["policy", "reason"],
            ),
            failures: counter_vec(
                r,
                "divvy_store_failures_total",
                "Counter store calls that failed, timed out, missed the caller's deadline or were abandoned",
                &["reason"],
            ),
            breaker_state: gauge(
                r,
                "divvy_store_breaker_state",
                "The counter store's circuit breaker: 0 closed, 1 open, 2 half-open",
            ),
            ready,
        }
    }
}

impl GlobalMetrics {
    fn new(r: &Registry) -> GlobalMetrics {
        GlobalMetrics {
            lease: {
                let g = GaugeVec::new(
                    Opts::new(
                        "divvy_global_lease_rate",
                        "This region's leased rate of a global limit (credits per second)",
                    ),
                    &["limit"],
                )
                .expect("static metric definition");
                r.register(Box::new(g.clone())).expect("unique metric name");
                g
            },
            demand: {
                let g = GaugeVec::new(
                    Opts::new(
                        "divvy_global_demand_rate",
                        "This region's demand on a global limit (credits per second)",
                    ),
                    &["limit"],
                )
                .expect("static metric definition");
                r.register(Box::new(g.clone())).expect("unique metric name");
                g
            },
            admitted: counter_vec(
                r,
                "divvy_global_admitted_total",
                "Hits a global limit allowed in this process",
                &["limit"],
            ),
            fallback: gauge(
                r,
                "divvy_global_fallback",
                "1 while the global store fails and conservative quotas decide",
            ),
            renewals: counter_vec(
                r,
                "divvy_global_renewals_total",
                "Lease renewals against the global store by result",
                &["result"],
            ),
            alive: gauge(
                r,
                "divvy_global_alive_timestamp_seconds",
                "Unix time of the last step of the global lease task",
            ),
        }
    }
}

impl GovernorMetrics {
    fn new(r: &Registry) -> GovernorMetrics {
        GovernorMetrics {
            measurement: gauge_vec(
                r,
                "divvy_governor_measurement",
                "The last load a governor read from Prometheus",
                &["rule"],
            ),
            output: gauge_vec(
                r,
                "divvy_governor_output",
                "The creditLimit a governor last set",
                &["rule"],
            ),
            setpoint: gauge_vec(
                r,
                "divvy_governor_setpoint",
                "The load a governor holds",
                &["rule"],
            ),
            breaker_open: gauge_vec(
                r,
                "divvy_governor_breaker_open",
                "1 while a governor's circuit breaker is open",
                &["rule"],
            ),
            leader: gauge_vec(
                r,
                "divvy_governor_leader",
                "1 while this replica holds a governor's lease and governs; 0 while it is idle",
                &["rule"],
            ),
            queries: counter_vec(
                r,
                "divvy_governor_queries_total",
                "A governor's Prometheus queries by result (ok, error, empty, stale, nan)",
                &["rule", "result"],
            ),
        }
    }
}

/// TLS on the gRPC and admin ports (`port`: grpc or http); exported only
/// for a port that serves TLS.
pub struct TlsMetrics {
    /// `divvy_tls_cert_expiry_seconds{port}`: seconds until the served certificate's notAfter.
    pub expiry: GaugeVec,
    /// `divvy_tls_reloads_total{port}`: certificate and key pairs reloaded after a change.
    pub reloads: IntCounterVec,
    /// `divvy_tls_reload_errors_total{port}`: changed files refused (the pair in force stays).
    pub reload_errors: IntCounterVec,
    /// `divvy_tls_handshake_failures_total{port,reason}`: connections closed before
    /// TLS was up; reason error, timeout or limit.
    pub handshake_failures: IntCounterVec,
    /// `divvy_tls_checked_timestamp_seconds{port}`: last time the files were polled.
    pub checked: GaugeVec,
}

impl TlsMetrics {
    fn new(r: &Registry) -> TlsMetrics {
        TlsMetrics {
            expiry: gauge_vec(
                r,
                "divvy_tls_cert_expiry_seconds",
                "Seconds until the served TLS certificate expires",
                &["port"],
            ),
            reloads: counter_vec(
                r,
                "divvy_tls_reloads_total",
                "TLS certificate and key pairs reloaded after their files changed",
                &["port"],
            ),
            reload_errors: counter_vec(
                r,
                "divvy_tls_reload_errors_total",
                "Changed TLS files refused (unreadable, unparsable or mismatched); the pair in force stays",
                &["port"],
            ),
            handshake_failures: counter_vec(
                r,
                "divvy_tls_handshake_failures_total",
                "Connections closed before their TLS handshake completed, by reason (error, timeout, limit)",
                &["port", "reason"],
            ),
            checked: gauge_vec(
                r,
                "divvy_tls_checked_timestamp_seconds",
                "Unix time the TLS files were last polled for changes",
                &["port"],
            ),
        }
    }

    /// Sets `divvy_tls_cert_expiry_seconds{port}` from a notAfter in Unix seconds.
    pub fn set_expiry(&self, port: &str, not_after: i64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.expiry
            .with_label_values(&[port])
            .set((not_after - now) as f64);
    }

    /// Counts a connection closed before its handshake completed.
    pub fn handshake_failed(&self, port: &str, reason: &str) {
        self.handshake_failures
            .with_label_values(&[port, reason])
            .inc();
    }
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
            admin_auth_failures: {
                let c = counter_vec(
                    &r,
                    "divvy_admin_auth_failures_total",
                    "Admin API requests refused for their token, by reason: missing, wrong, read_only (the read token on a knob change)",
                    &["reason"],
                );
                for reason in AUTH_FAILURE_REASONS {
                    c.with_label_values(&[reason]);
                }
                c
            },
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
            rejected: {
                let c = counter_vec(
                    &r,
                    "divvy_rejected_total",
                    "Requests, connections and counters refused to keep work and memory bounded, by reason",
                    &["reason"],
                );
                for reason in REJECT_REASONS {
                    c.with_label_values(&[reason]);
                }
                c
            },
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
}

impl HitStatus {
    /// divvy's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            HitStatus::Accepted => "accepted",
            HitStatus::Rejected => "rejected",
            HitStatus::CanaryAccepted => "canary-accepted",
            HitStatus::CanaryRejected => "canary-rejected",
        }
    }
}

static METRICS: LazyLock<Arc<Metrics>> = LazyLock::new(|| Arc::new(Metrics::new()));

/// The process's metrics (what records is handed them where it can be:
/// [`crate::observe::telemetry::Telemetry`]).
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// The process's metrics, shared.
pub fn process_metrics() -> Arc<Metrics> {
    METRICS.clone()
}
