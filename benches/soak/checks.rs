//! The checks on what the load saw: every request decided (no 5xx but in
//! the first second after a replica kill), and no limit over-admitted
//! beyond what the failure policy allows.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::faults::{Event, Kind, KNOB_DELETED, KNOB_LIMIT, KNOB_SET};
use crate::load::{Record, Status, ACTORS};
use crate::rig::RULES;

/// What the checks print, and what they found wrong.
#[derive(Default)]
pub struct Findings {
    /// The report's lines.
    pub report: String,
    /// Each failed assertion.
    pub violations: Vec<String>,
}

/// A 5xx is expected only this long after a replica is killed (requests
/// in flight to it, and Envoy's connections to it until its health check
/// fails).
pub const KILL_GRACE: f64 = 1.0;

/// Counts each status; a 5xx outside a kill's first second, or anything
/// that is not a decision, is a violation, except up to `tolerated` 5xx
/// (`SOAK_5XX_TOLERATED`, 0 unless set: see docs/reliability.md), which are
/// reported.
pub fn statuses(records: &[Record], events: &[Event], tolerated: usize, out: &mut Findings) {
    let kills: Vec<f64> = events
        .iter()
        .filter(|e| e.kind == Kind::ReplicaKill)
        .map(|e| e.injected)
        .collect();
    let start = crate::START.get().copied().unwrap_or(0.0);
    // Each other answer: how many, and when the first was sent.
    let mut other: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let (mut allowed, mut denied, mut excused) = (0, 0, 0);
    for r in records {
        let after_kill = kills
            .iter()
            .any(|k| r.done >= *k && r.done <= k + KILL_GRACE);
        match &r.status {
            Status::Allowed => allowed += 1,
            Status::Denied => denied += 1,
            Status::Server(_) if after_kill => excused += 1,
            status => {
                other
                    .entry(status_text(status))
                    .or_insert((0, r.sent - start))
                    .0 += 1
            }
        }
    }
    let per_envoy: Vec<usize> = (0..2)
        .map(|e| records.iter().filter(|r| r.envoy == e).count())
        .collect();
    let _ = writeln!(
        out.report,
        "requests: {} through Envoys {per_envoy:?} (200: {allowed}, 429: {denied}, 5xx in a replica kill's first second: {excused}, anything else: {})",
        records.len(),
        other.values().map(|(n, _)| n).sum::<usize>()
    );
    latency(records, out);
    let server: usize = other
        .iter()
        .filter(|(what, _)| what.starts_with("HTTP 5"))
        .map(|(_, (n, _))| n)
        .sum();
    if server > 0 && server <= tolerated {
        let _ = writeln!(
            out.report,
            "5xx outside replica kills: {server}, tolerated (SOAK_5XX_TOLERATED={tolerated})"
        );
        other.retain(|what, _| !what.starts_with("HTTP 5"));
    }
    for (what, (n, first)) in other {
        out.violations.push(format!(
            "{n} requests answered {what} (first at {first:.1} s)"
        ));
    }
}

/// The load's latency percentiles, from each request's send to its answer.
fn latency(records: &[Record], out: &mut Findings) {
    let mut took: Vec<f64> = records.iter().map(|r| (r.done - r.sent) * 1000.0).collect();
    took.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        took.get(((took.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let _ = writeln!(
        out.report,
        "latency through Envoy, ms: p50 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1}",
        pct(0.5),
        pct(0.99),
        pct(0.999),
        pct(1.0)
    );
}

fn status_text(status: &Status) -> String {
    match status {
        Status::Server(code) => format!("HTTP {code}"),
        Status::Other(why) => why.clone(),
        _ => String::new(),
    }
}

/// How many times a rule's own bound a window may admit while a Redis
/// fault's effects last: with `--on-store-failure local` (the default)
/// each of the two replicas admits up to `--local-share` 0.5 of the limit
/// on its own, beside what Redis admitted before it failed (2x); a Redis
/// restarted empty has also forgotten what it admitted (3x).
fn redis_factor(kind: Kind) -> u64 {
    match kind {
        Kind::RedisKill => 3,
        Kind::RedisStop | Kind::RedisSlow => 2,
        _ => 1,
    }
}

/// How many times its own bound a limit may admit in epoch second `k`:
/// [`redis_factor`] while a Redis fault lasts, and twice it wherever the
/// failure policy decided anything (Redis slower than Envoy's deadline on
/// a busy machine opens the breaker too).
pub fn factor(k: f64, events: &[Event], policy: &[(f64, f64)]) -> u64 {
    let overlaps = |from: f64, to: f64| from < k + 1.0 && to > k;
    let by_policy = if policy.iter().any(|(a, b)| overlaps(*a, *b)) {
        2
    } else {
        1
    };
    events
        .iter()
        .filter(|e| overlaps(e.injected, e.over()))
        .map(|e| redis_factor(e.kind))
        .fold(by_policy, u64::max)
}

/// The most an actor may be admitted on `rule` in epoch second `k`: the
/// rule's own bound times [`factor`] (the global limit: its own
/// arithmetic).
fn bound(rule: usize, k: f64, events: &[Event], policy: &[(f64, f64)]) -> u64 {
    if RULES[rule].0 == crate::global_limit::RULE {
        return crate::global_limit::bound(k, events, policy);
    }
    let mut base = RULES[rule].2;
    if rule == 0 && knob_covers(k, events) {
        base = KNOB_LIMIT;
    }
    base * factor(k, events, policy)
}

/// Whether epoch second `k` lies wholly between a knob being seen on
/// both replicas and its removal (not between a removal and the next
/// knob set, when two knob faults follow each other).
fn knob_covers(k: f64, events: &[Event]) -> bool {
    events.windows(2).any(|pair| {
        let (set, delete) = (&pair[0], &pair[1]);
        set.name == KNOB_SET
            && delete.name == KNOB_DELETED
            && set
                .recovered
                .is_some_and(|seen| k >= seen && k + 1.0 <= delete.injected)
    })
}

/// Counts each actor's admissions per epoch second (only those sent and
/// answered within the same second, so that which window decided them
/// is certain) against the limit in force.
pub fn admissions(records: &[Record], events: &[Event], policy: &[(f64, f64)], out: &mut Findings) {
    let mut counts: BTreeMap<(usize, usize, i64), u64> = BTreeMap::new();
    let (mut certain, mut allowed) = (0u64, 0u64);
    for r in records.iter().filter(|r| r.status == Status::Allowed) {
        allowed += 1;
        if r.sent.floor() == r.done.floor() {
            certain += 1;
            *counts
                .entry((r.rule, r.actor, r.sent.floor() as i64))
                .or_insert(0) += 1;
        }
    }
    let _ = writeln!(
        out.report,
        "admissions: {allowed} (200s), {certain} of them sent and answered in one epoch second and counted per window"
    );
    for (rule, (name, algorithm, _)) in RULES.iter().enumerate() {
        let mut worst = (0u64, 0u64, 0i64);
        let mut over = Vec::new();
        for ((_, _, k), n) in counts.range((rule, 0, i64::MIN)..=(rule, ACTORS, i64::MAX)) {
            let b = bound(rule, *k as f64, events, policy);
            if *n * worst.1 > worst.0 * b || worst.1 == 0 {
                worst = (*n, b, *k);
            }
            if *n > b {
                let at = *k as f64 - crate::START.get().copied().unwrap_or(0.0);
                over.push(format!("{n} > {b} at {at:.0} s"));
            }
        }
        let _ = writeln!(
            out.report,
            "  {name} ({algorithm}): fullest window {} of {} allowed",
            worst.0, worst.1
        );
        if !over.is_empty() {
            out.violations.push(format!(
                "{name}: over-admitted in {} windows: {}",
                over.len(),
                over.join(", ")
            ));
        }
    }
}

/// Each fault's recovery against its bound, and what went wrong in it.
pub fn recoveries(events: &[Event], out: &mut Findings) {
    let start = crate::START.get().copied().unwrap_or(0.0);
    for e in events {
        let recovery = e
            .recovery()
            .map_or("not seen".to_owned(), |r| format!("{:.2} s", r));
        let _ = writeln!(
            out.report,
            "  {:>6.1} s  {:<34} held {:>4.1} s, recovered in {recovery} (bound {:.1} s) {}",
            e.injected - start,
            e.name,
            e.healed - e.injected,
            e.bound,
            e.note
        );
        match e.recovery() {
            None => out.violations.push(format!("{}: no recovery seen", e.name)),
            Some(r) if r > e.bound => out.violations.push(format!(
                "{}: recovered in {r:.2} s, past its bound of {:.1} s",
                e.name, e.bound
            )),
            _ => {}
        }
        if let Some(problem) = &e.problem {
            out.violations.push(format!("{}: {problem}", e.name));
        }
    }
    summary(events, out);
    for kind in crate::faults::ALL {
        if !events.iter().any(|e| e.kind == kind) {
            out.violations.push(format!(
                "fault kind {kind:?} was never injected (run longer)"
            ));
        }
    }
}

/// Per fault (by name): how many, and the median and longest recovery.
fn summary(events: &[Event], out: &mut Findings) {
    let _ = writeln!(out.report, "recovery by fault (count, median, max, bound):");
    let mut names: Vec<&'static str> = events.iter().map(|e| e.name).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let mine: Vec<&Event> = events.iter().filter(|e| e.name == name).collect();
        let mut times: Vec<f64> = mine.iter().filter_map(|e| e.recovery()).collect();
        times.sort_by(f64::total_cmp);
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        let max = times.last().copied().unwrap_or(f64::NAN);
        let _ = writeln!(
            out.report,
            "  {name:<36} {:>4}  {median:>5.2} s  {max:>5.2} s  {:>4.1} s",
            mine.len(),
            mine[0].bound
        );
    }
    let _ = writeln!(out.report, "  faults in all: {}", events.len());
}
