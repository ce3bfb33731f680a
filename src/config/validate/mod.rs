//! Turns a [`RawConfig`] into a validated [`Policy`], collecting every problem.
//!
//! Checks, as divvy performs them: numbers, labels, matchPolicy, a default
//! rule, and unreachable rules. A rule is unreachable when an earlier `stop`
//! rule matches every request it could match (same or broader domain, a
//! subset of its keys, each value covering its value). The check is sound:
//! it never rejects a reachable rule (see [`crate::pattern::Pattern::covers`]).

use std::collections::HashMap;

use crate::config::model::{DeniedBody, LimitSpec, MatchPolicy, Policy, RuleSpec};
use crate::config::schema::{RawConfig, RawLimit, RawRule, Scalar};
use crate::store::Charge;

mod fair;
mod limits;
mod reachability;

use limits::{check_limit, same_counter};
use reachability::check_reachability;
pub use reachability::masks;

/// Validates `raw`, returning every problem found.
pub fn validate(raw: RawConfig, file: &str) -> Result<Policy, Vec<String>> {
    let mut problems = Vec::new();
    let mut rules = Vec::new();
    let charge = match raw.charge.as_deref() {
        None | Some("each") => Charge::Each,
        Some("all-or-nothing") => Charge::AllOrNothing,
        Some(other) => {
            problems.push(format!(
                "charge must be `each` or `all-or-nothing`, found `{other}`"
            ));
            Charge::Each
        }
    };
    let count = raw.overrides.len();
    let mut entries: Vec<(RawRule, bool)> = raw.overrides.into_iter().map(|r| (r, false)).collect();
    match raw.default {
        Some(d) => entries.push((d, true)),
        None => problems.push(
            "the config must end with a default rule (`default:` in YAML or JSON, `[default]` in INI)"
                .to_owned(),
        ),
    }
    for (idx, (raw_rule, is_default)) in entries.into_iter().enumerate() {
        let position = idx + 1;
        let name = if is_default {
            format!("the default rule (#{position})")
        } else {
            format!("rule #{position}")
        };
        if let Some(rule) = check_rule(raw_rule, position, is_default, &name, &mut problems) {
            rules.push(rule);
        }
    }
    debug_assert!(rules.len() <= count + 1);
    check_labels(&rules, &mut problems);
    check_reachability(&rules, &mut problems);
    let governors = super::governor::check_governors(raw.governors, &rules, &mut problems);
    if problems.is_empty() {
        Ok(Policy {
            source: file.to_owned(),
            rules,
            charge,
            governors,
            envoy: Vec::new(),
            divvy_rules: true,
        })
    } else {
        Err(problems)
    }
}

/// Puts `aux` rules (divvy JSON rules from another source, such as
/// ZooKeeper) ahead of `file`'s rules, in their order, and validates the
/// whole set as one policy: each aux rule as a rule of a file, labels unique
/// across both, and no rule unreachable. Aux rules are numbered in their
/// own list and named `aux rule #i`; the file's rules keep their numbers.
pub fn with_aux_rules(aux: &[RawRule], file: &Policy) -> Result<Policy, Vec<String>> {
    let mut problems = Vec::new();
    let mut rules = Vec::with_capacity(aux.len() + file.rules.len());
    for (i, raw) in aux.iter().enumerate() {
        let name = format!("aux rule #{}", i + 1);
        if raw.operation.is_empty() {
            problems.push(format!(
                "{name}: an aux rule needs a non-empty operation (it would stand before every rule of the file)"
            ));
            continue;
        }
        if let Some(mut rule) = check_rule(raw.clone(), i + 1, false, &name, &mut problems) {
            rule.aux = true;
            rules.push(rule);
        }
    }
    rules.extend(file.rules.iter().cloned());
    check_labels(&rules, &mut problems);
    check_reachability(&rules, &mut problems);
    if problems.is_empty() {
        Ok(Policy {
            source: file.source.clone(),
            rules,
            charge: file.charge,
            governors: file.governors.clone(),
            envoy: file.envoy.clone(),
            divvy_rules: file.divvy_rules,
        })
    } else {
        Err(problems)
    }
}

/// Validates one rule, pushing every problem; `name` is how messages call it
/// (`rule #3`, `the default rule (#6)`, `aux rule #1`).
fn check_rule(
    raw: RawRule,
    position: usize,
    is_default: bool,
    name: &str,
    problems: &mut Vec<String>,
) -> Option<RuleSpec> {
    let before = problems.len();
    let mut operation: Vec<(String, String)> = raw
        .operation
        .iter()
        .map(|(k, v)| (k.clone(), v.to_text()))
        .collect();
    operation.sort();
    let who = rule_name(name, raw.label.as_deref(), &operation);
    check_operation(&raw, &operation, is_default, &who, problems);
    let (limits, multi) = match &raw.limits {
        None => {
            let single = check_limit(&single_limit(&raw), &operation, &who, "", problems);
            (single.into_iter().collect(), false)
        }
        Some(list) => (
            check_limit_list(&raw, list, &operation, &who, problems),
            true,
        ),
    };
    let match_policy = check_match_policy(raw.match_policy.as_deref(), is_default, &who, problems);
    if let Some(label) = &raw.label {
        check_label(label, &who, "", problems);
    }
    check_domain(raw.domain.as_deref(), is_default, &who, problems);
    let denied_body = check_denied_body(raw.denied_body.as_deref(), &who, problems);
    if problems.len() > before {
        return None;
    }
    Some(RuleSpec {
        position,
        is_default,
        aux: false,
        operation,
        limits,
        multi,
        match_policy,
        label: raw.label,
        comment: raw.comment,
        domain: raw.domain,
        denied_body,
    })
}

/// The rule as every message about it names it: by its label, else by its
/// operation (`rule #2 (method=GET path=/x)`).
fn rule_name(name: &str, label: Option<&str>, operation: &[(String, String)]) -> String {
    match (label, operation.is_empty()) {
        (Some(l), _) => format!("{name} (label {l})"),
        (None, false) => format!(
            "{name} ({})",
            operation
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        (None, true) => name.to_owned(),
    }
}

/// The operation's values are text as clients send it, and the default
/// rule's operation is empty.
fn check_operation(
    raw: &RawRule,
    operation: &[(String, String)],
    is_default: bool,
    who: &str,
    problems: &mut Vec<String>,
) {
    for (k, v) in &raw.operation {
        if let Scalar::Float(f) = v {
            problems.push(format!(
                "{who}: operation value of `{k}` is the number {f:?}, which YAML and JSON may rewrite \
                 (1.10 becomes 1.1); quote it so it matches the text clients send"
            ));
        }
    }
    if is_default && !operation.is_empty() {
        problems.push(format!(
            "{who}: the default rule must have an empty operation"
        ));
    }
}

/// The one limit of a rule written with `creditLimit` (no `limits`).
fn single_limit(raw: &RawRule) -> RawLimit {
    RawLimit {
        credit_limit: raw.credit_limit.clone(),
        reset_seconds: raw.reset_seconds.clone(),
        algorithm: raw.algorithm.clone(),
        burst: raw.burst.clone(),
        actor_field: raw.actor_field.clone(),
        label: None,
        scope: raw.scope.clone(),
        fair_share: raw.fair_share.clone(),
        overdraft: raw.overdraft.clone(),
    }
}

/// Validates a rule's `limits`: no single-limit field beside it, at least
/// one entry, each entry valid, and no two entries counting the same.
fn check_limit_list(
    raw: &RawRule,
    list: &[RawLimit],
    operation: &[(String, String)],
    who: &str,
    problems: &mut Vec<String>,
) -> Vec<LimitSpec> {
    for (field, set) in [
        ("creditLimit", raw.credit_limit.is_some()),
        ("resetSeconds", raw.reset_seconds.is_some()),
        ("algorithm", raw.algorithm.is_some()),
        ("burst", raw.burst.is_some()),
        ("actorField", raw.actor_field.is_some()),
        ("scope", raw.scope.is_some()),
        ("fairShare", raw.fair_share.is_some()),
        ("overdraft", raw.overdraft.is_some()),
    ] {
        if set {
            problems.push(format!(
                "{who}: `{field}` cannot stand beside `limits`; set it on each limit"
            ));
        }
    }
    if list.is_empty() {
        problems.push(format!(
            "{who}: `limits` is empty; give at least one limit (or use creditLimit and resetSeconds)"
        ));
    }
    let limits: Vec<LimitSpec> = list
        .iter()
        .enumerate()
        .filter_map(|(i, l)| check_limit(l, operation, who, &format!("limits[{i}]."), problems))
        .collect();
    for (i, a) in limits.iter().enumerate() {
        if let Some(j) = limits[..i].iter().position(|b| same_counter(a, b)) {
            problems.push(format!(
                "{who}: limits[{i}] counts exactly what limits[{j}] counts (same actorField, algorithm, creditLimit and resetSeconds); remove one"
            ));
        }
    }
    limits
}

/// `stop` (the default), `canary` or `shadow`; the default rule cannot be a canary.
fn check_match_policy(
    text: Option<&str>,
    is_default: bool,
    who: &str,
    problems: &mut Vec<String>,
) -> MatchPolicy {
    let match_policy = match text {
        None | Some("stop") => MatchPolicy::Stop,
        Some("canary") => MatchPolicy::Canary,
        Some("shadow") => MatchPolicy::Shadow,
        Some(other) => {
            problems.push(format!(
                "{who}: matchPolicy must be `stop`, `canary` or `shadow`, found `{other}`"
            ));
            MatchPolicy::Stop
        }
    };
    if is_default && match_policy == MatchPolicy::Canary {
        problems.push(format!("{who}: the default rule cannot be a canary"));
    }
    match_policy
}

/// `none` or `problem-json`; absent leaves it to `--denied-body`.
fn check_denied_body(
    text: Option<&str>,
    who: &str,
    problems: &mut Vec<String>,
) -> Option<DeniedBody> {
    match text? {
        "none" => Some(DeniedBody::None),
        "problem-json" => Some(DeniedBody::ProblemJson),
        other => {
            problems.push(format!(
                "{who}: deniedBody must be `none` or `problem-json`, found `{other}`"
            ));
            None
        }
    }
}

/// A domain is not empty, holds no `:` (counter keys use it), and the
/// default rule names none.
fn check_domain(domain: Option<&str>, is_default: bool, who: &str, problems: &mut Vec<String>) {
    match domain {
        Some("") => problems.push(format!(
            "{who}: domain must not be empty (omit it to apply the rule to every domain)"
        )),
        Some(d) if d.contains(':') => problems.push(format!(
            "{who}: domain `{d}` must not contain `:` (it separates the parts of a counter key)"
        )),
        Some(_) if is_default => problems.push(format!(
            "{who}: the default rule applies to every domain and cannot name one"
        )),
        _ => {}
    }
}

fn check_label(label: &str, who: &str, field: &str, problems: &mut Vec<String>) {
    let ok = !label.is_empty()
        && label.len() <= 255
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        problems.push(format!(
            "{who}: {field}label `{label}` must be 1 to 255 characters of A-Z, a-z, 0-9, _ and -"
        ));
    }
}

/// Labels are unique across rules and the limits of rules.
fn check_labels(rules: &[RuleSpec], problems: &mut Vec<String>) {
    let mut seen: HashMap<&str, &RuleSpec> = HashMap::new();
    for rule in rules {
        let own = rule.label.as_deref().into_iter();
        let of_limits = rule.limits.iter().filter_map(|l| l.label.as_deref());
        for label in own.chain(of_limits) {
            if let Some(first) = seen.insert(label, rule) {
                let whose = if std::ptr::eq(first, rule) {
                    "another label of this rule".to_owned()
                } else {
                    first.to_string()
                };
                problems.push(format!(
                    "{rule}: label {label} is already used by {whose}; labels must be unique"
                ));
            }
        }
    }
}
