//! Applies match plans to counters: the one core every protocol calls.
//!
//! [`Limiter::check`] takes a request's descriptors (each an [`Operation`]
//! with a cost), finds each one's canaries and deciding rule, sends every
//! counter the request touches to the store in a single call, and returns a
//! [`Decision`] per descriptor. Protocol adapters only translate in and out.

mod bucket;
mod domain;
pub mod envoy;
mod plan;

pub use bucket::{BucketLimit, BucketRate};
pub use domain::{Descriptor, Verdict};

pub use plan::{counter_op, knob_for};
use plan::{Planner, Prepared};

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::observe::metrics::{metrics, HitStatus};
use crate::observe::recorder::recorder;

use crate::global::Global;
use crate::knobs::Knobs;
use crate::rules::{Operation, Rule, RuleSet};
use crate::store::{Algorithm, Charge, CounterOp, CounterState, Store, StoreError};

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
    /// Allowed: the counter is full again after this long (window over,
    /// bucket full). Denied: the same hit would be allowed after this long.
    After(Duration),
}

/// What one limit of a rule said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitOutcome {
    /// Index of the limit in the rule's limits.
    pub limit: usize,
    /// Whether this limit allows the hit.
    pub allowed: bool,
    /// Credits left in it.
    pub remaining: u64,
    /// Its creditLimit (the override's, if any).
    pub credit_limit: u64,
    /// Its window in seconds.
    pub reset_seconds: u64,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// When its credit comes back.
    pub reset: Reset,
    /// Its counter, if any (none for always-allow and always-deny).
    pub counter_key: Option<String>,
    /// Whether it is counted against this region's lease of a global limit.
    pub global: bool,
}

/// What one rule said about one descriptor: the limit that speaks for the
/// rule (allowed: the one with the fewest credits left; denied: the denying
/// one with the longest wait), and every limit when the rule has several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Index of the rule in the rule set.
    pub rule: usize,
    /// Whether the hit was allowed (every limit allowed it).
    pub allowed: bool,
    /// Credits left: the smallest of the rule's limits.
    pub remaining: u64,
    /// The speaking limit's creditLimit (the override's, if any).
    pub credit_limit: u64,
    /// The speaking limit's window, in seconds.
    pub reset_seconds: u64,
    /// The speaking limit's algorithm.
    pub algorithm: Algorithm,
    /// When credit comes back (denied: when the same hit would be allowed).
    pub reset: Reset,
    /// The speaking limit's counter, if any.
    pub counter_key: Option<String>,
    /// Every limit's outcome, for a rule with several (empty otherwise).
    pub limits: Vec<LimitOutcome>,
}

impl Outcome {
    /// The rule's outcome from its limits' (at least one).
    fn from_limits(rule: usize, mut limits: Vec<LimitOutcome>) -> Outcome {
        let wait = |l: &LimitOutcome| match l.reset {
            Reset::Never => Duration::MAX,
            Reset::After(d) => d,
            Reset::Unlimited => Duration::ZERO,
        };
        let allowed = limits.iter().all(|l| l.allowed);
        let remaining = limits.iter().map(|l| l.remaining).min().unwrap_or(0);
        let speaker = if allowed {
            // The fewest credits left; on a tie, the longest until full.
            limits
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| (l.remaining, std::cmp::Reverse(wait(l))))
        } else {
            limits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.allowed)
                .max_by_key(|(_, l)| wait(l))
        }
        .map_or(0, |(i, _)| i);
        let mut outcome = Outcome {
            rule,
            allowed,
            remaining,
            credit_limit: 0,
            reset_seconds: 0,
            algorithm: Algorithm::Window,
            reset: Reset::Never,
            counter_key: None,
            limits: Vec::new(),
        };
        if limits.len() == 1 {
            let l = limits.swap_remove(0);
            outcome.credit_limit = l.credit_limit;
            outcome.reset_seconds = l.reset_seconds;
            outcome.algorithm = l.algorithm;
            outcome.reset = l.reset;
            outcome.counter_key = l.counter_key;
        } else if let Some(l) = limits.get(speaker) {
            outcome.credit_limit = l.credit_limit;
            outcome.reset_seconds = l.reset_seconds;
            outcome.algorithm = l.algorithm;
            outcome.reset = l.reset;
            outcome.counter_key = l.counter_key.clone();
            outcome.limits = limits;
        }
        outcome
    }
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
    /// The rule set in force when the request was decided (a reload in
    /// between does not change the names an answer reports).
    rules: Arc<RuleSet>,
    /// One decision per descriptor, in request order.
    pub items: Vec<Decision>,
}

impl Decisions {
    /// The rule `outcome` was decided by (its name and spec, for the answer).
    pub fn rule(&self, outcome: &Outcome) -> &Rule {
        self.rules.rule(outcome.rule)
    }
}

/// The rate limiter: the current rule set, the knobs in force, the region's
/// global leases and a counter store.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Arc<dyn Store>,
    knobs: Arc<Knobs>,
    global: Option<Arc<Global>>,
}

impl Limiter {
    /// A limiter over `rules` and `store`, with knobs of its own.
    pub fn new(rules: RuleSet, store: Arc<dyn Store>) -> Limiter {
        Limiter::with_knobs(rules, store, Arc::new(Knobs::local()))
    }

    /// A limiter over `rules` and `store` that applies `knobs`.
    pub fn with_knobs(rules: RuleSet, store: Arc<dyn Store>, knobs: Arc<Knobs>) -> Limiter {
        Limiter {
            rules: ArcSwap::from_pointee(rules),
            store,
            knobs,
            global: None,
        }
    }

    /// Counts `scope: global` limits against this region's leases of them
    /// (without, a global limit is counted as a local token bucket: this
    /// process is the whole world).
    pub fn with_global(mut self, global: Arc<Global>) -> Limiter {
        self.global = Some(global);
        self
    }

    /// The region's global leases, if global limits are coordinated.
    pub fn global(&self) -> Option<&Arc<Global>> {
        self.global.as_ref()
    }

    /// The knobs in force.
    pub fn knobs(&self) -> &Arc<Knobs> {
        &self.knobs
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

    /// Decides and charges every descriptor of one request, in order, with
    /// one store call: each rule's limits are charged together or not at
    /// all, and under the policy's `charge: all-or-nothing` nothing is
    /// charged when any descriptor is denied.
    ///
    /// `domain` is the Envoy domain, or `None` for a line-protocol HIT.
    pub async fn check(&self, domain: Option<&str>, hits: &[Hit]) -> Result<Decisions, StoreError> {
        self.decide(self.rules(), domain, hits, false, None).await
    }

    /// Decides several independent requests of one descriptor each (a line
    /// connection's pipelined HITs) in one store call: each is charged on
    /// its own, whatever the policy's `charge`.
    pub async fn check_each(
        &self,
        domain: Option<&str>,
        hits: &[Hit],
    ) -> Result<Decisions, StoreError> {
        self.decide(self.rules(), domain, hits, true, None).await
    }

    async fn decide(
        &self,
        rules: Arc<RuleSet>,
        domain: Option<&str>,
        hits: &[Hit],
        independent: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decisions, StoreError> {
        let started = Instant::now();
        let RequestPlan {
            mut ops,
            prepared,
            charge,
        } = self.plan(&rules, domain, hits, independent);
        // The store's answer ends the decision's time too (what follows is
        // bookkeeping); without a store call, the time is read at the end.
        let (states, decided_at) = if ops.is_empty() {
            (Vec::new(), None)
        } else {
            let (states, answered) = self.apply(&ops, charge, deadline).await?;
            (states, Some(answered))
        };
        let items: Vec<Decision> = prepared
            .into_iter()
            .map(|(canaries, decider)| Decision {
                canaries: canaries
                    .into_iter()
                    .map(|p| self.finish(&rules, p, &mut ops, &states))
                    .collect(),
                decider: self.finish(&rules, decider, &mut ops, &states),
            })
            .collect();
        record(&rules, hits, &items);
        // Each descriptor (each line-protocol HIT) is one hit, timed as its request.
        let decided_at = decided_at.unwrap_or_else(Instant::now);
        metrics().hit_times(decided_at.duration_since(started), items.len());
        Ok(Decisions { rules, items })
    }

    /// Every hit's canaries and deciding rule prepared, their ops gathered
    /// in one list, and how the request is charged.
    fn plan(
        &self,
        rules: &RuleSet,
        domain: Option<&str>,
        hits: &[Hit],
        independent: bool,
    ) -> RequestPlan {
        let mut planner = Planner {
            rules,
            // Whether any knob is set, looked at once for the whole call.
            knobs: self.knobs.any().then_some(&*self.knobs),
            global: self.global.as_deref(),
            // Most hits count one limit: one op each, room made once.
            ops: Vec::with_capacity(hits.len()),
        };
        let mut prepared = Vec::with_capacity(hits.len());
        // A deciding rule that denies without a counter (creditLimit 0).
        let mut denied_outside = false;
        for hit in hits {
            let plan = rules.plan(domain, &hit.operation);
            let canaries = plan
                .canaries
                .iter()
                .map(|&rule| planner.prepare(rule, hit, None, false))
                .collect();
            let decider = planner.prepare(plan.decider, hit, hit.limit_override, true);
            // Counted limits are decided by the store; an always-deny rule has none.
            denied_outside |= decider.ops.is_empty() && decider.limits.iter().any(|l| !l.allowed);
            prepared.push((canaries, decider));
        }
        // With one descriptor per request, all-or-nothing is what each rule's
        // limits already are: charging each group on its own is the same.
        let charge = match rules.charge() {
            _ if independent => Charge::Each,
            Charge::AllOrNothing if denied_outside => Charge::Denied,
            other => other,
        };
        RequestPlan {
            ops: planner.ops,
            prepared,
            charge,
        }
    }

    /// The one store call of a request, timed; one state per op, and when
    /// the store answered (one clock read serves the store's time and the
    /// decision's).
    async fn apply(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(Vec<CounterState>, Instant), StoreError> {
        let store_started = Instant::now();
        let applied = self.store.apply_by(ops, charge, deadline).await;
        let answered = Instant::now();
        metrics()
            .store
            .duration
            .observe(answered.duration_since(store_started).as_secs_f64());
        let states = applied.inspect_err(|_| metrics().store.errors.inc())?;
        Ok((crate::store::answered_all(states, ops.len())?, answered))
    }

    /// A prepared rule's outcome from the store's states of its ops; each
    /// op's key is moved into its limit's outcome.
    fn finish(
        &self,
        rules: &RuleSet,
        p: Prepared,
        ops: &mut [CounterOp],
        states: &[CounterState],
    ) -> Outcome {
        let mut limits = p.limits;
        // The counted limits are those not always allowed, their ops in
        // `p.ops`, in the same order (an always-deny rule has no ops).
        let counted = limits.iter_mut().filter(|o| o.reset != Reset::Unlimited);
        for (o, i) in counted.zip(p.ops) {
            let (state, op) = (&states[i], &mut ops[i]);
            // A hit that only gives back or checks is not admitted.
            if o.global && state.allowed && !op.refund && op.cost != 0 {
                let spec = &rules.rule(p.rule).spec;
                let label = spec.limits.get(o.limit).and_then(|s| s.label.as_deref());
                metrics()
                    .global
                    .admitted
                    .with_label_values(&[label.unwrap_or("")])
                    .inc();
            }
            o.allowed = state.allowed;
            o.remaining = state.remaining;
            o.reset = Reset::After(match (o.global, self.global.as_deref()) {
                // A new lease may come at the next renewal: never tell a
                // client to wait longer than a lease period.
                (true, Some(g)) => state.reset_after.min(g.period()),
                _ => state.reset_after,
            });
            o.counter_key = Some(std::mem::take(&mut op.key));
        }
        Outcome::from_limits(p.rule, limits)
    }
}

/// A request planned: its ops, each hit's canaries and deciding rule, and
/// how it is charged.
struct RequestPlan {
    ops: Vec<CounterOp>,
    prepared: Vec<(Vec<Prepared>, Prepared)>,
    charge: Charge,
}

/// Counts every outcome in the metrics and the dashboard's history (a
/// denied hit under its actor), and logs the deciding rule's comment at
/// debug level.
fn record(rules: &RuleSet, hits: &[Hit], items: &[Decision]) {
    let m = metrics();
    let board = recorder();
    // One clock read for the request.
    let now = board.now();
    for (item, hit) in items.iter().zip(hits) {
        for c in &item.canaries {
            let (status, i) = if c.allowed {
                (HitStatus::CanaryAccepted, 2)
            } else {
                (HitStatus::CanaryRejected, 3)
            };
            let rule = rules.rule(c.rule);
            rule.counters.hits[i].inc();
            m.hit_statsd(status, rule.spec.label.as_deref());
        }
        let rule = rules.rule(item.decider.rule);
        let spec = &rule.spec;
        let (status, i) = if item.decider.allowed {
            (HitStatus::Accepted, 0)
        } else {
            (HitStatus::Rejected, 1)
        };
        rule.counters.hits[i].inc();
        rule.counters.decisions[i].inc();
        m.hit_statsd(status, spec.label.as_deref());
        if item.decider.allowed {
            board.record(now, &rule.stats, true, "", hit.cost);
        } else {
            let actor = denied_actor(rule, &item.decider, hit);
            board.record(now, &rule.stats, false, &actor, hit.cost);
        }
        tracing::debug!(
            rule = %spec,
            comment = spec.comment.as_deref().unwrap_or(""),
            allowed = item.decider.allowed,
            remaining = item.decider.remaining,
            "decided"
        );
    }
}

/// The actor of a denied hit, bounded as its counter key keeps it: the
/// value of the denying limit's `actorField` ("" for a rule without one).
fn denied_actor<'a>(rule: &Rule, decider: &Outcome, hit: &'a Hit) -> std::borrow::Cow<'a, str> {
    let limit = decider
        .limits
        .iter()
        .find(|l| !l.allowed)
        .map_or(0, |l| l.limit);
    let actor = rule
        .spec
        .limits
        .get(limit)
        .map_or("", |l| rule.actor(&hit.operation, l));
    if crate::rules::bounded::is_long(actor) {
        let mut bounded = String::with_capacity(64);
        crate::rules::bounded::push_value(&mut bounded, actor);
        std::borrow::Cow::Owned(bounded)
    } else {
        std::borrow::Cow::Borrowed(actor)
    }
}

#[cfg(test)]
mod tests;
