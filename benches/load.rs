//! Load benchmark: the real `divvy` binary (memory store) on loopback,
//! next to a baseline measured in the same run.
//!
//! Run with `cargo bench --bench load` (add `-- --seconds N` to change the
//! length of each run, `-- --only memory|redis|algorithms|global` to run one
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
//!
//! The `global` section measures what a `scope: global` limit costs on the
//! request path: two divvy servers on one regional redis-server, one with a
//! local token bucket and one with the same bucket `scope: global`, whose
//! global store (another redis-server) is reached through a proxy in this
//! process that delays every chunk 40 ms each way. Paced line-protocol load
//! (2000 req/s over 16 connections), baseline and global interleaved in 2
//! rounds, each server kept at 10 req/s while the other is measured (a
//! global limit idle for a lease period is leased nothing and denies until
//! its next renewal); p50/p99/p99.9, the global / baseline ratios and each
//! server's CPU time per request. With `taskset`, the divvy servers run on
//! CPU 0 and this process on CPU 1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
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
    http: SocketAddr,
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
    start_divvy_on(policy, extra, None)
}

/// A divvy serving `policy` with the flags `extra`; with `cpu`, started
/// through `taskset -c CPU` (so its pid is divvy's own).
fn start_divvy_on(policy: &str, extra: &[&str], cpu: Option<u32>) -> Divvy {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, policy).expect("policy");
    let mut command = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string(), env!("CARGO_BIN_EXE_divvy")]);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_divvy")),
    };
    let mut child = command
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
const SECTIONS: [&str; 4] = ["memory", "redis", "algorithms", "global"];

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

/// A TCP proxy on a free loopback port to `127.0.0.1:upstream` that holds
/// every chunk for [`GLOBAL_DELAY`] in each direction, in order (one queue
/// and one writer thread per direction). Its threads end with the
/// connections they carry.
struct DelayProxy {
    port: u16,
}

impl DelayProxy {
    fn start(upstream: u16) -> DelayProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                delayed_pipe(client, s2);
                delayed_pipe(server, c2);
            }
        });
        DelayProxy { port }
    }

    /// A `PING` through the proxy: its round trip.
    fn round_trip(&self) -> Duration {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect proxy");
        s.set_nodelay(true).expect("nodelay");
        let started = Instant::now();
        s.write_all(b"PING\r\n").expect("ping");
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).expect("pong");
        assert_eq!(&buf, b"+PONG\r\n");
        started.elapsed()
    }
}

/// Forwards `from` → `to`, each chunk [`GLOBAL_DELAY`] after it was read.
fn delayed_pipe(from: std::net::TcpStream, to: std::net::TcpStream) {
    let (tx, rx) = mpsc::channel::<Option<(Instant, Vec<u8>)>>();
    let Ok(mut reader) = from.try_clone() else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let chunk = match reader.read(&mut buf) {
                Ok(0) | Err(_) => None,
                Ok(n) => Some((Instant::now() + GLOBAL_DELAY, buf[..n].to_vec())),
            };
            let end = chunk.is_none();
            if tx.send(chunk).is_err() || end {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        let mut to = to;
        while let Ok(Some((due, bytes))) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
}

/// `conns` connections sending `HIT site=partner1` at `rate` requests per
/// second in all for `run`, each on its own schedule (spread evenly over one
/// interval), one request in flight per connection: a late answer makes
/// only the next send of its connection late. Latency is from writing the
/// line to reading the answer, which must be `OK true`.
async fn line_paced(addr: SocketAddr, run: Duration, rate: f64, conns: u64) -> Figures {
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
                while due < end {
                    tokio::time::sleep_until(due.into()).await;
                    let t = Instant::now();
                    wr.write_all(b"HIT site=partner1\n").await.expect("send");
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

/// User plus system CPU time of process `pid` so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32, tick: f64) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is the first, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / tick))
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 if that fails).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
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
fn global_section(rt: &tokio::runtime::Runtime, run: Duration, command: &str) {
    println!("\nglobal: {command}");
    // Both redis-servers start before this process is pinned, so they run
    // on any CPU.
    let global_redis = start_redis();
    let regional = start_redis();
    let pinned = match pin_self(1) {
        Ok(()) => true,
        Err(why) => {
            println!("  {why}: running unpinned");
            false
        }
    };
    let proxy = DelayProxy::start(global_redis.port);
    println!(
        "  topology: global redis :{} <- proxy :{} ({} ms each way, PING round trip {:.1} ms) \
         <- divvy; regional redis :{} <- both divvy",
        global_redis.port,
        proxy.port,
        GLOBAL_DELAY.as_millis(),
        proxy.round_trip().as_secs_f64() * 1000.0,
        regional.port,
    );
    let regional_url = format!("redis://127.0.0.1:{}", regional.port);
    let global_url = format!("redis://127.0.0.1:{}", proxy.port);
    let lease_ms = GLOBAL_LEASE_MS.to_string();
    let cpu = pinned.then_some(0);
    let baseline = start_divvy_on(&global_policy(false), &["--redis-url", &regional_url], cpu);
    let global = start_divvy_on(
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
        cpu,
    );
    if pinned {
        println!("  pinned: divvy servers on CPU 0 (taskset -c 0), this process (load generator and proxy) on CPU 1, redis-servers unpinned");
    }
    println!(
        "  load: line protocol HIT site=partner1, {GLOBAL_RATE:.0} req/s paced over {GLOBAL_CONNS} conns \
         (1 in flight each), {:.0} s per run, {GLOBAL_ROUNDS} rounds each, interleaved; \
         {:.0} s warm-up per server; every answer OK true; {GLOBAL_KEEP_ALIVE:.0} req/s on \
         1 more conn to each server all along, so neither sits idle while the other is measured",
        run.as_secs_f64(),
        GLOBAL_WARMUP.as_secs_f64()
    );
    let tick = clock_ticks();
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
            let before = (
                cpu_time(divvy.child.id(), tick),
                cpu_time(regional.child.id(), tick),
            );
            let mut f = rt.block_on(line_paced(divvy.line, run, GLOBAL_RATE, GLOBAL_CONNS));
            let after = (
                cpu_time(divvy.child.id(), tick),
                cpu_time(regional.child.id(), tick),
            );
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
    let mut pcts = Vec::new();
    for (k, f) in totals.into_iter().enumerate() {
        let mut f = f.expect("at least one round");
        let n = f.requests.max(1) as f64;
        let note = format!(
            "{} requests, cpu/req divvy {:.1} µs, redis {:.1} µs",
            f.requests,
            cpu_totals[k].0.as_secs_f64() * 1e6 / n,
            cpu_totals[k].1.as_secs_f64() * 1e6 / n
        );
        print_global_row(&format!("  {}", servers[k].0), &mut f, &note);
        pcts.push((f.pct(0.50), f.pct(0.99), f.pct(0.999)));
    }
    let ratio = |g: Duration, b: Duration| g.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "  global / baseline: p50 {:.2}x, p99 {:.2}x, p99.9 {:.2}x",
        ratio(pcts[1].0, pcts[0].0),
        ratio(pcts[1].1, pcts[0].1),
        ratio(pcts[1].2, pcts[0].2)
    );
    println!("  after the runs, {}", lease_summary(&global));
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
    if wants("global") {
        // Last: it pins this process to one CPU.
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
        global_section(&rt, run, &command);
    }
}
