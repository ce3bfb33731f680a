//! Validation of a limit's `fairShare`: its key, idle time and bound.

use std::time::Duration;

use crate::config::duration::parse_millis;
use crate::config::model::{
    FairShareSpec, FAIR_SHARE_IDLE, FAIR_SHARE_MAX_ACTORS, FAIR_SHARE_MOST_ACTORS,
};
use crate::config::schema::{RawFairShare, Scalar};

/// What a limit's `fairShare` checks against: the rule's operation and the
/// limit's numbers.
pub(super) struct FairContext<'a> {
    pub(super) operation: &'a [(String, String)],
    pub(super) credit_limit: u64,
    pub(super) reset_seconds: u64,
}

/// Validates `fairShare` (`field` prefixes field names, `limits[1].`).
pub(super) fn check_fair_share(
    raw: Option<&RawFairShare>,
    cx: &FairContext<'_>,
    who: &str,
    field: &str,
    problems: &mut Vec<String>,
) -> Option<FairShareSpec> {
    let (by, idle, max_actors) = match raw? {
        RawFairShare::Key(k) => (Some(k.clone()), None, None),
        RawFairShare::Full(f) => (f.by.clone(), f.idle.as_ref(), f.max_actors.as_ref()),
    };
    let before = problems.len();
    let by = by.unwrap_or_default();
    if by.is_empty() {
        problems.push(format!(
            "{who}: {field}fairShare needs a key (`fairShare: user` or `fairShare: {{by: user}}`)"
        ));
    } else if !cx.operation.iter().any(|(k, _)| *k == by) {
        let keys: Vec<&str> = cx.operation.iter().map(|(k, _)| k.as_str()).collect();
        problems.push(format!(
            "{who}: {field}fairShare key `{by}` is not a key of the rule's operation ({}); add it, e.g. `{by}: \"*\"`",
            if keys.is_empty() { "it has none".to_owned() } else { keys.join(", ") }
        ));
    }
    if cx.credit_limit == 0 {
        problems.push(format!(
            "{who}: {field}fairShare needs a limit to share: creditLimit is 0 (every hit is denied)"
        ));
    } else if cx.reset_seconds == 0 {
        problems.push(format!(
            "{who}: {field}fairShare needs a limit to share: resetSeconds is 0 (every hit is allowed)"
        ));
    }
    let idle = match idle {
        None => FAIR_SHARE_IDLE,
        Some(v) => match millis(v) {
            Some(ms) if (100..=3_600_000).contains(&ms) => Duration::from_millis(ms),
            _ => {
                problems.push(format!(
                    "{who}: {field}fairShare.idle must be a duration from 100ms to 1h (such as 5s), found {}",
                    v.to_text()
                ));
                FAIR_SHARE_IDLE
            }
        },
    };
    let max_actors = match max_actors {
        None => FAIR_SHARE_MAX_ACTORS,
        Some(v) => match whole(v) {
            Some(n) if (1..=FAIR_SHARE_MOST_ACTORS as u64).contains(&n) => n as usize,
            _ => {
                problems.push(format!(
                    "{who}: {field}fairShare.maxActors must be an integer from 1 to {FAIR_SHARE_MOST_ACTORS}, found {}",
                    v.to_text()
                ));
                FAIR_SHARE_MAX_ACTORS
            }
        },
    };
    (problems.len() == before).then_some(FairShareSpec {
        by,
        idle,
        max_actors,
    })
}

/// A duration in milliseconds: `5s`, `500ms`, or whole seconds.
fn millis(v: &Scalar) -> Option<u64> {
    match v {
        Scalar::UInt(n) => n.checked_mul(1000),
        Scalar::Str(s) => parse_millis(s.trim()),
        _ => None,
    }
}

fn whole(v: &Scalar) -> Option<u64> {
    match v {
        Scalar::UInt(n) => Some(*n),
        Scalar::Str(s) => s.trim().parse().ok(),
        _ => None,
    }
}
