//! The soak's global limit: a `scope: global` token bucket that both
//! replicas (one region, `--region soak`) decide against a lease of, the
//! global store being the same redis-server as the counters, reached
//! through the same fault proxy (docs/global.md: `--global-url` takes any
//! `--redis-url` form; the two key spaces are apart), so that every Redis
//! fault also cuts the region off from the global store. Its bound per
//! actor and epoch second follows docs/global.md and the README's "When
//! Redis fails", not a flat factor.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checks::Findings;
use crate::faults::{Event, Kind};
use crate::load::{Record, Status};
use crate::rig::{self, Rig, LIMIT, RULES};

/// The rule's name (a value of the load's `rule` header).
pub const RULE: &str = "global";

/// The region both replicas are in.
const REGION: &str = "soak";

/// `--global-lease-ms` (the default): the lease period.
const LEASE_MS: u64 = 2000;

/// `--global-fallback-share` (the default).
const FALLBACK_SHARE: f64 = 0.5;

/// `--global-fallback-ms` (the default).
const FALLBACK_MS: u64 = 2000;

/// `--global-floor` (the default).
const FLOOR: f64 = 0.01;

/// `--local-share` (the default): what each replica's failure policy
/// (`local`) may grant of a limit on its own while Redis fails.
pub const LOCAL_SHARE: f64 = 0.5;

/// The rule in the policy: per actor, [`LIMIT`] a second with a burst of
/// as many, shared by every region.
pub fn policy_part() -> String {
    format!(
        "  - operation: {{rule: {RULE}, actor: \"*\"}}\n    actorField: actor\n    algorithm: token_bucket\n    scope: global\n    creditLimit: {LIMIT}\n    resetSeconds: 1\n    burst: {LIMIT}\n    label: {RULE}\n"
    )
}

/// The flags of a replica of the region, its global store at `url`.
pub fn args(url: &str) -> Vec<String> {
    [
        ("--region", REGION.to_owned()),
        ("--global-url", url.to_owned()),
        ("--global-lease-ms", LEASE_MS.to_string()),
        ("--global-fallback-share", FALLBACK_SHARE.to_string()),
        ("--global-fallback-ms", FALLBACK_MS.to_string()),
        ("--global-floor", FLOOR.to_string()),
        ("--local-share", LOCAL_SHARE.to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value])
    .collect()
}

/// How long after a Redis fault's `injected` stamp the fault is surely in
/// force: the stamp is taken before the signal's own `kill` process is
/// spawned, which takes a while on a loaded machine.
const SLACK: f64 = 0.5;

/// Whether epoch second `k` lies wholly inside an outage of Redis (and so
/// of the global store): stopped or killed, and not yet back.
fn inside(e: &Event, k: f64) -> bool {
    matches!(e.kind, Kind::RedisStop | Kind::RedisKill)
        && k >= e.injected + SLACK
        && k + 1.0 <= e.healed
}

/// A lease's life: 1.5 periods from when the renewal that granted it was
/// sent (docs/global.md, "Leases").
fn lease_life() -> f64 {
    1.5 * LEASE_MS as f64 / 1000.0
}

/// The share of the whole limit the region may decide on in epoch second
/// `k`, at most: the whole while a lease can be in force; inside an
/// outage of the global store (Redis stopped or killed: the same server)
/// (from [`SLACK`] after its stamp) past the life of the last lease
/// granted before it, the fallback share
/// of it, and past the fallback time too, the floor (docs/global.md,
/// "What a region does"). Leases return within a renewal of the store
/// answering, so a second that reaches the healing counts as whole.
fn quota_share(k: f64, events: &[Event]) -> f64 {
    let outage = events.iter().find(|e| inside(e, k));
    let from = |e: &Event| e.injected + SLACK + lease_life();
    match outage {
        Some(e) if k >= from(e) + FALLBACK_MS as f64 / 1000.0 => FLOOR,
        Some(e) if k >= from(e) => FALLBACK_SHARE,
        _ => 1.0,
    }
}

/// The most an actor may be admitted in epoch second `k`:
/// - what the regional bucket in Redis admits: a token bucket of a lease
///   (at most the whole rate, burst at most the whole burst: one region),
///   burst + rate · 1 s; none in a second wholly inside a Redis stop or
///   kill (Redis answers nothing then), once more in a second a Redis
///   restarted empty may reach (it forgot the bucket);
/// - plus, wherever the failure policy may decide (a Redis fault until a
///   second after its recovery, or a replica's count of policy decisions
///   grew), each replica's local bucket: the local share of the quota in
///   force ([`quota_share`]), at least a credit of burst.
pub fn bound(k: f64, events: &[Event], policy: &[(f64, f64)]) -> u64 {
    let whole = 2 * LIMIT;
    let overlaps = |from: f64, to: f64| from < k + 1.0 && to > k;
    let redis_fault =
        |e: &&Event| matches!(e.kind, Kind::RedisStop | Kind::RedisKill | Kind::RedisSlow);
    let inside = events.iter().any(|e| inside(e, k));
    let killed = events
        .iter()
        .any(|e| e.kind == Kind::RedisKill && overlaps(e.injected, e.over()));
    let regional = if inside {
        0
    } else if killed {
        2 * whole
    } else {
        whole
    };
    let by_policy = policy.iter().any(|(a, b)| overlaps(*a, *b))
        || events
            .iter()
            .filter(redis_fault)
            .any(|e| overlaps(e.injected, e.over()));
    if !by_policy {
        return regional;
    }
    let share = LOCAL_SHARE * quota_share(k, events);
    let limit = LIMIT as f64;
    let per_replica = (share * limit).ceil().max(1.0) + (share * limit).ceil();
    regional + 2 * per_replica as u64
}

/// At the end of the run (every fault healed at least 12 s before): each
/// replica must show, in `GET /global`, a lease of the rule's counters in
/// phase `lease`, none above the whole rate, and no fallback; the report
/// shows them and `divvy_global_renewals_total`.
pub fn leases(rig: &Rig, out: &mut Findings) {
    let _ = writeln!(out.report, "global limit's leases at the end:");
    for replica in &rig.replicas {
        let http = replica.http();
        let mut seen = String::new();
        let ok = crate::faults::wait_until(5.0, || {
            let Some((200, body)) = rig::get(http, "/global") else {
                return false;
            };
            let Ok(view) = serde_json::from_str::<serde_json::Value>(&body) else {
                return false;
            };
            let leases: Vec<(f64, String)> = view["leases"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|l| l["counter"].as_str().is_some_and(|c| c.contains(RULE)))
                .map(|l| {
                    let rate = l["rate"].as_f64().unwrap_or(f64::NAN);
                    (rate, l["phase"].as_str().unwrap_or("?").to_owned())
                })
                .collect();
            seen = format!(
                "fallback {}, {} leases: {leases:?}",
                view["fallback"],
                leases.len()
            );
            view["fallback"] == serde_json::Value::Bool(false)
                && !leases.is_empty()
                && leases
                    .iter()
                    .all(|(rate, phase)| phase == "lease" && *rate <= LIMIT as f64 + 1e-6)
        });
        let renewals = rig::get(http, "/metrics")
            .map(|(_, body)| {
                crate::common::parse_metrics(&body)
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("divvy_global_renewals_total"))
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            out.report,
            "  replica {}: {seen}; {renewals}",
            replica.index
        );
        if ok.is_none() {
            out.violations.push(format!(
                "replica {}: no lease of the global limit in force at the end ({seen})",
                replica.index
            ));
        }
    }
}

/// The report's line on the seconds wholly inside a Redis outage (the
/// global store gone too): how many actor-seconds, and the fullest of them
/// against its bound (the over-admission itself is `checks::admissions`'s).
pub fn outages(records: &[Record], events: &[Event], policy: &[(f64, f64)], out: &mut Findings) {
    let Some(rule) = RULES.iter().position(|r| r.0 == RULE) else {
        return;
    };
    let mut counts: BTreeMap<(usize, i64), u64> = BTreeMap::new();
    for r in records.iter().filter(|r| r.rule == rule) {
        let k = r.sent.floor();
        if events.iter().any(|e| inside(e, k)) {
            let admitted = u64::from(r.status == Status::Allowed && k == r.done.floor());
            *counts.entry((r.actor, k as i64)).or_insert(0) += admitted;
        }
    }
    let mut worst = (0u64, 1u64, 1.0f64);
    for ((_, k), n) in &counts {
        let k = *k as f64;
        let b = bound(k, events, policy);
        if n * worst.1 > worst.0 * b || worst.0 == 0 {
            worst = (*n, b, quota_share(k, events));
        }
    }
    let _ = writeln!(
        out.report,
        "  {RULE} inside Redis outages (the global store gone too): {} actor-seconds, fullest {} of {} allowed (quota share {})",
        counts.len(),
        worst.0,
        worst.1,
        worst.2
    );
}
