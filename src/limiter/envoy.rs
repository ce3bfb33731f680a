//! Deciding a request of a domain an envoyproxy/ratelimit file defines,
//! with that project's answers.
//!
//! Each descriptor reaches at most one limit ([`DomainTree::find`]), or
//! carries its own (`limit` override). Limits named in another matched
//! limit's `replaces` are dropped; unlimited ones answer OK with
//! `remaining` u32::MAX. Every other limit is an epoch-aligned fixed
//! window of `requests_per_unit` per unit, its counter keyed by the
//! domain and the descriptor's entries (the pattern instead of the value
//! under `share_threshold`). `shadow_mode` limits are counted but never
//! OVER_LIMIT.
//!
//! `MARK`: envoyproxy/ratelimit adds every hit to its counter, over the
//! limit or not, so once a window is over it stays over (a check of 0 hits
//! included). Here a hit that does not fit is counted only up to one past
//! the limit: the counter's limit is requests_per_unit + 1, a count of
//! requests_per_unit + 1 means "over", and a hit larger than what is left
//! takes what is left. The answers are the same; the counter never grows
//! past the limit + 1. Under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`
//! nothing over the limit is counted, as there.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Limiter;
use crate::config::envoy_ratelimit::EnvoyUnit;
use crate::metrics::metrics;
use crate::rules::bounded;
use crate::rules::descriptor_tree::DomainTree;
use crate::store::{Algorithm, Charge, CounterOp, StoreError};

/// envoyproxy/ratelimit's settings that change answers, read from the
/// environment under that project's names.
#[derive(Debug, Clone)]
pub struct EnvoySettings {
    /// `SHADOW_MODE`: statuses kept, the overall code always OK.
    pub shadow_mode: bool,
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
}

fn env_bool(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "t" | "true" | "yes"
        )
    })
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

impl EnvoySettings {
    /// The settings from the environment.
    pub fn from_env() -> EnvoySettings {
        EnvoySettings {
            shadow_mode: env_bool("SHADOW_MODE"),
            all_or_nothing: env_bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
            near_limit_ratio: std::env::var("NEAR_LIMIT_RATIO")
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|r| r.is_finite() && (0.0..=1.0).contains(r))
                .unwrap_or(0.8),
            headers: env_bool("LIMIT_RESPONSE_HEADERS_ENABLED").then(|| {
                [
                    env_or("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
                    env_or("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
                    env_or("LIMIT_RESET_HEADER", "RateLimit-Reset"),
                ]
            }),
            dynamic_metadata: env_bool("RESPONSE_DYNAMIC_METADATA"),
        }
    }
}

/// One descriptor of the request.
#[derive(Debug, Clone)]
pub struct EnvoyDescriptor {
    /// Its entries in order.
    pub entries: Vec<(String, String)>,
    /// Hits to add (at least 1 from Envoy; 0 checks).
    pub cost: u64,
    /// Its own limit (requests per unit, unit), replacing the file's.
    pub limit_override: Option<(u32, EnvoyUnit)>,
    /// `is_negative_hits`: give `cost` back instead of taking it.
    pub refund: bool,
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
    fn no_limit() -> EnvoyStatus {
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

struct Planned {
    current: EnvoyCurrent,
    stats_key: String,
    shadow: bool,
    quota: bool,
    metadata: Option<serde_json::Value>,
    /// The op index; `None` for requests_per_unit 0 (always over).
    op: Option<usize>,
    cost: u64,
}

/// The counter of a descriptor: the domain, each entry's key and value
/// (bounded as in divvy's keys) with its length in front, so no choice of
/// keys and values can spell another descriptor's counter, and the unit.
fn counter_key(domain: &str, path: &[(String, String)], unit: EnvoyUnit) -> String {
    use std::fmt::Write as _;
    let mut key = String::with_capacity(16 + domain.len() + path.len() * 24);
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

impl Limiter {
    /// Decides `descriptors` of `tree`'s domain (see the module doc).
    pub async fn check_envoy(
        &self,
        tree: &DomainTree,
        descriptors: &[EnvoyDescriptor],
        settings: &EnvoySettings,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<EnvoyStatus>, StoreError> {
        let domain = tree.domain();
        let mut out: Vec<EnvoyStatus> = Vec::with_capacity(descriptors.len());
        let mut planned: Vec<Option<Planned>> = Vec::with_capacity(descriptors.len());
        let mut replacing: HashSet<String> = HashSet::new();
        let mut ops: Vec<CounterOp> = Vec::new();
        // First: each descriptor's limit.
        let mut found = Vec::with_capacity(descriptors.len());
        for d in descriptors {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Some((rpu, unit)) = d.limit_override {
                let path: Vec<(String, String)> = d.entries.clone();
                let mut stats_key = domain.to_owned();
                for (k, v) in &d.entries {
                    stats_key.push('.');
                    bounded::push_value(&mut stats_key, k);
                    if !v.is_empty() {
                        stats_key.push('_');
                        bounded::push_value(&mut stats_key, v);
                    }
                }
                found.push(Some(Found {
                    current: EnvoyCurrent {
                        requests_per_unit: rpu,
                        unit,
                        name: String::new(),
                    },
                    path,
                    stats_key,
                    shadow: false,
                    quota: false,
                    metadata: None,
                    unlimited: false,
                }));
                continue;
            }
            let Some(m) = tree.find(&entries) else {
                found.push(None);
                continue;
            };
            let Some(limit) = m.node.limit.clone() else {
                found.push(None);
                continue;
            };
            replacing.extend(limit.replaces.iter().cloned());
            found.push(Some(Found {
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
            }));
        }
        for (d, f) in descriptors.iter().zip(found) {
            let Some(Found {
                current,
                path,
                stats_key,
                shadow,
                quota,
                metadata,
                unlimited,
            }) = f
            else {
                planned.push(None);
                out.push(EnvoyStatus::no_limit());
                continue;
            };
            if unlimited {
                planned.push(None);
                out.push(EnvoyStatus {
                    remaining: u32::MAX,
                    unlimited: true,
                    ..EnvoyStatus::no_limit()
                });
                continue;
            }
            if !current.name.is_empty() && replacing.contains(&current.name) {
                planned.push(None);
                out.push(EnvoyStatus::no_limit());
                continue;
            }
            // Without all-or-nothing the counter's limit is one more than
            // the file's: a count of requests_per_unit + 1 marks the window
            // over (see `MARK` in the module doc). With it, nothing over the
            // limit is ever counted, as in envoyproxy/ratelimit.
            let limit = u64::from(current.requests_per_unit) + u64::from(!settings.all_or_nothing);
            let op = (limit > 0).then(|| {
                let mut op = CounterOp::new(
                    counter_key(domain, &path, current.unit),
                    Algorithm::Fixed,
                    limit,
                    Duration::from_secs(current.unit.seconds()),
                    d.cost,
                );
                // A shadow limit never denies the request, nor does a
                // check (hits_addend 0).
                op.decides = !shadow && d.cost > 0 && !d.refund;
                op.refund = d.refund;
                ops.push(op);
                ops.len() - 1
            });
            planned.push(Some(Planned {
                current,
                stats_key,
                shadow,
                quota,
                metadata,
                op,
                cost: d.cost,
            }));
            out.push(EnvoyStatus::no_limit());
        }
        let zero_over = planned
            .iter()
            .flatten()
            .any(|p| p.op.is_none() && !p.shadow && p.cost > 0);
        let charge = match settings.all_or_nothing {
            false => Charge::Each,
            true if zero_over => Charge::Denied,
            true => Charge::AllOrNothing,
        };
        let states = if ops.is_empty() {
            Vec::new()
        } else {
            let applied = self.store().apply_by(&ops, charge, deadline).await;
            let states = applied.inspect_err(|_| metrics().store_errors.inc())?;
            crate::store::answered_all(states, ops.len())?
        };
        // A hit larger than what is left is not counted by the store:
        // mark its window over by taking what is left (rare; a second call).
        let marks: Vec<CounterOp> = if settings.all_or_nothing {
            Vec::new()
        } else {
            planned
                .iter()
                .flatten()
                .filter_map(|p| {
                    p.op.filter(|&i| p.cost > 0 && !states[i].allowed && states[i].remaining > 0)
                })
                .map(|i| CounterOp {
                    cost: states[i].remaining,
                    ..ops[i].clone()
                })
                .collect()
        };
        // Best effort, and only while the caller still waits: past its
        // deadline the answer goes now.
        let in_time = deadline.is_none_or(|d| tokio::time::Instant::now() < d);
        if !marks.is_empty() && in_time {
            // The answer is OVER_LIMIT either way.
            let _ = self.store().apply_by(&marks, Charge::Each, deadline).await;
        }
        for (status, p) in out.iter_mut().zip(planned) {
            let Some(p) = p else { continue };
            let rpu = u64::from(p.current.requests_per_unit);
            let (allowed, remaining) = match p.op {
                // All-or-nothing: the count never exceeds the limit, and a
                // check of 0 hits passes even at the limit.
                Some(i) if settings.all_or_nothing => {
                    (states[i].allowed || p.cost == 0, states[i].remaining)
                }
                // Otherwise the store counts against requests_per_unit + 1:
                // within the file's limit when at least one credit of that
                // is left after the hit (a check: when the count is at most
                // the limit).
                Some(i) => {
                    let left = states[i].remaining;
                    let within = states[i].allowed && (p.cost == 0 || left >= 1);
                    (within, left.saturating_sub(1))
                }
                None => (p.cost == 0, 0),
            };
            record_stats(&p, allowed, remaining, rpu, settings.near_limit_ratio);
            status.over = !allowed && !p.shadow;
            status.remaining = if allowed {
                u32::try_from(remaining).unwrap_or(u32::MAX)
            } else {
                0
            };
            status.reset = Some(until_reset(p.current.unit));
            status.quota = p.quota;
            status.metadata = p.metadata;
            status.current = Some(p.current);
        }
        Ok(out)
    }
}

fn record_stats(p: &Planned, allowed: bool, remaining: u64, rpu: u64, ratio: f64) {
    let m = metrics();
    let key = m.envoy_stats_key(&p.stats_key);
    let add = |stat: &str, n: u64| {
        if n > 0 {
            m.envoy_stats.with_label_values(&[key, stat]).inc_by(n);
        }
    };
    add("total_hits", p.cost);
    if allowed {
        add("within_limit", p.cost);
        let used = rpu.saturating_sub(remaining);
        let near = (rpu as f64 * ratio).floor() as u64;
        if used > near {
            add("near_limit", p.cost.min(used - near));
        }
    } else {
        add("over_limit", p.cost);
        if p.shadow {
            add("shadow_mode", p.cost);
        }
    }
}
