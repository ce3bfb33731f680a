//! The compiled, immutable rule set and matching.
//!
//! A [`RuleSet`] is built once from a validated [`Policy`] and then shared
//! (through `ArcSwap`) by every request. Matching an [`Operation`] yields a
//! [`MatchPlan`]: the canary rules that match, in order, up to the first
//! matching stop rule, which decides. Rules with an exact value are indexed
//! by one (key, value) pair, the rarest one in the policy, so a descriptor is
//! only compared with rules that share one of its exact pairs plus the rules
//! that have no exact value at all.

pub mod bounded;
pub mod descriptor_tree;
pub mod operation;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{GovernorSpec, LimitSpec, MatchPolicy, Policy, RuleSpec};
use crate::observe::telemetry::{RuleTelemetry, Telemetry};
use crate::pattern::Pattern;
use crate::store::{Algorithm, Charge};
pub use operation::{Operation, OperationBuilder};

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule as validated.
    pub spec: RuleSpec,
    matchers: Vec<(String, Pattern)>,
    domain: Option<Pattern>,
    /// `divvy:<operation>:` (or `divvy@<domain>:<operation>:` for a domain rule).
    key_prefix: String,
    /// Per limit of the spec: the end of its counter keys, after the actor
    /// (`:<creditLimit>:<resetSeconds>[:<algorithm>]`).
    key_suffixes: Vec<String>,
    /// Its metrics and dashboard history, attached when the rule set is
    /// installed (compiling registers nothing).
    telemetry: Option<RuleTelemetry>,
    /// See [`Rule::name`].
    name: String,
}

impl Rule {
    fn compile(spec: RuleSpec) -> Rule {
        let matchers = spec
            .operation
            .iter()
            .map(|(k, v)| (k.clone(), Pattern::new(v)))
            .collect();
        let domain = spec.domain.as_deref().map(Pattern::new);
        let key_prefix = match &spec.domain {
            None => format!("divvy:{}:", spec.operation_text()),
            Some(d) => format!("divvy@{d}:{}:", spec.operation_text()),
        };
        let key_suffixes = spec
            .limits
            .iter()
            .map(|limit| key_suffix(&spec, limit))
            .collect();
        let name = spec.label.clone().unwrap_or_else(|| spec.to_string());
        Rule {
            spec,
            matchers,
            domain,
            key_prefix,
            key_suffixes,
            telemetry: None,
            name,
        }
    }

    /// Its metrics and dashboard history (`None` until its rule set is
    /// installed in a limiter).
    pub fn telemetry(&self) -> Option<&RuleTelemetry> {
        self.telemetry.as_ref()
    }

    /// How answers name the rule: its label, else the rule as written
    /// (`RuleSpec`'s `Display`), formatted once when the rule is compiled
    /// (neither changes while it is in force: knobs change limits only).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this rule applies to `op` in `domain` (`None`: a line-protocol HIT).
    pub fn matches(&self, domain: Option<&str>, op: &Operation) -> bool {
        let domain_ok = match (&self.domain, domain) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(p), Some(d)) => p.matches(d),
        };
        domain_ok
            && self
                .matchers
                .iter()
                .all(|(k, p)| op.get(k).is_some_and(|v| p.matches(v)))
    }

    /// The actor of `op` for `limit`: the value of its `actorField`, or ""
    /// when it has none or the request lacks the key.
    pub fn actor<'a>(&self, op: &'a Operation, limit: &LimitSpec) -> &'a str {
        limit
            .actor_field
            .as_deref()
            .and_then(|f| op.get(f))
            .unwrap_or("")
    }

    /// The counter key of `limit` for `op`, in divvy's Redis key shape:
    /// `divvy:<operation>:<actor>:<creditLimit>:<resetSeconds>`, as divvy
    /// writes it for a rule with divvy's window. Other algorithms append
    /// `:<algorithm>` (`fixed`, `sliding`, `token_bucket`); a rule written
    /// with `limits` appends it always and writes the actor as
    /// `<actorField>=<value>`, so its limits never share a counter. Rules
    /// with a domain use `divvy@<domain>:...` so that equal operations in
    /// different domains never share a counter. An actor value longer than
    /// 64 bytes is written bounded ([`bounded`]).
    pub fn counter_key(&self, op: &Operation, limit: &LimitSpec) -> String {
        let actor = self.actor(op, limit);
        let mut key = spare_key(self.key_prefix.len() + actor.len() + 40);
        key.push_str(&self.key_prefix);
        if self.spec.multi {
            if let Some(field) = &limit.actor_field {
                key.push_str(field);
                key.push('=');
            }
        }
        bounded::push_value(&mut key, actor);
        // One of the spec's own limits (an override's limit is made per request).
        match self
            .spec
            .limits
            .iter()
            .position(|l| std::ptr::eq(l, limit))
            .and_then(|i| self.key_suffixes.get(i))
        {
            Some(suffix) => key.push_str(suffix),
            None => key.push_str(&key_suffix(&self.spec, limit)),
        }
        key
    }

    /// Whether this rule only counts and never decides.
    pub fn is_canary(&self) -> bool {
        self.spec.match_policy == MatchPolicy::Canary
    }

    /// Whether this rule decides as a stop rule but never denies
    /// (`matchPolicy: shadow`).
    pub fn is_shadow(&self) -> bool {
        self.spec.match_policy == MatchPolicy::Shadow
    }
}

thread_local! {
    /// Counter keys given back with [`recycle_key`], for the thread's next.
    static SPARE_KEYS: std::cell::Cell<Vec<String>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Most keys, and the longest, kept for reuse.
const SPARE_KEYS_KEPT: usize = 8;
const SPARE_KEY_BYTES: usize = 256;

/// An empty string with room for `capacity` bytes for a counter key: a
/// recycled one when the thread has one.
fn spare_key(capacity: usize) -> String {
    let mut spare = SPARE_KEYS.take();
    let key = spare.pop();
    SPARE_KEYS.set(spare);
    match key {
        Some(mut key) => {
            key.clear();
            key.reserve(capacity);
            key
        }
        None => String::with_capacity(capacity),
    }
}

/// Gives a counter key that is no longer needed to the thread's next
/// [`Rule::counter_key`], so a warm decision builds its keys without
/// allocating (keys grown long, or more than a few, are dropped).
pub fn recycle_key(key: String) {
    if key.capacity() == 0 || key.capacity() > SPARE_KEY_BYTES {
        return;
    }
    let mut spare = SPARE_KEYS.take();
    if spare.len() < SPARE_KEYS_KEPT {
        spare.push(key);
    }
    SPARE_KEYS.set(spare);
}

/// The end of a counter key of `limit` (a limit of `spec`, or one made
/// from it): `:<creditLimit>:<resetSeconds>`, then `:<algorithm>` for a rule
/// with several limits or an algorithm other than divvy's window.
fn key_suffix(spec: &RuleSpec, limit: &LimitSpec) -> String {
    let mut suffix = format!(":{}:{}", limit.credit_limit, limit.reset_seconds);
    if spec.multi || limit.algorithm != Algorithm::Window {
        suffix.push(':');
        suffix.push_str(limit.algorithm.as_str());
    }
    suffix
}

/// The rules that apply to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchPlan {
    /// Indices of matching canary rules before the decider, in order.
    pub canaries: Vec<usize>,
    /// Index of the first matching stop rule (the default when nothing else matches).
    pub decider: usize,
}

/// The exact-pair index: per key (sorted by key, few: the keys rules give
/// exact values), value → indices of the rules indexed under that pair.
/// Built from the policy, then only looked up with a request's keys and
/// values (never grown by them), so its maps need no defence against hash
/// flooding: aHash, not the standard SipHash. The keys are a sorted list
/// rather than a map: a request looks up each of the index's keys among its
/// own sorted pairs, or each of its keys among the index's, whichever are
/// fewer, hashing no keys. Both measured cheaper per HIT
/// (docs/performance.md, "The line protocol path").
type PairIndex = Vec<(String, ValueIndex)>;

/// One key's part of the [`PairIndex`]: value → indices of the rules indexed under it.
type ValueIndex = HashMap<String, Vec<usize>, ahash::RandomState>;

/// The compiled rule set.
#[derive(Debug)]
pub struct RuleSet {
    rules: Vec<Rule>,
    /// key → value → indices of rules indexed under that exact pair (ascending).
    by_pair: PairIndex,
    /// Indices of rules with no exact value (ascending), the default among them.
    unindexed: Vec<usize>,
    /// Where the policy came from.
    source: String,
    /// How the descriptors of one request are charged.
    charge: Charge,
    /// The policy's governors.
    governors: Vec<GovernorSpec>,
    /// Domains defined by envoyproxy/ratelimit files.
    envoy: HashMap<String, Arc<descriptor_tree::DomainTree>>,
    /// Whether the rules come from a divvy policy.
    divvy_rules: bool,
}

impl RuleSet {
    /// Compiles a validated policy. The policy's last rule is the default.
    pub fn new(policy: Policy) -> RuleSet {
        let rules: Vec<Rule> = policy.rules.into_iter().map(Rule::compile).collect();
        let mut frequency: HashMap<(&str, &str), usize> = HashMap::new();
        for rule in &rules {
            for (k, p) in &rule.matchers {
                if let Pattern::Exact(v) = p {
                    *frequency.entry((k.as_str(), v.as_str())).or_default() += 1;
                }
            }
        }
        let mut by_key: HashMap<String, ValueIndex> = HashMap::new();
        let mut unindexed = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let rarest = rule
                .matchers
                .iter()
                .filter_map(|(k, p)| match p {
                    Pattern::Exact(v) => Some((k.as_str(), v.as_str())),
                    _ => None,
                })
                .min_by_key(|pair| frequency.get(pair).copied().unwrap_or(0));
            match rarest {
                Some((k, v)) => by_key
                    .entry(k.to_owned())
                    .or_default()
                    .entry(v.to_owned())
                    .or_default()
                    .push(i),
                None => unindexed.push(i),
            }
        }
        let mut by_pair: PairIndex = by_key.into_iter().collect();
        by_pair.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        RuleSet {
            rules,
            by_pair,
            unindexed,
            source: policy.source,
            charge: policy.charge,
            governors: policy.governors,
            envoy: policy
                .envoy
                .iter()
                .map(|c| {
                    (
                        c.domain.clone(),
                        Arc::new(descriptor_tree::DomainTree::new(c.clone())),
                    )
                })
                .collect(),
            divvy_rules: policy.divvy_rules,
        }
    }

    /// Attaches each rule's metrics and dashboard history from `telemetry`
    /// (what installing the rule set in a limiter does; until then the
    /// rules register nothing).
    pub fn attach(&mut self, telemetry: &Telemetry) {
        for rule in &mut self.rules {
            let spec = &rule.spec;
            let t = telemetry.rule(&rule.name, spec.label.as_deref(), spec.domain.as_deref());
            rule.telemetry = Some(t);
        }
        // The configured limits, for dashboards that draw usage against them.
        let m = &telemetry.metrics.policy;
        m.rule_limit.reset();
        m.rule_window.reset();
        for rule in &self.rules {
            if let Some(l) = rule.spec.limits.first() {
                let name = [rule.name()];
                m.rule_limit
                    .with_label_values(&name)
                    .set(l.credit_limit as f64);
                m.rule_window
                    .with_label_values(&name)
                    .set(l.reset_seconds as f64);
            }
        }
    }

    /// The tree of `domain` when an envoyproxy/ratelimit file defines it.
    pub fn envoy_domain(&self, domain: &str) -> Option<&Arc<descriptor_tree::DomainTree>> {
        if self.envoy.is_empty() {
            return None;
        }
        self.envoy.get(domain)
    }

    /// Every envoyproxy/ratelimit domain, sorted by name.
    pub fn envoy_domains(&self) -> Vec<&Arc<descriptor_tree::DomainTree>> {
        let mut all: Vec<_> = self.envoy.values().collect();
        all.sort_by(|a, b| a.domain().cmp(b.domain()));
        all
    }

    /// Whether divvy rules decide domains no envoyproxy/ratelimit file
    /// defines (false: they get "no limit").
    pub fn has_divvy_rules(&self) -> bool {
        self.divvy_rules
    }

    /// The policy's governors.
    pub fn governors(&self) -> &[GovernorSpec] {
        &self.governors
    }

    /// The rules in order; the last is the default.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Rule `i`.
    pub fn rule(&self, i: usize) -> &Rule {
        &self.rules[i]
    }

    /// Where the policy came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// How the descriptors of one request are charged.
    pub fn charge(&self) -> Charge {
        self.charge
    }

    /// The canaries and the deciding rule for `op` in `domain`
    /// (`None` for a line-protocol HIT, which only domain-less rules match).
    pub fn plan(&self, domain: Option<&str>, op: &Operation) -> MatchPlan {
        // Rules indexed by one of the request's pairs; most requests have
        // none, and then the unindexed rules (in order) are the candidates.
        let mut indexed: Vec<usize> = Vec::new();
        if self.by_pair.len() <= op.len() {
            for (k, values) in &self.by_pair {
                if let Some(list) = op.get(k).and_then(|v| values.get(v)) {
                    indexed.extend_from_slice(list);
                }
            }
        } else {
            for (k, v) in op.pairs() {
                let key = self.by_pair.binary_search_by(|(e, _)| e.as_str().cmp(k));
                if let Some(list) = key.ok().and_then(|i| self.by_pair[i].1.get(v)) {
                    indexed.extend_from_slice(list);
                }
            }
        }
        let candidates: &[usize] = if indexed.is_empty() {
            &self.unindexed
        } else {
            indexed.extend_from_slice(&self.unindexed);
            indexed.sort_unstable();
            &indexed
        };
        let mut canaries = Vec::new();
        for &i in candidates {
            let rule = &self.rules[i];
            if rule.matches(domain, op) {
                if rule.is_canary() {
                    canaries.push(i);
                } else {
                    return MatchPlan {
                        canaries,
                        decider: i,
                    };
                }
            }
        }
        // Unreachable with a validated policy (the default matches everything),
        // but never panic: fall back to the last rule.
        MatchPlan {
            canaries,
            decider: self.rules.len().saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests;
