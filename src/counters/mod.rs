//! Counters for operators: find the counters of one rule and one actor,
//! read them, and reset them on every replica (`GET` and `DELETE
//! /counters`, `divvy counters reset`; see docs/counters.md).
//!
//! This module finds the counters (no I/O): a rule's (or one `limits`
//! entry's) label and an actor become the same [`CounterOp`]s the limiter
//! charges, knobs applied. [`resets`] deletes them in the store and tells
//! the other replicas, whose over-limit caches then drop their denials.

pub mod resets;

use crate::config::LimitSpec;
use crate::knobs::Knobs;
use crate::limiter::{counter_op, knob_for};
use crate::rules::{Operation, Rule, RuleSet};
use crate::store::CounterOp;

/// Why a counter query names no counter (each answered 400 or 404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// No `rule=` in the query.
    #[error("the query needs rule=LABEL (a rule's label, or a `limits` entry's)")]
    MissingRule,
    /// A parameter given twice, or empty.
    #[error("{0} must be given once and not be empty")]
    Repeated(&'static str),
    /// No rule or limit has that label.
    #[error("no rule or limit labelled {0:?} is in force")]
    UnknownRule(String),
    /// The rule counts per actor and no actor was given.
    #[error("rule {rule:?} counts per {field}: add actor=VALUE (or {field}=VALUE)")]
    MissingActor {
        /// The label asked for.
        rule: String,
        /// The limit's `actorField`.
        field: String,
    },
    /// An actor was given for a rule that counts every request on one counter.
    #[error("rule {0:?} has no actorField (one counter for everyone): omit actor")]
    NoActorField(String),
}

/// A parsed `rule=LABEL&actor=VALUE[&key=value...]` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterQuery {
    /// A rule's label (or its text, for a rule without one), or a limit's label.
    pub rule: String,
    /// The value of the rule's `actorField`.
    pub actor: Option<String>,
    /// Any other pairs: the request's fields (an actor field named directly).
    pub fields: Vec<(String, String)>,
}

impl CounterQuery {
    /// Parses a URL query string.
    pub fn parse(query: &str) -> Result<CounterQuery, QueryError> {
        let (mut rule, mut actor, mut fields) = (None, None, Vec::new());
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match k.as_ref() {
                "rule" => (&mut rule, "rule"),
                "actor" => (&mut actor, "actor"),
                _ => {
                    fields.push((k.into_owned(), v.into_owned()));
                    continue;
                }
            };
            if slot.0.is_some() || v.is_empty() {
                return Err(QueryError::Repeated(slot.1));
            }
            *slot.0 = Some(v.into_owned());
        }
        Ok(CounterQuery {
            rule: rule.ok_or(QueryError::MissingRule)?,
            actor,
            fields,
        })
    }
}

/// One counter the query names.
#[derive(Debug, Clone)]
pub struct Target {
    /// The rule's name (its label, or its text).
    pub rule: String,
    /// The limit's own label, if it has one.
    pub limit_label: Option<String>,
    /// The limit in force (knob applied).
    pub limit: LimitSpec,
    /// The counter's op (cost 1); `None` for a limit that keeps no counter
    /// (creditLimit 0 or resetSeconds 0).
    pub op: Option<CounterOp>,
}

/// The counters `query` names in `rules`, with `knobs` applied: every limit
/// of the rule labelled so, or the one limit labelled so.
pub fn find(
    rules: &RuleSet,
    knobs: &Knobs,
    query: &CounterQuery,
) -> Result<Vec<Target>, QueryError> {
    let label = query.rule.as_str();
    let (rule, only) = rules
        .rules()
        .iter()
        .find_map(|r| {
            if r.spec.label.as_deref() == Some(label) || r.name() == label {
                return Some((r, None));
            }
            let i = r
                .spec
                .limits
                .iter()
                .position(|l| l.label.as_deref() == Some(label))?;
            Some((r, Some(i)))
        })
        .ok_or_else(|| QueryError::UnknownRule(label.to_owned()))?;
    let chosen: Vec<usize> = match only {
        Some(i) => vec![i],
        None => (0..rule.spec.limits.len()).collect(),
    };
    let op = operation(rule, &chosen, query)?;
    Ok(chosen
        .into_iter()
        .map(|i| target(rule, knobs, i, &op))
        .collect())
}

/// The request the query stands for: its fields, then the actor as the
/// value of each chosen limit's `actorField` (the last of a repeated key wins).
fn operation(rule: &Rule, chosen: &[usize], query: &CounterQuery) -> Result<Operation, QueryError> {
    let fields: Vec<&str> = chosen
        .iter()
        .filter_map(|&i| rule.spec.limits[i].actor_field.as_deref())
        .collect();
    let mut pairs: Vec<(&str, &str)> = query
        .fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match &query.actor {
        Some(_) if fields.is_empty() => return Err(QueryError::NoActorField(query.rule.clone())),
        Some(actor) => pairs.extend(fields.iter().map(|f| (*f, actor.as_str()))),
        None => {
            let missing = fields.iter().find(|f| !pairs.iter().any(|(k, _)| k == *f));
            if let Some(field) = missing {
                return Err(QueryError::MissingActor {
                    rule: query.rule.clone(),
                    field: (*field).to_owned(),
                });
            }
        }
    }
    Ok(Operation::from_pairs(pairs))
}

fn target(rule: &Rule, knobs: &Knobs, i: usize, op: &Operation) -> Target {
    let own = &rule.spec.limits[i];
    let knob = knob_for(knobs, &rule.spec, i);
    let limit = knob.as_ref().map_or_else(|| own.clone(), |k| k.apply(own));
    let counted = limit.credit_limit > 0 && limit.reset_seconds > 0;
    Target {
        rule: rule.name().to_owned(),
        limit_label: own.label.clone(),
        op: counted.then(|| counter_op(rule, op, own, &limit)),
        limit,
    }
}

#[cfg(test)]
mod tests;
