//! Load benchmark: the real `divvy` binary (release build) on loopback, next
//! to do-nothing baselines measured in the same run, on the same core budget.
//!
//! Run with `cargo bench --bench load`. Options (after `--`):
//! - `--seconds N` (default 4; fractions allowed): the length of each
//!   measured run (a run measured in halves takes N seconds in all);
//! - `--only SECTION[,SECTION...]`: run only these sections, one of
//!   `grpc`, `line`, `redis`, `over-limit`, `redis-far`, `algorithms`,
//!   `memory-per-counter`, `global`, `compare`,
//!   or `memory` (both memory-store sections, `grpc` and `line`);
//!   `--redis-only` is `--only redis`.
//!
//! `DIVVY_BENCH_BIN=/path/to/divvy` measures another build of divvy (an
//! older commit's, for a before/after) instead of this one's.
//! `DIVVY_BENCH_BEFORE=/path/to/divvy` adds the `compare` section, which
//! measures that build and this one side by side in the same run.
//!
//! It installs nothing: the load generator is this program (tokio, tonic
//! and the `h2` crate) and, for gRPC's maximum, h2load (Debian's
//! nghttp2-client, which the test command installs) when it is on the
//! PATH; redis-server, redis-cli and redis-benchmark must be on the PATH
//! for the sections that use Redis.
//!
//! Placement: with two or more CPUs allowed, every server process (divvy,
//! the do-nothing baselines, the benchmark's own redis-servers) runs on the
//! first CPU (`taskset -c`) and this process, the load generator, on the
//! second; the servers' CPU time is read from `/proc/PID/stat`
//! (utime + stime) before and after each run, and quoted per request. The
//! load generator's own CPU use is printed too: near 100% of its core, a
//! figure is bounded by the generator rather than the server. A baseline and
//! divvy are measured in halves, in the order baseline, divvy, divvy,
//! baseline, so a noisy neighbour weighs on both alike; figures are quoted
//! as ratios divvy / baseline because the machines are shared and noisy.
//!
//! Sections:
//! - `grpc`: Envoy's ShouldRateLimit on the memory store. The baseline is a
//!   do-nothing tonic RateLimitService (this program started again with the
//!   hidden argument `--baseline-grpc-server PORT`, pinned like divvy) that
//!   answers every call with one constant OK response. The load comes from
//!   h2load when it is on the PATH: a C HTTP/2 client that costs several
//!   times less per call than a tonic one, so that the server, not the
//!   generator, sets the maximum (every call is then the same request, one
//!   actor; each server's answer to it is checked before and after the
//!   runs, as h2load sees HTTP statuses only, and a failed call stops the
//!   benchmark). Maximum throughput with 16 HTTP/2 connections x 32
//!   calls in flight each; then paced (open-loop) load at 25% and 50% of the
//!   baseline's measured maximum, on both servers, from this program's own
//!   HTTP/2 client (the `h2` crate, without tonic): a thread keeps the
//!   schedule and hands the runtime every call due within the next 100 µs,
//!   each call is sent whatever became of the earlier ones, spread over
//!   16 connections and 65,536 actors, every answer is decoded and must be
//!   OK, and latency runs from each call's scheduled send time (or its
//!   actual one if that was earlier) to the end of its answer, p50/p99/p99.9;
//!   the generator's own send lag is printed. (h2load's `--rps`, used
//!   before, sends in 10 ms bursts.) Without h2load, this program's tonic
//!   client gives the maximum, which is then mostly the generator's: the
//!   servers' CPU µs per call, and the generator's CPU use printed next to
//!   it (h2load's included, a child waited for), say how far that goes.
//! - `line`: the divvy line protocol on the memory store against a
//!   constant-answer line server (this program with `--baseline-line-server
//!   PORT`, pinned like divvy): 64 connections x 1 request in flight, 16
//!   connections x 16 pipelined, 1 connection x 256 pipelined; HIT/s,
//!   latency percentiles (from writing a request to reading its answer) and
//!   server CPU µs per HIT.
//! - `redis`: the Redis store on a redis-server this benchmark starts (on the
//!   servers' CPU), next to the memory store: line protocol 64 x 1 and
//!   1 x 256 pipelined, with divvy's and Redis's CPU µs per HIT; 64
//!   connections paced at 25% and 50% of the Redis store's 64 x 1 maximum
//!   (each on its own schedule, one request in flight, sends on tokio's
//!   1 ms timer ticks, so the connections due in one tick send together),
//!   latency percentiles of both stores; and
//!   redis-benchmark's EVALSHA of divvy's script on the same redis-server,
//!   with Redis's CPU µs per call (one counter a call) and per counter (32
//!   counters a call, mostly existing ones).
//! - `over-limit`: the Redis store under abuse, 90% of HITs on 10 actors
//!   over their limit (64 connections x 1 in flight), one divvy with the
//!   over-limit cache off and one with it on, each on its own redis-server,
//!   ABBA: HIT/s, divvy's and Redis's CPU per HIT, Redis script calls per HIT.
//! - `redis-far`: the Redis store with its redis-server (not pinned)
//!   reached through a proxy in this process (its threads on any CPU) that
//!   delays every chunk 250 µs each way (a Redis in the same zone; the
//!   round trip, printed, is longer: the proxy's sleeps overshoot), one divvy with the default one
//!   script call out at a time (`--redis-batches-in-flight 1`) next to one
//!   with 8: line protocol 64 x 1 (HIT/s and latency), then 64 connections
//!   paced at 25% and 50% of the default's maximum (latency), ABBA.
//! - `algorithms`: each counting algorithm (window, fixed, sliding,
//!   token_bucket, and a rule with two token-bucket limits) on the line
//!   protocol, 64 connections x 1 in flight, one actor per connection, on
//!   the memory store and on the Redis store, as ratios to the `window`
//!   algorithm measured in the same run, with CPU µs per HIT. One divvy runs
//!   per rule and the rules take turns in short rounds, so a noisy neighbour
//!   slows them all alike; a second divvy with the window rule shows how far
//!   two identical servers differ in the same run.
//! - `memory-per-counter`: for window, fixed, sliding and token_bucket on
//!   the memory store, 1,000,000 HITs with distinct actors (16 connections x
//!   256 pipelined) against a rule with an actorField, 10 per hour (one HIT
//!   leaves every algorithm's counter live for minutes); the divvy process's
//!   VmRSS before and 2 s after (the allocator gives back what the tables'
//!   last growth step left behind after a short delay; the reading at once
//!   is printed too), over the live counters added (`divvy_counters`,
//!   swept every second): bytes per counter (the target is at most 100;
//!   printed, not asserted), and the CPU time per new counter.
//! - `global`: what a `scope: global` limit costs on the request path: two
//!   divvy servers on one regional redis-server, one with a local token
//!   bucket and one with the same bucket `scope: global`, whose global store
//!   (another redis-server) is reached through a proxy in this process (its
//!   threads on any CPU) that
//!   delays every chunk 40 ms each way. Paced line-protocol load (2000 req/s
//!   over 16 connections), baseline and global interleaved in 2 rounds, each
//!   server kept at 10 req/s while the other is measured (a global limit idle
//!   for a lease period is leased nothing and denies until its next renewal);
//!   p50/p99/p99.9, the global / baseline ratios and each server's CPU time
//!   per request. Its redis-servers are not pinned.
//! - `compare` (only with `DIVVY_BENCH_BEFORE`): an older divvy build and
//!   this one (or `DIVVY_BENCH_BIN`'s) on the memory store, gRPC's maximum
//!   and the three line loads, each load ABBA (before, this, this, before),
//!   with this / before ratios: a before/after in one run, where two
//!   invocations (one per build) are at the mercy of whichever ran in the
//!   quieter minutes. Both serve the benchmark's policy, so the older
//!   build must accept it.
//!
//! At the end, one markdown table sums up the key figures and ratios, with
//! the command that produced them.

/// The servers' allocator (mimalloc, as `divvy` uses), so the do-nothing
/// baselines this program serves allocate as divvy does.
#[global_allocator]
static ALLOCATOR: divvy::allocator::MiMalloc = divvy::allocator::MiMalloc;

mod generators;
mod procs;
mod sections;
mod stats;

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::procs::baseline::{serve_baseline, BASELINE_GRPC, BASELINE_LINE};
use crate::procs::placement::{place, Placement, PLACEMENT};
use crate::procs::redis::start_redis;
use crate::sections::algorithms::algorithms_sections;
use crate::sections::compare::{compare_section, COMPARE_ENV};
use crate::sections::global::global_section;
use crate::sections::grpc::grpc_section;
use crate::sections::line::line_section;
use crate::sections::memory_per_counter::memory_per_counter_section;
use crate::sections::over_limit::over_limit_section;
use crate::sections::redis::redis_section;
use crate::sections::redis_far::redis_far_section;
use crate::stats::summary::Summary;

// The delaying proxy of the redis-far and global sections, shared with the
// integration tests.
#[allow(dead_code)]
#[path = "../../tests/common/delay_proxy.rs"]
mod delay_proxy;

/// The sections `--only` may name (`memory` is `grpc` and `line`).
const SECTIONS: [&str; 10] = [
    "grpc",
    "line",
    "redis",
    "over-limit",
    "redis-far",
    "algorithms",
    "memory-per-counter",
    "global",
    "compare",
    "memory",
];

/// What the command line asks for.
struct Options {
    /// `--seconds` (default 4): the length of each measured run ...
    seconds: f64,
    /// ... as a duration.
    run: Duration,
    /// The sections `--only` names (`--redis-only`: `redis`); all if `None`.
    only: Option<Vec<String>>,
    /// The older build of the compare section ([`COMPARE_ENV`]).
    before: Option<String>,
    /// The command that ran this, as the report quotes it.
    command: String,
}

impl Options {
    /// Reads the options, stopping at once on an unknown section or a
    /// compare section without its older build.
    fn parse(args: &[String]) -> Options {
        let seconds: f64 = flag_value(args, "--seconds")
            .and_then(|s| s.parse().ok())
            .filter(|s: &f64| *s > 0.0)
            .unwrap_or(4.0);
        let only = only_sections(args);
        let before = compare_build(&only);
        Options {
            seconds,
            run: Duration::from_secs_f64(seconds),
            only,
            before,
            command: command_line(args),
        }
    }

    /// Whether `section` runs (`--only memory` is `grpc` and `line`).
    fn wants(&self, section: &str) -> bool {
        self.only.as_ref().is_none_or(|o| {
            o.iter().any(|s| {
                s == section || (s == "memory" && (section == "grpc" || section == "line"))
            })
        })
    }
}

/// The argument after `flag`, if any.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter().skip_while(|a| *a != flag).nth(1).cloned()
}

/// `--only A,B` runs those sections; `--redis-only` is `--only redis`.
fn only_sections(args: &[String]) -> Option<Vec<String>> {
    let only: Option<Vec<String>> = flag_value(args, "--only")
        .map(|o| o.split(',').map(|s| s.trim().to_owned()).collect())
        .or_else(|| {
            args.iter()
                .any(|a| a == "--redis-only")
                .then(|| vec![String::from("redis")])
        });
    for o in only.iter().flatten() {
        assert!(
            SECTIONS.contains(&o.as_str()),
            "--only takes some of {SECTIONS:?} (comma-separated), found `{o}`"
        );
    }
    only
}

/// The compare section's older build, checked before anything runs.
fn compare_build(only: &Option<Vec<String>>) -> Option<String> {
    let before = std::env::var(COMPARE_ENV).ok();
    match &before {
        None => assert!(
            !only.iter().flatten().any(|o| o == "compare"),
            "the compare section needs {COMPARE_ENV}=/path/to/an/older/divvy"
        ),
        Some(path) => assert!(
            std::path::Path::new(path).is_file(),
            "{COMPARE_ENV}={path}: no such file"
        ),
    }
    before
}

/// The command as the user would type it (`--bench`, cargo's, left out).
fn command_line(args: &[String]) -> String {
    let user: Vec<&str> = args[1..]
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    if user.is_empty() {
        String::from("cargo bench --bench load")
    } else {
        format!("cargo bench --bench load -- {}", user.join(" "))
    }
}

/// The report's first lines: the command, the run length, the placement and
/// the load average.
fn print_header(options: &Options, placed: &Placement) {
    println!("# divvy load benchmark: {}", options.command);
    println!(
        "{} s per run; {}; load average at start {}",
        options.seconds,
        placed.note,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// The load generator: one worker on its one CPU (plus the thread that
/// blocks on each run), two when unpinned.
fn load_runtime(pinned: bool) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if pinned { 1 } else { 2 })
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every section `options` wants, in order; the Redis section's
/// redis-server serves the algorithms section too.
fn run_sections(rt: &Runtime, options: &Options, summary: &mut Summary) {
    let run = options.run;
    if options.wants("grpc") {
        grpc_section(rt, run, summary);
    }
    if options.wants("line") {
        line_section(rt, run, summary);
    }
    let mut redis = None;
    if options.wants("redis") {
        let redis = redis.get_or_insert_with(start_redis);
        redis_section(rt, redis, run, summary);
    }
    if options.wants("over-limit") {
        over_limit_section(rt, run, summary);
    }
    if options.wants("redis-far") {
        redis_far_section(rt, run, summary);
    }
    if options.wants("algorithms") {
        let redis = redis.get_or_insert_with(start_redis);
        algorithms_sections(rt, redis, options.seconds, run, summary);
    }
    drop(redis);
    if options.wants("memory-per-counter") {
        memory_per_counter_section(rt, summary);
    }
    if options.wants("global") {
        global_section(rt, run, summary);
    }
    if options.wants("compare") {
        // (Named in `--only` without the variable, the run stopped at the start.)
        match &options.before {
            Some(before) => compare_section(rt, before, run, summary),
            None => println!("\n## compare: skipped ({COMPARE_ENV} is not set)"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // This program started again as a baseline server (see `BaselineProc`).
    for flag in [BASELINE_GRPC, BASELINE_LINE] {
        if let Some(port) = flag_value(&args, flag) {
            serve_baseline(flag, &port);
        }
    }
    let options = Options::parse(&args);
    let placed = PLACEMENT.get_or_init(place);
    print_header(&options, placed);
    let rt = load_runtime(placed.load.is_some());
    let mut summary = Summary::default();
    run_sections(&rt, &options, &mut summary);
    summary.print(&options.command, options.seconds);
}
