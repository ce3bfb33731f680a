//! What the limiter answers: one outcome type for every engine.

use std::sync::Arc;
use std::time::Duration;

use crate::rules::{Rule, RuleSet};
use crate::store::Algorithm;

use super::envoy::EnvoyStatus;
use super::plan::Limits;

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
    /// Whether it is a value's own share of a `fairShare` limit (the limit
    /// `limit` itself has an outcome of its own, just before this one).
    pub fair: bool,
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
    pub(super) fn from_limits(rule: usize, limits: Limits) -> Outcome {
        let mut limits = match limits {
            Limits::One(l) => return Outcome::from_one(rule, l),
            Limits::Many(v) => v,
        };
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
            return Outcome::from_one(rule, limits.swap_remove(0));
        }
        if let Some(l) = limits.get(speaker) {
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

impl Outcome {
    /// The outcome of a rule of one limit.
    fn from_one(rule: usize, l: LimitOutcome) -> Outcome {
        Outcome {
            rule,
            allowed: l.allowed,
            remaining: l.remaining,
            credit_limit: l.credit_limit,
            reset_seconds: l.reset_seconds,
            algorithm: l.algorithm,
            reset: l.reset,
            counter_key: l.counter_key,
            limits: Vec::new(),
        }
    }
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The deciding rule's outcome.
    pub decider: Outcome,
    /// The canary rules that ran, in order; they never decide.
    pub canaries: Vec<Outcome>,
    /// The deciding rule is a shadow rule that would have denied the hit
    /// (`decider` says allowed: a shadow rule never denies).
    pub shadow_denied: bool,
}

/// The answers for a request, with the rule set they were decided by.
#[derive(Debug)]
pub struct Decisions {
    /// The rule set in force when the request was decided (a reload in
    /// between does not change the names an answer reports).
    pub(super) rules: Arc<RuleSet>,
    /// One decision per descriptor, in request order.
    pub items: Vec<Decision>,
}

impl Decisions {
    /// The rule `outcome` was decided by (its name and spec, for the answer).
    pub fn rule(&self, outcome: &Outcome) -> &Rule {
        self.rules.rule(outcome.rule)
    }

    /// Gives the outcomes' counter keys back for the thread's next
    /// decisions (an adapter calls it once the answer is written).
    pub fn recycle(self) {
        for item in self.items {
            for outcome in item.canaries.into_iter().chain([item.decider]) {
                let limits = outcome.limits.into_iter().filter_map(|l| l.counter_key);
                for key in outcome.counter_key.into_iter().chain(limits) {
                    crate::rules::recycle_key(key);
                }
            }
        }
    }
}

/// How a request was decided, for its adapter to format.
#[derive(Debug)]
pub enum Verdict {
    /// By the divvy rules.
    Divvy(Decisions),
    /// By the envoyproxy/ratelimit file that defines the domain: one status
    /// per descriptor.
    Envoy(Vec<EnvoyStatus>),
    /// No file defines the domain and no divvy rules are loaded: no limit.
    NoRules,
    /// No configuration was loaded at all (no policy file, no xDS update yet).
    NoConfig,
}

impl Verdict {
    /// The divvy rules' decisions, if they decided.
    pub fn into_decisions(self) -> Option<Decisions> {
        match self {
            Verdict::Divvy(d) => Some(d),
            _ => None,
        }
    }
}
