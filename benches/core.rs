//! In-process benchmarks of the core: rule matching with small and large
//! policies, and memory-store growth under unbounded distinct actors.
//!
//! Run with `cargo bench --bench core`. Figures print; nothing is asserted.
//!
//! - Matching: time per `RuleSet::plan` for a 10-rule policy (the baseline)
//!   and a 10,000-rule policy whose rules each carry an exact value, plus a
//!   linear scan of the same 10,000 rules for comparison.
//! - Memory: 10 million distinct IPs hit a 60-second per-IP rule over one
//!   simulated hour (a manual clock, so it runs in seconds), with the store
//!   swept every simulated 5 seconds as the server does. It prints the
//!   largest number of counters held and the process's resident memory.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use divvy::config::{parse_str, Format};
use divvy::rules::{Operation, RuleSet};
use divvy::store::memory::Clock;
use divvy::store::{Algorithm, CounterOp, MemoryStore};

fn policy(rules: usize) -> RuleSet {
    let mut yaml = String::from("overrides:\n");
    for i in 0..rules {
        yaml.push_str(&format!(
            "  - operation: {{tenant: t{i}, path: \"/api/*\", ip: \"*\"}}\n    creditLimit: 100\n    resetSeconds: 60\n    actorField: ip\n"
        ));
    }
    yaml.push_str("default: {creditLimit: 10, resetSeconds: 60}\n");
    RuleSet::new(parse_str(&yaml, Format::Yaml, "bench.yaml").expect("policy"))
}

fn time_per_op(iters: u64, mut f: impl FnMut(u64)) -> Duration {
    let start = Instant::now();
    for i in 0..iters {
        f(i);
    }
    start.elapsed() / iters as u32
}

fn matching() {
    let small = policy(10);
    let load_start = Instant::now();
    let large = policy(10_000);
    println!(
        "compiling and validating 10,000 rules: {:?}",
        load_start.elapsed()
    );
    let ops: Vec<Operation> = (0..1000)
        .map(|i| {
            Operation::from_pairs([
                ("tenant", format!("t{}", (i * 7919) % 10_000)),
                ("path", "/api/items".to_owned()),
                ("ip", format!("10.0.0.{}", i % 256)),
                ("method", "GET".to_owned()),
            ])
        })
        .collect();
    let iters = 200_000;
    let base = time_per_op(iters, |i| {
        black_box(small.plan(None, &ops[(i % 1000) as usize]));
    });
    let indexed = time_per_op(iters, |i| {
        black_box(large.plan(None, &ops[(i % 1000) as usize]));
    });
    let linear = time_per_op(2_000, |i| {
        let op = &ops[(i % 1000) as usize];
        black_box(large.rules().iter().position(|r| r.matches(None, op)));
    });
    println!("plan, 10 rules (baseline):        {base:>10.1?}");
    println!(
        "plan, 10,000 rules (indexed):     {indexed:>10.1?}  {:.2}x baseline",
        indexed.as_secs_f64() / base.as_secs_f64()
    );
    println!(
        "linear scan of 10,000 rules:      {linear:>10.1?}  {:.0}x baseline",
        linear.as_secs_f64() / base.as_secs_f64()
    );
}

#[derive(Default)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed))
    }
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn memory() {
    const ACTORS: u64 = 10_000_000;
    const HOUR_MS: u64 = 3_600_000;
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::with_clock(clock.clone());
    let rss_before = rss_mib();
    let mut max_len = 0;
    let mut last_sweep = 0;
    let start = Instant::now();
    for i in 0..ACTORS {
        let now = i * HOUR_MS / ACTORS;
        clock.0.store(now, Ordering::Relaxed);
        let op = CounterOp::new(
            format!(
                "divvy:ip=* path=/api/*:10.{}.{}.{}:100:60",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            ),
            Algorithm::Window,
            100,
            Duration::from_secs(60),
            1,
        );
        black_box(store.apply_one(&op));
        if now - last_sweep >= 5_000 {
            store.sweep();
            last_sweep = now;
            max_len = max_len.max(store.len());
        }
    }
    max_len = max_len.max(store.len());
    println!(
        "10,000,000 distinct IPs over a simulated hour, 60 s windows: {:?}, {:.0} hits/s",
        start.elapsed(),
        ACTORS as f64 / start.elapsed().as_secs_f64()
    );
    println!(
        "  most counters held at once: {max_len} (an unswept store would hold {ACTORS}); \
         resident memory grew {:.0} MiB",
        rss_mib() - rss_before
    );
}

fn main() {
    matching();
    memory();
}
