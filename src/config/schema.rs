//! The config schema as read from a file, before validation.
//!
//! divvy's JSON schema is `{ "overrides": [rule...], "default": rule }`; YAML
//! is a superset of JSON, so YAML files use that same schema, and the INI
//! reader produces it too. Every raw type is here, the `governors:` section's
//! included; [`super::validate`] turns them into the [`super::model`] types.
//! Unknown fields are errors, so a typo cannot silently disable a limit.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A whole config file: the ordered override rules, then the default rule.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// How the descriptors of one request are charged: `each` (default) or
    /// `all-or-nothing`.
    pub charge: Option<String>,
    /// Rules in order of precedence.
    #[serde(default)]
    pub overrides: Vec<RawRule>,
    /// The rule that matches every request no override matched.
    pub default: Option<RawRule>,
    /// PID controllers that set a rule's creditLimit from a load metric.
    #[serde(default)]
    pub governors: Vec<RawGovernor>,
}

/// One rule as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRule {
    /// Keys the request must carry, with exact or glob values.
    #[serde(default)]
    pub operation: BTreeMap<String, Scalar>,
    /// Credits per window; 0 denies everything.
    pub credit_limit: Option<Scalar>,
    /// Window length: integer seconds or a duration such as `90s`, `1m`, `1h`, `1d`.
    pub reset_seconds: Option<Scalar>,
    /// Request key whose value selects a separate counter (the actor).
    pub actor_field: Option<String>,
    /// `stop` (default) or `canary`.
    pub match_policy: Option<String>,
    /// A unique name for metrics and logs.
    pub label: Option<String>,
    /// Free text.
    pub comment: Option<String>,
    /// The Envoy domain(s) this rule applies to (glob allowed); absent means every domain.
    pub domain: Option<String>,
    /// `window` (default), `fixed`, `sliding` or `token_bucket`.
    pub algorithm: Option<String>,
    /// Token bucket capacity (default: creditLimit); only with `token_bucket`.
    pub burst: Option<Scalar>,
    /// Several limits, each with its own counter, instead of creditLimit and
    /// resetSeconds: a hit is allowed only if every one allows it.
    pub limits: Option<Vec<RawLimit>>,
    /// `local` (default) or `global`: a token bucket shared by every region.
    pub scope: Option<String>,
    /// Divides the limit among the values of a request key, max-min fair by demand.
    pub fair_share: Option<RawFairShare>,
    /// `none` or `problem-json`: the body of this rule's denials (default: `--denied-body`).
    pub denied_body: Option<String>,
    /// `true`: a hit is charged in full even past what is left (a debt).
    pub overdraft: Option<Scalar>,
}

/// `fairShare: KEY` or `fairShare: {by: KEY, idle: 5s, maxActors: 10000}`.
#[derive(Debug, Clone)]
pub enum RawFairShare {
    /// The short form: the key alone.
    Key(String),
    /// The long form.
    Full(RawFairShareFull),
}

impl<'de> Deserialize<'de> for RawFairShare {
    // By hand rather than `untagged`, so a mistake in the long form is
    // reported as itself (an unknown field, a wrong type), not as "no variant".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawFairShare;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a request key, or {by: KEY, idle: DURATION, maxActors: N}")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawFairShare, E> {
                Ok(RawFairShare::Key(v.to_owned()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawFairShare, A::Error> {
                let d = serde::de::value::MapAccessDeserializer::new(map);
                RawFairShareFull::deserialize(d).map(RawFairShare::Full)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The long form of `fairShare`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawFairShareFull {
    /// The request key whose values share the limit.
    pub by: Option<String>,
    /// How long a value stays active after its last request (default 5s).
    pub idle: Option<Scalar>,
    /// Most values tracked; beyond, new values share one overflow share.
    pub max_actors: Option<Scalar>,
}

/// One limit of a rule's `limits`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawLimit {
    /// Credits per window (per refill period for a token bucket).
    pub credit_limit: Option<Scalar>,
    /// Window length (refill period): integer seconds or a duration.
    pub reset_seconds: Option<Scalar>,
    /// `window` (default), `fixed`, `sliding` or `token_bucket`.
    pub algorithm: Option<String>,
    /// Token bucket capacity (default: creditLimit).
    pub burst: Option<Scalar>,
    /// Request key whose value selects this limit's counter.
    pub actor_field: Option<String>,
    /// A unique name (for knobs, metrics and explain).
    pub label: Option<String>,
    /// `local` (default) or `global`: a token bucket shared by every region.
    pub scope: Option<String>,
    /// Divides the limit among the values of a request key, max-min fair by demand.
    pub fair_share: Option<RawFairShare>,
    /// `true`: a hit is charged in full even past what is left (a debt).
    pub overdraft: Option<Scalar>,
}

/// A scalar value from YAML, JSON or INI: numbers and booleans are accepted
/// where a string is expected (`foo: 3` in an operation), and strings where a
/// number is expected (INI has only strings), then checked by the validator.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A non-negative integer.
    UInt(u64),
    /// A negative integer.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// Text.
    Str(String),
}

impl Scalar {
    /// The value as the text a request would carry.
    pub fn to_text(&self) -> String {
        match self {
            Scalar::UInt(n) => n.to_string(),
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
            Scalar::Str(s) => s.clone(),
        }
    }
}

/// One governor as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawGovernor {
    /// The label of the rule (with one limit) or of a `limits` entry.
    pub rule: Option<String>,
    /// A PromQL instant query giving one number.
    pub query: Option<String>,
    /// Prometheus's base URL (`http://host:port`).
    pub prometheus: Option<String>,
    /// The load to hold.
    pub setpoint: Option<f64>,
    /// The control interval (`5s`, `500ms`, `1m`, or integer seconds).
    pub every: Option<Scalar>,
    /// The lowest creditLimit the governor sets.
    pub min: Option<f64>,
    /// The highest creditLimit the governor sets.
    pub max: Option<f64>,
    /// Proportional gain.
    pub kp: Option<f64>,
    /// Integral gain (per second).
    pub ki: Option<f64>,
    /// Derivative gain (seconds).
    pub kd: Option<f64>,
    /// The circuit breaker.
    pub breaker: Option<RawBreaker>,
    /// Intervals without data after which the rate falls to `min`.
    pub fallback_after: Option<u32>,
}

/// `breaker: {above: N}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBreaker {
    /// Load above which the rate drops to 0 at once.
    pub above: Option<f64>,
}
