//! Rate-limit response headers for Envoy to add (`response_headers_to_add`).
//!
//! Built from the deciding descriptor of a request: the first denied one,
//! else the one with the fewest credits left (always-allow descriptors never
//! decide). The window is the rule's exact window in seconds, and reset
//! times are rounded up so a client that waits as told is not denied again.
//! `draft`: the IETF httpapi draft's `RateLimit-Policy` and `RateLimit`;
//! `legacy`: `X-RateLimit-*`; either adds `Retry-After` on a denial that a
//! reset will lift.

use std::borrow::Cow;

use crate::config::RuleSpec;
use crate::limiter::{Decisions, Outcome, Reset};

/// Which headers to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HeaderStyle {
    /// No headers.
    #[default]
    None,
    /// `RateLimit` and `RateLimit-Policy` (IETF draft).
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    Legacy,
}

/// The outcome that decides the headers, if any: among denied descriptors
/// the one that resets last (so a client waiting as told is not denied
/// again), else the one with the fewest credits left.
fn deciding(decisions: &Decisions) -> Option<&Outcome> {
    let limited = || {
        decisions
            .items
            .iter()
            .map(|d| &d.decider)
            .filter(|o| o.reset != Reset::Unlimited)
    };
    let wait = |o: &Outcome| match o.reset {
        Reset::After(d) => d,
        Reset::Never | Reset::Unlimited => std::time::Duration::ZERO,
    };
    let denied =
        limited()
            .filter(|o| !o.allowed)
            .fold(None, |best: Option<&Outcome>, o| match best {
                Some(b) if wait(b) >= wait(o) => Some(b),
                _ => Some(o),
            });
    denied.or_else(|| {
        limited().fold(None, |best: Option<&Outcome>, o| match best {
            Some(b) if b.remaining <= o.remaining => Some(b),
            _ => Some(o),
        })
    })
}

/// The name a client sees for `spec`'s policy, in `RateLimit-Policy` and in
/// a problem body alike: its label, else `rule-<position>` (`aux-rule-<n>`).
/// Not the rule's display name, which has spaces and parentheses that a
/// structured-field string would carry awkwardly.
pub fn policy_name(spec: &RuleSpec) -> Cow<'_, str> {
    match &spec.label {
        Some(label) => Cow::Borrowed(label),
        None => {
            let kind = if spec.aux { "aux-rule" } else { "rule" };
            Cow::Owned(format!("{kind}-{}", spec.position))
        }
    }
}

/// Seconds until `reset`, rounded up so a client that waits as told is not
/// denied again (`None`: it never resets, or there is nothing to reset).
pub fn reset_seconds(reset: Reset) -> Option<u64> {
    match reset {
        Reset::After(d) => Some(u64::try_from(d.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)),
        Reset::Never | Reset::Unlimited => None,
    }
}

/// The headers for `decisions` in `style`, as (name, value) pairs.
pub fn rate_limit_headers(style: HeaderStyle, decisions: &Decisions) -> Vec<(String, String)> {
    if style == HeaderStyle::None {
        return Vec::new();
    }
    let Some(o) = deciding(decisions) else {
        return Vec::new();
    };
    let reset = reset_seconds(o.reset);
    let mut headers = Vec::with_capacity(4);
    match style {
        HeaderStyle::None => {}
        HeaderStyle::Draft => {
            let name = policy_name(&decisions.rule(o).spec);
            let mut policy = format!("\"{name}\";q={}", o.credit_limit);
            if o.reset_seconds > 0 {
                policy.push_str(&format!(";w={}", o.reset_seconds));
            }
            let mut now = format!("\"{name}\";r={}", o.remaining);
            if let Some(t) = reset {
                now.push_str(&format!(";t={t}"));
            }
            headers.push(("RateLimit-Policy".to_owned(), policy));
            headers.push(("RateLimit".to_owned(), now));
        }
        HeaderStyle::Legacy => {
            headers.push(("X-RateLimit-Limit".to_owned(), o.credit_limit.to_string()));
            headers.push(("X-RateLimit-Remaining".to_owned(), o.remaining.to_string()));
            if let Some(t) = reset {
                headers.push(("X-RateLimit-Reset".to_owned(), t.to_string()));
            }
        }
    }
    if !o.allowed {
        if let Some(t) = reset {
            headers.push(("Retry-After".to_owned(), t.max(1).to_string()));
        }
    }
    headers
}
