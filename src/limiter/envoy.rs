//! Deciding a request of a domain an envoyproxy/ratelimit file defines,
//! with that project's answers.
//!
//! Each descriptor reaches at most one limit ([`DomainTree::find`]) or
//! carries its own override; `replaces`, `unlimited`, `shadow_mode` and
//! `share_threshold` behave as there, and every other limit is an
//! epoch-aligned fixed window keyed by domain and descriptor entries.
//!
//! `MARK`: envoyproxy/ratelimit counts every hit, over the limit or not;
//! here a hit counts only up to one past the limit (the counter's limit is
//! requests_per_unit + 1, and a hit larger than what is left fills the
//! counter: `CounterOp::fill`), so the answers are the same, the counter
//! stays bounded, and the request takes one store call. More: README, "Migrating from envoyproxy/ratelimit".

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::bucket::{self, BucketLimit};
use super::engine::Engine;
use super::outcome::Verdict;
use super::record::{Tally, TreeTally};
use super::request::{Descriptor, Items, Request};
use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::rules::bounded;
use crate::rules::descriptor_tree::DomainTree;
use crate::store::{Algorithm, Charge, CounterOp, CounterState};

/// envoyproxy/ratelimit's settings that change answers, under that
/// project's variable names; built once at start and handed in.
#[derive(Debug, Clone)]
pub struct EnvoySettings {
    /// `SHADOW_MODE`: statuses kept, the overall code always OK.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is a quota descriptor (the request is
    /// over only when all of them are), as `quota_mode` makes one.
    pub quota_mode: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: nothing is charged when
    /// any descriptor is over its limit.
    pub all_or_nothing: bool,
    /// `NEAR_LIMIT_RATIO` (0.8): the share of a limit past which hits count as near the limit.
    pub near_limit_ratio: f64,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`: the limit, remaining and reset
    /// header names (`LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
    /// `LIMIT_RESET_HEADER`).
    pub headers: Option<[String; 3]>,
    /// `RESPONSE_DYNAMIC_METADATA`: the response carries the request and
    /// the metadata of the descriptors that passed.
    pub dynamic_metadata: bool,
    /// `CACHE_KEY_PREFIX`: put in front of every counter key, so deployments
    /// sharing one Redis count apart.
    pub cache_key_prefix: String,
    /// Before any configuration is loaded, ShouldRateLimit is an error
    /// ("no rate limit configuration loaded"), as in envoyproxy/ratelimit;
    /// otherwise every descriptor gets "no limit".
    pub error_without_config: bool,
}

impl Default for EnvoySettings {
    /// envoyproxy/ratelimit's defaults: every variable unset.
    fn default() -> EnvoySettings {
        EnvoySettings::from_vars(|_| None)
    }
}

impl EnvoySettings {
    /// The settings from envoyproxy/ratelimit's variables, each read through
    /// `var` (the process's environment, read once at start by the caller).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> EnvoySettings {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let flag = |name: &str| {
            set(name).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "t" | "true" | "yes"
                )
            })
        };
        let or = |name: &str, default: &str| set(name).unwrap_or_else(|| default.to_owned());
        EnvoySettings {
            shadow_mode: flag("SHADOW_MODE"),
            quota_mode: flag("QUOTA_MODE"),
            all_or_nothing: flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
            near_limit_ratio: set("NEAR_LIMIT_RATIO")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|r| r.is_finite() && (0.0..=1.0).contains(r))
                .unwrap_or(0.8),
            headers: flag("LIMIT_RESPONSE_HEADERS_ENABLED").then(|| {
                [
                    or("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                    or("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                    or("LIMIT_RESET_HEADER", "RateLimit-Reset"),
                ]
            }),
            dynamic_metadata: flag("RESPONSE_DYNAMIC_METADATA"),
            cache_key_prefix: set("CACHE_KEY_PREFIX").unwrap_or_default(),
            error_without_config: false,
        }
    }
}

/// The limit a descriptor was decided by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyCurrent {
    /// requests_per_unit.
    pub requests_per_unit: u32,
    /// unit.
    pub unit: EnvoyUnit,
    /// name.
    pub name: String,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyStatus {
    /// OVER_LIMIT (false: OK).
    pub over: bool,
    /// The limit, if one applied (none for "no limit" and unlimited).
    pub current: Option<EnvoyCurrent>,
    /// limit_remaining.
    pub remaining: u32,
    /// duration_until_reset (with a limit).
    pub reset: Option<Duration>,
    /// Whether it was unlimited.
    pub unlimited: bool,
    /// Whether the limit is in quota mode.
    pub quota: bool,
    /// The metadata of the node that decided.
    pub metadata: Option<serde_json::Value>,
}

impl EnvoyStatus {
    /// A descriptor no limit applies to: OK, with nothing else.
    pub(crate) fn no_limit() -> EnvoyStatus {
        EnvoyStatus {
            over: false,
            current: None,
            remaining: 0,
            reset: None,
            unlimited: false,
            quota: false,
            metadata: None,
        }
    }
}

/// The limit a descriptor reached, before `replaces` applies.
struct Found {
    current: EnvoyCurrent,
    path: Vec<(String, String)>,
    stats_key: String,
    shadow: bool,
    quota: bool,
    metadata: Option<serde_json::Value>,
    unlimited: bool,
}

pub(super) struct Planned {
    current: EnvoyCurrent,
    stats_key: String,
    shadow: bool,
    quota: bool,
    metadata: Option<serde_json::Value>,
    /// The op index; `None` for requests_per_unit 0 (always over).
    op: Option<usize>,
    cost: u64,
    /// The descriptor's entries as counted (the dashboard's actor when denied).
    path: Vec<(String, String)>,
}

/// The counter of a descriptor: `prefix` (`CACHE_KEY_PREFIX`), the domain,
/// each entry's key and value (bounded as in divvy's keys) with its length
/// in front, so no choice of keys and values can spell another descriptor's
/// counter, and the unit.
fn counter_key(prefix: &str, domain: &str, path: &[(String, String)], unit: EnvoyUnit) -> String {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(16 + prefix.len() + domain.len() + path.len() * 24);
    key.push_str(prefix);
    key.push_str("divvy-rl:");
    key.push_str(domain);
    let mut part = String::new();
    for (k, v) in path {
        for text in [k, v] {
            part.clear();
            bounded::push_value(&mut part, text);
            // Writing to a String cannot fail.
            let _ = write!(key, "_{}:{part}", part.len());
        }
    }
    key.push(':');
    key.push_str(&unit.seconds().to_string());
    key
}

/// Seconds left in the epoch-aligned window of `unit`.
fn until_reset(unit: EnvoyUnit) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let u = unit.seconds();
    Duration::from_secs(u - now % u)
}

/// What a descriptor comes to before the store is asked.
pub(super) enum Slot {
    /// No limit reached (or one another matched limit `replaces`).
    NoLimit,
    /// An unlimited limit.
    Unlimited,
    /// A limit to count (or always over, without an op).
    Counted(Planned),
}

/// The limit descriptor `d` reached in `tree`, if any; the names it
/// `replaces` are added to `replacing`.
fn find(tree: &DomainTree, d: &Descriptor, replacing: &mut HashSet<String>) -> Option<Found> {
    if let Some((rpu, unit)) = d.envoy_override() {
        return Some(override_found(tree.domain(), d, rpu, unit));
    }
    let m = tree.find(&d.entries)?;
    let limit = m.node.limit.clone()?;
    replacing.extend(limit.replaces.iter().cloned());
    Some(Found {
        current: EnvoyCurrent {
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.unwrap_or(EnvoyUnit::Second),
            name: limit.name,
        },
        path: m.counter_path,
        stats_key: m.stats_key,
        shadow: m.node.shadow_mode,
        quota: m.node.quota_mode,
        metadata: m.node.metadata,
        unlimited: limit.unlimited,
    })
}

/// A descriptor's own limit: its entries are the counter's path.
fn override_found(domain: &str, d: &Descriptor, rpu: u32, unit: EnvoyUnit) -> Found {
    let mut stats_key = domain.to_owned();
    for &(k, v) in d.entries.iter() {
        stats_key.push('.');
        bounded::push_value(&mut stats_key, k);
        if !v.is_empty() {
            stats_key.push('_');
            bounded::push_value(&mut stats_key, v);
        }
    }
    Found {
        current: EnvoyCurrent {
            requests_per_unit: rpu,
            unit,
            name: String::new(),
        },
        path: d
            .entries
            .iter()
            .map(|&(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        stats_key,
        shadow: false,
        quota: false,
        metadata: None,
        unlimited: false,
    }
}

/// What `found` comes to for `d`, with its op (if counted) appended to `ops`.
fn slot(
    domain: &str,
    d: &Descriptor,
    found: Option<Found>,
    replacing: &HashSet<String>,
    settings: &EnvoySettings,
    ops: &mut Vec<CounterOp>,
) -> Slot {
    let Some(f) = found else {
        return Slot::NoLimit;
    };
    if f.unlimited {
        return Slot::Unlimited;
    }
    if !f.current.name.is_empty() && replacing.contains(&f.current.name) {
        return Slot::NoLimit;
    }
    // Without all-or-nothing the counter's limit is one more than the
    // file's: a count of requests_per_unit + 1 marks the window over (see
    // `MARK` in the module doc). With it, nothing over the limit is ever
    // counted, as in envoyproxy/ratelimit.
    let limit = u64::from(f.current.requests_per_unit) + u64::from(!settings.all_or_nothing);
    let op = (limit > 0).then(|| {
        let mut op = CounterOp::new(
            counter_key(&settings.cache_key_prefix, domain, &f.path, f.current.unit),
            Algorithm::Fixed,
            limit,
            Duration::from_secs(f.current.unit.seconds()),
            d.cost,
        );
        // A shadow limit never denies the request, nor does a check
        // (hits_addend 0).
        op.decides = !f.shadow && d.cost > 0 && !d.refund;
        op.refund = d.refund;
        // A hit larger than what is left takes what is left, so the
        // window reads over (see `MARK`); all-or-nothing never over-counts.
        op.fill = !settings.all_or_nothing;
        ops.push(op);
        ops.len() - 1
    });
    Slot::Counted(Planned {
        current: f.current,
        stats_key: f.stats_key,
        shadow: f.shadow,
        quota: f.quota,
        metadata: f.metadata,
        op,
        cost: d.cost,
        path: f.path,
    })
}

/// How the request is charged: all-or-nothing under
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, nothing at all when a limit
/// of 0 already denies it.
fn charge(slots: &[Slot], settings: &EnvoySettings) -> Charge {
    let zero_over = slots
        .iter()
        .any(|s| matches!(s, Slot::Counted(p) if p.op.is_none() && !p.shadow && p.cost > 0));
    match settings.all_or_nothing {
        false => Charge::Each,
        true if zero_over => Charge::Denied,
        true => Charge::AllOrNothing,
    }
}

/// The envoyproxy/ratelimit engine: the tree of the file that defines the
/// request's domain, under envoyproxy/ratelimit's settings.
pub(super) struct Tree<'a> {
    pub(super) tree: &'a DomainTree,
    pub(super) settings: &'a EnvoySettings,
}

impl<'r> Engine<'r> for Tree<'_> {
    type Plan = Vec<Slot>;

    fn plan(&self, request: &Request<'r>, ops: &mut Vec<CounterOp>) -> (Vec<Slot>, Charge) {
        let from_hits: Vec<Descriptor<'r>>;
        let descriptors = match request.items {
            Items::Descriptors(d) => d,
            Items::Hits(hits) => {
                from_hits = hits.iter().map(Descriptor::of_hit).collect();
                &from_hits
            }
        };
        // Every descriptor's limit first: a later one's `replaces` counts too.
        let mut replacing: HashSet<String> = HashSet::new();
        let found: Vec<Option<Found>> = descriptors
            .iter()
            .map(|d| find(self.tree, d, &mut replacing))
            .collect();
        let slots: Vec<Slot> = descriptors
            .iter()
            .zip(found)
            .map(|(d, f)| slot(self.tree.domain(), d, f, &replacing, self.settings, ops))
            .collect();
        let charge = charge(&slots, self.settings);
        (slots, charge)
    }

    fn finish(
        &self,
        slots: Vec<Slot>,
        _ops: &mut [CounterOp],
        states: &[CounterState],
        tallies: &mut Vec<Tally>,
    ) -> Verdict {
        let statuses = slots
            .into_iter()
            .map(|s| match s {
                Slot::NoLimit => EnvoyStatus::no_limit(),
                Slot::Unlimited => EnvoyStatus {
                    remaining: u32::MAX,
                    unlimited: true,
                    ..EnvoyStatus::no_limit()
                },
                Slot::Counted(p) => status(p, states, self.settings, tallies),
            })
            .collect();
        Verdict::Envoy(statuses)
    }

    fn bucket(&self, _domain: &str, entries: &[(&str, &str)]) -> BucketLimit {
        bucket::tree_limit(self.tree, entries, &self.settings.cache_key_prefix)
    }
}

/// The answer for a counted descriptor, from its counter's state, with its
/// tally for the record step.
fn status(
    p: Planned,
    states: &[CounterState],
    settings: &EnvoySettings,
    tallies: &mut Vec<Tally>,
) -> EnvoyStatus {
    let rpu = u64::from(p.current.requests_per_unit);
    let (allowed, remaining) = match p.op {
        // All-or-nothing: the count never exceeds the limit, and a check
        // of 0 hits passes even at the limit.
        Some(i) if settings.all_or_nothing => {
            (states[i].allowed || p.cost == 0, states[i].remaining)
        }
        // Otherwise the store counts against requests_per_unit + 1: within
        // the file's limit when at least one credit of that is left after
        // the hit (a check: when the count is at most the limit).
        Some(i) => {
            let left = states[i].remaining;
            let within = states[i].allowed && (p.cost == 0 || left >= 1);
            (within, left.saturating_sub(1))
        }
        None => (p.cost == 0, 0),
    };
    let used = rpu.saturating_sub(remaining);
    let near_at = (rpu as f64 * settings.near_limit_ratio).floor() as u64;
    tallies.push(Tally::Tree(TreeTally {
        stats_key: p.stats_key,
        requests_per_unit: p.current.requests_per_unit,
        unit: p.current.unit,
        allowed,
        shadow: p.shadow,
        cost: p.cost,
        near: match used > near_at {
            true => p.cost.min(used - near_at),
            false => 0,
        },
        actor: match allowed || p.shadow {
            true => String::new(),
            false => actor(&p.path),
        },
    }));
    EnvoyStatus {
        over: !allowed && !p.shadow,
        remaining: if allowed {
            u32::try_from(remaining).unwrap_or(u32::MAX)
        } else {
            0
        },
        reset: Some(until_reset(p.current.unit)),
        unlimited: false,
        quota: p.quota,
        metadata: p.metadata,
        current: Some(p.current),
    }
}

/// A denied descriptor's actor on the dashboard: its entries as counted
/// (`k=v,...`), each value bounded as in counter keys.
fn actor(path: &[(String, String)]) -> String {
    let mut actor = String::new();
    for (i, (k, v)) in path.iter().enumerate() {
        if i > 0 {
            actor.push(',');
        }
        bounded::push_value(&mut actor, k);
        actor.push('=');
        bounded::push_value(&mut actor, v);
    }
    actor
}
