//! The engines behind [`super::Limiter::decide`]: divvy rules and
//! envoyproxy/ratelimit trees. Each plans a request into counter ops and
//! turns the store's answer into a verdict; between them the limiter makes
//! the request's one store call, and after them it runs the one record step
//! every engine shares ([`super::record`]).

use crate::rules::descriptor_tree::DomainTree;
use crate::rules::RuleSet;
use crate::store::{Charge, CounterOp, CounterState};

use super::bucket::BucketLimit;
use super::outcome::Verdict;
use super::record::Tally;
use super::request::Request;

/// One way of deciding a request.
pub(super) trait Engine<'r> {
    /// What the engine keeps of a request between planning and finishing.
    type Plan;

    /// Plans `request`: its counter ops appended to `ops`, and how the
    /// store is to charge them.
    fn plan(&self, request: &Request<'r>, ops: &mut Vec<CounterOp>) -> (Self::Plan, Charge);

    /// The verdict from the store's `states` (one per op, in order; a key
    /// may be moved out of its op), with what the record step counts
    /// pushed to `tallies`.
    fn finish(
        &self,
        plan: Self::Plan,
        ops: &mut [CounterOp],
        states: &[CounterState],
        tallies: &mut Vec<Tally>,
    ) -> Verdict;

    /// The limit that decides one descriptor, without counting it (the
    /// question Envoy's Rate Limit Quota Service asks).
    fn bucket(&self, domain: &str, entries: &[(&str, &str)]) -> BucketLimit;
}

/// Which engine decides a domain: chosen once per request, the same way for
/// a decision and for a bucket's limit.
pub(super) enum Choice<'a> {
    /// The envoyproxy/ratelimit file that defines the domain.
    Tree(&'a DomainTree),
    /// The divvy rules.
    Divvy,
    /// No file defines the domain and no divvy rules are loaded.
    NoRules,
    /// No configuration was loaded at all.
    NoConfig,
}

impl Choice<'_> {
    /// The engine for `domain` under `rules` (`None`: the line protocol,
    /// always the divvy rules).
    pub(super) fn of<'a>(rules: &'a RuleSet, domain: Option<&str>) -> Choice<'a> {
        let Some(domain) = domain else {
            return Choice::Divvy;
        };
        if let Some(tree) = rules.envoy_domain(domain) {
            return Choice::Tree(tree);
        }
        match (rules.has_divvy_rules(), rules.source().is_empty()) {
            (true, _) => Choice::Divvy,
            (false, true) => Choice::NoConfig,
            (false, false) => Choice::NoRules,
        }
    }
}
