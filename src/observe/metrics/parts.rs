//! The metrics of each part of the service beside the decision: the
//! store and its breaker, global leases, governors, rule sources, RLQS, TLS.

use prometheus::{GaugeVec, Histogram, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::build::{counter, counter_vec, counter_vec_of, gauge, gauge_vec, histogram};

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
    /// `divvy_shed_total{reason}`: requests answered at once by the failure
    /// policy because they waited too long for their turn (`queue`) or past
    /// their caller's deadline (`deadline`) before being handled.
    pub shed: IntCounterVec,
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
    pub(super) fn new(r: &Registry) -> SourceMetrics {
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
    pub(super) fn new(r: &Registry) -> RlqsMetrics {
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
    pub(super) fn new(r: &Registry) -> StoreMetrics {
        let ready = gauge(
            r,
            "divvy_store_ready",
            "1 while the configured counter store is in use, 0 while a failure policy decides",
        );
        ready.set(1);
        StoreMetrics {
            shed: counter_vec_of(
                r,
                "divvy_shed_total",
                "Requests answered at once by the failure policy, without deciding, because they waited past their caller's deadline (less the margin) before being handled, by reason",
                "reason",
                &super::SHED_REASONS,
            ),
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
    pub(super) fn new(r: &Registry) -> GlobalMetrics {
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
    pub(super) fn new(r: &Registry) -> GovernorMetrics {
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
    pub(super) fn new(r: &Registry) -> TlsMetrics {
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
