//! Load benchmark: the real `divvy` binary (memory store) on loopback,
//! next to a baseline measured in the same run.
//!
//! Run with `cargo bench --bench load` (add `-- --seconds N` to change the
//! length of each run, `-- --only memory|redis|algorithms` to run one
//! section). It prints requests per second and latency percentiles for:
//! - the divvy line protocol, one connection with up to 256 requests pipelined;
//! - the line protocol, 64 connections with one request in flight each;
//! - Envoy's ShouldRateLimit over gRPC, 64 concurrent requests on one channel.
//!
//! The baseline is a trivial line server in this process that answers every
//! line with a constant `OK` (no parsing, no rules, no counters): the cost of
//! loopback TCP and the load generator on this machine. Figures are quoted
//! as ratios to it, because these machines are shared and noisy.
//!
//! The `redis` section compares the Redis store with the memory store and
//! with redis-benchmark's EVALSHA of divvy's script on the same redis-server.
//!
//! The `algorithms` section measures each counting algorithm (and a rule
//! with two token-bucket limits) on the line protocol, 64 connections with
//! one request in flight, one actor per connection, on the memory store and
//! on a redis-server of its own, as ratios to the `window` algorithm measured
//! in the same run. One divvy runs per rule and the rules take turns in short
//! rounds, so a noisy neighbour slows them all alike; a second divvy with the
//! window rule shows how far two identical servers differ in the same run.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

const POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*", ip: "*"}
    creditLimit: 1000000000
    resetSeconds: 1h
    actorField: ip
  - operation: {path: /login}
    creditLimit: 5
    resetSeconds: 1m
default:
  creditLimit: 1000000000
  resetSeconds: 1h
"#;

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

struct Divvy {
    child: Child,
    grpc: SocketAddr,
    line: SocketAddr,
    _dir: tempfile::TempDir,
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

fn start_redis() -> RedisProc {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new("redis-server")
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

/// redis-benchmark's own EVALSHA rate for divvy's script on random counters.
fn redis_benchmark_evalsha(port: u16, clients: u32, pipeline: u32, seconds: u64) -> f64 {
    let sha = redis_cli(port, &["SCRIPT", "LOAD", divvy::store::redis::SCRIPT]);
    let requests = (seconds * 60_000).to_string();
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &requests, "-r", "100000", "-q"])
        // One counter per call: now from Redis TIME (-1), then divvy's window
        // (algorithm 0), limit, window ms, burst, cost 1, flags 4 (a request
        // starts here); the same arguments the Redis store sends.
        .args([
            "EVALSHA",
            &sha,
            "1",
            "bench:__rand_int__",
            "-1",
            "0",
            "1000000000",
            "3600000",
            "1000000000",
            "1",
            "4",
        ])
        .output()
        .expect("redis-benchmark (tests/run-all.sh installs redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 81234.56 requests per second, p50=..."; the last figure printed wins.
    text.rsplit("requests per second")
        .nth(1)
        .and_then(|before| before.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0.0)
}

fn start_divvy() -> Divvy {
    start_divvy_with(POLICY, &[])
}

fn start_divvy_with(policy: &str, extra: &[&str]) -> Divvy {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, policy).expect("policy");
    let mut child = Command::new(env!("CARGO_BIN_EXE_divvy"))
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
    let (mut grpc, mut line) = (None, None);
    while grpc.is_none() || line.is_none() {
        let l = lines.next().expect("divvy exited").expect("read log");
        if let Some(a) = l.split("grpc listening on ").nth(1) {
            grpc = Some(a.trim().parse().expect("addr"));
        }
        if let Some(a) = l.split("line protocol listening on ").nth(1) {
            line = Some(a.trim().parse().expect("addr"));
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Divvy {
        child,
        grpc: grpc.expect("grpc"),
        line: line.expect("line"),
        _dir: dir,
    }
}

/// The baseline: answers each line with a constant, batching like divvy does.
async fn baseline_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
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
    });
    addr
}

fn request_line(i: u64) -> String {
    format!(
        "HIT method=GET path=/api/items ip=10.0.{}.{}\n",
        (i / 256) % 256,
        i % 256
    )
}

struct Figures {
    requests: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    /// The figures of two runs together.
    fn add(mut self, other: Figures) -> Figures {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self
    }
    fn pct(&mut self, p: f64) -> Duration {
        self.latencies.sort_unstable();
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
}

/// One connection, up to `window` requests in flight.
async fn line_pipelined(addr: SocketAddr, run: Duration, window: usize) -> Figures {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (rd, mut wr) = stream.into_split();
    let permits = Arc::new(Semaphore::new(window));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let deadline = Instant::now() + run;
    let p = permits.clone();
    let writer = tokio::spawn(async move {
        let mut i = 0u64;
        while Instant::now() < deadline {
            let permit = p.acquire().await.expect("semaphore");
            permit.forget();
            // Send as many as the window allows in one write.
            let mut batch = request_line(i);
            let mut sent = vec![Instant::now()];
            i += 1;
            while let Ok(permit) = p.try_acquire() {
                permit.forget();
                batch.push_str(&request_line(i));
                i += 1;
                sent.push(Instant::now());
            }
            if wr.write_all(batch.as_bytes()).await.is_err() {
                break;
            }
            for t in sent {
                let _ = tx.send(t);
            }
        }
        drop(tx);
        i
    });
    let start = Instant::now();
    let mut reader = TokioBufReader::new(rd);
    let mut line = String::new();
    let mut latencies = Vec::new();
    while let Some(sent) = rx.recv().await {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            break;
        }
        assert!(line.starts_with("OK"), "unexpected answer {line:?}");
        latencies.push(sent.elapsed());
        permits.add_permits(1);
    }
    let sent = writer.await.expect("writer");
    Figures {
        requests: sent.min(latencies.len() as u64),
        elapsed: start.elapsed(),
        latencies,
    }
}

/// `conns` connections, one request in flight on each.
async fn line_concurrent(addr: SocketAddr, run: Duration, conns: u64) -> Figures {
    line_concurrent_with(addr, run, conns, |c, i| request_line(c * 1_000_000 + i)).await
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
    }
}

/// `concurrency` ShouldRateLimit calls in flight, spread over `channels`
/// HTTP/2 connections (Envoy opens one per worker thread).
async fn grpc_concurrent(
    addr: SocketAddr,
    run: Duration,
    concurrency: u64,
    channels: u64,
) -> Figures {
    let mut clients = Vec::new();
    for _ in 0..channels {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..concurrency)
        .map(|c| {
            let mut client = clients[(c % channels) as usize].clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = c * 1_000_000;
                while Instant::now() < deadline {
                    let req = RateLimitRequest {
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
                    };
                    let t = Instant::now();
                    let r = client
                        .should_rate_limit(req)
                        .await
                        .expect("rpc")
                        .into_inner();
                    assert_eq!(r.overall_code, 1);
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
    }
}

fn report(name: &str, mut f: Figures, baseline: Option<f64>) -> f64 {
    let rate = f.rate();
    let ratio = baseline.map_or(String::from("(baseline)"), |b| {
        format!("{:.2}x baseline", rate / b)
    });
    print_row(name, &mut f, &ratio);
    rate
}

/// Prints one row of figures: rate, p50, p99, then `note`.
fn print_row(name: &str, f: &mut Figures, note: &str) {
    println!(
        "{name:<46} {:>10.0} req/s  p50 {:>8.1?}  p99 {:>8.1?}  {note}",
        f.rate(),
        f.pct(0.50),
        f.pct(0.99)
    );
}

/// The sections `--only` may name.
const SECTIONS: [&str; 3] = ["memory", "redis", "algorithms"];

/// The memory store over each protocol, next to the in-process baseline.
async fn memory_section(divvy: &Divvy, run: Duration, seconds: u64) {
    let base = baseline_server().await;
    // Warm up both.
    line_concurrent(divvy.line, Duration::from_millis(500), 8).await;
    line_concurrent(base, Duration::from_millis(500), 8).await;
    println!("{seconds} s per run, 2 cores shared by load generator and server\n");
    let b = report(
        "baseline: line, 1 conn, 256 pipelined",
        line_pipelined(base, run, 256).await,
        None,
    );
    report(
        "divvy: line, 1 conn, 256 pipelined",
        line_pipelined(divvy.line, run, 256).await,
        Some(b),
    );
    let b = report(
        "baseline: line, 64 conns x 1 in flight",
        line_concurrent(base, run, 64).await,
        None,
    );
    report(
        "divvy: line, 64 conns x 1 in flight",
        line_concurrent(divvy.line, run, 64).await,
        Some(b),
    );
    report(
        "divvy: gRPC, 64 in flight, 1 channel",
        grpc_concurrent(divvy.grpc, run, 64, 1).await,
        Some(b),
    );
    report(
        "divvy: gRPC, 64 in flight, 4 channels",
        grpc_concurrent(divvy.grpc, run, 64, 4).await,
        Some(b),
    );
    let b1 = report(
        "baseline: line, 1 conn x 1 in flight",
        line_concurrent(base, run, 1).await,
        None,
    );
    report(
        "divvy: line, 1 conn x 1 in flight",
        line_concurrent(divvy.line, run, 1).await,
        Some(b1),
    );
    report(
        "divvy: gRPC, 1 in flight",
        grpc_concurrent(divvy.grpc, run, 1, 1).await,
        Some(b1),
    );
}

/// The Redis store, next to the memory store and redis-benchmark's own
/// EVALSHA figure on the same Redis, in the same run.
fn redis_section(
    rt: &tokio::runtime::Runtime,
    divvy: &Divvy,
    redis: &RedisProc,
    run: Duration,
    seconds: u64,
) {
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let shared = start_divvy_with(POLICY, &["--redis-url", &url]);
    println!();
    let evalsha = redis_benchmark_evalsha(redis.port, 64, 1, seconds);
    let evalsha_pipelined = redis_benchmark_evalsha(redis.port, 64, 16, seconds);
    println!(
        "{:<46} {evalsha:>10.0} req/s  (64 clients, no pipelining)",
        "redis-benchmark: EVALSHA of divvy's script"
    );
    println!(
        "{:<46} {evalsha_pipelined:>10.0} req/s  (64 clients, 16 pipelined)",
        "redis-benchmark: EVALSHA of divvy's script"
    );
    rt.block_on(async {
        line_concurrent(shared.line, Duration::from_millis(500), 8).await;
        let m = report(
            "memory store: line, 64 conns x 1 in flight",
            line_concurrent(divvy.line, run, 64).await,
            None,
        );
        let r = report(
            "redis store: line, 64 conns x 1 in flight",
            line_concurrent(shared.line, run, 64).await,
            Some(m),
        );
        println!(
            "  redis store vs redis-benchmark EVALSHA (unpipelined): {:.2}x",
            r / evalsha.max(1.0)
        );
        let m = report(
            "memory store: line, 1 conn, 256 pipelined",
            line_pipelined(divvy.line, run, 256).await,
            None,
        );
        report(
            "redis store: line, 1 conn, 256 pipelined",
            line_pipelined(shared.line, run, 256).await,
            Some(m),
        );
        let m = report(
            "memory store: gRPC, 64 in flight, 4 channels",
            grpc_concurrent(divvy.grpc, run, 64, 4).await,
            None,
        );
        report(
            "redis store: gRPC, 64 in flight, 4 channels",
            grpc_concurrent(shared.grpc, run, 64, 4).await,
            Some(m),
        );
    });
}

/// Rounds of the algorithms section: each rule runs `--seconds / ROUNDS` per
/// round, the rules in turn, so that noise on a shared machine spreads over
/// all of them instead of landing on one.
const ROUNDS: u32 = 4;

/// Each rule of [`ALGORITHM_RULES`] on one store (`extra`: divvy's store
/// flags), one divvy per rule, line protocol, 64 connections x 1 in flight,
/// `run` in all per rule, interleaved in [`ROUNDS`] rounds. Ratios are to
/// `window`; a second divvy with the window rule shows the noise floor.
fn algorithms_section(rt: &tokio::runtime::Runtime, store: &str, extra: &[&str], run: Duration) {
    let rules: Vec<(&str, &str)> = ALGORITHM_RULES
        .into_iter()
        .chain([("window, 2nd divvy", ALGORITHM_RULES[0].1)])
        .collect();
    let servers: Vec<Divvy> = rules
        .iter()
        .map(|(_, rule)| start_divvy_with(&algorithm_policy(rule), extra))
        .collect();
    let mut figures: Vec<Option<Figures>> = rules.iter().map(|_| None).collect();
    rt.block_on(async {
        for divvy in &servers {
            line_concurrent_with(divvy.line, Duration::from_millis(300), 8, actor_line).await;
        }
        for round in 0..ROUNDS as usize {
            for k in 0..servers.len() {
                // Each round starts one rule later, so no rule always runs first.
                let k = (round + k) % servers.len();
                let f = line_concurrent_with(servers[k].line, run / ROUNDS, 64, actor_line).await;
                figures[k] = Some(match figures[k].take() {
                    None => f,
                    Some(sum) => sum.add(f),
                });
            }
        }
    });
    drop(servers);
    let mut window: Option<(f64, Duration)> = None;
    for ((name, _), f) in rules.iter().zip(figures) {
        let mut f = f.expect("at least one round");
        let (rate, p99) = (f.rate(), f.pct(0.99));
        let note = match window {
            None => {
                window = Some((rate, p99));
                String::from("(baseline)")
            }
            Some((w, w99)) => format!(
                "{name} / window = {:.2}x, p99 {:.2}x",
                rate / w.max(1.0),
                p99.as_secs_f64() / w99.as_secs_f64().max(1e-9)
            ),
        };
        print_row(&format!("{store}: {name}"), &mut f, &note);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().skip_while(|a| *a != flag).nth(1).cloned();
    let seconds: u64 = value("--seconds").and_then(|s| s.parse().ok()).unwrap_or(4);
    let run = Duration::from_secs(seconds);
    // `--only SECTION` runs one section; `--redis-only` (`--only redis`)
    // skips the memory-store section (the Redis section still measures the
    // memory store next to the Redis store).
    let only = value("--only").or_else(|| {
        args.iter()
            .any(|a| a == "--redis-only")
            .then(|| String::from("redis"))
    });
    if let Some(o) = &only {
        assert!(
            SECTIONS.contains(&o.as_str()),
            "--only takes one of {SECTIONS:?}, found `{o}`"
        );
    }
    let wants = |section: &str| only.as_deref().is_none_or(|o| o == section);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut redis = None;
    if wants("memory") || wants("redis") {
        let divvy = start_divvy();
        if wants("memory") {
            rt.block_on(memory_section(&divvy, run, seconds));
        }
        if wants("redis") {
            let redis = redis.get_or_insert_with(start_redis);
            redis_section(&rt, &divvy, redis, run, seconds);
        }
    }
    if wants("algorithms") {
        let redis = redis.get_or_insert_with(start_redis);
        let url = format!("redis://127.0.0.1:{}", redis.port);
        println!(
            "\nalgorithms: line, 64 conns x 1 in flight, one actor per conn, nothing denied \
             (req/s = HIT/s);\n{seconds} s per rule in {ROUNDS} interleaved rounds, one divvy per rule"
        );
        algorithms_section(&rt, "memory store", &[], run);
        algorithms_section(&rt, "redis store", &["--redis-url", &url], run);
    }
}
