//! In-process benchmarks of the core: rule matching with small and large
//! policies, and memory-store growth under unbounded distinct actors.
//!
//! Run with `cargo bench --bench core` (`-- line`, `-- grpc`, `-- matching`
//! or `-- memory` for one section). Figures print; nothing is asserted.
//!
//! - Matching: time per `RuleSet::plan` for a 10-rule policy (the baseline)
//!   and a 10,000-rule policy whose rules each carry an exact value, plus a
//!   linear scan of the same 10,000 rules for comparison.
//! - Line path: CPU time per HIT of one line-protocol connection served
//!   in-process over an in-memory pipe (framing, parsing, matching, the
//!   memory store, answering; no kernel), 256 HITs per batch (or
//!   `DIVVY_CORE_BATCH`, for `DIVVY_CORE_ROUNDS` batches), 65,536 actors,
//!   the policy of `cargo bench --bench load`.
//! - gRPC handler: CPU time per `ShouldRateLimit` call of the service's
//!   handler in-process (validation, descriptors into hits, matching, the
//!   memory store, the response; no HTTP/2, no protobuf), the load
//!   benchmark's request over 65,536 actors and its policy.
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

/// The server's allocator, so allocation costs are the server's.
#[global_allocator]
static ALLOCATOR: divvy::allocator::MiMalloc = divvy::allocator::MiMalloc;

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

/// The policy of the load benchmark's line sections.
const LINE_POLICY: &str = include_str!("line_policy.yaml");

/// A limiter on [`LINE_POLICY`] and a fresh memory store, and a
/// current-thread runtime to drive it: the in-process sections' server.
fn line_policy_server() -> (divvy::limiter::Limiter, tokio::runtime::Runtime) {
    let rules = RuleSet::new(parse_str(LINE_POLICY, Format::Yaml, "bench.yaml").expect("policy"));
    let limiter = divvy::limiter::Limiter::new(rules, Arc::new(MemoryStore::new()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (limiter, rt)
}

/// Prints `what`: the best and the median of `runs` (µs per `unit`).
fn print_best_and_median(what: &str, unit: &str, mut runs: Vec<f64>) {
    runs.sort_by(f64::total_cmp);
    println!(
        "{what}: {:.3} µs per {unit} (best of {}), median {:.3}",
        runs[0],
        runs.len(),
        runs[runs.len() / 2]
    );
}

/// `name` from the environment as a count, or `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The line path in-process. `DIVVY_CORE_BATCH` (default 256) HITs a
/// batch, `DIVVY_CORE_ROUNDS` (default 2,000) batches a timed run; 65,536
/// actors (rounded down to whole batches), every one hit (its counter made)
/// in the untimed warm-up before the seven timed runs. `benches/line_instructions.sh`
/// sets both to count instructions per HIT under callgrind.
fn line_path() {
    use divvy::server::line::{conn::serve_connection, ConnLimits};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const ACTORS: usize = 65_536;
    let batch = env_count("DIVVY_CORE_BATCH", 256).min(ACTORS);
    let rounds = env_count("DIVVY_CORE_ROUNDS", 2_000);
    let (limiter, rt) = line_policy_server();
    let limiter = Arc::new(limiter);
    let batches: Vec<Vec<u8>> = (0..(ACTORS / batch) as u64)
        .map(|b| {
            (0..batch as u64)
                .map(|i| {
                    let n = b * batch as u64 + i;
                    format!(
                        "HIT method=GET path=/api/items ip=10.0.{}.{}\n",
                        (n / 256) % 256,
                        n % 256
                    )
                })
                .collect::<String>()
                .into_bytes()
        })
        .collect();
    let warm_up = (rounds / 4).max(batches.len());
    let elapsed = rt.block_on(async move {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let limits = ConnLimits {
            max_line: 8192,
            max_batch: batch,
            idle_timeout: Duration::from_secs(60),
            max_connections: 1,
        };
        tokio::spawn(serve_connection(server, limiter, limits, stop));
        let (mut rd, mut wr) = tokio::io::split(client);
        let mut answers = vec![0u8; 64 * 1024];
        let mut run = async |rounds: usize| {
            let start = Instant::now();
            for r in 0..rounds {
                wr.write_all(&batches[r % batches.len()])
                    .await
                    .expect("write");
                let mut lines = 0;
                while lines < batch {
                    let n = rd.read(&mut answers).await.expect("read");
                    lines += answers[..n].iter().filter(|&&b| b == b'\n').count();
                }
            }
            start.elapsed()
        };
        run(warm_up).await;
        let mut times = Vec::new();
        for _ in 0..7 {
            times.push(run(rounds).await);
        }
        times
    });
    print_best_and_median(
        &format!("line path in-process (parse, match, memory store, answer; {batch} per batch)"),
        "HIT",
        elapsed
            .iter()
            .map(|e| e.as_secs_f64() * 1e6 / (rounds * batch) as f64)
            .collect(),
    );
}

/// The gRPC handler in-process: `rls::respond` on the load benchmark's
/// request (path `/api/items`, a per-IP actor) over 65,536 actors. The
/// requests of a round are built before it is timed (as tonic decodes
/// them before the handler runs). `DIVVY_CORE_GRPC_ROUNDS` (default 8)
/// rounds, the first untimed: two counts under callgrind with different
/// rounds give the instructions of a call on existing counters.
fn grpc_handler() {
    use divvy::server::rls::{respond, ResponseStyle};
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    const ACTORS: usize = 65_536;
    let (limiter, rt) = line_policy_server();
    let entry = |key: &str, value: String| Entry {
        key: key.to_owned(),
        value,
    };
    let requests = || -> Vec<RateLimitRequest> {
        (0..ACTORS)
            .map(|n| RateLimitRequest {
                domain: "bench".to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![
                        entry("path", "/api/items".to_owned()),
                        entry("ip", format!("10.0.{}.{}", n / 256, n % 256)),
                    ],
                    ..Default::default()
                }],
                hits_addend: 0,
            })
            .collect()
    };
    let mut per_call: Vec<f64> = Vec::new();
    rt.block_on(async {
        for round in 0..env_count("DIVVY_CORE_GRPC_ROUNDS", 8) {
            let batch = requests();
            let start = Instant::now();
            for request in batch {
                black_box(
                    respond(&limiter, ResponseStyle::default(), request, None)
                        .await
                        .expect("answer"),
                );
            }
            // The first round creates the counters: not timed.
            if round > 0 {
                per_call.push(start.elapsed().as_secs_f64() * 1e6 / ACTORS as f64);
            }
        }
    });
    print_best_and_median(
        "gRPC handler in-process (validate, hits, match, memory store, response; 65,536 actors)",
        "call",
        per_call,
    );
}

fn main() {
    // `cargo bench --bench core -- line` runs only the named sections
    // (`line`, `grpc`, `matching`, `memory`); without names, all of them.
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| names.is_empty() || names.iter().any(|n| n == name);
    if wanted("line") {
        line_path();
    }
    if wanted("grpc") {
        grpc_handler();
    }
    if wanted("matching") {
        matching();
    }
    if wanted("memory") {
        memory();
    }
}
