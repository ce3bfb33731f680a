//! Turns a [`RawConfig`] into a validated [`Policy`], collecting every problem.
//!
//! Checks, as divvy performs them: numbers, labels, matchPolicy, a default
//! rule, and unreachable rules. A rule is unreachable when an earlier `stop`
//! rule matches every request it could match (same or broader domain, a
//! subset of its keys, each value covering its value). The check is sound:
//! it never rejects a reachable rule (see [`Pattern::covers`]).

use std::collections::{HashMap, HashSet};

use super::duration::parse_seconds;
use super::model::{
    LimitSpec, MatchPolicy, Policy, RuleSpec, MAX_CREDIT_LIMIT, MAX_CREDIT_MS, MAX_RESET_SECONDS,
};
use super::schema::{RawConfig, RawLimit, RawRule, Scalar};
use crate::pattern::Pattern;
use crate::store::{Algorithm, Charge};

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
            let single = check_limit(&single_limit(&raw), &who, "", problems);
            (single.into_iter().collect(), false)
        }
        Some(list) => (check_limit_list(&raw, list, &who, problems), true),
    };
    let match_policy = check_match_policy(raw.match_policy.as_deref(), is_default, &who, problems);
    if let Some(label) = &raw.label {
        check_label(label, &who, "", problems);
    }
    check_domain(raw.domain.as_deref(), is_default, &who, problems);
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
    }
}

/// Validates a rule's `limits`: no single-limit field beside it, at least
/// one entry, each entry valid, and no two entries counting the same.
fn check_limit_list(
    raw: &RawRule,
    list: &[RawLimit],
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
        .filter_map(|(i, l)| check_limit(l, who, &format!("limits[{i}]."), problems))
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

/// `stop` (the default) or `canary`; the default rule cannot be a canary.
fn check_match_policy(
    text: Option<&str>,
    is_default: bool,
    who: &str,
    problems: &mut Vec<String>,
) -> MatchPolicy {
    let match_policy = match text {
        None | Some("stop") => MatchPolicy::Stop,
        Some("canary") => MatchPolicy::Canary,
        Some(other) => {
            problems.push(format!(
                "{who}: matchPolicy must be `stop` or `canary`, found `{other}`"
            ));
            MatchPolicy::Stop
        }
    };
    if is_default && match_policy == MatchPolicy::Canary {
        problems.push(format!("{who}: the default rule cannot be a canary"));
    }
    match_policy
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

/// Whether two limits of one rule would count in one counter.
fn same_counter(a: &LimitSpec, b: &LimitSpec) -> bool {
    a.actor_field == b.actor_field
        && a.algorithm == b.algorithm
        && a.credit_limit == b.credit_limit
        && a.reset_seconds == b.reset_seconds
        && a.credit_limit > 0
        && a.reset_seconds > 0
}

/// Validates one limit; `field` prefixes field names (`limits[1].`).
fn check_limit(
    raw: &RawLimit,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> Option<LimitSpec> {
    let before = problems.len();
    let credit_limit = check_credit_limit(raw.credit_limit.as_ref(), who, field, problems);
    let reset_seconds = check_reset_seconds(
        raw.reset_seconds.as_ref(),
        credit_limit,
        who,
        field,
        problems,
    );
    let global = check_scope(raw.scope.as_deref(), who, field, problems);
    let algorithm = check_algorithm(raw.algorithm.as_deref(), global, who, field, problems);
    let burst = check_burst(
        raw.burst.as_ref(),
        algorithm,
        credit_limit,
        who,
        field,
        problems,
    );
    let limit = LimitSpec {
        credit_limit,
        reset_seconds,
        algorithm,
        burst,
        actor_field: raw.actor_field.clone().filter(|a| !a.is_empty()),
        label: raw.label.clone(),
        global,
    };
    check_exact_in_scripts(&limit, who, field, problems);
    if let Some(label) = &raw.label {
        check_label(label, who, field, problems);
    }
    (problems.len() == before).then_some(limit)
}

/// `creditLimit`: required, an integer from 0 to [`MAX_CREDIT_LIMIT`].
fn check_credit_limit(
    v: Option<&Scalar>,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> u64 {
    match v {
        None => {
            problems.push(format!("{who}: {field}creditLimit is required"));
            0
        }
        Some(v) => match integer(v, false) {
            Some(n) if n <= MAX_CREDIT_LIMIT => n,
            _ => {
                problems.push(format!(
                    "{who}: {field}creditLimit must be a non-negative integer, found {}",
                    show(v)
                ));
                0
            }
        },
    }
}

/// `resetSeconds`: seconds or a duration up to [`MAX_RESET_SECONDS`],
/// required when the limit is above 0.
fn check_reset_seconds(
    v: Option<&Scalar>,
    credit_limit: u64,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> u64 {
    match v {
        None if credit_limit > 0 => {
            problems.push(format!(
                "{who}: {field}resetSeconds is required when creditLimit > 0 (write 0 explicitly for always-allow)"
            ));
            0
        }
        None => 0,
        Some(v) => match integer(v, true) {
            Some(n) if n <= MAX_RESET_SECONDS => n,
            _ => {
                problems.push(format!(
                    "{who}: {field}resetSeconds must be a non-negative integer number of seconds or a duration such as 90s, 1m, 1h, 1d (at most 100 years), found {}",
                    show(v)
                ));
                0
            }
        },
    }
}

/// `scope`: `local` (the default) or `global`; whether the limit is global.
fn check_scope(text: Option<&str>, who: &str, field: &str, problems: &mut Vec<String>) -> bool {
    match text {
        None | Some("local") => false,
        Some("global") => true,
        Some(other) => {
            problems.push(format!(
                "{who}: {field}scope must be `local` or `global`, found `{other}`"
            ));
            false
        }
    }
}

/// `algorithm`: one the stores know (divvy's window by default); a global
/// limit is a token bucket shared by every region.
fn check_algorithm(
    text: Option<&str>,
    global: bool,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> Algorithm {
    match text {
        None if global => Algorithm::TokenBucket,
        Some(a) if global && a != Algorithm::TokenBucket.as_str() => {
            problems.push(format!(
                "{who}: {field}scope global limits are token buckets; algorithm must be {} (or omitted), found `{a}`",
                Algorithm::TokenBucket.as_str()
            ));
            Algorithm::TokenBucket
        }
        None => Algorithm::Window,
        Some(text) => Algorithm::parse(text).unwrap_or_else(|| {
            problems.push(format!(
                "{who}: {field}algorithm must be one of {}; found `{text}`",
                Algorithm::ALL.map(Algorithm::as_str).join(", ")
            ));
            Algorithm::Window
        }),
    }
}

/// `burst`: only for a token bucket, from 1 to [`MAX_CREDIT_LIMIT`];
/// `creditLimit` when absent.
fn check_burst(
    v: Option<&Scalar>,
    algorithm: Algorithm,
    credit_limit: u64,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> u64 {
    match v {
        None => credit_limit,
        Some(_) if !algorithm.spec().has_burst => {
            problems.push(format!(
                "{who}: {field}burst applies only to algorithm {} (this limit's algorithm is {})",
                Algorithm::TokenBucket.as_str(),
                algorithm.as_str()
            ));
            credit_limit
        }
        Some(v) => match integer(v, false) {
            Some(n) if (1..=MAX_CREDIT_LIMIT).contains(&n) => n,
            _ => {
                problems.push(format!(
                    "{who}: {field}burst must be an integer of at least 1, found {}",
                    show(v)
                ));
                credit_limit
            }
        },
    }
}

/// The products the algorithm's arithmetic computes stay within
/// [`MAX_CREDIT_MS`] (its own bound), so every store counts exactly.
fn check_exact_in_scripts(limit: &LimitSpec, who: &str, field: &str, problems: &mut Vec<String>) {
    let algorithm = limit.algorithm;
    // A global limit counts in thousandths of a credit per second (see
    // limiter/plan.rs, `Planner::leased`).
    let scale = if limit.global { 1000 } else { 1 };
    let window_ms = limit
        .reset_seconds
        .saturating_mul(1000)
        .saturating_mul(scale);
    if limit.credit_limit > 0 && !algorithm.exact(limit.credit_limit, limit.burst, window_ms) {
        problems.push(format!(
            "{who}: {field}{} × resetSeconds is too large for the {} algorithm (at most {MAX_CREDIT_MS} credit-milliseconds, so every store counts exactly)",
            if algorithm.spec().has_burst { "burst" } else { "creditLimit" },
            algorithm.as_str()
        ));
    }
}

/// A non-negative integer; strings are parsed (INI), as durations if allowed.
fn integer(v: &Scalar, duration: bool) -> Option<u64> {
    match v {
        Scalar::UInt(n) => Some(*n),
        // divvy's JSON files may say 3.0; a whole number is a whole number.
        Scalar::Float(f) if *f >= 0.0 && f.fract() == 0.0 && *f <= MAX_CREDIT_LIMIT as f64 => {
            Some(*f as u64)
        }
        Scalar::Str(s) if duration => parse_seconds(s),
        Scalar::Str(s) => {
            let s = s.trim();
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                s.parse().ok()
            } else {
                None
            }
        }
        _ => None,
    }
}

fn show(v: &Scalar) -> String {
    match v {
        Scalar::Str(s) => format!("`{s}`"),
        Scalar::Float(f) => format!("{f:?}"),
        other => other.to_text(),
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

/// Reports every rule that an earlier stop rule masks.
///
/// An earlier rule A can mask B only if each of A's exact values appears in
/// B as the same exact value, so stop rules are indexed by one of their exact
/// pairs and B is only compared with the rules indexed under its own exact
/// pairs plus those with no exact pair: large policies stay fast to check.
fn check_reachability(rules: &[RuleSpec], problems: &mut Vec<String>) {
    let compiled: Vec<Vec<(&str, Pattern)>> = rules
        .iter()
        .map(|r| {
            r.operation
                .iter()
                .map(|(k, v)| (k.as_str(), Pattern::new(v)))
                .collect()
        })
        .collect();
    let domains: Vec<Option<Pattern>> = rules
        .iter()
        .map(|r| r.domain.as_deref().map(Pattern::new))
        .collect();
    let mut by_pair: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    let mut unindexed: Vec<usize> = Vec::new();
    for (b, rule) in rules.iter().enumerate() {
        // Candidates: earlier stop rules whose index pair B also has exactly.
        let mut candidates: Vec<usize> = unindexed.clone();
        let mut seen = HashSet::new();
        for (k, p) in &compiled[b] {
            if let Pattern::Exact(v) = p {
                if seen.insert((*k, v.as_str())) {
                    if let Some(list) = by_pair.get(&(*k, v.as_str())) {
                        candidates.extend(list);
                    }
                }
            }
        }
        candidates.sort_unstable();
        if let Some(&a) = candidates
            .iter()
            .find(|&&a| masks_compiled(&compiled[a], &domains[a], &compiled[b], &domains[b]))
        {
            problems.push(format!(
                "{rule} is unreachable: the earlier stop {} matches every request it could match",
                rules[a]
            ));
        }
        if rule.match_policy == MatchPolicy::Stop {
            let first_exact = compiled[b].iter().find_map(|(k, p)| match p {
                Pattern::Exact(v) => Some((*k, v.as_str())),
                _ => None,
            });
            match first_exact {
                Some(pair) => by_pair.entry(pair).or_default().push(b),
                None => unindexed.push(b),
            }
        }
    }
}

/// Whether rule `a`, if it is a stop rule placed before `b`, matches every
/// request `b` could match (so `b` would be unreachable). Sound: never `true`
/// when some request matches `b` but not `a`.
pub fn masks(a: &RuleSpec, b: &RuleSpec) -> bool {
    fn compile(r: &RuleSpec) -> Vec<(&str, Pattern)> {
        r.operation
            .iter()
            .map(|(k, v)| (k.as_str(), Pattern::new(v)))
            .collect()
    }
    let domain = |r: &RuleSpec| r.domain.as_deref().map(Pattern::new);
    masks_compiled(&compile(a), &domain(a), &compile(b), &domain(b))
}

fn masks_compiled(
    a: &[(&str, Pattern)],
    a_domain: &Option<Pattern>,
    b: &[(&str, Pattern)],
    b_domain: &Option<Pattern>,
) -> bool {
    let domain_ok = match (a_domain, b_domain) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(pa), Some(pb)) => pa.covers(pb),
    };
    domain_ok
        && a.iter().all(|(ka, pa)| {
            b.iter()
                .find(|(kb, _)| kb == ka)
                .is_some_and(|(_, pb)| pa.covers(pb))
        })
}
