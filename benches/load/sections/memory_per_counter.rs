//! The `memory-per-counter` section: divvy's resident memory per live
//! counter, each single-limit algorithm on the memory store.

use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::generators::line::line_fill;
use crate::procs::divvy::{http_get, start_divvy_with, Divvy};
use crate::procs::usage::rss_bytes;
use crate::sections::algorithms::algorithm_policy;
use crate::stats::format::{print_row, thousands};
use crate::stats::summary::Summary;
use crate::stats::tally::{measure, Tally};

/// The rules of the memory-per-counter section: each actor's one HIT is
/// allowed and leaves a counter that stays live for minutes (a token bucket
/// with a high rate would refill within microseconds and be dropped as good
/// as fresh), an actorField making one counter per actor.
pub const MEMORY_RULES: [(&str, &str); 4] = [
    ("window", "creditLimit: 10\n    resetSeconds: 1h\n    actorField: ip"),
    (
        "fixed",
        "creditLimit: 10\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: fixed",
    ),
    (
        "sliding",
        "creditLimit: 10\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: sliding",
    ),
    (
        "token_bucket",
        "creditLimit: 10\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: token_bucket\n    burst: 10",
    ),
];

/// Live counters added in the memory-per-counter section.
pub const COUNTERS: u64 = 1_000_000;

/// `divvy_counters` from divvy's /metrics (as of its last sweep).
pub fn live_counters(divvy: &Divvy) -> Option<u64> {
    http_get(divvy.http, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix("divvy_counters "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits (at most 5 s) for `divvy_counters` to reach `at_least`; its last value.
pub fn counters_at_least(divvy: &Divvy, at_least: u64) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = live_counters(divvy);
        if n.is_some_and(|n| n >= at_least) || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Resident memory per live counter, each single-limit algorithm on the memory store.
pub fn memory_per_counter_section(rt: &Runtime, summary: &mut Summary) {
    println!(
        "\n## memory-per-counter: memory store, {} HITs with distinct actors (16 conns x 256 \
         pipelined), rule with actorField ip, 10 per 1 h; divvy's VmRSS before and after",
        thousands(COUNTERS as f64)
    );
    for (name, rule) in MEMORY_RULES {
        let mut fill = fill(rt, rule);
        let added = match (fill.n0, fill.n1) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => COUNTERS,
        };
        let per = match (fill.rss0, fill.rss1) {
            (Some(a), Some(b)) if added > 0 => Some((b as f64 - a as f64) / added as f64),
            _ => None,
        };
        let per_text = per.map_or_else(|| String::from("n/a"), |p| format!("{p:.0} B"));
        let note = fill.t.cpu_note("new counter");
        print_row(&format!("{name}: filling"), &mut fill.t.f, "HIT/s", &note);
        print_memory(name, &fill, per, &per_text);
        summary.row(
            "memory-per-counter",
            &format!("{name}: bytes of RSS per live counter (target <= 100)"),
            per_text,
            String::from("–"),
            String::from("–"),
        );
    }
}

/// The readings around one rule's fill: live counters before and after
/// (`n0`, `n1`), VmRSS before, at once after and 2 s after, and the tally
/// of the fill.
struct Fill {
    t: Tally,
    n0: Option<u64>,
    n1: Option<u64>,
    rss0: Option<u64>,
    rss_now: Option<u64>,
    rss1: Option<u64>,
}

/// A divvy serving `rule`, warmed up, then filled with [`COUNTERS`] new
/// actors; its readings.
fn fill(rt: &Runtime, rule: &str) -> Fill {
    // Sweeps every second keep divvy_counters current.
    let divvy = start_divvy_with(&algorithm_policy(rule), &["--sweep-seconds", "1"]);
    let pid = divvy.pid();
    // Warm-up with other actors (10.128.x.x): the runtime, connection
    // buffers and the allocator's first pages are in place before the
    // first reading.
    rt.block_on(line_fill(divvy.line, 1 << 23, 20_000, 16, 256));
    let n0 = counters_at_least(&divvy, 20_000);
    let rss0 = rss_bytes(pid);
    let t = measure(
        rt,
        &[("divvy", pid)],
        line_fill(divvy.line, 0, COUNTERS, 16, 256),
    );
    let n1 = counters_at_least(&divvy, n0.unwrap_or(0) + COUNTERS);
    let rss_now = rss_bytes(pid);
    // Read again 2 s later: the allocator gives back the arrays a
    // table's last growth step left behind after a short delay.
    std::thread::sleep(Duration::from_secs(2));
    let rss1 = rss_bytes(pid);
    Fill {
        t,
        n0,
        n1,
        rss0,
        rss_now,
        rss1,
    }
}

/// The VmRSS and live-counter line of rule `name`: `per` bytes per counter
/// (`per_text`) against the 100-byte target.
fn print_memory(name: &str, fill: &Fill, per: Option<f64>, per_text: &str) {
    println!(
        "  {name}: VmRSS {:.1} MiB -> {:.1} MiB at once, {:.1} MiB 2 s later; live counters {} -> {}: \
         {per_text} per counter 2 s later (target <= 100 B: {})",
        fill.rss0.unwrap_or(0) as f64 / 1048576.0,
        fill.rss_now.unwrap_or(0) as f64 / 1048576.0,
        fill.rss1.unwrap_or(0) as f64 / 1048576.0,
        fill.n0.map_or_else(|| String::from("?"), |n| n.to_string()),
        fill.n1.map_or_else(|| String::from("?"), |n| n.to_string()),
        match per {
            Some(p) if p <= 100.0 => "met",
            Some(_) => "missed",
            None => "n/a",
        }
    );
}
