//! The one record step every engine shares: the request's counters,
//! dashboard history and offenders, and its latency.

use std::time::Duration;

use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::observe::metrics::{HitStatus, Metrics};
use crate::observe::recorder::Recorder;
use crate::observe::telemetry::Telemetry;
use crate::rules::RuleSet;

/// What one outcome adds to the metrics and the dashboard.
pub(super) enum Tally {
    /// A divvy rule's outcome for a hit.
    Rule {
        /// The rule's index in the rule set.
        rule: usize,
        /// Canary (never decides) or deciding rule.
        canary: bool,
        /// A shadow rule that would have denied the hit (and allowed it).
        shadow: bool,
        /// Whether the rule allowed the hit.
        allowed: bool,
        /// The hit's credits.
        cost: u64,
        /// A denied hit's actor, bounded as its counter key keeps it.
        actor: String,
    },
    /// An envoyproxy/ratelimit limit's outcome for a descriptor.
    Tree(TreeTally),
}

/// What an envoyproxy/ratelimit limit's outcome adds.
pub(super) struct TreeTally {
    /// The limit's stats key (`<domain>.<key_value path>`).
    pub(super) stats_key: String,
    /// The limit, for the dashboard's description of it.
    pub(super) requests_per_unit: u32,
    /// Its unit.
    pub(super) unit: EnvoyUnit,
    /// Whether the descriptor was within the limit.
    pub(super) allowed: bool,
    /// A shadow limit (counted over, never denying).
    pub(super) shadow: bool,
    /// The descriptor's hits.
    pub(super) cost: u64,
    /// Of them, those past the near-limit share.
    pub(super) near: u64,
    /// A denied descriptor's entries as counted (`k=v,...`).
    pub(super) actor: String,
}

/// Counts every tally, then the request's time to decide (`decided`, for
/// `descriptors` hits: each is one hit, timed as its request), stamped
/// with the second of `at` (the decision's own clock read).
pub(super) fn record(
    telemetry: &Telemetry,
    rules: &RuleSet,
    tallies: &[Tally],
    (at, decided): (std::time::Instant, Duration),
    descriptors: usize,
) {
    let (m, board) = (&*telemetry.metrics, &*telemetry.recorder);
    let now = board.second_at(at);
    for tally in tallies {
        match tally {
            Tally::Rule {
                rule,
                canary,
                shadow,
                allowed,
                cost,
                actor,
            } => {
                let rule = rules.rule(*rule);
                let Some(t) = rule.telemetry() else {
                    continue;
                };
                let label = rule.spec.label.as_deref();
                let (status, i) = match (canary, allowed) {
                    (false, true) => (HitStatus::Accepted, 0),
                    (false, false) => (HitStatus::Rejected, 1),
                    (true, true) => (HitStatus::CanaryAccepted, 2),
                    (true, false) => (HitStatus::CanaryRejected, 3),
                };
                t.counters.hits[i].inc();
                m.hit_statsd(status, label);
                if *shadow {
                    // envoyproxy/ratelimit's stat name for a shadow denial.
                    // (Looked up here: only shadow rules have this series.)
                    m.hit(HitStatus::Shadow, label);
                    t.stats.shadow_denied();
                }
                if !canary {
                    t.counters.decisions[i].inc();
                    board.record(now, &t.stats, *allowed, actor, *cost);
                    tracing::debug!(
                        rule = %rule.spec,
                        comment = rule.spec.comment.as_deref().unwrap_or(""),
                        allowed,
                        "decided"
                    );
                }
            }
            Tally::Tree(t) => tree(m, board, t, now),
        }
    }
    m.hit_times(decided, descriptors);
}

/// An envoyproxy/ratelimit limit's stats (envoyproxy/ratelimit's names)
/// and its dashboard history.
fn tree(m: &Metrics, board: &Recorder, t: &TreeTally, now: u64) {
    let TreeTally {
        stats_key,
        requests_per_unit,
        unit,
        allowed,
        shadow,
        cost,
        near,
        actor,
    } = t;
    let key = m.envoy_stats_key(stats_key);
    let add = |stat: &str, n: u64| {
        if n > 0 {
            m.envoy_stats.with_label_values(&[key, stat]).inc_by(n);
        }
    };
    add("total_hits", *cost);
    if *allowed {
        add("within_limit", *cost);
        add("near_limit", *near);
    } else {
        add("over_limit", *cost);
        if *shadow {
            add("shadow_mode", *cost);
        }
    }
    let describe = || {
        format!(
            "{requests_per_unit} per {}",
            unit.as_str().to_ascii_lowercase()
        )
    };
    if let Some(stats) = board.envoy_limit(stats_key, describe) {
        board.record(now, &stats, *allowed || *shadow, actor, *cost);
    }
}
