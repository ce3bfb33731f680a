//! Validation of one limit: its numbers, scope, algorithm and burst, and
//! whether the Redis script can hold them exactly.

use super::check_label;
use super::fair::{check_fair_share, FairContext};
use crate::config::duration::parse_seconds;
use crate::config::model::{LimitSpec, MAX_CREDIT_LIMIT, MAX_CREDIT_MS, MAX_RESET_SECONDS};
use crate::config::schema::{RawLimit, Scalar};
use crate::store::Algorithm;

/// Whether two limits of one rule would count in one counter.
pub(super) fn same_counter(a: &LimitSpec, b: &LimitSpec) -> bool {
    a.actor_field == b.actor_field
        && a.algorithm == b.algorithm
        && a.credit_limit == b.credit_limit
        && a.reset_seconds == b.reset_seconds
        && a.credit_limit > 0
        && a.reset_seconds > 0
}

/// Validates one limit; `field` prefixes field names (`limits[1].`).
pub(super) fn check_limit(
    raw: &RawLimit,
    operation: &[(String, String)],
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
    let fair = FairContext {
        operation,
        credit_limit,
        reset_seconds,
    };
    let fair_share = check_fair_share(raw.fair_share.as_ref(), &fair, who, field, problems);
    let overdraft = check_overdraft(raw.overdraft.as_ref(), who, field, problems);
    let limit = LimitSpec {
        credit_limit,
        reset_seconds,
        algorithm,
        burst,
        actor_field: raw.actor_field.clone().filter(|a| !a.is_empty()),
        label: raw.label.clone(),
        global,
        fair_share,
        overdraft,
    };
    check_exact_in_scripts(&limit, who, field, problems);
    if let Some(label) = &raw.label {
        check_label(label, who, field, problems);
    }
    (problems.len() == before).then_some(limit)
}

/// `overdraft`: `true` or `false` (default false).
fn check_overdraft(v: Option<&Scalar>, who: &str, field: &str, problems: &mut Vec<String>) -> bool {
    match v {
        None => false,
        Some(Scalar::Bool(b)) => *b,
        Some(other) => {
            problems.push(format!(
                "{who}: {field}overdraft must be true or false, found {}",
                show(other)
            ));
            false
        }
    }
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
