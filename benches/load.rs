//! Load benchmark: the real `divvy` binary (release build) on loopback, next
//! to do-nothing baselines measured in the same run, on the same core budget.
//!
//! Run with `cargo bench --bench load`. Options (after `--`):
//! - `--seconds N` (default 4; fractions allowed): the length of each
//!   measured run (a run measured in halves takes N seconds in all);
//! - `--only SECTION[,SECTION...]`: run only these sections, one of
//!   `grpc`, `line`, `redis`, `redis-far`, `algorithms`,
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

use std::ffi::OsStr;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

// The delaying proxy of the redis-far and global sections, shared with the
// integration tests.
#[allow(dead_code)]
#[path = "../tests/common/delay_proxy.rs"]
mod delay_proxy;
use delay_proxy::DelayProxy;

/// The policy the line and gRPC loads run against (shared with the core bench).
const POLICY: &str = include_str!("line_policy.yaml");

/// The sections `--only` may name (`memory` is `grpc` and `line`).
const SECTIONS: [&str; 9] = [
    "grpc",
    "line",
    "redis",
    "redis-far",
    "algorithms",
    "memory-per-counter",
    "global",
    "compare",
    "memory",
];

/// The environment variable that names an older divvy build for the
/// `compare` section.
const COMPARE_ENV: &str = "DIVVY_BENCH_BEFORE";

/// gRPC load: this many HTTP/2 connections (tonic Channels), ...
const GRPC_CHANNELS: u64 = 16;
/// ... with this many calls in flight on each at maximum throughput.
const GRPC_STREAMS: u64 = 32;
/// Paced gRPC load, as fractions of the do-nothing server's maximum.
const GRPC_PACED: [f64; 2] = [0.25, 0.5];

/// Line-protocol loads: a name, connections, requests in flight on each.
const LINE_LOADS: [(&str, u64, usize); 3] = [
    ("64 conns x 1 in flight", 64, 1),
    ("16 conns x 16 pipelined", 16, 16),
    ("1 conn x 256 pipelined", 1, 256),
];

/// The rules of the algorithms section, one divvy each: a name and the rule's
/// limit fields. Limits are huge so nothing is denied; `window` (the
/// default algorithm, written as before algorithms existed) is the baseline.
const ALGORITHM_RULES: [(&str, &str); 5] = [
    (
        "window",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip",
    ),
    (
        "fixed",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: fixed",
    ),
    (
        "sliding",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: sliding",
    ),
    (
        "token_bucket",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: token_bucket\n    burst: 1000000000",
    ),
    (
        "2 token_bucket limits",
        "limits:
      - {creditLimit: 1000000000, resetSeconds: 1h, algorithm: token_bucket, burst: 1000000000, actorField: ip}
      - {creditLimit: 1000000000, resetSeconds: 1h, algorithm: token_bucket, burst: 1000000000, actorField: user}",
    ),
];

/// A policy whose one override is `rule` (see [`ALGORITHM_RULES`]).
fn algorithm_policy(rule: &str) -> String {
    format!(
        "overrides:\n  - operation: {{path: /bench, ip: \"*\", user: \"*\"}}\n    {rule}\n\
         default:\n  creditLimit: 1000000000\n  resetSeconds: 1h\n"
    )
}

/// The one request of connection `conn` in the algorithms section: the
/// same actor (ip and user) on every request of a connection.
fn actor_line(conn: u64, _i: u64) -> String {
    format!(
        "HIT path=/bench ip=10.2.{}.{} user=u{conn}\n",
        conn / 256,
        conn % 256
    )
}

/// The request for actor `n` (below 2^24) in the memory-per-counter section:
/// a distinct ip for each `n`, the rule's actorField.
fn counter_line(n: u64) -> String {
    format!(
        "HIT path=/bench ip=10.{}.{}.{} user=u\n",
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

// Placement: which CPU runs what ---------------------------------------------

/// Where the servers and the load generator run.
struct Placement {
    /// The CPU of every server process, when pinned.
    server: Option<u32>,
    /// The CPU of this process (the load generator), when pinned.
    load: Option<u32>,
    /// Every CPU this process was allowed at start, as taskset writes them.
    all: String,
    /// One line describing the above.
    note: String,
}

static PLACEMENT: OnceLock<Placement> = OnceLock::new();

fn placement() -> &'static Placement {
    PLACEMENT.get_or_init(|| Placement {
        server: None,
        load: None,
        all: String::new(),
        note: String::from("unpinned"),
    })
}

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status),
/// and that list as written there.
fn allowed_cpus() -> (Vec<u32>, String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    (cpus, list)
}

/// Pins this process to the second allowed CPU, servers to go on the first;
/// unpinned (with the reason) on a machine with one CPU or without taskset.
fn place() -> Placement {
    let (cpus, all) = allowed_cpus();
    if cpus.len() < 2 {
        return Placement {
            server: None,
            load: None,
            note: format!(
                "unpinned: {} CPU allowed ({all}), servers and load generator share it",
                cpus.len()
            ),
            all,
        };
    }
    match pin_self(cpus[1]) {
        Ok(()) => Placement {
            server: Some(cpus[0]),
            load: Some(cpus[1]),
            note: format!(
                "servers pinned to CPU {} (taskset -c {}), load generator (this process) to CPU {}",
                cpus[0], cpus[0], cpus[1]
            ),
            all,
        },
        Err(why) => Placement {
            server: None,
            load: None,
            note: format!("unpinned: {why}"),
            all,
        },
    }
}

/// `program` through `taskset -c CPUS` (so the child's pid is the program's
/// own), or plain without `cpus`.
fn on_cpus(program: impl AsRef<OsStr>, cpus: Option<String>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// `program` on the servers' CPU.
fn server_command(program: impl AsRef<OsStr>) -> Command {
    on_cpus(program, placement().server.map(|c| c.to_string()))
}

/// `program` on any CPU this process was allowed at start (not the load
/// generator's only).
fn any_cpu_command(program: impl AsRef<OsStr>) -> Command {
    let p = placement();
    on_cpus(program, p.load.map(|_| p.all.clone()))
}

/// Pins every thread of this process to `cpu` with `taskset`; `Err` says why not.
fn pin_self(cpu: u32) -> Result<(), String> {
    let pid = std::process::id().to_string();
    match Command::new("taskset")
        .args(["-a", "-cp", &cpu.to_string(), &pid])
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "taskset -a -cp {cpu} {pid} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("taskset not available ({e})")),
    }
}

// Server processes -----------------------------------------------------------

struct Divvy {
    child: Child,
    grpc: SocketAddr,
    line: SocketAddr,
    http: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Divvy {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Divvy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server of the benchmark's own on a free loopback port.
struct RedisProc {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server on the servers' CPU.
fn start_redis() -> RedisProc {
    start_redis_with(server_command("redis-server"))
}

/// A redis-server started by `command` (`redis-server`, maybe through taskset).
fn start_redis_with(mut command: Command) -> RedisProc {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = command
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (tests/run-all.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cli(port, &["PING"]) != "PONG" {
        assert!(Instant::now() < deadline, "redis did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    RedisProc {
        child,
        port,
        _dir: dir,
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// EVALSHA and EVAL calls the redis-server on `port` has run (its
/// `INFO commandstats`).
fn script_calls(port: u16) -> Option<u64> {
    let info = redis_cli(port, &["INFO", "commandstats"]);
    let mut total = None;
    for line in info.lines() {
        // cmdstat_evalsha:calls=123,usec=...
        let Some(rest) = line
            .strip_prefix("cmdstat_evalsha:calls=")
            .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
        else {
            continue;
        };
        let n: u64 = rest.split(',').next()?.parse().ok()?;
        total = Some(total.unwrap_or(0) + n);
    }
    total
}

/// redis-benchmark's own EVALSHA rate for divvy's script (`requests`
/// calls of `counters` counters each, one request a counter, as the store
/// batches them), and Redis's CPU time per call. One counter a call draws
/// from 100,000 random counters; several draw each from 100, so most
/// calls charge counters that exist, as a busy service's batches do.
fn redis_benchmark_evalsha(
    redis: &RedisProc,
    clients: u32,
    pipeline: u32,
    requests: u64,
    counters: u32,
) -> (f64, Option<f64>) {
    let port = redis.port;
    let sha = redis_cli(port, &["SCRIPT", "LOAD", divvy::store::redis::SCRIPT]);
    let range = if counters == 1 { "100000" } else { "100" };
    let keys: Vec<String> = (0..counters)
        .map(|i| format!("bench:{i}:__rand_int__"))
        .collect();
    // Now from Redis TIME (-1), one limit shape, the hints 3 (every op a
    // lone counter, no key twice: each counter's key names its place), the
    // shape (divvy's window, algorithm 0: limit, window ms, burst), then one
    // run of every counter: its head (how many - 1) * 2^32 + shape 1 * 128 +
    // flags 4 (a request starts here), and cost 1; the same arguments the
    // Redis store sends.
    let mut args: Vec<String> = vec!["EVALSHA".into(), sha, counters.to_string()];
    args.extend(keys);
    args.extend(["-1", "1", "3", "0", "1000000000", "3600000", "1000000000"].map(String::from));
    let head = (u64::from(counters) - 1) * (1 << 32) + 132;
    args.extend([head.to_string(), "1".into()]);
    let before = cpu_time(redis.child.id());
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &requests.to_string(), "-r", range, "-q"])
        .args(&args)
        .output()
        .expect("redis-benchmark (tests/run-all.sh installs redis-tools)");
    let cpu = match (before, cpu_time(redis.child.id())) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b).as_secs_f64() * 1e6 / requests as f64),
        _ => None,
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 81234.56 requests per second, p50=..."; the last figure printed wins.
    let rate = text
        .rsplit("requests per second")
        .nth(1)
        .and_then(|before| before.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0);
    (rate, cpu)
}

/// A divvy (memory store) serving [`POLICY`].
fn start_divvy() -> Divvy {
    start_divvy_with(POLICY, &[])
}

/// The divvy executable measured: `DIVVY_BENCH_BIN`'s build, else this one's.
fn divvy_binary() -> String {
    std::env::var("DIVVY_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_divvy").to_owned())
}

/// A divvy ([`divvy_binary`]) serving `policy` with the flags `extra`, on
/// the servers' CPU.
fn start_divvy_with(policy: &str, extra: &[&str]) -> Divvy {
    start_divvy_binary(&divvy_binary(), policy, extra)
}

/// [`start_divvy_with`] for the divvy executable at `binary`.
fn start_divvy_binary(binary: &str, policy: &str, extra: &[&str]) -> Divvy {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, policy).expect("policy");
    let mut child = server_command(binary)
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0"])
        .args(extra)
        .env("DIVVY_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn divvy");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (mut grpc, mut line, mut http) = (None, None, None);
    let mut seen = Vec::new();
    while grpc.is_none() || line.is_none() || http.is_none() {
        let l = match lines.next() {
            Some(l) => l.expect("read log"),
            None => panic!("divvy exited: {}", seen.join("\n")),
        };
        seen.push(l.clone());
        if let Some(a) = l.split("grpc listening on ").nth(1) {
            grpc = Some(a.trim().parse().expect("addr"));
        }
        if let Some(a) = l.split("line protocol listening on ").nth(1) {
            line = Some(a.trim().parse().expect("addr"));
        }
        if let Some(a) = l.split("http listening on ").nth(1) {
            http = Some(a.trim().parse().expect("addr"));
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Divvy {
        child,
        grpc: grpc.expect("grpc"),
        line: line.expect("line"),
        http: http.expect("http"),
        _dir: dir,
    }
}

// Baselines: this program started again as a do-nothing server ----------------

/// The hidden argument that makes this program the do-nothing gRPC server.
const BASELINE_GRPC: &str = "--baseline-grpc-server";
/// The hidden argument that makes this program the constant-answer line server.
const BASELINE_LINE: &str = "--baseline-line-server";

/// A baseline server process (this program with [`BASELINE_GRPC`] or
/// [`BASELINE_LINE`]), on the servers' CPU. It exits when its stdin closes,
/// so it never outlives the benchmark.
struct BaselineProc {
    child: Child,
    addr: SocketAddr,
}

impl BaselineProc {
    fn start(flag: &str) -> BaselineProc {
        let exe = std::env::current_exe().expect("this benchmark's path");
        let mut child = server_command(exe)
            .args([flag, "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a baseline server");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("baseline address");
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("baseline server said {first:?}"));
        BaselineProc { child, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BaselineProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The do-nothing RateLimitService: one constant answer to every call.
struct DoNothing(RateLimitResponse);

#[tonic::async_trait]
impl RateLimitService for DoNothing {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

/// The do-nothing server's answer: OK, shaped like divvy's answer to the
/// benchmark's request (one descriptor status with its limit and reset).
fn constant_response() -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: String::from("bench"),
                requests_per_unit: 1_000_000_000,
                unit: Unit::Hour as i32,
            }),
            limit_remaining: 999_999_999,
            duration_until_reset: Some(PbDuration {
                seconds: 3599,
                nanos: 0,
            }),
            quota: None,
        }],
        ..Default::default()
    }
}

/// Runs this program as a baseline server (`flag` is [`BASELINE_GRPC`] or
/// [`BASELINE_LINE`]) on 127.0.0.1:`port` (0: any free port): prints
/// `listening on ADDR`, serves until stdin closes, exits.
fn serve_baseline(flag: &str, port: &str) -> ! {
    let port: u16 = port.parse().expect("baseline server port");
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    // The runtime `divvy serve` picks: one worker per allowed CPU, the
    // single-threaded scheduler on one (pinned) CPU.
    let rt = divvy::runtime::build(divvy::runtime::worker_threads(None)).expect("runtime");
    let grpc = flag == BASELINE_GRPC;
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        println!("listening on {}", listener.local_addr().expect("addr"));
        if grpc {
            serve_do_nothing_grpc(listener).await;
        } else {
            serve_constant_lines(listener).await;
        }
    });
    std::process::exit(0)
}

/// The do-nothing gRPC server: tonic with divvy's stream limit, no Nagle.
async fn serve_do_nothing_grpc(listener: TcpListener) {
    use tokio_stream::StreamExt as _;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    tonic::transport::Server::builder()
        .max_concurrent_streams(1024)
        .add_service(RateLimitServiceServer::new(DoNothing(constant_response())))
        .serve_with_incoming(incoming)
        .await
        .expect("serve gRPC");
}

/// The line baseline: answers each line with a constant, batching like divvy
/// does (everything read at once is answered in one write).
async fn serve_constant_lines(listener: TcpListener) {
    while let Ok((mut s, _)) = listener.accept().await {
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut out = Vec::new();
            loop {
                let n = match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for _ in buf[..n].iter().filter(|&&b| b == b'\n') {
                    out.extend_from_slice(b"OK true 1 3600\n");
                }
                if s.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
        });
    }
}

// Load generators --------------------------------------------------------------

/// Connection `conn`'s `i`th request of the many-actor loads.
fn conn_request_line(conn: u64, i: u64) -> String {
    request_line(conn * 1_000_000 + i)
}

fn request_line(i: u64) -> String {
    format!(
        "HIT method=GET path=/api/items ip=10.0.{}.{}\n",
        (i / 256) % 256,
        i % 256
    )
}

/// The figures of one or more runs against one server.
#[derive(Default)]
struct Figures {
    /// Requests answered.
    requests: u64,
    /// The time they took (summed over runs one after the other).
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// Paced load only: how late the generator sent each request.
    lags: Vec<Duration>,
    /// Paced load only: requests still unanswered at the end.
    lost: u64,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// The figures of two runs one after the other.
    fn add(mut self, other: Figures) -> Figures {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.lags.extend(other.lags);
        self.lost += other.lost;
        self
    }
    /// The figures of two loads run side by side.
    fn alongside(mut self, other: Figures) -> Figures {
        self.elapsed = self.elapsed.max(other.elapsed);
        self.requests += other.requests;
        self.latencies.extend(other.latencies);
        self.lags.extend(other.lags);
        self.lost += other.lost;
        self
    }
    fn pct(&mut self, p: f64) -> Duration {
        percentile(&mut self.latencies, p)
    }
    fn lag_pct(&mut self, p: f64) -> Duration {
        percentile(&mut self.lags, p)
    }
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i]
}

/// One connection, up to `window` requests in flight, sending `lines` until
/// they run out or `deadline` passes. Whatever fits in the window goes out in
/// one write; latency is from that write to reading the answer, which must
/// be `OK true`.
async fn pipelined<I>(addr: SocketAddr, deadline: Instant, window: usize, mut lines: I) -> Figures
where
    I: Iterator<Item = String> + Send + 'static,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (rd, mut wr) = stream.into_split();
    let permits = Arc::new(Semaphore::new(window));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let p = permits.clone();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let mut batch = String::new();
        'send: while Instant::now() < deadline {
            p.acquire().await.expect("semaphore").forget();
            batch.clear();
            let Some(first) = lines.next() else { break };
            batch.push_str(&first);
            let mut n = 1;
            while let Ok(permit) = p.try_acquire() {
                let Some(line) = lines.next() else { break };
                permit.forget();
                batch.push_str(&line);
                n += 1;
            }
            let sent = Instant::now();
            if wr.write_all(batch.as_bytes()).await.is_err() {
                break;
            }
            for _ in 0..n {
                if tx.send(sent).is_err() {
                    break 'send;
                }
            }
        }
        // Dropping `tx` ends the reader after the last answer.
    });
    let mut reader = TokioBufReader::new(rd);
    let mut line = String::new();
    let mut latencies = Vec::new();
    while let Some(sent) = rx.recv().await {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            break;
        }
        assert!(line.starts_with("OK true"), "unexpected answer {line:?}");
        latencies.push(sent.elapsed());
        permits.add_permits(1);
    }
    writer.await.expect("writer");
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// `conns` connections side by side, `window` requests pipelined on each.
async fn line_pipelined(addr: SocketAddr, run: Duration, conns: u64, window: usize) -> Figures {
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let lines = (c * 1_000_000..).map(request_line);
            tokio::spawn(pipelined(addr, deadline, window, lines))
        })
        .collect();
    let mut all = Figures::default();
    for t in tasks {
        all = all.alongside(t.await.expect("connection"));
    }
    all
}

/// `conns` connections, one request in flight on each.
async fn line_concurrent(addr: SocketAddr, run: Duration, conns: u64) -> Figures {
    line_concurrent_with(addr, run, conns, conn_request_line).await
}

/// The line-protocol load `conns` x `window` (see [`LINE_LOADS`]).
async fn line_load(addr: SocketAddr, run: Duration, conns: u64, window: usize) -> Figures {
    if window == 1 {
        line_concurrent(addr, run, conns).await
    } else {
        line_pipelined(addr, run, conns, window).await
    }
}

/// Sends `total` HITs for actors `first`, `first + 1`, ... (see
/// [`counter_line`]) over `conns` connections with `window` pipelined on each.
async fn line_fill(addr: SocketAddr, first: u64, total: u64, conns: u64, window: usize) -> Figures {
    let deadline = Instant::now() + Duration::from_secs(3600);
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let lines = (first + c..first + total)
                .step_by(conns as usize)
                .map(counter_line);
            tokio::spawn(pipelined(addr, deadline, window, lines))
        })
        .collect();
    let mut all = Figures::default();
    for t in tasks {
        all = all.alongside(t.await.expect("connection"));
    }
    assert_eq!(all.requests, total, "every HIT answered");
    all
}

/// `conns` connections, one request in flight on each; `line(conn, i)` is
/// the `i`th request of connection `conn`.
async fn line_concurrent_with(
    addr: SocketAddr,
    run: Duration,
    conns: u64,
    line: fn(u64, u64) -> String,
) -> Figures {
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (rd, mut wr) = stream.into_split();
                let mut reader = TokioBufReader::new(rd);
                let mut answer = String::new();
                let mut lat = Vec::new();
                let mut i = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    wr.write_all(line(c, i).as_bytes()).await.expect("send");
                    answer.clear();
                    reader.read_line(&mut answer).await.expect("answer");
                    assert!(
                        answer.starts_with("OK true"),
                        "unexpected answer {answer:?}"
                    );
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// The `i`th ShouldRateLimit request: the `/api/*` rule, one of 65536 actors.
fn grpc_request(i: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "path".into(),
                    value: "/api/items".into(),
                },
                Entry {
                    key: "ip".into(),
                    value: format!("10.1.{}.{}", (i / 256) % 256, i % 256),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// `channels` clients, each on an HTTP/2 connection of its own.
async fn grpc_clients(addr: SocketAddr, channels: u64) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..channels {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    clients
}

/// `concurrency` ShouldRateLimit calls in flight, spread over `channels`
/// HTTP/2 connections (Envoy opens one per worker thread); each call's
/// answer must be OK.
async fn grpc_concurrent(
    addr: SocketAddr,
    run: Duration,
    concurrency: u64,
    channels: u64,
) -> Figures {
    let clients = grpc_clients(addr, channels).await;
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..concurrency)
        .map(|c| {
            let mut client = clients[(c % channels) as usize].clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = c * 1_000_000;
                while Instant::now() < deadline {
                    let req = grpc_request(i);
                    let t = Instant::now();
                    let r = client
                        .should_rate_limit(req)
                        .await
                        .expect("rpc")
                        .into_inner();
                    assert_eq!(r.overall_code, Code::Ok as i32);
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// How early the paced generator may send a call: the pacer thread sends
/// every call due within this much of its waking in one batch, so that it
/// wakes the runtime once per batch rather than once per call.
const PACE_QUANTUM: Duration = Duration::from_micros(100);

/// Actors the paced generator spreads its calls over (as [`grpc_request`]).
const PACED_ACTORS: u64 = 65_536;

/// One HTTP/2 connection of the paced generator: the `h2` crate's client
/// alone (no tonic, no tower buffer task between a call and its
/// connection), several times cheaper per call than a tonic client. Its
/// budget for small DATA frames received and not yet read (h2's guard
/// against a peer flooding them) is raised: every answer's message is one
/// small DATA frame before its trailers, and at 50% a connection can hold a
/// few hundred unread when the generator's core falls behind, which closed
/// a run's connection once with ENHANCE_YOUR_CALM.
async fn h2_connection(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (send, connection) = h2::client::Builder::new()
        .data_frame_budget(64 << 20)
        .handshake(stream)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("paced gRPC generator: connection to {addr} failed: {e}");
        }
    });
    send
}

/// One unary ShouldRateLimit call over `send`: `body` (a [`grpc_body`]) to
/// `uri`; the answer's `overall_code`, or what went wrong (an HTTP or gRPC
/// status other than OK, a reset stream, an answer that does not decode).
async fn h2_call(
    send: h2::client::SendRequest<bytes::Bytes>,
    uri: http::Uri,
    body: bytes::Bytes,
) -> Result<i32, String> {
    let mut send = send.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    stream.send_data(body, true).map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    let (head, mut answer) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("HTTP status {}", head.status));
    }
    let mut data = Vec::new();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        // Gives the window back; it fails only for a stream already gone,
        // whose next read reports that.
        let _ = answer.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = answer.trailers().await.map_err(|e| e.to_string())?;
    // grpc-status comes in the trailers, or in the headers of a
    // trailers-only answer.
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| head.headers.get("grpc-status"))
        .map(|v| v.as_bytes().to_vec());
    if status.as_deref() != Some(b"0") {
        let message = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| head.headers.get("grpc-message"))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Err(format!(
            "grpc-status {:?}, grpc-message {message:?}",
            status.map(|s| String::from_utf8_lossy(&s).into_owned())
        ));
    }
    // One uncompressed message: flag 0, then its big-endian length.
    let (frame, message) = data
        .split_at_checked(5)
        .ok_or("answer shorter than its frame header")?;
    let length = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]);
    if frame[0] != 0 || usize::try_from(length).ok() != Some(message.len()) {
        return Err(format!(
            "answer not one uncompressed message: flag {}, length {length} for {} bytes",
            frame[0],
            message.len()
        ));
    }
    let answer: RateLimitResponse =
        prost::Message::decode(message).map_err(|e| format!("answer: {e}"))?;
    Ok(answer.overall_code)
}

/// The bodies of the paced generator's calls: [`grpc_request`] of each of
/// [`PACED_ACTORS`] actors, as [`grpc_body`].
fn paced_bodies() -> Arc<Vec<bytes::Bytes>> {
    Arc::new(
        (0..PACED_ACTORS)
            .map(|i| bytes::Bytes::from(grpc_body(&grpc_request(i))))
            .collect(),
    )
}

/// Open-loop load: ShouldRateLimit calls at `rate` per second for `run`,
/// round robin over `channels` HTTP/2 connections (the `h2` crate's client,
/// see [`h2_connection`]) and over [`PACED_ACTORS`] actors, each sent at its
/// scheduled time whatever became of the earlier ones (no cap on calls in
/// flight). A thread of its own keeps the schedule (tokio's timer ticks in
/// whole milliseconds), handing the runtime every call due within the next
/// [`PACE_QUANTUM`] at once. Latency runs from the scheduled send time, or
/// from the actual one when that was earlier, to the end of the answer, so
/// a stall (of the server or of this generator) counts against every call
/// it delays: no coordinated omission. `lags` is how late each call
/// started. Every answer must be OK; calls unanswered 5 s after the run
/// are `lost`. `bodies` are [`paced_bodies`], built once per section.
async fn grpc_paced(
    addr: SocketAddr,
    run: Duration,
    rate: f64,
    channels: u64,
    bodies: Arc<Vec<bytes::Bytes>>,
) -> Figures {
    let mut conns = Vec::new();
    for _ in 0..channels {
        conns.push(h2_connection(addr).await);
    }
    let uri: http::Uri = grpc_url(addr).parse().expect("uri");
    let total = (run.as_secs_f64() * rate) as u64;
    let interval = 1.0 / rate;
    let start = Instant::now() + Duration::from_millis(20);
    let due = move |i: u64| start + Duration::from_secs_f64(interval * i as f64);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<(u64, Instant)>>();
    let pacer = std::thread::spawn(move || {
        let mut i = 0;
        while i < total {
            let now = Instant::now();
            if due(i) > now + PACE_QUANTUM {
                std::thread::sleep(due(i) - now - PACE_QUANTUM);
            }
            let until = Instant::now() + PACE_QUANTUM;
            let mut batch = Vec::new();
            while i < total && due(i) <= until {
                batch.push((i, due(i)));
                i += 1;
            }
            if tx.send(batch).is_err() {
                return;
            }
        }
    });
    let mut calls = Vec::with_capacity(total as usize);
    while let Some(batch) = rx.recv().await {
        for (i, due) in batch {
            let send = conns[(i % channels) as usize].clone();
            let body = bodies[(i % PACED_ACTORS) as usize].clone();
            let uri = uri.clone();
            calls.push(tokio::spawn(async move {
                let now = Instant::now();
                let lag = now.saturating_duration_since(due);
                let from = due.min(now);
                let answer = h2_call(send, uri, body).await;
                (from.elapsed(), lag, answer)
            }));
        }
    }
    pacer.join().expect("pacer");
    let grace = start + run + Duration::from_secs(5);
    let mut f = Figures {
        elapsed: run,
        ..Figures::default()
    };
    for mut call in calls {
        match tokio::time::timeout_at(grace.into(), &mut call).await {
            Ok(Ok((latency, lag, Ok(code)))) => {
                assert_eq!(code, Code::Ok as i32, "answer not OK");
                f.latencies.push(latency);
                f.lags.push(lag);
            }
            Ok(Ok((_, _, Err(e)))) => panic!("call: {e}"),
            Ok(Err(e)) => panic!("call task: {e}"),
            Err(_) => {
                call.abort();
                f.lost += 1;
            }
        }
    }
    f.requests = f.latencies.len() as u64;
    f
}

/// The gRPC generator of maximum load: h2load when it is on the PATH, else
/// this program's tonic client (paced load always comes from [`grpc_paced`]).
#[derive(Clone, Copy)]
enum GrpcGenerator {
    /// h2load, from Debian's nghttp2-client (the test command installs it):
    /// nghttp2 in C, several times cheaper per call than a tonic client, so
    /// the server rather than the generator sets the maximum.
    H2load,
    /// This program's tonic client ([`grpc_concurrent`]).
    Tonic,
}

impl GrpcGenerator {
    /// h2load if `h2load --version` runs, else tonic.
    fn pick() -> GrpcGenerator {
        let runs = Command::new("h2load")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if runs {
            GrpcGenerator::H2load
        } else {
            GrpcGenerator::Tonic
        }
    }

    fn describe(self) -> &'static str {
        match self {
            GrpcGenerator::H2load => {
                "h2load (nghttp2-client), one process on the load generator's CPU; \
                 every call is the same request (one actor)"
            }
            GrpcGenerator::Tonic => {
                "this program's tonic client (h2load not on the PATH: install \
                 nghttp2-client for a generator that costs less than the servers)"
            }
        }
    }
}

/// The URL of ShouldRateLimit on `addr` (h2load's target, and the paced
/// generator's request URI).
fn grpc_url(addr: SocketAddr) -> String {
    format!("http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
}

/// `request` as the body of a unary gRPC call: the 5-byte frame header
/// (uncompressed, length) and the protobuf message.
fn grpc_body(request: &RateLimitRequest) -> Vec<u8> {
    let message = prost::Message::encode_to_vec(request);
    let len = u32::try_from(message.len()).expect("small message");
    let mut body = vec![0u8];
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(&message);
    body
}

/// One h2load run against `addr` for `run`: `clients` HTTP/2 connections,
/// at most `streams` calls in flight on each, every call the request of
/// [`grpc_request`]`(0)`, as fast as answers come. Latency is h2load's,
/// from sending a call to the end of its answer, read from its per-call
/// log. h2load sees HTTP statuses only: the caller checks the gRPC answer
/// to this request before and after its runs.
///
/// Paced load does not use h2load: its `--rps` timer fires at most every
/// 10 ms and sends every call then due at once, so at 18,000 calls/s over
/// 16 connections about 180 calls came every 10 ms and the p50 was the
/// time a server took to drain them (one connection per 100 calls/s ticked
/// in phase, the same bursts; `--timing-script-file` fell behind its
/// schedule). [`grpc_paced`] keeps a 100 µs schedule instead.
async fn h2load_grpc(addr: SocketAddr, run: Duration, clients: u64, streams: u64) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let body = dir.path().join("body");
    let log = dir.path().join("log");
    std::fs::write(&body, grpc_body(&grpc_request(0))).expect("body");
    let output = Command::new("h2load")
        .arg(format!("--clients={clients}"))
        .arg(format!("--max-concurrent-streams={streams}"))
        .arg(format!("--duration={}ms", run.as_millis().max(1)))
        .arg(format!("--data={}", body.display()))
        .arg(format!("--log-file={}", log.display()))
        .args([
            "--header=content-type: application/grpc",
            "--header=te: trailers",
        ])
        .arg(grpc_url(addr))
        .stdin(Stdio::null())
        .output()
        .expect("run h2load");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "h2load failed:\n{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // "requests: 137039 total, 137039 started, 137039 done, 137039 succeeded, 0 failed, 0 errored, 0 timeout"
    let counts = text
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .unwrap_or_else(|| panic!("no request counts in h2load's output:\n{text}"));
    let count = |what: &str| -> u64 {
        counts
            .split(", ")
            .find_map(|part| part.strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{what}` in h2load's `{counts}`"))
    };
    let (succeeded, failed, errored) = (count(" succeeded"), count(" failed"), count(" errored"));
    // Calls still in flight when the run ends are counted nowhere.
    assert!(failed == 0 && errored == 0, "h2load: {counts}\n{text}");
    let mut latencies = Vec::with_capacity(succeeded as usize);
    for row in std::fs::read_to_string(&log).expect("h2load log").lines() {
        let mut cols = row.split('\t');
        let (_, status, micros) = (cols.next(), cols.next(), cols.next());
        if status.is_some_and(|s| s.starts_with('2')) {
            if let Some(us) = micros.and_then(|m| m.trim().parse::<u64>().ok()) {
                latencies.push(Duration::from_micros(us));
            }
        }
    }
    Figures {
        requests: succeeded,
        elapsed: run,
        latencies,
        ..Figures::default()
    }
}

/// Checks that `addr` answers [`grpc_request`]`(0)`, the call h2load repeats,
/// with OK.
async fn grpc_answers_ok(addr: SocketAddr) {
    let mut client = grpc_clients(addr, 1).await.remove(0);
    let answer = client
        .should_rate_limit(grpc_request(0))
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
}

// Measuring: CPU time, memory, rows --------------------------------------------

/// User plus system CPU time of process `pid` so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    stat_cpu_time(pid, 2)
}

/// This process's CPU time plus that of the children it has waited for
/// (h2load runs), from `/proc/self/stat`.
fn generator_cpu_time() -> Option<Duration> {
    stat_cpu_time(std::process::id(), 4)
}

/// The sum of the first `n` CPU-time fields of `/proc/PID/stat`: utime,
/// stime, then cutime and cstime (children waited for).
fn stat_cpu_time(pid: u32, n: usize) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is the first, utime the 12th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let mut ticks = 0u64;
    for f in fields.get(11..11 + n)? {
        ticks += f.parse::<u64>().ok()?;
    }
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks()))
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 if that fails).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Resident memory of process `pid` (`VmRSS` of /proc/PID/status), in bytes.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A server under load: where to send it, and the processes whose CPU time
/// its requests cost (a label and a pid each).
struct Target {
    addr: SocketAddr,
    pids: Vec<(&'static str, u32)>,
}

/// The figures of one target over one or more runs, with the CPU time its
/// processes and this process (the load generator) spent meanwhile.
struct Tally {
    f: Figures,
    labels: Vec<&'static str>,
    cpu: Vec<Option<Duration>>,
    load_cpu: Option<Duration>,
    wall: Duration,
}

impl Tally {
    fn add(self, other: Tally) -> Tally {
        let sum = |a: Option<Duration>, b: Option<Duration>| Some(a? + b?);
        Tally {
            f: self.f.add(other.f),
            labels: self.labels,
            cpu: self
                .cpu
                .iter()
                .zip(&other.cpu)
                .map(|(a, b)| sum(*a, *b))
                .collect(),
            load_cpu: sum(self.load_cpu, other.load_cpu),
            wall: self.wall + other.wall,
        }
    }

    fn rate(&self) -> f64 {
        self.f.rate()
    }

    /// CPU µs per answered request of process `k`.
    fn cpu_us(&self, k: usize) -> Option<f64> {
        let cpu = self.cpu.get(k).copied().flatten()?;
        Some(cpu.as_secs_f64() * 1e6 / self.f.requests.max(1) as f64)
    }

    /// The share of one core process `k` used.
    fn util(&self, k: usize) -> Option<f64> {
        let cpu = self.cpu.get(k).copied().flatten()?;
        Some(cpu.as_secs_f64() / self.wall.as_secs_f64().max(1e-9))
    }

    /// The share of one core the load generator used.
    fn load_util(&self) -> Option<f64> {
        Some(self.load_cpu?.as_secs_f64() / self.wall.as_secs_f64().max(1e-9))
    }

    /// "cpu/req divvy 12.3 µs (97%), redis ... ; load gen 64%".
    fn cpu_note(&self, per: &str) -> String {
        let mut parts = Vec::new();
        for (k, label) in self.labels.iter().enumerate() {
            parts.push(format!(
                "{label} {} ({})",
                us(self.cpu_us(k)),
                percent(self.util(k))
            ));
        }
        format!(
            "cpu/{per} {}; load gen {}",
            parts.join(", "),
            percent(self.load_util())
        )
    }
}

/// Runs `load` on `rt`, reading the CPU time of `pids` and of this process
/// before and after.
fn measure<Fut>(rt: &Runtime, pids: &[(&'static str, u32)], load: Fut) -> Tally
where
    Fut: Future<Output = Figures>,
{
    let before: Vec<Option<Duration>> = pids.iter().map(|(_, p)| cpu_time(*p)).collect();
    let load_before = generator_cpu_time();
    let started = Instant::now();
    let f = rt.block_on(load);
    let wall = started.elapsed();
    let delta = |b: Option<Duration>, a: Option<Duration>| Some(a?.saturating_sub(b?));
    Tally {
        f,
        labels: pids.iter().map(|(l, _)| *l).collect(),
        cpu: pids
            .iter()
            .zip(before)
            .map(|((_, p), b)| delta(b, cpu_time(*p)))
            .collect(),
        load_cpu: delta(load_before, generator_cpu_time()),
        wall,
    }
}

/// `load` (given an address and a run length) on two targets, in halves of
/// `run`, in the order a, b, b, a: a noisy neighbour weighs on both alike.
fn abba<F, Fut>(rt: &Runtime, targets: [&Target; 2], run: Duration, load: F) -> [Tally; 2]
where
    F: Fn(SocketAddr, Duration) -> Fut,
    Fut: Future<Output = Figures>,
{
    let mut tallies: [Option<Tally>; 2] = [None, None];
    for k in [0, 1, 1, 0] {
        let t = measure(rt, &targets[k].pids, load(targets[k].addr, run / 2));
        tallies[k] = Some(match tallies[k].take() {
            None => t,
            Some(sum) => sum.add(t),
        });
    }
    tallies.map(|t| t.expect("measured"))
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| String::from("n/a"), |v| format!("{v:.1} µs"))
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| String::from("n/a"), |v| format!("{:.0}%", v * 100.0))
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}x", a / b)
    } else {
        String::from("n/a")
    }
}

fn ratio_opt(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => String::from("n/a"),
    }
}

fn dur_ratio(a: Duration, b: Duration) -> String {
    ratio(a.as_secs_f64(), b.as_secs_f64())
}

/// `12345.6` as `12,346`.
fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `d`'s p50 / p99 / p99.9 as ratios to `b`'s.
fn pct_ratios(d: &mut Figures, b: &mut Figures) -> String {
    format!(
        "{} / {} / {}",
        dur_ratio(d.pct(0.5), b.pct(0.5)),
        dur_ratio(d.pct(0.99), b.pct(0.99)),
        dur_ratio(d.pct(0.999), b.pct(0.999))
    )
}

/// p50 / p99 / p99.9 as one cell.
fn pcts(f: &mut Figures) -> String {
    format!(
        "{:.1?} / {:.1?} / {:.1?}",
        f.pct(0.5),
        f.pct(0.99),
        f.pct(0.999)
    )
}

/// One row of figures: rate, p50, p99, p99.9, then `note`.
fn print_row(name: &str, f: &mut Figures, unit: &str, note: &str) {
    println!(
        "  {name:<38} {:>9.0} {unit}  p50 {:>8.1?}  p99 {:>8.1?}  p99.9 {:>8.1?}  {note}",
        f.rate(),
        f.pct(0.50),
        f.pct(0.99),
        f.pct(0.999)
    );
}

/// The closing table: key figures and ratios.
#[derive(Default)]
struct Summary {
    rows: Vec<[String; 5]>,
}

impl Summary {
    /// The rate and latency rows of `d` against the baseline `b`.
    fn rate_and_latency(&mut self, section: &str, what: &str, d: &mut Tally, b: &mut Tally) {
        self.rate(section, &format!("HIT/s, {what}"), d, b);
        self.latency(section, what, d, b);
    }

    /// A throughput row, `measure`: `d`'s rate against the baseline `b`'s.
    fn rate(&mut self, section: &str, measure: &str, d: &Tally, b: &Tally) {
        self.row(
            section,
            measure,
            thousands(d.rate()),
            thousands(b.rate()),
            ratio(d.rate(), b.rate()),
        );
    }

    /// A server CPU row, `measure`: µs per request of `d`'s server against
    /// the baseline `b`'s.
    fn cpu(&mut self, section: &str, measure: &str, d: &Tally, b: &Tally) {
        self.row(
            section,
            measure,
            us(d.cpu_us(0)),
            us(b.cpu_us(0)),
            ratio_opt(d.cpu_us(0), b.cpu_us(0)),
        );
    }

    /// The rows of gRPC's maximum in `section`, each measurement named
    /// after `prefix`: throughput, server CPU per call and the generator's
    /// CPU, `d` against the baseline `b`.
    fn grpc_max(&mut self, section: &str, prefix: &str, d: &Tally, b: &Tally) {
        let streams = format!("{GRPC_CHANNELS} conns x {GRPC_STREAMS} streams");
        self.rate(section, &format!("{prefix}max req/s, {streams}"), d, b);
        self.cpu(section, &format!("{prefix}server CPU µs/req at max"), d, b);
        self.row(
            section,
            &format!("{prefix}load generator CPU at max (near 100%: the generator bounds max)"),
            percent(d.load_util()),
            percent(b.load_util()),
            String::from("–"),
        );
    }

    /// The p50 / p99 / p99.9 row of `d` against `b`.
    fn latency(&mut self, section: &str, what: &str, d: &mut Tally, b: &mut Tally) {
        self.row(
            section,
            &format!("p50 / p99 / p99.9, {what}"),
            pcts(&mut d.f),
            pcts(&mut b.f),
            pct_ratios(&mut d.f, &mut b.f),
        );
    }

    fn row(&mut self, section: &str, measure: &str, divvy: String, base: String, ratio: String) {
        self.rows
            .push([section.to_owned(), measure.to_owned(), divvy, base, ratio]);
    }

    fn print(&self, command: &str, seconds: f64) {
        println!("\n## Summary\n");
        println!("| section | measurement | divvy | baseline | divvy / baseline |");
        println!("|---|---|---|---|---|");
        for r in &self.rows {
            println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
        }
        println!(
            "\nProduced by `{command}` ({seconds} s per run; {}; loopback, release build).",
            placement().note
        );
        println!(
            "Absolute figures depend on the machine and its neighbours; the ratios to a baseline \
             measured in the same run are the figures to compare."
        );
    }
}

// The sections ----------------------------------------------------------------

/// Maximum-throughput gRPC load through `generator`.
async fn grpc_max(generator: GrpcGenerator, addr: SocketAddr, run: Duration) -> Figures {
    match generator {
        GrpcGenerator::H2load => h2load_grpc(addr, run, GRPC_CHANNELS, GRPC_STREAMS).await,
        GrpcGenerator::Tonic => {
            grpc_concurrent(addr, run, GRPC_CHANNELS * GRPC_STREAMS, GRPC_CHANNELS).await
        }
    }
}

/// Checks each target's answer to the call h2load repeats (h2load sees
/// HTTP statuses only; the counter only grows, so OK after the runs means
/// OK throughout).
fn grpc_all_ok(rt: &Runtime, targets: &[Target]) {
    rt.block_on(async {
        for t in targets {
            grpc_answers_ok(t.addr).await;
        }
    });
}

/// gRPC's maximum on both targets, ABBA, after their answers are checked
/// and each is warmed up for 500 ms; the answers are checked again after.
fn grpc_max_pair(
    rt: &Runtime,
    generator: GrpcGenerator,
    targets: &[Target; 2],
    run: Duration,
) -> [Tally; 2] {
    grpc_all_ok(rt, targets);
    rt.block_on(async {
        for t in targets {
            grpc_max(generator, t.addr, Duration::from_millis(500)).await;
        }
    });
    let pair = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
        grpc_max(generator, addr, run)
    });
    grpc_all_ok(rt, targets);
    pair
}

/// gRPC on the memory store: the do-nothing tonic server and divvy, maximum
/// throughput and paced latency.
fn grpc_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    let generator = GrpcGenerator::pick();
    let paced = format!(
        "this program's h2 client (the `h2` crate, no tonic), a thread keeping the schedule \
         to {:?} over {PACED_ACTORS} actors, latency from each call's scheduled send",
        PACE_QUANTUM
    );
    println!(
        "\n## grpc: ShouldRateLimit, memory store; do-nothing tonic server vs divvy\n  \
         generator: {}\n  \
         max: {GRPC_CHANNELS} HTTP/2 connections x {GRPC_STREAMS} calls in flight each; \
         paced: open loop at {:?} of the do-nothing maximum, {paced}",
        generator.describe(),
        GRPC_PACED.map(|p| format!("{:.0}%", p * 100.0))
    );
    let base = BaselineProc::start(BASELINE_GRPC);
    let divvy = start_divvy();
    let targets = [
        Target {
            addr: base.addr,
            pids: vec![("server", base.pid())],
        },
        Target {
            addr: divvy.grpc,
            pids: vec![("server", divvy.pid())],
        },
    ];
    let [mut b, mut d] = grpc_max_pair(rt, generator, &targets, run);
    let name = format!("max, {GRPC_CHANNELS} x {GRPC_STREAMS} in flight");
    let note = b.cpu_note("req");
    print_row(&format!("do-nothing: {name}"), &mut b.f, "req/s", &note);
    let note = d.cpu_note("req");
    print_row(&format!("divvy: {name}"), &mut d.f, "req/s", &note);
    println!(
        "  divvy / do-nothing: throughput {}, server cpu/req {}",
        ratio(d.rate(), b.rate()),
        ratio_opt(d.cpu_us(0), b.cpu_us(0))
    );
    summary.grpc_max("grpc", "", &d, &b);
    let max = b.rate();
    let bodies = paced_bodies();
    for share in GRPC_PACED {
        let rate = max * share;
        let [mut b, mut d] = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
            grpc_paced(addr, run, rate, GRPC_CHANNELS, bodies.clone())
        });
        let label = format!("paced {:.0}% ({rate:.0}/s)", share * 100.0);
        for (who, t) in [("do-nothing", &mut b), ("divvy", &mut d)] {
            let note = format!(
                "send lag p50 {:.1?} p99 {:.1?}; {}{}",
                t.f.lag_pct(0.5),
                t.f.lag_pct(0.99),
                if t.f.lost > 0 {
                    format!("{} calls unanswered; ", t.f.lost)
                } else {
                    String::new()
                },
                t.cpu_note("req")
            );
            print_row(&format!("{who}: {label}"), &mut t.f, "req/s", &note);
        }
        println!(
            "  divvy / do-nothing at {:.0}%: p50 / p99 / p99.9 {}, server cpu/req {}",
            share * 100.0,
            pct_ratios(&mut d.f, &mut b.f),
            ratio_opt(d.cpu_us(0), b.cpu_us(0))
        );
        let behind = behind_schedule(&mut b, &mut d);
        if !behind.is_empty() {
            println!("  {}", behind.trim_start_matches("; "));
        }
        summary.row(
            "grpc",
            &format!(
                "p50 / p99 / p99.9 paced at {:.0}% of do-nothing max ({rate:.0}/s){behind}",
                share * 100.0
            ),
            pcts(&mut d.f),
            pcts(&mut b.f),
            pct_ratios(&mut d.f, &mut b.f),
        );
    }
    grpc_all_ok(rt, &targets);
}

/// A note for a paced pair of runs in which the generator could not keep its
/// schedule (a send lag p50 over [`PACE_QUANTUM`] in either run): its own
/// queue then counts in both servers' latencies, and the pair measures the
/// generator as much as the servers. Empty when it kept up.
fn behind_schedule(b: &mut Tally, d: &mut Tally) -> String {
    let (lb, ld) = (b.f.lag_pct(0.5), d.f.lag_pct(0.5));
    if lb <= PACE_QUANTUM && ld <= PACE_QUANTUM {
        return String::new();
    }
    format!(
        "; the generator fell behind its schedule (send lag p50 {lb:.1?} do-nothing, \
         {ld:.1?} divvy): its queue counts in both"
    )
}

/// The line protocol on the memory store: the constant-answer server and divvy.
fn line_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!(
        "\n## line: divvy line protocol, memory store; constant-answer line server vs divvy \
         (every answer OK true, so HIT/s = req/s)"
    );
    let base = BaselineProc::start(BASELINE_LINE);
    let divvy = start_divvy();
    let targets = [
        Target {
            addr: base.addr,
            pids: vec![("server", base.pid())],
        },
        Target {
            addr: divvy.line,
            pids: vec![("server", divvy.pid())],
        },
    ];
    for (name, [mut b, mut d]) in line_pairs(rt, &targets, ["constant", "divvy"], run, &LINE_LOADS)
    {
        println!(
            "  divvy / constant: HIT/s {}, p99 {}, server cpu/HIT {}",
            ratio(d.rate(), b.rate()),
            dur_ratio(d.f.pct(0.99), b.f.pct(0.99)),
            ratio_opt(d.cpu_us(0), b.cpu_us(0))
        );
        summary.rate_and_latency("line", name, &mut d, &mut b);
        summary.cpu("line", &format!("server CPU µs/HIT, {name}"), &d, &b);
    }
}

/// Two divvy builds side by side in one run: `before` (an older build's
/// executable) and this one's (or `DIVVY_BENCH_BIN`'s), each on the
/// memory store, measured in halves in the order before, this, this,
/// before for each load (gRPC's maximum with the gRPC section's generator,
/// then the line loads), so that neither build gets the quieter moments.
/// Separate invocations, one per build, read whichever ran first lower in
/// every one of five pairs of `--only line` runs on these machines.
fn compare_section(rt: &Runtime, before: &str, run: Duration, summary: &mut Summary) {
    let generator = GrpcGenerator::pick();
    let this = divvy_binary();
    println!(
        "\n## compare: divvy at {before} ({COMPARE_ENV}) vs divvy at {this}, memory store, ABBA\n  \
         gRPC max: {}, {GRPC_CHANNELS} x {GRPC_STREAMS}; then the line loads",
        generator.describe()
    );
    let old = start_divvy_binary(before, POLICY, &[]);
    let new = start_divvy_binary(&this, POLICY, &[]);
    let grpc = [&old, &new].map(|server| Target {
        addr: server.grpc,
        pids: vec![("server", server.pid())],
    });
    let [mut b, mut d] = grpc_max_pair(rt, generator, &grpc, run);
    let name = format!("gRPC max, {GRPC_CHANNELS} x {GRPC_STREAMS} in flight");
    for (label, t) in [("before", &mut b), ("this", &mut d)] {
        let note = t.cpu_note("req");
        print_row(&format!("{label}: {name}"), &mut t.f, "req/s", &note);
    }
    summary.grpc_max("compare", "gRPC (baseline: the build before) ", &d, &b);
    let line = [&old, &new].map(|server| Target {
        addr: server.line,
        pids: vec![("server", server.pid())],
    });
    for (name, [b, d]) in line_pairs(rt, &line, ["before", "this"], run, &LINE_LOADS) {
        let before = "(baseline: the build before)";
        summary.rate("compare", &format!("line HIT/s, {name} {before}"), &d, &b);
        summary.cpu(
            "compare",
            &format!("line server CPU µs/HIT, {name} {before}"),
            &d,
            &b,
        );
    }
}

/// Warms both targets up, then runs each line load on them in ABBA order
/// and prints a row for each (labelled `labels`): each load's name and
/// the two tallies, in the targets' order. Lazy: a load runs when the
/// caller asks for it, so the caller's lines follow its rows.
fn line_pairs<'a>(
    rt: &'a Runtime,
    targets: &'a [Target; 2],
    labels: [&'a str; 2],
    run: Duration,
    loads: &'a [(&'static str, u64, usize)],
) -> impl Iterator<Item = (&'static str, [Tally; 2])> + 'a {
    rt.block_on(async {
        for t in targets {
            line_concurrent(t.addr, Duration::from_millis(500), 8).await;
        }
    });
    loads.iter().map(move |&(name, conns, window)| {
        let mut pair = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
            line_load(addr, run, conns, window)
        });
        for (t, label) in pair.iter_mut().zip(labels) {
            let note = t.cpu_note("HIT");
            print_row(&format!("{label}: {name}"), &mut t.f, "HIT/s", &note);
        }
        (name, pair)
    })
}

/// The Redis store next to the memory store, and redis-benchmark's own
/// EVALSHA figure on the same redis-server, in the same run.
fn redis_section(rt: &Runtime, redis: &RedisProc, run: Duration, summary: &mut Summary) {
    println!(
        "\n## redis: line protocol, Redis store (redis-server on the servers' CPU) vs memory store"
    );
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let memory = start_divvy();
    let shared = start_divvy_with(POLICY, &["--redis-url", &url]);
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
    // Every line load, as the line section runs them.
    let loads = LINE_LOADS;
    let pairs = line_pairs(rt, &targets, ["memory store", "redis store"], run, &loads);
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
        summary.rate_and_latency(
            "redis",
            &format!("{name} (baseline: memory store)"),
            &mut r,
            &mut m,
        );
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

/// The paced rows of a section comparing two line servers (`targets`,
/// called `labels`): [`LINE_LOADS`]' 64 connections paced at each share of
/// [`REDIS_PACED`] of `max` HIT/s, ABBA in `run`; each server's row, the
/// second's latency over the first's, and a summary row in `section` (what
/// it measured: `what` of the share in percent and the rate).
fn paced_pair(
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
const REDIS_PACED: [f64; 2] = [0.25, 0.5];

/// The redis-far section's delay each way between divvy and its Redis: a
/// redis-server in the same zone (half a millisecond of round trip asked;
/// the proxy's sleeps overshoot, and the section prints the `PING` round
/// trip it measures).
const REDIS_FAR_DELAY: Duration = Duration::from_micros(250);
/// `--redis-batches-in-flight` of the redis-far section's second divvy.
const REDIS_FAR_IN_FLIGHT: &str = "8";

/// The Redis store with Redis half a millisecond away: the default of one
/// script call out at a time next to [`REDIS_FAR_IN_FLIGHT`], at the maximum
/// and paced (see the file's documentation).
fn redis_far_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!(
        "\n## redis-far: Redis store, redis-server {} µs away each way; \
         --redis-batches-in-flight 1 (the default) vs {REDIS_FAR_IN_FLIGHT}",
        REDIS_FAR_DELAY.as_micros()
    );
    let redis = start_redis_with(any_cpu_command("redis-server"));
    let proxy = DelayProxy::start(redis.port, REDIS_FAR_DELAY, unpin_thread);
    println!(
        "  topology: redis :{} (not pinned) <- proxy :{} in this process (PING round trip, median of 5: {:.2} ms) <- both divvy",
        redis.port,
        proxy.port,
        proxy.round_trip().as_secs_f64() * 1000.0
    );
    let url = proxy.url();
    let one = start_divvy_with(POLICY, &["--redis-url", &url]);
    let more = start_divvy_with(
        POLICY,
        &[
            "--redis-url",
            &url,
            "--redis-batches-in-flight",
            REDIS_FAR_IN_FLIGHT,
        ],
    );
    let targets = [
        Target {
            addr: one.line,
            pids: vec![("divvy", one.pid()), ("redis", redis.child.id())],
        },
        Target {
            addr: more.line,
            pids: vec![("divvy", more.pid()), ("redis", redis.child.id())],
        },
    ];
    let more_label = format!("{REDIS_FAR_IN_FLIGHT} calls out");
    let loads = [LINE_LOADS[0]];
    let mut max = None;
    for (name, [mut a, mut b]) in line_pairs(rt, &targets, ["1 call out", &more_label], run, &loads)
    {
        max = Some(a.rate());
        println!(
            "  {more_label} / 1: {name}: HIT/s {}, p50 / p99 / p99.9 {}",
            ratio(b.rate(), a.rate()),
            pct_ratios(&mut b.f, &mut a.f)
        );
        summary.rate_and_latency(
            "redis-far",
            &format!("{name}, {more_label} (baseline: 1, the default)"),
            &mut b,
            &mut a,
        );
    }
    let Some(max) = max else { return };
    paced_pair(
        rt,
        &targets,
        ["1 call out", &more_label],
        (max, run),
        "redis-far",
        |share, rate| {
            format!(
                "{} conns paced at {share:.0}% of the default's maximum ({rate:.0}/s), {more_label} (baseline: 1)",
                LINE_LOADS[0].1
            )
        },
        summary,
    );
}

/// Rounds of the algorithms section: each rule runs `--seconds / ROUNDS` per
/// round, the rules in turn, so that noise on a shared machine spreads over
/// all of them instead of landing on one.
const ROUNDS: u32 = 4;

/// Each rule of [`ALGORITHM_RULES`] on one store (`extra`: divvy's store
/// flags; `redis`: the redis-server's pid, whose CPU time is counted too),
/// one divvy per rule, line protocol, 64 connections x 1 in flight, `run` in
/// all per rule, interleaved in [`ROUNDS`] rounds. Ratios are to `window`;
/// a second divvy with the window rule shows the noise floor.
fn algorithms_section(
    rt: &Runtime,
    store: &str,
    extra: &[&str],
    redis: Option<u32>,
    run: Duration,
    summary: &mut Summary,
) {
    let rules: Vec<(&str, &str)> = ALGORITHM_RULES
        .into_iter()
        .chain([("window, 2nd divvy", ALGORITHM_RULES[0].1)])
        .collect();
    let servers: Vec<Divvy> = rules
        .iter()
        .map(|(_, rule)| start_divvy_with(&algorithm_policy(rule), extra))
        .collect();
    let mut tallies: Vec<Option<Tally>> = rules.iter().map(|_| None).collect();
    rt.block_on(async {
        for divvy in &servers {
            line_concurrent_with(divvy.line, Duration::from_millis(300), 8, actor_line).await;
        }
    });
    for round in 0..ROUNDS as usize {
        for k in 0..servers.len() {
            // Each round starts one rule later, so no rule always runs first.
            let k = (round + k) % servers.len();
            let mut pids = vec![("divvy", servers[k].pid())];
            pids.extend(redis.map(|p| ("redis", p)));
            let t = measure(
                rt,
                &pids,
                line_concurrent_with(servers[k].line, run / ROUNDS, 64, actor_line),
            );
            tallies[k] = Some(match tallies[k].take() {
                None => t,
                Some(sum) => sum.add(t),
            });
        }
    }
    drop(servers);
    // HIT/s and CPU µs per HIT (divvy's, then Redis's on the Redis store).
    let cell = |t: &Tally| match t.cpu_us(1) {
        Some(r) => format!(
            "{} HIT/s, {} + redis {}",
            thousands(t.rate()),
            us(t.cpu_us(0)),
            us(Some(r))
        ),
        None => format!("{} HIT/s, {}", thousands(t.rate()), us(t.cpu_us(0))),
    };
    let mut window: Option<(f64, Duration, Option<f64>, String)> = None;
    for ((name, _), t) in rules.iter().zip(tallies) {
        let mut t = t.expect("at least one round");
        let (rate, p99, cpu) = (t.rate(), t.f.pct(0.99), t.cpu_us(0));
        let Some((w, w99, wcpu, wcell)) = &window else {
            let note = format!("(baseline); {}", t.cpu_note("HIT"));
            print_row(&format!("{store}: {name}"), &mut t.f, "HIT/s", &note);
            window = Some((rate, p99, cpu, cell(&t)));
            continue;
        };
        let note = format!(
            "{name} / window = {}, p99 {}, divvy cpu/HIT {}; {}",
            ratio(rate, *w),
            dur_ratio(p99, *w99),
            ratio_opt(cpu, *wcpu),
            t.cpu_note("HIT")
        );
        print_row(&format!("{store}: {name}"), &mut t.f, "HIT/s", &note);
        summary.row(
            "algorithms",
            &format!("{store}: {name} vs window, 64 x 1: HIT/s, divvy CPU/HIT"),
            cell(&t),
            wcell.clone(),
            format!(
                "{} (divvy CPU/HIT {})",
                ratio(rate, *w),
                ratio_opt(cpu, *wcpu)
            ),
        );
    }
}

/// The rules of the memory-per-counter section: each actor's one HIT is
/// allowed and leaves a counter that stays live for minutes (a token bucket
/// with a high rate would refill within microseconds and be dropped as good
/// as fresh), an actorField making one counter per actor.
const MEMORY_RULES: [(&str, &str); 4] = [
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
const COUNTERS: u64 = 1_000_000;

/// `divvy_counters` from divvy's /metrics (as of its last sweep).
fn live_counters(divvy: &Divvy) -> Option<u64> {
    http_get(divvy.http, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix("divvy_counters "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits (at most 5 s) for `divvy_counters` to reach `at_least`; its last value.
fn counters_at_least(divvy: &Divvy, at_least: u64) -> Option<u64> {
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
fn memory_per_counter_section(rt: &Runtime, summary: &mut Summary) {
    println!(
        "\n## memory-per-counter: memory store, {} HITs with distinct actors (16 conns x 256 \
         pipelined), rule with actorField ip, 10 per 1 h; divvy's VmRSS before and after",
        thousands(COUNTERS as f64)
    );
    for (name, rule) in MEMORY_RULES {
        // Sweeps every second keep divvy_counters current.
        let divvy = start_divvy_with(&algorithm_policy(rule), &["--sweep-seconds", "1"]);
        let pid = divvy.pid();
        // Warm-up with other actors (10.128.x.x): the runtime, connection
        // buffers and the allocator's first pages are in place before the
        // first reading.
        rt.block_on(line_fill(divvy.line, 1 << 23, 20_000, 16, 256));
        let n0 = counters_at_least(&divvy, 20_000);
        let rss0 = rss_bytes(pid);
        let mut t = measure(
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
        let added = match (n0, n1) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => COUNTERS,
        };
        let per = match (rss0, rss1) {
            (Some(a), Some(b)) if added > 0 => Some((b as f64 - a as f64) / added as f64),
            _ => None,
        };
        let per_text = per.map_or_else(|| String::from("n/a"), |p| format!("{p:.0} B"));
        let note = t.cpu_note("new counter");
        print_row(&format!("{name}: filling"), &mut t.f, "HIT/s", &note);
        println!(
            "  {name}: VmRSS {:.1} MiB -> {:.1} MiB at once, {:.1} MiB 2 s later; live counters {} -> {}: \
             {per_text} per counter 2 s later (target <= 100 B: {})",
            rss0.unwrap_or(0) as f64 / 1048576.0,
            rss_now.unwrap_or(0) as f64 / 1048576.0,
            rss1.unwrap_or(0) as f64 / 1048576.0,
            n0.map_or_else(|| String::from("?"), |n| n.to_string()),
            n1.map_or_else(|| String::from("?"), |n| n.to_string()),
            match per {
                Some(p) if p <= 100.0 => "met",
                Some(_) => "missed",
                None => "n/a",
            }
        );
        summary.row(
            "memory-per-counter",
            &format!("{name}: bytes of RSS per live counter (target <= 100)"),
            per_text,
            String::from("–"),
            String::from("–"),
        );
    }
}

// The global section -------------------------------------------------------

/// The latency proxy's delay, each way, between divvy and the global store.
const GLOBAL_DELAY: Duration = Duration::from_millis(40);
/// `--global-lease-ms` of the global divvy.
const GLOBAL_LEASE_MS: u64 = 2000;
/// Paced load of the global section: requests per second in all, over
/// this many connections.
const GLOBAL_RATE: f64 = 2000.0;
const GLOBAL_CONNS: u64 = 16;
/// Rounds of the global section: baseline and global take turns.
const GLOBAL_ROUNDS: u32 = 2;
/// Paced load on each server before measuring: past the global limit's
/// first lease (its 1% floor until then).
const GLOBAL_WARMUP: Duration = Duration::from_secs(2);
/// Requests per second each server gets all through the section (see
/// [`keep_alive`]).
const GLOBAL_KEEP_ALIVE: f64 = 10.0;

/// One token bucket per site, huge so nothing is denied; `scope: global`
/// or local to the region.
fn global_policy(global: bool) -> String {
    let scope = if global { " scope: global," } else { "" };
    format!(
        "overrides:\n  - operation: {{site: \"*\"}}\n    limits:\n      \
         - {{label: partner, actorField: site,{scope} creditLimit: 1000000, resetSeconds: 1, \
         algorithm: token_bucket, burst: 1000000}}\n\
         default: {{creditLimit: 0}}\n"
    )
}

/// Lets the calling thread run on any CPU: the proxy stands for the
/// network, and on the load generator's CPU (which this process is pinned
/// to) its delays would grow with the load.
fn unpin_thread() {
    let cpus = placement().all.clone();
    // `taskset -p` on this thread's id changes this thread alone; the id
    // is the last part of /proc/thread-self's target (`<pid>/task/<tid>`).
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    if !cpus.is_empty() && !tid.is_empty() {
        let _ = Command::new("taskset")
            .args(["-cp", &cpus, &tid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `conns` connections sending `HIT site=partner1` at `rate` requests per
/// second in all for `run` (see [`line_paced_with`]).
async fn line_paced(addr: SocketAddr, run: Duration, rate: f64, conns: u64) -> Figures {
    line_paced_with(addr, run, rate, conns, |_, _| {
        String::from("HIT site=partner1\n")
    })
    .await
}

/// `conns` connections sending `line(conn, i)` at `rate` requests per
/// second in all for `run`, each on its own schedule (spread evenly over one
/// interval), one request in flight per connection: a late answer makes
/// only the next send of its connection late. Sends wait on tokio's timer,
/// which fires on whole milliseconds: the connections due within one tick
/// send together, a burst of about `rate / 1000` lines. Latency is from
/// writing the line to reading the answer, which must be `OK true`.
async fn line_paced_with(
    addr: SocketAddr,
    run: Duration,
    rate: f64,
    conns: u64,
    line: fn(u64, u64) -> String,
) -> Figures {
    let interval = Duration::from_secs_f64(conns as f64 / rate);
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (rd, mut wr) = stream.into_split();
                let mut reader = TokioBufReader::new(rd);
                let mut answer = String::new();
                let mut lat = Vec::new();
                let mut due = start + interval.mul_f64(c as f64 / conns as f64);
                let mut i = 0;
                while due < end {
                    let text = line(c, i);
                    i += 1;
                    tokio::time::sleep_until(due.into()).await;
                    let t = Instant::now();
                    wr.write_all(text.as_bytes()).await.expect("send");
                    answer.clear();
                    reader.read_line(&mut answer).await.expect("answer");
                    assert!(
                        answer.starts_with("OK true"),
                        "unexpected answer {answer:?}"
                    );
                    lat.push(t.elapsed());
                    due += interval;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed().min(run),
        latencies,
        ..Figures::default()
    }
}

/// One connection sending `HIT site=partner1` at `rate` requests per second
/// until `stop`: keeps a server's demand alive while the other is measured
/// (a global limit's region with no demand for a lease period is leased
/// nothing, and would deny until its next renewal when the load resumes).
/// Returns the requests sent and the answers that were not `OK true`, with
/// the first of them.
fn keep_alive(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, Option<String>)> {
    rt.spawn(async move {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (rd, mut wr) = stream.into_split();
        let mut reader = TokioBufReader::new(rd);
        let mut answer = String::new();
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        let (mut sent, mut bad, mut first_bad) = (0, 0, None);
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            wr.write_all(b"HIT site=partner1\n").await.expect("send");
            answer.clear();
            reader.read_line(&mut answer).await.expect("answer");
            sent += 1;
            if !answer.starts_with("OK true") {
                bad += 1;
                first_bad.get_or_insert_with(|| answer.trim().to_owned());
            }
        }
        (sent, bad, first_bad)
    })
}

/// `GET path` on divvy's HTTP port: the body.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// The global divvy's lease after the warm-up, from `/global`.
fn lease_summary(divvy: &Divvy) -> String {
    let body = http_get(divvy.http, "/global");
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return format!("/global unreadable: {body:?}");
    };
    match v["leases"].as_array().and_then(|l| l.first()) {
        Some(l) => format!(
            "region {} lease: rate {} /s, burst {}, fallback {}, expires in {} s",
            v["region"], l["rate"], l["burst"], l["fallback"], l["expiresInSeconds"]
        ),
        None => format!("no lease yet: {v}"),
    }
}

/// Rows of the global section: rate, p50, p99, p99.9, then `note`.
fn print_global_row(name: &str, f: &mut Figures, note: &str) {
    println!(
        "{name:<30} {:>7.0} req/s  p50 {:>8.1?}  p99 {:>8.1?}  p99.9 {:>8.1?}  {note}",
        f.rate(),
        f.pct(0.50),
        f.pct(0.99),
        f.pct(0.999)
    );
}

/// A global limit's decision latency next to the same limit local to the
/// region, both on one regional redis-server, the global store 40 ms away
/// each way; see the file's documentation.
fn global_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!("\n## global: a scope: global token bucket vs the same bucket local to the region");
    // The redis-servers run on any CPU (not pinned with the servers).
    let global_redis = start_redis_with(any_cpu_command("redis-server"));
    let regional = start_redis_with(any_cpu_command("redis-server"));
    let proxy = DelayProxy::start(global_redis.port, GLOBAL_DELAY, unpin_thread);
    println!(
        "  topology: global redis :{} <- proxy :{} ({} ms each way, PING round trip, median of 5: {:.1} ms) \
         <- divvy; regional redis :{} <- both divvy",
        global_redis.port,
        proxy.port,
        GLOBAL_DELAY.as_millis(),
        proxy.round_trip().as_secs_f64() * 1000.0,
        regional.port,
    );
    let regional_url = format!("redis://127.0.0.1:{}", regional.port);
    let global_url = proxy.url();
    let lease_ms = GLOBAL_LEASE_MS.to_string();
    let baseline = start_divvy_with(&global_policy(false), &["--redis-url", &regional_url]);
    let global = start_divvy_with(
        &global_policy(true),
        &[
            "--redis-url",
            &regional_url,
            "--region",
            "r1",
            "--global-url",
            &global_url,
            "--global-lease-ms",
            &lease_ms,
        ],
    );
    println!(
        "  placement: {} (the proxy runs in this process, its threads unpinned); redis-servers unpinned",
        placement().note
    );
    println!(
        "  load: line protocol HIT site=partner1, {GLOBAL_RATE:.0} req/s paced over {GLOBAL_CONNS} conns \
         (1 in flight each), {:.0} s per run, {GLOBAL_ROUNDS} rounds each, interleaved; \
         {:.0} s warm-up per server; every answer OK true; {GLOBAL_KEEP_ALIVE:.0} req/s on \
         1 more conn to each server all along, so neither sits idle while the other is measured",
        run.as_secs_f64(),
        GLOBAL_WARMUP.as_secs_f64()
    );
    let servers = [
        ("baseline (local limit)", &baseline),
        ("global (scope: global)", &global),
    ];
    let mut totals: [Option<Figures>; 2] = [None, None];
    let mut cpu_totals = [(Duration::ZERO, Duration::ZERO); 2];
    let stop = Arc::new(AtomicBool::new(false));
    let keep: Vec<_> = servers
        .iter()
        .map(|(_, divvy)| keep_alive(rt, divvy.line, GLOBAL_KEEP_ALIVE, stop.clone()))
        .collect();
    rt.block_on(async {
        for (_, divvy) in &servers {
            line_paced(divvy.line, GLOBAL_WARMUP, GLOBAL_RATE, GLOBAL_CONNS).await;
        }
    });
    println!("  after warm-up, {}", lease_summary(&global));
    for round in 0..GLOBAL_ROUNDS as usize {
        for k in 0..servers.len() {
            // Each round starts with the other server.
            let k = (round + k) % servers.len();
            let (name, divvy) = servers[k];
            let before = (cpu_time(divvy.child.id()), cpu_time(regional.child.id()));
            let mut f = rt.block_on(line_paced(divvy.line, run, GLOBAL_RATE, GLOBAL_CONNS));
            let after = (cpu_time(divvy.child.id()), cpu_time(regional.child.id()));
            let per_request = |b: Option<Duration>, a: Option<Duration>| match (b, a) {
                (Some(b), Some(a)) => Some(a.saturating_sub(b)),
                _ => None,
            };
            let (d, r) = (
                per_request(before.0, after.0),
                per_request(before.1, after.1),
            );
            let n = f.requests.max(1) as f64;
            let note = match (d, r) {
                (Some(d), Some(r)) => {
                    cpu_totals[k].0 += d;
                    cpu_totals[k].1 += r;
                    format!(
                        "cpu/req divvy {:.1} µs, redis {:.1} µs",
                        d.as_secs_f64() * 1e6 / n,
                        r.as_secs_f64() * 1e6 / n
                    )
                }
                _ => String::from("(no /proc cpu times)"),
            };
            print_global_row(&format!("  round {}: {name}", round + 1), &mut f, &note);
            totals[k] = Some(match totals[k].take() {
                None => f,
                Some(sum) => sum.add(f),
            });
        }
    }
    stop.store(true, Ordering::Relaxed);
    for ((name, _), k) in servers.iter().zip(keep) {
        let (sent, bad, first) = rt.block_on(k).expect("keep-alive");
        if bad > 0 {
            println!(
                "  keep-alive of {name}: {bad} of {sent} answers not OK true (first: {})",
                first.unwrap_or_default()
            );
        }
    }
    println!("  all rounds:");
    let mut rows = Vec::new();
    for (k, f) in totals.into_iter().enumerate() {
        let mut f = f.expect("at least one round");
        let n = f.requests.max(1) as f64;
        let cpu = cpu_totals[k].0.as_secs_f64() * 1e6 / n;
        let note = format!(
            "{} requests, cpu/req divvy {cpu:.1} µs, redis {:.1} µs",
            f.requests,
            cpu_totals[k].1.as_secs_f64() * 1e6 / n
        );
        print_global_row(&format!("  {}", servers[k].0), &mut f, &note);
        rows.push(([f.pct(0.50), f.pct(0.99), f.pct(0.999)], pcts(&mut f), cpu));
    }
    let (b, g) = (&rows[0], &rows[1]);
    let ratios = format!(
        "{} / {} / {}",
        dur_ratio(g.0[0], b.0[0]),
        dur_ratio(g.0[1], b.0[1]),
        dur_ratio(g.0[2], b.0[2])
    );
    println!("  global / baseline: p50 / p99 / p99.9 {ratios}");
    summary.row(
        "global",
        &format!(
            "p50 / p99 / p99.9 at {GLOBAL_RATE:.0} req/s paced, global store {} ms away (baseline: local limit)",
            GLOBAL_DELAY.as_millis()
        ),
        g.1.clone(),
        b.1.clone(),
        ratios,
    );
    summary.row(
        "global",
        "divvy CPU µs/req (baseline: local limit)",
        us(Some(g.2)),
        us(Some(b.2)),
        ratio(g.2, b.2),
    );
    println!("  after the runs, {}", lease_summary(&global));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().skip_while(|a| *a != flag).nth(1).cloned();
    // This program started again as a baseline server (see `BaselineProc`).
    for flag in [BASELINE_GRPC, BASELINE_LINE] {
        if let Some(port) = value(flag) {
            serve_baseline(flag, &port);
        }
    }
    let seconds: f64 = value("--seconds")
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(4.0);
    let run = Duration::from_secs_f64(seconds);
    // `--only A,B` runs those sections; `--redis-only` is `--only redis`.
    let only: Option<Vec<String>> = value("--only")
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
    // The compare section's older build, checked before anything runs.
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
    let wants = |section: &str| {
        only.as_ref().is_none_or(|o| {
            o.iter().any(|s| {
                s == section || (s == "memory" && (section == "grpc" || section == "line"))
            })
        })
    };
    let user: Vec<&str> = args[1..]
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    let command = if user.is_empty() {
        String::from("cargo bench --bench load")
    } else {
        format!("cargo bench --bench load -- {}", user.join(" "))
    };
    let placed = PLACEMENT.get_or_init(place);
    let pinned = placed.load.is_some();
    println!("# divvy load benchmark: {command}");
    println!(
        "{seconds} s per run; {}; load average at start {}",
        placed.note,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    // The load generator: one worker on its one CPU (plus the thread that
    // blocks on each run), two when unpinned.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if pinned { 1 } else { 2 })
        .enable_all()
        .build()
        .expect("runtime");
    let mut summary = Summary::default();
    if wants("grpc") {
        grpc_section(&rt, run, &mut summary);
    }
    if wants("line") {
        line_section(&rt, run, &mut summary);
    }
    let mut redis = None;
    if wants("redis") {
        let redis = redis.get_or_insert_with(start_redis);
        redis_section(&rt, redis, run, &mut summary);
    }
    if wants("redis-far") {
        redis_far_section(&rt, run, &mut summary);
    }
    if wants("algorithms") {
        let redis = redis.get_or_insert_with(start_redis);
        let url = format!("redis://127.0.0.1:{}", redis.port);
        println!(
            "\n## algorithms: line, 64 conns x 1 in flight, one actor per conn, nothing denied \
             (req/s = HIT/s);\n  {seconds} s per rule in {ROUNDS} interleaved rounds, one divvy per rule"
        );
        algorithms_section(&rt, "memory store", &[], None, run, &mut summary);
        algorithms_section(
            &rt,
            "redis store",
            &["--redis-url", &url],
            Some(redis.child.id()),
            run,
            &mut summary,
        );
    }
    drop(redis);
    if wants("memory-per-counter") {
        memory_per_counter_section(&rt, &mut summary);
    }
    if wants("global") {
        global_section(&rt, run, &mut summary);
    }
    if wants("compare") {
        // (Named in `--only` without the variable, the run stopped at the start.)
        match &before {
            Some(before) => compare_section(&rt, before, run, &mut summary),
            None => println!("\n## compare: skipped ({COMPARE_ENV} is not set)"),
        }
    }
    summary.print(&command, seconds);
}
