//! Applies match plans to counters: the one core every protocol calls.
//!
//! [`Limiter::check`] takes a request's descriptors (each an [`Operation`]
//! with a cost), finds each one's canaries and deciding rule, sends every
//! counter the request touches to the store in a single call, and returns a
//! [`Decision`] per descriptor. Protocol adapters only translate in and out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::metrics::{metrics, HitStatus};

use crate::rules::{Operation, RuleSet};
use crate::store::{Algorithm, CounterOp, Store, StoreError};

/// A limit that replaces the deciding rule's own (Envoy's `RateLimitOverride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Credits per window.
    pub credit_limit: u64,
    /// Window in seconds.
    pub reset_seconds: u64,
}

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The key/value pairs.
    pub operation: Operation,
    /// Credits to take; 0 checks without consuming.
    pub cost: u64,
    /// Give the credits back instead of taking them.
    pub refund: bool,
    /// A limit to use instead of the deciding rule's.
    pub limit_override: Option<LimitOverride>,
}

impl Hit {
    /// A hit of one credit with no override.
    pub fn one(operation: Operation) -> Hit {
        Hit {
            operation,
            cost: 1,
            refund: false,
            limit_override: None,
        }
    }
}

/// When a rule's credit comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// creditLimit 0: never (divvy answers `-1`).
    Never,
    /// Always allowed (resetSeconds 0): nothing to reset (divvy answers `0`).
    Unlimited,
    /// The open window ends after this long.
    After(Duration),
}

/// What one rule said about one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Index of the rule in the rule set.
    pub rule: usize,
    /// Whether the hit was allowed (and its credits taken).
    pub allowed: bool,
    /// Credits left.
    pub remaining: u64,
    /// The limit applied (the override's, if any).
    pub credit_limit: u64,
    /// The window applied, in seconds.
    pub reset_seconds: u64,
    /// When credit comes back.
    pub reset: Reset,
    /// The counter touched, if any (none for always-allow and always-deny).
    pub counter_key: Option<String>,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The deciding rule's outcome.
    pub decider: Outcome,
    /// The canary rules that ran, in order; they never decide.
    pub canaries: Vec<Outcome>,
}

/// The answers for a request, with the rule set they were decided by.
#[derive(Debug)]
pub struct Decisions {
    /// The rule set in force when the request was decided.
    pub rules: Arc<RuleSet>,
    /// One decision per descriptor, in request order.
    pub items: Vec<Decision>,
}

/// The rate limiter: the current rule set and a counter store.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Arc<dyn Store>,
}

impl Limiter {
    /// A limiter over `rules` and `store`.
    pub fn new(rules: RuleSet, store: Arc<dyn Store>) -> Limiter {
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            store,
        }
    }

    /// The rule set in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// Installs a new rule set in one atomic step; requests in flight finish on the old one.
    pub fn install(&self, rules: RuleSet) {
        self.rules.store(Arc::new(rules));
    }

    /// The counter store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Decides and charges every descriptor of one request, in order.
    ///
    /// `domain` is the Envoy domain, or `None` for a line-protocol HIT.
    pub async fn check(&self, domain: Option<&str>, hits: &[Hit]) -> Result<Decisions, StoreError> {
        let started = Instant::now();
        let rules = self.rules.load_full();
        let mut items = Vec::with_capacity(hits.len());
        let mut ops = Vec::new();
        // For each outcome that needs a counter: (descriptor, canary index or None).
        let mut slots: Vec<(usize, Option<usize>)> = Vec::new();
        for (d, hit) in hits.iter().enumerate() {
            let plan = rules.plan(domain, &hit.operation);
            let mut canaries = Vec::with_capacity(plan.canaries.len());
            for (c, &rule) in plan.canaries.iter().enumerate() {
                let spec = &rules.rule(rule).spec;
                let (outcome, op) =
                    prepare(&rules, rule, hit, spec.credit_limit, spec.reset_seconds);
                if let Some(op) = op {
                    ops.push(op);
                    slots.push((d, Some(c)));
                }
                canaries.push(outcome);
            }
            let spec = &rules.rule(plan.decider).spec;
            let (limit, reset) = match hit.limit_override {
                Some(o) => (o.credit_limit, o.reset_seconds),
                None => (spec.credit_limit, spec.reset_seconds),
            };
            let (decider, op) = prepare(&rules, plan.decider, hit, limit, reset);
            if let Some(op) = op {
                ops.push(op);
                slots.push((d, None));
            }
            items.push(Decision { decider, canaries });
        }
        if !ops.is_empty() {
            let store_started = Instant::now();
            let applied = self.store.apply(&ops).await;
            metrics()
                .store_duration
                .observe(store_started.elapsed().as_secs_f64());
            let states = applied.inspect_err(|_| metrics().store_errors.inc())?;
            if states.len() != ops.len() {
                return Err(StoreError::Unavailable(format!(
                    "store answered {} counters for {} asked",
                    states.len(),
                    ops.len()
                )));
            }
            for (((d, canary), state), op) in slots.into_iter().zip(states).zip(ops) {
                let outcome = match canary {
                    Some(c) => &mut items[d].canaries[c],
                    None => &mut items[d].decider,
                };
                outcome.counter_key = Some(op.key);
                outcome.allowed = state.allowed;
                outcome.remaining = state.remaining;
                outcome.reset = Reset::After(state.reset_after);
            }
        }
        record(&rules, &items);
        // Each descriptor (each line-protocol HIT) is one hit, timed as its request.
        let elapsed = started.elapsed();
        for _ in &items {
            metrics().hit_time(elapsed);
        }
        Ok(Decisions { rules, items })
    }
}

/// Counts every outcome in the metrics, and logs the deciding rule's comment at debug level.
fn record(rules: &RuleSet, items: &[Decision]) {
    let m = metrics();
    for item in items {
        for c in &item.canaries {
            let status = if c.allowed {
                HitStatus::CanaryAccepted
            } else {
                HitStatus::CanaryRejected
            };
            m.hit(status, rules.rule(c.rule).spec.label.as_deref());
        }
        let spec = &rules.rule(item.decider.rule).spec;
        let (status, code) = if item.decider.allowed {
            (HitStatus::Accepted, "ok")
        } else {
            (HitStatus::Rejected, "over_limit")
        };
        m.hit(status, spec.label.as_deref());
        m.decisions
            .with_label_values(&[
                spec.domain.as_deref().unwrap_or(""),
                spec.label.as_deref().unwrap_or(""),
                code,
            ])
            .inc();
        tracing::debug!(
            rule = %spec,
            comment = spec.comment.as_deref().unwrap_or(""),
            allowed = item.decider.allowed,
            remaining = item.decider.remaining,
            "decided"
        );
    }
}

/// The outcome skeleton for `rule` and, when a counter is involved, its op.
fn prepare(
    rules: &RuleSet,
    rule: usize,
    hit: &Hit,
    credit_limit: u64,
    reset_seconds: u64,
) -> (Outcome, Option<CounterOp>) {
    let mut outcome = Outcome {
        rule,
        allowed: false,
        remaining: 0,
        credit_limit,
        reset_seconds,
        reset: Reset::Never,
        counter_key: None,
    };
    if credit_limit == 0 {
        return (outcome, None);
    }
    if reset_seconds == 0 {
        outcome.allowed = true;
        outcome.remaining = credit_limit;
        outcome.reset = Reset::Unlimited;
        return (outcome, None);
    }
    let key = rules
        .rule(rule)
        .counter_key(&hit.operation, credit_limit, reset_seconds);
    let op = CounterOp {
        key,
        limit: credit_limit,
        window: Duration::from_secs(reset_seconds),
        cost: hit.cost,
        refund: hit.refund,
        algorithm: Algorithm::DivvyWindow,
    };
    (outcome, Some(op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_str, Format};
    use crate::store::MemoryStore;

    const POLICY: &str = r#"
overrides:
  - operation: {path: /canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 60
  - operation: {path: "/c*"}
    creditLimit: 2
    resetSeconds: 60
    actorField: ip
  - operation: {path: /deny}
    creditLimit: 0
  - operation: {path: /free}
    creditLimit: 5
    resetSeconds: 0
default: {creditLimit: 100, resetSeconds: 60}
"#;

    fn limiter() -> Limiter {
        let policy = parse_str(POLICY, Format::Yaml, "t.yaml").unwrap();
        Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()))
    }

    fn hit(pairs: &[(&str, &str)]) -> Hit {
        Hit::one(Operation::from_pairs(pairs.iter().copied()))
    }

    async fn one(l: &Limiter, pairs: &[(&str, &str)]) -> Decision {
        let mut d = l.check(None, &[hit(pairs)]).await.unwrap();
        d.items.remove(0)
    }

    #[tokio::test]
    async fn canary_counts_but_never_decides() {
        let l = limiter();
        for i in 0..2 {
            let d = one(&l, &[("path", "/canary"), ("ip", "a")]).await;
            assert!(d.decider.allowed);
            assert_eq!(d.decider.rule, 1);
            assert_eq!(d.canaries.len(), 1);
            assert_eq!(d.canaries[0].allowed, i == 0);
        }
        assert!(
            !one(&l, &[("path", "/canary"), ("ip", "a")])
                .await
                .decider
                .allowed
        );
        // Another actor has its own counter.
        assert!(
            one(&l, &[("path", "/canary"), ("ip", "b")])
                .await
                .decider
                .allowed
        );
    }

    #[tokio::test]
    async fn always_deny_and_always_allow_touch_no_counter() {
        let l = limiter();
        let d = one(&l, &[("path", "/deny")]).await;
        assert_eq!(
            (d.decider.allowed, d.decider.remaining, d.decider.reset),
            (false, 0, Reset::Never)
        );
        for _ in 0..10 {
            let d = one(&l, &[("path", "/free")]).await;
            assert_eq!(
                (d.decider.allowed, d.decider.remaining, d.decider.reset),
                (true, 5, Reset::Unlimited)
            );
            assert!(d.decider.counter_key.is_none());
        }
    }

    #[tokio::test]
    async fn override_gets_its_own_counter() {
        let l = limiter();
        let mut h = hit(&[("path", "/x")]);
        h.limit_override = Some(LimitOverride {
            credit_limit: 1,
            reset_seconds: 60,
        });
        let d = l.check(None, &[h.clone(), h]).await.unwrap();
        assert!(d.items[0].decider.allowed);
        assert!(!d.items[1].decider.allowed);
        assert_eq!(
            d.items[1].decider.counter_key.as_deref(),
            Some("divvy:::1:60")
        );
        // The default's own counter is untouched.
        assert_eq!(one(&l, &[("path", "/x")]).await.decider.remaining, 99);
    }
}
