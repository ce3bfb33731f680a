//! The `redis` section: the Redis store next to the memory store, and
//! redis-benchmark's EVALSHA; the paced pair of rows it shares with
//! `redis-far`.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::line::{conn_request_line, line_paced_with};
use crate::procs::divvy::{start_divvy, start_divvy_with, POLICY};
use crate::procs::redis::{redis_benchmark_evalsha, script_calls, RedisProc};
use crate::sections::line::{line_pairs, LINE_LOADS};
use crate::stats::format::{dur_ratio, pct_ratios, print_row, ratio, ratio_opt, thousands, us};
use crate::stats::summary::Summary;
use crate::stats::tally::{abba, Tally, Target};

/// The Redis store next to the memory store, and redis-benchmark's own
/// EVALSHA figure on the same redis-server, in the same run.
pub fn redis_section(rt: &Runtime, redis: &RedisProc, run: Duration, summary: &mut Summary) {
    println!(
        "\n## redis: line protocol, Redis store (redis-server on the servers' CPU) vs memory store"
    );
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let memory = start_divvy();
    let shared = start_divvy_with(POLICY, &["--redis-url", &url]);
    evalsha_rows(redis, run, summary);
    let targets = [
        Target {
            addr: memory.line,
            pids: vec![("divvy", memory.pid())],
        },
        Target {
            addr: shared.line,
            pids: vec![("divvy", shared.pid()), ("redis", redis.child.id())],
        },
    ];
    let redis_max = line_rows(rt, redis, &targets, run, summary);
    // Latency at a paced load, where batching trades a wait for the call in
    // flight against CPU: the Redis store's own maximum sets the rates.
    let Some(max) = redis_max else { return };
    paced_pair(
        rt,
        &targets,
        ["memory store", "redis store"],
        (max, run),
        "redis",
        |share, rate| {
            format!(
                "{} conns paced at {share:.0}% of the Redis store's maximum ({rate:.0}/s) (baseline: memory store)",
                LINE_LOADS[0].1
            )
        },
        summary,
    );
}

/// redis-benchmark's EVALSHA of divvy's script on `redis`: calls/s and
/// Redis's CPU per call at 64 clients (1 and 16 pipelined), then its CPU
/// per counter at 32 counters a call.
fn evalsha_rows(redis: &RedisProc, run: Duration, summary: &mut Summary) {
    let requests = ((run.as_secs_f64() * 60_000.0) as u64).max(10_000);
    for (clients, pipeline) in [(64, 1), (64, 16)] {
        let (rate, cpu) = redis_benchmark_evalsha(redis, clients, pipeline, requests, 1);
        println!(
            "  {:<38} {rate:>9.0} call/s  ({clients} clients, {pipeline} pipelined; redis cpu/call {})",
            "redis-benchmark: EVALSHA of divvy's script",
            us(cpu)
        );
        if pipeline == 1 {
            summary.row(
                "redis",
                "redis-benchmark EVALSHA of divvy's script, 64 clients: calls/s, Redis CPU µs/call",
                format!("{} /s, {}", thousands(rate), us(cpu)),
                String::from("–"),
                String::from("–"),
            );
        }
    }
    // The script's cost per counter in a batch, without divvy's side.
    let batched = (requests / 32).max(1_000);
    let (rate, cpu) = redis_benchmark_evalsha(redis, 16, 1, batched, 32);
    let per_counter = cpu.map(|c| c / 32.0);
    println!(
        "  {:<38} {rate:>9.0} call/s  (16 clients, 32 counters a call; redis cpu/counter {})",
        "redis-benchmark: EVALSHA of divvy's script",
        us(per_counter)
    );
    summary.row(
        "redis",
        "redis-benchmark EVALSHA of divvy's script, 32 counters a call: Redis CPU µs/counter",
        us(per_counter),
        String::from("–"),
        String::from("–"),
    );
}

/// Every line load, as the line section runs them, on the memory store
/// and the Redis store (`targets`), with the HITs each script call
/// carried; the Redis store's HIT/s at the first load (64 x 1).
fn line_rows(
    rt: &Runtime,
    redis: &RedisProc,
    targets: &[Target; 2],
    run: Duration,
    summary: &mut Summary,
) -> Option<f64> {
    let loads = LINE_LOADS;
    let pairs = line_pairs(rt, targets, ["memory store", "redis store"], run, &loads);
    let mut calls_before = script_calls(redis.port);
    let mut redis_max = None;
    for (name, [mut m, mut r]) in pairs {
        if name == LINE_LOADS[0].0 {
            redis_max = Some(r.rate());
        }
        // Only the Redis store's runs call the script, so the calls since
        // the last load are theirs: how many HITs one script call carried.
        let calls = script_calls(redis.port);
        let per_call = calls
            .zip(calls_before)
            .map(|(a, b)| a.saturating_sub(b))
            .filter(|&c| c > 0)
            .map(|c| r.f.requests as f64 / c as f64);
        calls_before = calls;
        let per_call = per_call.map_or_else(|| String::from("n/a"), |v| format!("{v:.1}"));
        println!("  redis store: {name}: {per_call} HITs per script call");
        store_rows(name, per_call, &mut m, &mut r, summary);
    }
    redis_max
}

/// The Redis store (`r`) against the memory store (`m`) at the line load
/// `name`: the ratios, and the summary's rows (`per_call`: HITs per script
/// call).
fn store_rows(name: &str, per_call: String, m: &mut Tally, r: &mut Tally, summary: &mut Summary) {
    println!(
        "  redis / memory store: HIT/s {}, p99 {}, divvy cpu/HIT {}, divvy + redis cpu/HIT {}",
        ratio(r.rate(), m.rate()),
        dur_ratio(r.f.pct(0.99), m.f.pct(0.99)),
        ratio_opt(r.cpu_us(0), m.cpu_us(0)),
        ratio_opt(
            r.cpu_us(0).zip(r.cpu_us(1)).map(|(a, b)| a + b),
            m.cpu_us(0)
        )
    );
    summary.rate_and_latency("redis", &format!("{name} (baseline: memory store)"), r, m);
    summary.row(
        "redis",
        &format!("HITs per script call (the batch), {name}"),
        per_call,
        String::from("–"),
        String::from("–"),
    );
    summary.row(
        "redis",
        &format!("CPU µs/HIT divvy + Redis, {name} (baseline: memory store)"),
        format!("{} + {}", us(r.cpu_us(0)), us(r.cpu_us(1))),
        us(m.cpu_us(0)),
        ratio_opt(
            r.cpu_us(0).zip(r.cpu_us(1)).map(|(a, b)| a + b),
            m.cpu_us(0),
        ),
    );
}

/// The paced rows of a section comparing two line servers (`targets`,
/// called `labels`): [`LINE_LOADS`]' 64 connections paced at each share of
/// [`REDIS_PACED`] of `max` HIT/s, ABBA in `run`; each server's row, the
/// second's latency over the first's, and a summary row in `section` (what
/// it measured: `what` of the share in percent and the rate).
pub fn paced_pair(
    rt: &Runtime,
    targets: &[Target; 2],
    labels: [&str; 2],
    (max, run): (f64, Duration),
    section: &str,
    what: impl Fn(f64, f64) -> String,
    summary: &mut Summary,
) {
    for share in REDIS_PACED {
        let rate = max * share;
        let [mut a, mut b] = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
            line_paced_with(addr, run, rate, LINE_LOADS[0].1, conn_request_line)
        });
        let label = format!("paced {:.0}% ({rate:.0}/s)", share * 100.0);
        for (who, t) in [(labels[0], &mut a), (labels[1], &mut b)] {
            let note = t.cpu_note("HIT");
            print_row(&format!("{who}: {label}"), &mut t.f, "HIT/s", &note);
        }
        println!(
            "  {} / {}, {label}: p50 / p99 / p99.9 {}",
            labels[1],
            labels[0],
            pct_ratios(&mut b.f, &mut a.f)
        );
        summary.latency(section, &what(share * 100.0, rate), &mut b, &mut a);
    }
}

/// Shares of the Redis store's 64 x 1 maximum its paced runs offer.
pub const REDIS_PACED: [f64; 2] = [0.25, 0.5];
