//! What limit decides a descriptor, without counting it: the question a
//! protocol that enforces elsewhere (Envoy's Rate Limit Quota Service) asks,
//! answered by the same rules, trees and knobs that decide ShouldRateLimit.

use crate::config::LimitSpec;
use crate::knobs::Knobs;
use crate::rules::{Operation, RuleSet};

use super::engine::{Choice, Engine};
use super::{knob_for, Limiter};

/// One limit of the deciding rule, as a rate its claimants divide.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRate {
    /// The limit's counter (the rule's key for this descriptor's actor):
    /// descriptors with the same key share one rate.
    pub key: String,
    /// Credits per second. Window, fixed and sliding limits are given as
    /// the token bucket of the same average rate.
    pub rate: f64,
    /// Bucket capacity: a token bucket's burst, else the limit itself.
    pub burst: u64,
    /// The limit in words (`20 per 1s`), knobs applied.
    pub describe: String,
}

/// The limit that decides a descriptor.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketLimit {
    /// No rule and no tree limit applies (or nothing is loaded): no limit.
    NoLimit,
    /// An always-allow rule or an unlimited tree limit (or a shadow one).
    AllowAll {
        /// The deciding rule's name.
        rule: String,
    },
    /// A limit of 0 (as written or set by a knob): every hit is denied.
    DenyAll {
        /// The deciding rule's name.
        rule: String,
    },
    /// Counted limits; a hit needs every one of them.
    Rates {
        /// The deciding rule's name.
        rule: String,
        /// Each counted limit (always-allowed ones left out).
        rates: Vec<BucketRate>,
    },
}

impl BucketLimit {
    /// The deciding rule's name (empty for no limit).
    pub fn rule(&self) -> &str {
        match self {
            BucketLimit::NoLimit => "",
            BucketLimit::AllowAll { rule }
            | BucketLimit::DenyAll { rule }
            | BucketLimit::Rates { rule, .. } => rule,
        }
    }
}

impl Limiter {
    /// The limit that decides descriptor `entries` of `domain` under the
    /// rules and knobs in force, without touching a counter: the engine
    /// that would decide it is asked. Canaries never decide and are left
    /// out; a request's own override does not exist here. A `scope:
    /// global` limit is given at its full rate.
    pub fn bucket_limit(&self, domain: &str, entries: &[(&str, &str)]) -> BucketLimit {
        let rules = self.rules();
        match Choice::of(&rules, Some(domain)) {
            Choice::Tree(tree) => self.tree(tree).bucket(domain, entries),
            Choice::Divvy => self.divvy(&rules).bucket(domain, entries),
            Choice::NoRules | Choice::NoConfig => BucketLimit::NoLimit,
        }
    }
}

/// The limit the divvy rules give one descriptor.
pub(super) fn divvy_limit(
    rules: &RuleSet,
    knobs: &Knobs,
    domain: &str,
    entries: &[(&str, &str)],
) -> BucketLimit {
    let op = Operation::from_pairs(entries.iter().copied());
    let plan = rules.plan(Some(domain), &op);
    let rule = rules.rule(plan.decider);
    let name = rule.name().to_owned();
    let knobs = knobs.any().then_some(knobs);
    let mut rates = Vec::with_capacity(rule.spec.limits.len());
    for (i, own) in rule.spec.limits.iter().enumerate() {
        let limit = match knobs.and_then(|k| knob_for(k, &rule.spec, i)) {
            Some(knob) => knob.apply(own),
            None => own.clone(),
        };
        if limit.credit_limit == 0 {
            return BucketLimit::DenyAll { rule: name };
        }
        if limit.reset_seconds == 0 {
            continue;
        }
        rates.push(BucketRate {
            key: rule.counter_key(&op, own),
            rate: limit.credit_limit as f64 / limit.reset_seconds as f64,
            burst: burst_of(&limit),
            describe: limit.describe(),
        });
    }
    if rates.is_empty() {
        BucketLimit::AllowAll { rule: name }
    } else {
        BucketLimit::Rates { rule: name, rates }
    }
}

/// A limit's bucket capacity: a token bucket's burst; a window's limit.
fn burst_of(limit: &LimitSpec) -> u64 {
    if limit.algorithm.spec().has_burst {
        limit.burst.max(1)
    } else {
        limit.credit_limit.max(1)
    }
}

/// The limit an envoyproxy/ratelimit tree gives one descriptor; its key
/// starts with `prefix` (`CACHE_KEY_PREFIX`).
pub(super) fn tree_limit(
    tree: &crate::rules::descriptor_tree::DomainTree,
    entries: &[(&str, &str)],
    prefix: &str,
) -> BucketLimit {
    let Some(m) = tree.find(entries) else {
        return BucketLimit::NoLimit;
    };
    let Some(limit) = m.node.limit.clone() else {
        return BucketLimit::NoLimit;
    };
    // The node as written, not the stats key (which may carry request
    // values): the name is a metric label.
    let rule = if limit.name.is_empty() {
        format!("{}.{}", tree.domain(), m.node.composite())
    } else {
        limit.name.clone()
    };
    // A shadow limit never denies.
    if limit.unlimited || m.node.shadow_mode {
        return BucketLimit::AllowAll { rule };
    }
    if limit.requests_per_unit == 0 {
        return BucketLimit::DenyAll { rule };
    }
    let unit = limit
        .unit
        .unwrap_or(crate::config::envoy_ratelimit::EnvoyUnit::Second);
    let mut key = format!("{prefix}divvy-rl:{}", tree.domain());
    for (k, v) in &m.counter_path {
        key.push(':');
        crate::rules::bounded::push_value(&mut key, k);
        key.push('=');
        crate::rules::bounded::push_value(&mut key, v);
    }
    BucketLimit::Rates {
        rates: vec![BucketRate {
            key,
            rate: f64::from(limit.requests_per_unit) / unit.seconds() as f64,
            burst: u64::from(limit.requests_per_unit),
            describe: format!("{} per {}", limit.requests_per_unit, unit.as_str()),
        }],
        rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_str, Format};
    use crate::knobs::{Knob, Knobs};
    use crate::rules::RuleSet;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    const POLICY: &str = r#"
overrides:
  - operation: {user: zero}
    creditLimit: 0
  - operation: {user: free}
    creditLimit: 1
    resetSeconds: 0
  - operation: {user: "*"}
    label: per-user
    creditLimit: 20
    resetSeconds: 1
    actorField: user
    algorithm: token_bucket
    burst: 40
  - operation: {team: "*"}
    limits:
      - {creditLimit: 600, resetSeconds: 60, label: team-minute, actorField: team}
      - {creditLimit: 1000, resetSeconds: 3600, algorithm: sliding, actorField: team}
default: {creditLimit: 5, resetSeconds: 0}
"#;

    fn limiter(knobs: Arc<Knobs>) -> Limiter {
        let policy = parse_str(POLICY, Format::Yaml, "t.yaml").unwrap();
        Limiter::with_knobs(RuleSet::new(policy), Arc::new(MemoryStore::new()), knobs)
    }

    #[tokio::test]
    async fn each_kind_of_rule_becomes_a_bucket_limit_and_knobs_apply() {
        let knobs = Arc::new(Knobs::local(Arc::new(
            crate::observe::metrics::Metrics::new(),
        )));
        let l = limiter(knobs.clone());
        assert!(matches!(
            l.bucket_limit("d", &[("user", "zero")]),
            BucketLimit::DenyAll { .. }
        ));
        assert!(matches!(
            l.bucket_limit("d", &[("user", "free")]),
            BucketLimit::AllowAll { .. }
        ));
        assert!(matches!(
            l.bucket_limit("d", &[("other", "x")]),
            BucketLimit::AllowAll { .. }
        ));
        let BucketLimit::Rates { rule, rates } = l.bucket_limit("d", &[("user", "a")]) else {
            panic!("per-user rule");
        };
        assert_eq!(rule, "per-user");
        assert_eq!((rates[0].rate, rates[0].burst), (20.0, 40));
        let b = l.bucket_limit("d", &[("user", "b")]);
        let BucketLimit::Rates { rates: rb, .. } = b else {
            panic!("per-user rule");
        };
        assert_ne!(
            rates[0].key, rb[0].key,
            "each user has a counter of its own"
        );
        // A window is the token bucket of the same average rate, its limit as burst.
        let BucketLimit::Rates { rates, .. } = l.bucket_limit("d", &[("team", "t")]) else {
            panic!("team rule");
        };
        assert_eq!(rates.len(), 2);
        assert_eq!((rates[0].rate, rates[0].burst), (10.0, 600));
        assert!((rates[1].rate - 1000.0 / 3600.0).abs() < 1e-12);
        let stop = Knob::credit_limit(0);
        knobs.set("per-user", stop).await.unwrap();
        assert!(matches!(
            l.bucket_limit("d", &[("user", "a")]),
            BucketLimit::DenyAll { .. }
        ));
    }

    #[test]
    fn an_envoyproxy_ratelimit_tree_decides_its_domain() {
        let yaml = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 120}\n  - key: zero\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: free\n    rate_limit: {unlimited: true}\n";
        let mut policy = crate::config::no_policy().unwrap();
        policy.envoy = vec![Arc::new(
            crate::config::envoy_ratelimit::parse("edge.yaml", yaml).unwrap(),
        )];
        let l = Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()));
        let BucketLimit::Rates { rates, .. } = l.bucket_limit("edge", &[("user", "a")]) else {
            panic!("the user limit");
        };
        assert_eq!((rates[0].rate, rates[0].burst), (2.0, 120));
        assert_eq!(l.bucket_limit("edge", &[("user", "a")]).rule(), "edge.user");
        assert!(matches!(
            l.bucket_limit("edge", &[("zero", "x")]),
            BucketLimit::DenyAll { .. }
        ));
        assert!(matches!(
            l.bucket_limit("edge", &[("free", "x")]),
            BucketLimit::AllowAll { .. }
        ));
        assert_eq!(
            l.bucket_limit("edge", &[("other", "x")]),
            BucketLimit::NoLimit
        );
        assert_eq!(
            l.bucket_limit("elsewhere", &[("user", "a")]),
            BucketLimit::NoLimit
        );
    }
}
