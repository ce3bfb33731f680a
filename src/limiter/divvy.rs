//! The divvy-rules engine: each hit's canaries and deciding rule planned
//! into counter ops, and their outcomes from the store's answer.

use std::borrow::Cow;
use std::sync::Arc;

use crate::fair::{FairShares, Share};
use crate::global::Global;
use crate::knobs::Knobs;
use crate::observe::metrics::Metrics;
use crate::rules::{Rule, RuleSet};
use crate::store::{Charge, CounterOp, CounterState};

use super::bucket::{self, BucketLimit};
use super::engine::Engine;
use super::outcome::{Decision, Decisions, Outcome, Reset, Verdict};
use super::plan::{Planner, Prepared};
use super::record::Tally;
use super::request::{Caller, Descriptor, Hit, Items, Request};

/// The divvy rules in force, with the knobs and the region's global leases.
pub(super) struct DivvyRules<'a> {
    pub(super) rules: &'a Arc<RuleSet>,
    pub(super) knobs: &'a Knobs,
    pub(super) global: Option<&'a Global>,
    pub(super) fair: &'a FairShares,
    pub(super) metrics: &'a Metrics,
    pub(super) debtors: &'a super::debtors::Debtors,
}

/// A request planned: each hit with its canaries and deciding rule.
pub(super) struct DivvyPlan<'r> {
    prepared: Vec<Planned<'r>>,
    /// Fair shares asked for, with their ops' indices.
    shares: Vec<(usize, Share)>,
}

/// One hit planned.
struct Planned<'r> {
    /// The request's hit, or one made from its descriptor.
    hit: Cow<'r, Hit>,
    canaries: Vec<Prepared>,
    decider: Prepared,
}

impl<'r> Engine<'r> for DivvyRules<'_> {
    type Plan = DivvyPlan<'r>;

    fn plan(&self, request: &Request<'r>, ops: &mut Vec<CounterOp>) -> (DivvyPlan<'r>, Charge) {
        let (hits, descriptors): (&'r [Hit], &[Descriptor]) = match request.items {
            Items::Hits(hits) => (hits, &[]),
            Items::Descriptors(d) => (&[], d),
        };
        let mut planner = Planner {
            rules: self.rules,
            // Whether any knob is set, looked at once for the whole call.
            knobs: self.knobs.any().then_some(self.knobs),
            global: self.global,
            fair: Some(self.fair),
            ops: std::mem::take(ops),
            shares: Vec::new(),
        };
        let mut prepared = Vec::with_capacity(request.items.len());
        // A deciding rule that denies without a counter (creditLimit 0).
        let mut denied_outside = false;
        let made = descriptors.iter().map(|d| Cow::Owned(d.hit()));
        for hit in hits.iter().map(Cow::Borrowed).chain(made) {
            let plan = self.rules.plan(request.domain, &hit.operation);
            let canaries = plan
                .canaries
                .iter()
                .map(|&rule| planner.prepare(rule, &hit, None, false))
                .collect();
            // A shadow rule's denial must not deny the request's other hits.
            let decides = !self.rules.rule(plan.decider).is_shadow();
            let decider = planner.prepare(plan.decider, &hit, hit.limit_override, decides);
            // Counted limits are decided by the store; an always-deny rule has none.
            denied_outside |= decider.ops.is_empty() && decider.limits.iter().any(|l| !l.allowed);
            prepared.push(Planned {
                hit,
                canaries,
                decider,
            });
        }
        *ops = planner.ops;
        // With one descriptor per request, all-or-nothing is what each rule's
        // limits already are: charging each group on its own is the same.
        let charge = match self.rules.charge() {
            _ if request.caller == Caller::Line => Charge::Each,
            Charge::AllOrNothing if denied_outside => Charge::Denied,
            other => other,
        };
        let shares = planner.shares;
        (DivvyPlan { prepared, shares }, charge)
    }

    fn finish(
        &self,
        plan: DivvyPlan<'r>,
        ops: &mut [CounterOp],
        states: &[CounterState],
        tallies: &mut Vec<Tally>,
    ) -> Verdict {
        self.count_admitted(&plan.shares, ops, states);
        let mut items = Vec::with_capacity(plan.prepared.len());
        for planned in plan.prepared {
            let Planned {
                hit,
                canaries,
                decider,
            } = planned;
            let canaries: Vec<Outcome> = canaries
                .into_iter()
                .map(|p| self.outcome(p, ops, states))
                .collect();
            let mut decider = self.outcome(decider, ops, states);
            let rule = self.rules.rule(decider.rule);
            // A shadow rule's would-be denial is counted, and the hit allowed.
            let shadow = rule.is_shadow() && !decider.allowed;
            if shadow {
                allow(&mut decider);
            }
            for c in &canaries {
                tallies.push(Tally::Rule {
                    rule: c.rule,
                    canary: true,
                    shadow: false,
                    allowed: c.allowed,
                    cost: hit.cost,
                    actor: String::new(),
                });
            }
            tallies.push(Tally::Rule {
                rule: decider.rule,
                canary: false,
                shadow,
                allowed: decider.allowed,
                cost: hit.cost,
                actor: match decider.allowed {
                    true => String::new(),
                    false => denied_actor(rule, &decider, &hit),
                },
            });
            items.push(Decision {
                decider,
                canaries,
                shadow_denied: shadow,
            });
            if let Cow::Owned(made) = hit {
                made.operation.recycle();
            }
        }
        Verdict::Divvy(Decisions {
            rules: self.rules.clone(),
            items,
        })
    }

    fn bucket(&self, domain: &str, entries: &[(&str, &str)]) -> BucketLimit {
        bucket::divvy_limit(self.rules, self.knobs, domain, entries)
    }
}

impl DivvyRules<'_> {
    /// Counts what the store admitted of each value's fair share (for `/fair`).
    fn count_admitted(
        &self,
        shares: &[(usize, Share)],
        ops: &[CounterOp],
        states: &[CounterState],
    ) {
        if shares.is_empty() {
            return;
        }
        let now = self.fair.now();
        for (i, share) in shares {
            let (op, state) = (&ops[*i], &states[*i]);
            if state.allowed && !op.refund && op.cost > 0 {
                share
                    .entry
                    .admitted(&share.value, share.ask.overflow, op.cost, now);
            }
        }
    }

    /// A prepared rule's outcome from the store's states of its ops; each
    /// op's key is moved into its limit's outcome.
    fn outcome(&self, p: Prepared, ops: &mut [CounterOp], states: &[CounterState]) -> Outcome {
        let mut limits = p.limits;
        // The counted limits are those not always allowed, their ops in
        // `p.ops`, in the same order (an always-deny rule has no ops).
        let counted = limits.iter_mut().filter(|o| o.reset != Reset::Unlimited);
        for (o, i) in counted.zip(p.ops) {
            let (state, op) = (&states[i], &mut ops[i]);
            // A hit that only gives back or checks is not admitted.
            if o.global && state.allowed && !op.refund && op.cost != 0 {
                let spec = &self.rules.rule(p.rule).spec;
                let label = spec.limits.get(o.limit).and_then(|s| s.label.as_deref());
                self.metrics
                    .global
                    .admitted
                    .with_label_values(&[label.unwrap_or("")])
                    .inc();
            }
            if state.overdrawn > 0 {
                let rule = self.rules.rule(p.rule);
                self.metrics
                    .policy
                    .overdraft_charged
                    .with_label_values(&[rule.spec.label.as_deref().unwrap_or("")])
                    .inc_by(state.overdrawn);
                self.debtors.note(rule.name(), op);
            }
            o.allowed = state.allowed;
            o.remaining = state.remaining;
            o.reset = Reset::After(match (o.global, self.global) {
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

/// Turns a shadow rule's denial into an allowance: the limits keep their
/// counts (0 left), only the decision changes.
fn allow(outcome: &mut Outcome) {
    outcome.allowed = true;
    for l in &mut outcome.limits {
        l.allowed = true;
    }
}

/// The actor of a denied hit, bounded as its counter key keeps it: the
/// value of the denying limit's `actorField` ("" for a rule without one).
fn denied_actor(rule: &Rule, decider: &Outcome, hit: &Hit) -> String {
    let limit = decider
        .limits
        .iter()
        .find(|l| !l.allowed)
        .map_or(0, |l| l.limit);
    let denier = decider.limits.iter().find(|l| !l.allowed);
    let spec = rule.spec.limits.get(limit);
    // A value held to its fair share is named by the fair-share key.
    let fair_key = spec
        .and_then(|l| l.fair_share.as_ref())
        .filter(|_| denier.is_some_and(|l| l.fair));
    let actor = match fair_key {
        Some(f) => hit.operation.get(&f.by).unwrap_or(""),
        None => spec.map_or("", |l| rule.actor(&hit.operation, l)),
    };
    let mut bounded = String::with_capacity(actor.len().min(64));
    crate::rules::bounded::push_value(&mut bounded, actor);
    bounded
}
