//! The body of `PUT /knobs/{label}`: parsed and checked against the limit it
//! names, with a message a person can act on for every refusal.

use serde_json::{Map, Value};

use super::{Knob, KnobError};
use crate::config::duration::parse_seconds;
use crate::config::model::{MAX_CREDIT_LIMIT, MAX_CREDIT_MS, MAX_RESET_SECONDS};
use crate::config::LimitSpec;
use crate::rules::RuleSet;
use crate::store::Algorithm;

/// A knob request as sent: the fields it sets and how long it lasts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnobBody {
    /// New creditLimit.
    pub credit_limit: Option<u64>,
    /// New resetSeconds.
    pub reset_seconds: Option<u64>,
    /// New burst (token bucket only).
    pub burst: Option<u64>,
    /// Seconds until the knob removes itself.
    pub ttl_seconds: Option<u64>,
}

fn bad(message: String) -> KnobError {
    KnobError::Invalid(message)
}

fn whole(v: &Value, field: &str, min: u64, max: u64) -> Result<u64, KnobError> {
    match v.as_u64() {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(format!(
            "{field} must be an integer from {min} to {max}, found {v}"
        ))),
    }
}

impl KnobBody {
    /// Parses a JSON body; every problem is an error and nothing is set.
    pub fn parse(bytes: &[u8]) -> Result<KnobBody, KnobError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(bad(
                "the body must be a JSON object such as {\"creditLimit\": 20}".to_owned(),
            ));
        };
        KnobBody::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<KnobBody, KnobError> {
        let mut body = KnobBody::default();
        for (key, v) in map {
            match key.as_str() {
                "creditLimit" => {
                    body.credit_limit = Some(whole(v, "creditLimit", 0, MAX_CREDIT_LIMIT)?)
                }
                "resetSeconds" => {
                    let n = match v {
                        Value::String(s) => parse_seconds(s)
                            .filter(|n| (1..=MAX_RESET_SECONDS).contains(n))
                            .ok_or_else(|| {
                                bad(format!(
                                    "resetSeconds must be at least 1 second: an integer or a duration such as 30s, 5m, 1h, found {v}"
                                ))
                            })?,
                        _ => whole(v, "resetSeconds", 1, MAX_RESET_SECONDS)?,
                    };
                    body.reset_seconds = Some(n);
                }
                "burst" => body.burst = Some(whole(v, "burst", 1, MAX_CREDIT_LIMIT)?),
                "ttlSeconds" => {
                    body.ttl_seconds = Some(whole(v, "ttlSeconds", 1, MAX_RESET_SECONDS)?)
                }
                other => {
                    return Err(bad(format!(
                        "unknown field `{other}`; a knob sets creditLimit, resetSeconds, burst and optionally ttlSeconds"
                    )))
                }
            }
        }
        if body.credit_limit.is_none() && body.reset_seconds.is_none() && body.burst.is_none() {
            return Err(bad(
                "set at least one of creditLimit, resetSeconds, burst".to_owned()
            ));
        }
        Ok(body)
    }

    /// The knob this body makes for `label`, checked against the limit it
    /// names in `rules`.
    pub fn knob_for(
        &self,
        rules: &RuleSet,
        label: &str,
        set_by: &str,
        now_ms: u64,
    ) -> Result<Knob, KnobError> {
        let limit = target(rules, label)?;
        let knob = Knob {
            credit_limit: self.credit_limit,
            reset_seconds: self.reset_seconds,
            burst: self.burst,
            expires_at_ms: self
                .ttl_seconds
                .map(|t| now_ms.saturating_add(t.saturating_mul(1000))),
            set_by: set_by.to_owned(),
            set_at_ms: now_ms,
        };
        check(&knob, limit, label)?;
        Ok(knob)
    }
}

/// The limit `label` names: a rule with one limit, or a `limits` entry.
pub fn target<'a>(rules: &'a RuleSet, label: &str) -> Result<&'a LimitSpec, KnobError> {
    for rule in rules.rules() {
        let spec = &rule.spec;
        if let Some(l) = spec
            .limits
            .iter()
            .find(|l| l.label.as_deref() == Some(label))
        {
            return Ok(l);
        }
        if spec.label.as_deref() == Some(label) {
            if spec.limits.len() == 1 {
                return Ok(&spec.limits[0]);
            }
            let names: Vec<&str> = spec
                .limits
                .iter()
                .filter_map(|l| l.label.as_deref())
                .collect();
            return Err(bad(format!(
                "rule `{label}` has {} limits; set the knob on one of them by its label{}",
                spec.limits.len(),
                if names.is_empty() {
                    " (give its limits labels in the policy)".to_owned()
                } else {
                    format!(": {}", names.join(", "))
                }
            )));
        }
    }
    Err(KnobError::UnknownLabel(label.to_owned()))
}

/// Whether `knob` makes a valid limit of `limit`.
pub fn check(knob: &Knob, limit: &LimitSpec, label: &str) -> Result<(), KnobError> {
    if knob.burst.is_some() && !limit.algorithm.spec().has_burst {
        let with_burst: Vec<&str> = Algorithm::ALL
            .iter()
            .filter(|a| a.spec().has_burst)
            .map(|a| a.as_str())
            .collect();
        return Err(bad(format!(
            "burst applies only to {} limits; `{label}` uses {}",
            with_burst.join(" or "),
            limit.algorithm.as_str()
        )));
    }
    let effective = knob.apply(limit);
    if effective.algorithm.spec().has_burst
        && effective.reset_seconds != limit.reset_seconds
        && effective.reset_seconds > 0
        && (u128::from(effective.credit_limit) * u128::from(limit.reset_seconds))
            % u128::from(effective.reset_seconds)
            != 0
    {
        // The bucket counts in the rule's own period; only whole rates per
        // that period are exact.
        return Err(bad(format!(
            "{} per {}s is not a whole number of credits per `{label}`'s own period of {}s; \
             choose a creditLimit that makes it one, or set creditLimit alone",
            effective.credit_limit, effective.reset_seconds, limit.reset_seconds
        )));
    }
    let algorithm = effective.algorithm;
    // A burst is counted in the rule's own period, whatever the knob's.
    let seconds = if algorithm.spec().has_burst {
        limit.reset_seconds
    } else {
        effective.reset_seconds
    };
    let window_ms = seconds.saturating_mul(1000);
    if !algorithm.exact(effective.credit_limit, effective.burst, window_ms) {
        return Err(bad(format!(
            "these numbers are too large for the {} algorithm (at most {MAX_CREDIT_MS} credit-milliseconds)",
            effective.algorithm.as_str()
        )));
    }
    if effective.credit_limit > 0 && effective.reset_seconds == 0 {
        return Err(bad(format!(
            "`{label}` always allows (resetSeconds 0); set resetSeconds too"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_str, Format};

    fn rules() -> RuleSet {
        RuleSet::new(
            parse_str(
                "overrides:\n  - operation: {k: a}\n    label: api\n    creditLimit: 40\n    resetSeconds: 1\n    algorithm: token_bucket\ndefault: {creditLimit: 1, resetSeconds: 1}\n",
                Format::Yaml,
                "t.yaml",
            )
            .unwrap(),
        )
    }

    fn knob(body: &str) -> Result<Knob, KnobError> {
        KnobBody::parse(body.as_bytes()).and_then(|b| b.knob_for(&rules(), "api", "me", 0))
    }

    #[test]
    fn a_bucket_period_must_give_a_whole_rate_per_the_rules_own_period() {
        assert!(knob(r#"{"creditLimit": 120, "resetSeconds": 2}"#).is_ok());
        let e = knob(r#"{"creditLimit": 1, "resetSeconds": "1m"}"#).unwrap_err();
        assert!(
            e.to_string().contains("not a whole number of credits"),
            "{e}"
        );
        assert!(knob(r#"{"creditLimit": 1}"#).is_ok());
        // Capacity is counted in the rule's own period.
        let e = knob(r#"{"burst": 5000000000000, "resetSeconds": 1}"#).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }
}
