//! The validated policy: its types and the bounds every number is held to.
//!
//! What the checks in [`super::validate`] and [`super::governor`] produce and
//! the rest of the service reads: a [`Policy`] of [`RuleSpec`]s, each with
//! its [`LimitSpec`]s, and its [`GovernorSpec`]s. The bounds (`MAX_*`) are
//! shared with the knobs, which change the same numbers at run time.

use std::fmt;
use std::time::Duration;

use crate::store::algorithm::Numbers;
use crate::store::{Algorithm, Charge};

/// Longest window accepted: 100 years of 365 days.
pub const MAX_RESET_SECONDS: u64 = 100 * 365 * 86_400;
/// Largest credit limit (and burst) accepted, and largest product of credits
/// and window ms an algorithm may reach: the algorithms' own bounds.
pub use crate::store::algorithm::{MAX_CREDIT_LIMIT, MAX_CREDIT_MS};

/// Whether a matching rule decides or only counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchPolicy {
    /// The first matching stop rule decides.
    Stop,
    /// Counted and charged, never decides.
    Canary,
    /// Decides as `stop` would and is counted, but never denies: a denial it
    /// would have given is counted as `shadow_mode` and the hit allowed.
    Shadow,
}

impl MatchPolicy {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchPolicy::Stop => "stop",
            MatchPolicy::Canary => "canary",
            MatchPolicy::Shadow => "shadow",
        }
    }
}

/// What a denial carries besides its status: `--denied-body`, or a rule's
/// `deniedBody` for the descriptors that rule denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeniedBody {
    /// No body: Envoy's own local reply.
    #[default]
    None,
    /// An `application/problem+json` body of type `quota-exceeded` (the IETF
    /// httpapi RateLimit headers draft) naming the violated policies.
    ProblemJson,
}

/// One validated limit of a rule: a rule written with `creditLimit` has
/// one, a rule written with `limits` has one per entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSpec {
    /// Credits per window (refill period); 0 denies everything.
    pub credit_limit: u64,
    /// Window (refill period) in seconds; 0 with a positive limit allows everything.
    pub reset_seconds: u64,
    /// How the counter is spent and refilled.
    pub algorithm: Algorithm,
    /// Token bucket capacity in credits (equal to `credit_limit` for other algorithms).
    pub burst: u64,
    /// The request key naming the actor, if counters are per actor.
    pub actor_field: Option<String>,
    /// The limit's own label (a `limits` entry's).
    pub label: Option<String>,
    /// Whether the limit is one token bucket shared by every region (`scope: global`).
    pub global: bool,
    /// Whether the limit is divided among the values of a request key.
    pub fair_share: Option<FairShareSpec>,
    /// Whether a hit is charged in full even past what is left, leaving the
    /// counter in debt (`overdraft: true`; see `CounterOp::overdraft`).
    pub overdraft: bool,
}

/// Default of `fairShare.idle`.
pub const FAIR_SHARE_IDLE: Duration = Duration::from_secs(5);
/// Default of `fairShare.maxActors`.
pub const FAIR_SHARE_MAX_ACTORS: usize = 10_000;
/// Largest `fairShare.maxActors` accepted.
pub const FAIR_SHARE_MOST_ACTORS: usize = 1_000_000;

/// A limit divided among the values of one request key (`fairShare`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FairShareSpec {
    /// The request key whose values share the limit.
    pub by: String,
    /// How long a value stays active after its last request.
    pub idle: Duration,
    /// Most values tracked per counter; beyond, new values share one overflow share.
    pub max_actors: usize,
}

impl LimitSpec {
    /// `40 per 1s`, `token bucket 40 per 1s, burst 80`, `1000 per 3600s,
    /// overdraft`, `always deny`, ...
    pub fn describe(&self) -> String {
        match (self.credit_limit, self.reset_seconds) {
            (0, _) => "always deny".to_owned(),
            (n, 0) => format!("always allow ({n})"),
            (n, s) if self.overdraft => {
                format!(
                    "{}, overdraft",
                    (self.algorithm.spec().describe)(n, s, self.burst)
                )
            }
            (n, s) => (self.algorithm.spec().describe)(n, s, self.burst),
        }
    }

    /// Its numbers, as an algorithm counts them.
    pub fn numbers(&self) -> Numbers {
        Numbers {
            credit_limit: self.credit_limit,
            reset_seconds: self.reset_seconds,
            burst: self.burst,
        }
    }
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// 1-based position in the file; the default rule comes last.
    pub position: usize,
    /// Whether this is the default (catch-all) rule.
    pub is_default: bool,
    /// Whether the rule came from another source than the file (ZooKeeper);
    /// `position` then counts in that source.
    pub aux: bool,
    /// Required request keys and their values (exact or glob), sorted by key.
    pub operation: Vec<(String, String)>,
    /// The limits (at least one); a hit is allowed only if every one allows it.
    pub limits: Vec<LimitSpec>,
    /// Whether the rule was written with `limits` (its counter keys name each limit's actor field).
    pub multi: bool,
    /// stop or canary.
    pub match_policy: MatchPolicy,
    /// Unique name.
    pub label: Option<String>,
    /// Free text.
    pub comment: Option<String>,
    /// Envoy domain pattern; `None` applies to every domain and to line-protocol HITs.
    pub domain: Option<String>,
    /// The body of this rule's denials (`None`: the service's `--denied-body`).
    pub denied_body: Option<DeniedBody>,
}

impl RuleSpec {
    /// The first limit (a rule written with `creditLimit` has only this one).
    pub fn first_limit(&self) -> &LimitSpec {
        // Validation guarantees at least one limit.
        &self.limits[0]
    }

    /// The operation as divvy writes it: `k=v` pairs sorted by key, joined by one space.
    pub fn operation_text(&self) -> String {
        let mut out = String::new();
        for (i, (k, v)) in self.operation.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(k);
            out.push('=');
            out.push_str(v);
        }
        out
    }
}

impl fmt::Display for RuleSpec {
    /// `rule #3 (label cookies)`, `rule #3 (method=GET path=/x)` or `the default rule (#6)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default {
            return write!(f, "the default rule (#{})", self.position);
        }
        let kind = if self.aux { "aux rule" } else { "rule" };
        write!(f, "{kind} #{} (", self.position)?;
        match &self.label {
            Some(label) => write!(f, "label {label}")?,
            None => write!(f, "{}", self.operation_text())?,
        }
        if let Some(d) = &self.domain {
            write!(f, ", domain {d}")?;
        }
        write!(f, ")")
    }
}

/// A validated policy: override rules in order, the default rule last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// envoyproxy/ratelimit files, one domain each (a directory's).
    pub envoy: Vec<std::sync::Arc<super::envoy_ratelimit::EnvoyConfig>>,
    /// Whether the rules come from a divvy policy (false: a directory of
    /// envoyproxy/ratelimit files only, and the one rule is a stand-in).
    pub divvy_rules: bool,
    /// The governors (each sets one label's creditLimit knob).
    pub governors: Vec<GovernorSpec>,
    /// Where it came from (for messages and the admin API).
    pub source: String,
    /// The rules; the last one is the default.
    pub rules: Vec<RuleSpec>,
    /// How the descriptors of one request are charged.
    pub charge: Charge,
}

/// What a governor's controller is asked to do (validated: every number
/// finite, `min <= max`, gains not negative).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// The load to hold.
    pub setpoint: f64,
    /// Lowest output (creditLimit).
    pub min: f64,
    /// Highest output (creditLimit).
    pub max: f64,
    /// Proportional gain.
    pub kp: f64,
    /// Integral gain (per second).
    pub ki: f64,
    /// Derivative gain (seconds).
    pub kd: f64,
    /// Load above which the output drops to 0 at once.
    pub breaker_above: Option<f64>,
    /// Steps without data after which the output falls to `min`.
    pub fallback_after: u32,
}

/// A validated governor.
#[derive(Debug, Clone, PartialEq)]
pub struct GovernorSpec {
    /// The governed label (its knob's label).
    pub rule: String,
    /// The PromQL query.
    pub query: String,
    /// Prometheus's base URL; `None`: the server's `--prometheus-url`.
    pub prometheus: Option<String>,
    /// The control interval.
    pub every: Duration,
    /// The controller's numbers.
    pub tuning: Tuning,
}

// Every number is checked finite by validation, so equality is total.
impl Eq for GovernorSpec {}
