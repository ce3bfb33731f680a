//! The benchmark's own redis-servers: starting them, `redis-cli`, the
//! script calls they ran, and redis-benchmark's EVALSHA of divvy's script.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::placement::server_command;
use crate::procs::usage::cpu_time;

/// A redis-server of the benchmark's own on a free loopback port.
pub struct RedisProc {
    pub child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server on the servers' CPU.
pub fn start_redis() -> RedisProc {
    start_redis_with(server_command("redis-server"))
}

/// A redis-server started by `command` (`redis-server`, maybe through taskset).
pub fn start_redis_with(mut command: Command) -> RedisProc {
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

pub fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// EVALSHA and EVAL calls the redis-server on `port` has run (its
/// `INFO commandstats`).
pub fn script_calls(port: u16) -> Option<u64> {
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
pub fn redis_benchmark_evalsha(
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
