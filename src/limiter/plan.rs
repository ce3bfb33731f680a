//! A request's plan: for each hit, the limits of its deciding rule and
//! canaries with knobs and global leases applied, and the counter ops the
//! store is to apply, gathered for one store call.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{FairShareSpec, LimitSpec, RuleSpec};
use crate::fair::{self, FairShares, Share};
use crate::global::Global;
use crate::knobs::{Knob, Knobs};
use crate::rules::{Operation, Rule, RuleSet};
use crate::store::CounterOp;

use super::{Hit, LimitOutcome, LimitOverride, Reset};

/// A rule's limits prepared for one hit: the outcome of each limit, and
/// the ops of its counted limits.
pub(super) struct Prepared {
    pub(super) rule: usize,
    /// Every limit's outcome; the counted ones (all but the always-allowed,
    /// `Reset::Unlimited`) are decided by the store.
    pub(super) limits: Limits,
    /// Where the counted limits' ops are in the request's ops, one per
    /// counted limit in order (empty: nothing counted, as for an
    /// always-deny rule).
    pub(super) ops: std::ops::Range<usize>,
}

/// A rule's limits' outcomes: most rules have one, held in place.
pub(super) enum Limits {
    /// A rule of one limit (or one that denies every hit).
    One(LimitOutcome),
    /// A rule of several limits.
    Many(Vec<LimitOutcome>),
}

impl std::ops::Deref for Limits {
    type Target = [LimitOutcome];

    fn deref(&self) -> &[LimitOutcome] {
        match self {
            Limits::One(l) => std::slice::from_ref(l),
            Limits::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Limits {
    fn deref_mut(&mut self) -> &mut [LimitOutcome] {
        match self {
            Limits::One(l) => std::slice::from_mut(l),
            Limits::Many(v) => v,
        }
    }
}

/// Prepares the rules of one request's hits, gathering their ops.
pub(super) struct Planner<'a> {
    pub(super) rules: &'a RuleSet,
    /// The knobs, when any is set (looked at once for the whole request).
    pub(super) knobs: Option<&'a Knobs>,
    pub(super) global: Option<&'a Global>,
    /// Fair shares, when the limiter keeps them.
    pub(super) fair: Option<&'a FairShares>,
    /// Every counter op of the request, in order.
    pub(super) ops: Vec<CounterOp>,
    /// The values' shares asked for, with the index of each one's op.
    pub(super) shares: Vec<(usize, Share)>,
}

impl Planner<'_> {
    /// The limits of `rule` for `hit` (an override replaces them with one
    /// limit of its own numbers and the rule's first limit's algorithm and
    /// actor), with an op per counted limit appended to the request's ops.
    pub(super) fn prepare(
        &mut self,
        rule: usize,
        hit: &Hit,
        limit_override: Option<LimitOverride>,
        decides: bool,
    ) -> Prepared {
        let compiled = self.rules.rule(rule);
        let own = own_limits(compiled, limit_override, self.knobs);
        // Knobs apply to the rule's own limits (a request's override wins).
        let limits: Cow<'_, [LimitSpec]> = match self.knobs {
            Some(knobs) if limit_override.is_none() => own
                .iter()
                .enumerate()
                .map(|(i, limit)| match knob_for(knobs, &compiled.spec, i) {
                    Some(k) => k.apply(limit),
                    None => limit.clone(),
                })
                .collect(),
            _ => Cow::Borrowed(&own[..]),
        };
        let first = self.ops.len();
        // One limit that denies every hit: no counter of the rule is touched.
        if let Some(i) = limits.iter().position(|l| l.credit_limit == 0) {
            return Prepared {
                rule,
                limits: Limits::One(pending(i, &limits[i])),
                ops: first..first,
            };
        }
        let at = At {
            hit,
            first,
            decides,
        };
        let mut outcome =
            |(i, limit): (usize, &LimitSpec)| self.limit(compiled, &own[i], (i, limit), &at);
        let limits = match &limits[..] {
            [one] => match outcome((0, one)) {
                (o, None) => Limits::One(o),
                (o, Some(share)) => Limits::Many(vec![o, share]),
            },
            many => {
                let mut all = Vec::with_capacity(many.len() + 1);
                for (o, share) in many.iter().enumerate().map(outcome) {
                    all.push(o);
                    all.extend(share);
                }
                Limits::Many(all)
            }
        };
        Prepared {
            rule,
            limits,
            ops: first..self.ops.len(),
        }
    }
}

/// Where a rule's limits are being prepared: the hit, where the rule's ops
/// start in the request's, and whether the rule decides.
struct At<'h> {
    hit: &'h Hit,
    first: usize,
    decides: bool,
}

impl Planner<'_> {
    /// Limit `i` of `rule` (`limit`, as `own` with knobs applied) for the
    /// hit: its outcome, with its op appended (none for always-allow), and
    /// the outcome of the value's fair share when it has one.
    fn limit(
        &mut self,
        rule: &Rule,
        own: &LimitSpec,
        (i, limit): (usize, &LimitSpec),
        at: &At<'_>,
    ) -> (LimitOutcome, Option<LimitOutcome>) {
        let mut o = pending(i, limit);
        if limit.reset_seconds == 0 {
            o.allowed = true;
            o.remaining = limit.credit_limit;
            o.reset = Reset::Unlimited;
            return (o, None);
        }
        let mut op = CounterOp {
            cost: at.hit.cost,
            refund: at.hit.refund,
            // Not the rule's first counted limit.
            joint: self.ops.len() > at.first,
            decides: at.decides,
            ..counter_op(rule, &at.hit.operation, own, limit)
        };
        if let (true, Some(global)) = (limit.global, self.global) {
            lease(global, &mut op, limit, at.hit.cost);
            o.global = true;
        }
        let share = limit
            .fair_share
            .as_ref()
            .and_then(|spec| self.share(rule, (i, limit), spec, at.hit, &op, o.global));
        self.ops.push(op);
        let share = share.map(|(outcome, op, share)| {
            // The value's op follows the limit's own.
            self.shares.push((self.ops.len(), share));
            self.ops.push(op);
            outcome
        });
        (o, share)
    }

    /// The value's own share of limit `i` (a `fairShare` limit) whose op
    /// is `whole` (counted in thousandths when `scaled`, a global lease):
    /// its outcome, its op and the share asked for (`None`: the limit
    /// alone holds the hit).
    fn share(
        &self,
        rule: &Rule,
        (i, limit): (usize, &LimitSpec),
        spec: &FairShareSpec,
        hit: &Hit,
        whole: &CounterOp,
        scaled: bool,
    ) -> Option<(LimitOutcome, CounterOp, Share)> {
        let fair = self.fair?;
        let value = hit.operation.get(&spec.by).unwrap_or("");
        // What the value asks: a check-only hit asks for one, a refund for nothing.
        let asked = if hit.refund { 0 } else { hit.cost.max(1) };
        let names = (limit.label.as_deref().unwrap_or(rule.name()), rule.name());
        let share = fair.ask(&whole.key, names, spec, value, asked, fair::rate_of(whole))?;
        let mut o = pending(i, limit);
        o.credit_limit =
            fair::share_credits(whole, share.ask.fraction, scaled, limit.reset_seconds);
        o.fair = true;
        Some((o, fair::share_op(whole, &share, scaled), share))
    }
}

/// A global limit counts in the region's store at the region's lease, with
/// the same capacity whatever the lease (`crate::global::lease_bucket`).
fn lease(global: &Global, op: &mut CounterOp, limit: &LimitSpec, cost: u64) {
    op.key.push_str(":global");
    let (rate, burst) = global.quota(&op.key, limit, cost);
    let bucket = crate::global::lease_bucket(rate, burst, limit.burst, limit.reset_seconds);
    op.limit = bucket.limit;
    op.window = Duration::from_millis(bucket.window_ms);
    op.burst = bucket.burst;
}

/// A limit's outcome before the store answers; `finish` pairs the outcomes
/// that are not `Reset::Unlimited` with the rule's ops, in order.
fn pending(i: usize, limit: &LimitSpec) -> LimitOutcome {
    LimitOutcome {
        limit: i,
        allowed: false,
        remaining: 0,
        credit_limit: limit.credit_limit,
        reset_seconds: limit.reset_seconds,
        algorithm: limit.algorithm,
        reset: Reset::Never,
        counter_key: None,
        global: false,
        fair: false,
    }
}

/// The limits of `rule` as written, or the one limit of a request's
/// override.
fn own_limits<'r>(
    rule: &'r Rule,
    limit_override: Option<LimitOverride>,
    knobs: Option<&Knobs>,
) -> Cow<'r, [LimitSpec]> {
    match limit_override {
        None => Cow::Borrowed(&rule.spec.limits),
        Some(o) => Cow::Owned(vec![overridden(rule, o, knobs)]),
    }
}

/// A request's own limit for `rule`: its numbers, the rule's first limit's
/// algorithm and actor.
fn overridden(rule: &Rule, o: LimitOverride, knobs: Option<&Knobs>) -> LimitSpec {
    let first = rule.spec.first_limit();
    let reset_seconds = o.reset_seconds;
    // An override is not validated like a policy: keep its numbers inside
    // what every store counts exactly (a lower limit, never a higher one).
    let window_ms = reset_seconds.saturating_mul(1000).max(1);
    let most = first.algorithm.largest_exact_limit(window_ms);
    let mut credit_limit = o.credit_limit.min(most.max(1));
    // A knob's creditLimit 0 (the breaker) stops the rule even for a
    // request carrying its own limit.
    let stopped = knobs.is_some_and(|knobs| {
        (0..rule.spec.limits.len())
            .any(|i| knob_for(knobs, &rule.spec, i).is_some_and(|k| k.credit_limit == Some(0)))
    });
    if stopped {
        credit_limit = 0;
    }
    LimitSpec {
        credit_limit,
        reset_seconds,
        burst: o.credit_limit.min(most.max(1)),
        label: None,
        ..first.clone()
    }
}

/// The counter op of `own` (a limit of `rule` as written) for `operation`
/// (cost 1), counted with the numbers of `effective` (the same limit with a
/// knob applied, or `own`) as its algorithm counts a knob's numbers
/// ([`crate::store::algorithm::Spec::counted`]). The counter keeps `own`'s
/// key, so consumption carries over when a knob changes the numbers.
pub fn counter_op(
    rule: &Rule,
    operation: &Operation,
    own: &LimitSpec,
    effective: &LimitSpec,
) -> CounterOp {
    let c = (effective.algorithm.spec().counted)(own.numbers(), effective.numbers());
    CounterOp {
        burst: c.burst,
        overdraft: own.overdraft,
        ..CounterOp::new(
            rule.counter_key(operation, own),
            effective.algorithm,
            c.limit,
            Duration::from_secs(c.window_seconds),
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
