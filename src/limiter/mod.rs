//! Applies match plans to counters: the one core every protocol calls.
//!
//! [`Limiter::check`] takes a request's descriptors (each an [`Operation`]
//! with a cost), finds each one's canaries and deciding rule, sends every
//! counter the request touches to the store in a single call, and returns a
//! [`Decision`] per descriptor. Protocol adapters only translate in and out.

pub mod envoy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::metrics::{metrics, HitStatus};

use crate::config::model::{MAX_CREDIT_LIMIT, MAX_CREDIT_MS};
use crate::config::{LimitSpec, RuleSpec};
use crate::global::Global;
use crate::knobs::{Knob, Knobs};
use crate::rules::{Operation, Rule, RuleSet};
use crate::store::{Algorithm, Charge, CounterOp, Store, StoreError};

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
    /// The rule set in force when the request was decided.
    pub rules: Arc<RuleSet>,
    /// One decision per descriptor, in request order.
    pub items: Vec<Decision>,
}

/// The rate limiter: the current rule set, the knobs in force, the region's
/// global leases and a counter store.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Arc<dyn Store>,
    knobs: Arc<Knobs>,
    global: Option<Arc<Global>>,
}

/// A rule's limits prepared for one hit: the outcome of each limit, and
/// the ops of its counted limits.
struct Prepared {
    rule: usize,
    /// Every limit's outcome; the counted ones (all but the always-allowed,
    /// `Reset::Unlimited`) are decided by the store.
    limits: Vec<LimitOutcome>,
    /// Where the counted limits' ops are in the request's ops, one per
    /// counted limit in order (empty: nothing counted, as for an
    /// always-deny rule).
    ops: std::ops::Range<usize>,
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
        self.decide(domain, hits, false, None).await
    }

    /// [`Limiter::check`] for a caller that must be answered by a deadline:
    /// the store is waited for until `deadline` at most (then the failure
    /// policy decides).
    pub async fn check_until(
        &self,
        domain: Option<&str>,
        hits: &[Hit],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decisions, StoreError> {
        self.decide(domain, hits, false, deadline).await
    }

    /// Decides several independent requests of one descriptor each (a line
    /// connection's pipelined HITs) in one store call: each is charged on
    /// its own, whatever the policy's `charge`.
    pub async fn check_each(
        &self,
        domain: Option<&str>,
        hits: &[Hit],
    ) -> Result<Decisions, StoreError> {
        self.decide(domain, hits, true, None).await
    }

    async fn decide(
        &self,
        domain: Option<&str>,
        hits: &[Hit],
        independent: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decisions, StoreError> {
        let started = Instant::now();
        let rules = self.rules.load_full();
        // Most hits count one limit: one op each, room made once.
        let mut ops = Vec::with_capacity(hits.len());
        let mut prepared: Vec<(Vec<Prepared>, Prepared)> = Vec::with_capacity(hits.len());
        // A deciding rule that denies without a counter (creditLimit 0).
        let mut denied_outside = false;
        // Whether any knob is set, looked at once for the whole call.
        let knobs = self.knobs.any().then_some(&*self.knobs);
        let global = self.global.as_deref();
        for hit in hits {
            let plan = rules.plan(domain, &hit.operation);
            let canaries = plan
                .canaries
                .iter()
                .map(|&rule| prepare(&rules, rule, hit, None, knobs, global, false, &mut ops))
                .collect();
            let decider = prepare(
                &rules,
                plan.decider,
                hit,
                hit.limit_override,
                knobs,
                global,
                true,
                &mut ops,
            );
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
        let mut states = Vec::new();
        // The store's answer ends the decision's time too (what follows is
        // bookkeeping): one clock read fewer per call that reaches the
        // store. Without one, the time is read at the end.
        let mut decided_at = None;
        if !ops.is_empty() {
            let store_started = Instant::now();
            let applied = self.store.apply_by(&ops, charge, deadline).await;
            let answered = Instant::now();
            decided_at = Some(answered);
            metrics()
                .store_duration
                .observe(answered.duration_since(store_started).as_secs_f64());
            states = applied.inspect_err(|_| metrics().store_errors.inc())?;
            if states.len() != ops.len() {
                return Err(StoreError::Unavailable(format!(
                    "store answered {} counters for {} asked",
                    states.len(),
                    ops.len()
                )));
            }
        }
        // Each op's key is moved into its outcome.
        let mut finish = |p: Prepared| {
            let mut limits = p.limits;
            // The counted limits are those not always allowed, their ops
            // in `p.ops`, in the same order.
            // (An always-deny rule has no ops and one outcome, not counted.)
            debug_assert!(
                p.ops.is_empty()
                    || limits
                        .iter()
                        .filter(|o| o.reset != Reset::Unlimited)
                        .count()
                        == p.ops.len(),
                "one op per counted limit"
            );
            let counted = limits.iter_mut().filter(|o| o.reset != Reset::Unlimited);
            for (o, i) in counted.zip(p.ops) {
                let state = &states[i];
                let op = &mut ops[i];
                // A hit that only gives back or checks is not admitted.
                if o.global && state.allowed && !op.refund && op.cost != 0 {
                    let label = rules
                        .rule(p.rule)
                        .spec
                        .limits
                        .get(o.limit)
                        .and_then(|s| s.label.as_deref());
                    metrics()
                        .global_admitted
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
        };
        let items: Vec<Decision> = prepared
            .into_iter()
            .map(|(canaries, decider)| Decision {
                canaries: canaries.into_iter().map(&mut finish).collect(),
                decider: finish(decider),
            })
            .collect();
        record(&rules, &items);
        // Each descriptor (each line-protocol HIT) is one hit, timed as its request.
        let decided_at = decided_at.unwrap_or_else(Instant::now);
        metrics().hit_times(decided_at.duration_since(started), items.len());
        Ok(Decisions { rules, items })
    }
}

/// Counts every outcome in the metrics, and logs the deciding rule's comment at debug level.
fn record(rules: &RuleSet, items: &[Decision]) {
    let m = metrics();
    for item in items {
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
        tracing::debug!(
            rule = %spec,
            comment = spec.comment.as_deref().unwrap_or(""),
            allowed = item.decider.allowed,
            remaining = item.decider.remaining,
            "decided"
        );
    }
}

/// The counter op of `own` (a limit of `rule` as written) for `operation`
/// (cost 1), counted with the numbers of `effective` (the same limit with a
/// knob applied, or `own`). The counter keeps `own`'s key, so consumption
/// carries over when a knob changes the numbers:
/// - divvy's window: the stored credits count against `own`'s limit (sent
///   as the op's burst) and are shifted by the difference;
/// - fixed and sliding: the stored counts are used credits, whatever the limit;
/// - token bucket: the bucket keeps `own`'s period as its unit; a knob's
///   period becomes the equivalent rate per that unit (rounded down, at
///   least 1), and creditLimit and burst apply as they are.
pub fn counter_op(
    rule: &Rule,
    operation: &Operation,
    own: &LimitSpec,
    effective: &LimitSpec,
) -> CounterOp {
    let (limit, window, burst) = match effective.algorithm {
        Algorithm::Window => (
            effective.credit_limit,
            effective.reset_seconds,
            own.credit_limit,
        ),
        Algorithm::Fixed | Algorithm::Sliding => (
            effective.credit_limit,
            effective.reset_seconds,
            effective.credit_limit,
        ),
        Algorithm::TokenBucket if effective.reset_seconds == own.reset_seconds => {
            (effective.credit_limit, own.reset_seconds, effective.burst)
        }
        Algorithm::TokenBucket => {
            let rate = u128::from(effective.credit_limit) * u128::from(own.reset_seconds)
                / u128::from(effective.reset_seconds.max(1));
            (
                u64::try_from(rate).unwrap_or(u64::MAX).max(1),
                own.reset_seconds,
                effective.burst,
            )
        }
    };
    CounterOp {
        burst,
        ..CounterOp::new(
            rule.counter_key(operation, own),
            effective.algorithm,
            limit,
            Duration::from_secs(window),
            1,
        )
    }
}

/// The knob in force for limit `i` of `spec`: one set on the limit's own
/// label (a `limits` entry's), or on the rule's label when the rule has one
/// limit (as [`crate::knobs::body::target`] resolves labels).
pub fn knob_for(knobs: &Knobs, spec: &RuleSpec, i: usize) -> Option<Arc<Knob>> {
    let own = spec
        .limits
        .get(i)
        .and_then(|l| l.label.as_deref())
        .and_then(|l| knobs.get(l));
    own.or_else(|| {
        (spec.limits.len() == 1)
            .then_some(spec.label.as_deref())
            .flatten()
            .and_then(|l| knobs.get(l))
    })
}

/// The limits of `rule` for `hit` (an override replaces them with one
/// limit of its own numbers and the rule's first limit's algorithm and
/// actor), with an op per counted limit appended to `ops`.
#[allow(clippy::too_many_arguments)]
fn prepare(
    rules: &RuleSet,
    rule: usize,
    hit: &Hit,
    limit_override: Option<LimitOverride>,
    knobs: Option<&Knobs>,
    global: Option<&Global>,
    decides: bool,
    ops: &mut Vec<CounterOp>,
) -> Prepared {
    let compiled = rules.rule(rule);
    let mut overridden;
    let mut knobbed: Vec<LimitSpec> = Vec::new();
    let own: &[LimitSpec] = match limit_override {
        None => &compiled.spec.limits,
        Some(o) => {
            let first = compiled.spec.first_limit();
            let reset_seconds = o.reset_seconds;
            // An override is not validated like a policy: keep its numbers
            // inside what every store counts exactly (a lower limit, never a higher one).
            let window_ms = reset_seconds.saturating_mul(1000).max(1);
            let most = match first.algorithm {
                Algorithm::Sliding => (MAX_CREDIT_MS / window_ms).saturating_sub(1),
                Algorithm::TokenBucket => MAX_CREDIT_MS / window_ms,
                _ => MAX_CREDIT_LIMIT,
            };
            let credit_limit = o.credit_limit.min(most.max(1));
            overridden = [LimitSpec {
                credit_limit,
                reset_seconds,
                burst: credit_limit,
                label: None,
                ..first.clone()
            }];
            // A knob's creditLimit 0 (the breaker) stops the rule even for a
            // request carrying its own limit.
            let stopped = knobs.is_some_and(|knobs| {
                (0..compiled.spec.limits.len()).any(|i| {
                    knob_for(knobs, &compiled.spec, i).is_some_and(|k| k.credit_limit == Some(0))
                })
            });
            if stopped {
                overridden[0].credit_limit = 0;
            }
            &overridden
        }
    };
    // Knobs apply to the rule's own limits (a request's override wins).
    let limits: &[LimitSpec] = match knobs {
        Some(knobs) if limit_override.is_none() => {
            for (i, limit) in own.iter().enumerate() {
                let knob = knob_for(knobs, &compiled.spec, i);
                knobbed.push(match knob {
                    Some(k) => k.apply(limit),
                    None => limit.clone(),
                });
            }
            &knobbed
        }
        _ => own,
    };
    let mut outcomes = Vec::with_capacity(limits.len());
    // This rule's ops start here.
    let first = ops.len();
    let always_deny = limits.iter().position(|l| l.credit_limit == 0);
    for (i, limit) in limits.iter().enumerate() {
        let mut o = LimitOutcome {
            limit: i,
            allowed: false,
            remaining: 0,
            credit_limit: limit.credit_limit,
            reset_seconds: limit.reset_seconds,
            algorithm: limit.algorithm,
            // Until the store answers; `finish` pairs the outcomes that are
            // not `Reset::Unlimited` with this rule's ops, in order.
            reset: Reset::Never,
            counter_key: None,
            global: false,
        };
        if always_deny.is_some() {
            // One limit denies every hit: no counter of the rule is touched.
            if always_deny == Some(i) {
                return Prepared {
                    rule,
                    limits: vec![o],
                    ops: first..first,
                };
            }
            continue;
        }
        if limit.reset_seconds == 0 {
            o.allowed = true;
            o.remaining = limit.credit_limit;
            o.reset = Reset::Unlimited;
        } else {
            let mut op = CounterOp {
                cost: hit.cost,
                refund: hit.refund,
                // Not the rule's first counted limit.
                joint: ops.len() > first,
                decides,
                ..counter_op(compiled, &hit.operation, &own[i], limit)
            };
            if let (true, Some(global)) = (limit.global, global) {
                // A global limit counts in the region's store at the region's
                // lease, in thousandths of a credit per window.
                op.key.push_str(":global");
                let (rate, burst) = global.quota(&op.key, limit, hit.cost);
                let window = limit.reset_seconds.max(1);
                let per_window_milli = rate * window as f64 * 1000.0;
                op.limit = (per_window_milli.floor() as u64).max(1);
                op.window = Duration::from_secs(window.saturating_mul(1000));
                op.burst = burst;
                o.global = true;
            }
            ops.push(op);
        }
        outcomes.push(o);
    }
    Prepared {
        rule,
        limits: outcomes,
        ops: first..ops.len(),
    }
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

    const AON: &str = r#"
charge: all-or-nothing
overrides:
  - operation: {k: canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 1h
  - operation: {k: a}
    creditLimit: 5
    resetSeconds: 1h
    algorithm: fixed
  - operation: {k: b}
    creditLimit: 1
    resetSeconds: 1h
    algorithm: token_bucket
  - operation: {k: zero}
    creditLimit: 0
  - operation: {k: multi}
    limits:
      - {creditLimit: 3, resetSeconds: 1h, actorField: key, algorithm: sliding}
      - {creditLimit: 4, resetSeconds: 1h, actorField: customer}
default: {creditLimit: 100, resetSeconds: 60}
"#;

    fn aon() -> Limiter {
        let policy = parse_str(AON, Format::Yaml, "t.yaml").unwrap();
        Limiter::new(RuleSet::new(policy), Arc::new(MemoryStore::new()))
    }

    #[tokio::test]
    async fn all_or_nothing_charges_nothing_when_a_descriptor_is_denied() {
        let l = aon();
        let (a, b) = (hit(&[("k", "a")]), hit(&[("k", "b")]));
        let d = l.check(Some("d"), &[a.clone(), b.clone()]).await.unwrap();
        assert_eq!(
            (d.items[0].decider.remaining, d.items[1].decider.remaining),
            (4, 0)
        );
        // b is spent: a is allowed but not charged, and says so.
        let d = l.check(Some("d"), &[a.clone(), b.clone()]).await.unwrap();
        assert!(d.items[0].decider.allowed && !d.items[1].decider.allowed);
        assert_eq!(d.items[0].decider.remaining, 4);
        // A rule that always denies blocks the request too.
        let d = l
            .check(Some("d"), &[a.clone(), hit(&[("k", "zero")])])
            .await
            .unwrap();
        assert!(d.items[0].decider.allowed && !d.items[1].decider.allowed);
        assert_eq!(d.items[0].decider.remaining, 4);
        assert_eq!(one(&l, &[("k", "a")]).await.decider.remaining, 3);
        // Line-protocol HITs are separate requests: each is charged on its own.
        let d = l.check_each(None, &[a.clone(), b]).await.unwrap();
        assert_eq!(d.items[0].decider.remaining, 2);
    }

    #[tokio::test]
    async fn a_denied_canary_does_not_block_and_a_blocked_request_charges_no_canary() {
        let l = aon();
        let c = hit(&[("k", "canary")]);
        let d = l.check(Some("d"), std::slice::from_ref(&c)).await.unwrap();
        assert!(d.items[0].canaries[0].allowed);
        let d = l
            .check(Some("d"), &[c.clone(), hit(&[("k", "a")])])
            .await
            .unwrap();
        assert!(!d.items[0].canaries[0].allowed);
        assert!(d.items[1].decider.allowed && d.items[1].decider.remaining == 4);
    }

    #[tokio::test]
    async fn several_limits_answer_the_smallest_and_a_denial_charges_none() {
        let l = aon();
        let h = |key: &str| hit(&[("k", "multi"), ("key", key), ("customer", "c")]);
        let d = one(&l, &[("k", "multi"), ("key", "k1"), ("customer", "c")]).await;
        assert_eq!((d.decider.allowed, d.decider.remaining), (true, 2));
        assert_eq!(d.decider.limits.len(), 2);
        assert_eq!(d.decider.algorithm, Algorithm::Sliding);
        let d = l.check(None, &[h("k2"), h("k2"), h("k2")]).await.unwrap();
        assert!(d.items.iter().all(|i| i.decider.allowed));
        // 1 left in both after the second: on a tie the limit full last speaks
        // (divvy's 1 h window).
        assert_eq!(d.items[1].decider.remaining, 1);
        assert_eq!(d.items[1].decider.algorithm, Algorithm::Window);
        // Now the customer is spent; k3 is denied and its own limit keeps its credit.
        let d = l.check(None, &[h("k3")]).await.unwrap();
        let o = &d.items[0].decider;
        assert!(!o.allowed);
        assert_eq!((o.limits[0].allowed, o.limits[0].remaining), (true, 3));
        assert_eq!((o.limits[1].allowed, o.limits[1].remaining), (false, 0));
        assert_eq!(o.credit_limit, 4, "the denying limit speaks");
    }

    #[tokio::test]
    async fn huge_overrides_are_kept_countable_and_a_stopped_rule_stays_stopped() {
        let policy = parse_str(
            "overrides:\n  - operation: {k: tb}\n    label: tb\n    creditLimit: 5\n    resetSeconds: 1\n    algorithm: token_bucket\ndefault: {creditLimit: 1, resetSeconds: 1}\n",
            Format::Yaml,
            "t.yaml",
        )
        .unwrap();
        let knobs = Arc::new(Knobs::local());
        let l = Limiter::with_knobs(
            RuleSet::new(policy),
            Arc::new(MemoryStore::new()),
            knobs.clone(),
        );
        let mut h = hit(&[("k", "tb")]);
        h.cost = 1_000_000_000;
        h.limit_override = Some(LimitOverride {
            credit_limit: u64::from(u32::MAX),
            reset_seconds: 365 * 86_400,
        });
        // No overflow, no panic: the override is clamped to what stores count exactly.
        let d = l.check(Some("d"), &[h.clone()]).await.unwrap();
        assert!(d.items[0].decider.credit_limit <= MAX_CREDIT_MS);
        h.cost = 1;
        assert!(
            l.check(Some("d"), &[h.clone()]).await.unwrap().items[0]
                .decider
                .allowed
        );
        let stop = crate::knobs::Knob {
            credit_limit: Some(0),
            reset_seconds: None,
            burst: None,
            expires_at_ms: None,
            set_by: "test".into(),
            set_at_ms: 0,
        };
        knobs.set("tb", stop).await.unwrap();
        let d = l.check(Some("d"), &[h]).await.unwrap();
        assert!(
            !d.items[0].decider.allowed,
            "the breaker wins over a request's own limit"
        );
    }
}
