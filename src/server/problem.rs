//! The body of a denial: an RFC 9457 problem (`application/problem+json`) of
//! the `quota-exceeded` type that the IETF httpapi RateLimit headers draft
//! registers, naming the violated policies in its `violated-policies` member.
//!
//! Envoy's rate-limit filter sends a response's `raw_body` as the body of
//! its local reply (the 429) and adds `response_headers_to_add` to it, a
//! `content-type` among them replacing its own; so the body and its media
//! type travel in the `RateLimitResponse`. Built only for a denial: an
//! allowed request costs nothing more.

use std::borrow::Cow;

use serde::Serialize;

use super::headers::{policy_name, reset_seconds};
use crate::config::DeniedBody;
use crate::limiter::Decisions;

/// The body's media type.
pub const CONTENT_TYPE: &str = "application/problem+json";
/// The draft's problem type for requests over one or more quota policies.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The title the draft registers for that type.
pub const TITLE: &str = "Quota Exceeded";
/// The status the draft recommends, and Envoy's default for a denial.
pub const STATUS: u16 = 429;

/// One violated policy: what divvy adds to the draft's list of names.
/// A budget's debt and when it is paid back (an overdraft) would be further
/// members here; there are none yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation<'a> {
    /// The policy's name, as `RateLimit-Policy` names it.
    pub policy: Cow<'a, str>,
    /// Credits left (a denied hit may need more than are left).
    pub remaining: u64,
    /// Seconds until the denied hit would be allowed, rounded up (absent:
    /// never, for an always-deny rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<u64>,
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies")]
    violated_policies: Vec<&'a str>,
    policies: &'a [Violation<'a>],
}

/// The problem body for the denied descriptors of `decisions` whose rule's
/// `deniedBody` (else `default`) is `problem-json`; `None` when there are
/// none. A policy that denied several descriptors is named once, with its
/// fewest credits left and its latest reset.
pub fn for_decisions(default: DeniedBody, decisions: &Decisions) -> Option<Vec<u8>> {
    let mut violations: Vec<Violation<'_>> = Vec::new();
    for o in decisions.items.iter().map(|d| &d.decider) {
        if o.allowed {
            continue;
        }
        let spec = &decisions.rule(o).spec;
        if spec.denied_body.unwrap_or(default) != DeniedBody::ProblemJson {
            continue;
        }
        add(
            &mut violations,
            Violation {
                policy: policy_name(spec),
                remaining: o.remaining,
                reset: reset_seconds(o.reset),
            },
        );
    }
    body(&violations)
}

/// Adds `v` to `violations`, merging it into an entry of the same policy.
pub fn add<'a>(violations: &mut Vec<Violation<'a>>, v: Violation<'a>) {
    match violations.iter_mut().find(|w| w.policy == v.policy) {
        Some(w) => {
            w.remaining = w.remaining.min(v.remaining);
            // A policy that never resets outlasts any reset.
            w.reset = w.reset.zip(v.reset).map(|(a, b)| a.max(b));
        }
        None => violations.push(v),
    }
}

/// The JSON body naming `violations` (`None` when there are none).
pub fn body(violations: &[Violation<'_>]) -> Option<Vec<u8>> {
    if violations.is_empty() {
        return None;
    }
    let names: Vec<&str> = violations.iter().map(|v| v.policy.as_ref()).collect();
    let mut detail = format!("Quota exceeded for {}", names.join(", "));
    let resets: Option<Vec<u64>> = violations.iter().map(|v| v.reset).collect();
    if let Some(wait) = resets.and_then(|r| r.into_iter().max()) {
        detail.push_str(&format!("; retry in {} s", wait.max(1)));
    }
    detail.push('.');
    serde_json::to_vec(&Problem {
        kind: QUOTA_EXCEEDED,
        title: TITLE,
        status: STATUS,
        detail,
        violated_policies: names,
        policies: violations,
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violation(policy: &str, remaining: u64, reset: Option<u64>) -> Violation<'static> {
        Violation {
            policy: Cow::Owned(policy.to_owned()),
            remaining,
            reset,
        }
    }

    #[test]
    fn names_each_policy_once_with_its_latest_reset() {
        let mut v = Vec::new();
        add(&mut v, violation("api", 0, Some(5)));
        add(&mut v, violation("login", 2, Some(60)));
        add(&mut v, violation("api", 1, Some(9)));
        let json: serde_json::Value = serde_json::from_slice(&body(&v).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "type": QUOTA_EXCEEDED,
                "title": "Quota Exceeded",
                "status": 429,
                "detail": "Quota exceeded for api, login; retry in 60 s.",
                "violated-policies": ["api", "login"],
                "policies": [
                    {"policy": "api", "remaining": 0, "reset": 9},
                    {"policy": "login", "remaining": 2, "reset": 60},
                ],
            })
        );
    }

    #[test]
    fn a_policy_that_never_resets_has_no_reset_and_no_retry() {
        let mut v = Vec::new();
        add(&mut v, violation("closed", 0, None));
        add(&mut v, violation("closed", 0, Some(3)));
        let json: serde_json::Value = serde_json::from_slice(&body(&v).unwrap()).unwrap();
        assert_eq!(json["detail"], "Quota exceeded for closed.");
        assert_eq!(
            json["policies"],
            serde_json::json!([{"policy": "closed", "remaining": 0}])
        );
        assert!(body(&[]).is_none());
    }
}
