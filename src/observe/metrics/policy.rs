//! The policy's own figures: each rule's configured limit, and what
//! `overdraft: true` limits charged past what was left.

use prometheus::{GaugeVec, IntCounterVec, Registry};

use super::build::{counter_vec, gauge_vec};

/// Rules' configured limits and overdraft charges.
#[derive(Clone)]
pub struct PolicyMetrics {
    /// `divvy_overdraft_charged_total{rule}`: credits an `overdraft: true`
    /// limit charged past what was left (new debt), by rule label.
    pub overdraft_charged: IntCounterVec,
    /// `divvy_rule_limit{rule}`: each divvy rule's configured `creditLimit`
    /// (its first limit's), by rule name; set when a rule set is installed.
    pub rule_limit: GaugeVec,
    /// `divvy_rule_limit_window_seconds{rule}`: that limit's `resetSeconds`.
    pub rule_window: GaugeVec,
}

impl PolicyMetrics {
    pub(super) fn new(r: &Registry) -> PolicyMetrics {
        PolicyMetrics {
            overdraft_charged: counter_vec(
                r,
                "divvy_overdraft_charged_total",
                "Credits overdraft limits charged past what was left, by rule label",
                &["rule"],
            ),
            rule_limit: gauge_vec(
                r,
                "divvy_rule_limit",
                "Each divvy rule's configured creditLimit (its first limit's), by rule name",
                &["rule"],
            ),
            rule_window: gauge_vec(
                r,
                "divvy_rule_limit_window_seconds",
                "The resetSeconds of each divvy rule's first limit, by rule name",
                &["rule"],
            ),
        }
    }
}
