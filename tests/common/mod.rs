//! Helpers for integration tests: start the real `divvy` binary on free
//! loopback ports and talk to it.
#![allow(dead_code)]

pub mod certs;
pub mod delay_proxy;
pub mod envoy;
pub mod fault_proxy;
pub mod flood;
pub mod pacer;
pub mod pki;
pub mod prometheus;
pub mod redis;
pub mod rlqs;
pub mod xds;
pub mod zookeeper;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use proptest::test_runner::{RngAlgorithm, TestRng};
use tonic::transport::Channel;

/// The binary as envoyproxy/ratelimit's `/bin/ratelimit` (a link named
/// `ratelimit` in `dir`), with an empty environment.
pub fn as_ratelimit(dir: &Path) -> Command {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(binary(), &link).expect("symlink");
    let mut command = Command::new(link);
    command.env_clear();
    command
}

/// envoyproxy/ratelimit's variables that put every port on a free loopback
/// port, log the addresses and send no statsd.
pub const RATELIMIT_ON_LOOPBACK: [(&str, &str); 6] = [
    ("USE_STATSD", "false"),
    ("LOG_LEVEL", "info"),
    ("GRPC_HOST", "127.0.0.1"),
    ("GRPC_PORT", "0"),
    ("HOST", "127.0.0.1"),
    ("PORT", "0"),
];

/// Path of the binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_divvy"))
}

/// Runs `divvy <command> <args>` as an admin client of `server` (its admin
/// URL given by `url_flag`, which `knob` and `counters` name differently),
/// with `token` as `DIVVY_ADMIN_TOKEN` and no other admin variable from
/// the test's environment; returns whether it succeeded, its stdout and its
/// stderr (where refusals such as a wrong token's 403 show).
pub fn admin_client(
    server: &Server,
    command: &str,
    url_flag: &str,
    args: &[&str],
    token: Option<&str>,
) -> (bool, String, String) {
    let mut cmd = Command::new(binary());
    cmd.arg(command)
        .args(args)
        .args([url_flag, &format!("http://{}", server.http)])
        .env_remove("DIVVY_ADMIN_TOKEN")
        .env_remove("DIVVY_ADMIN_READ_TOKEN")
        .env_remove("DIVVY_ADMIN_URL");
    if let Some(t) = token {
        cmd.env("DIVVY_ADMIN_TOKEN", t);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run divvy {command}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `f` every 20 ms until it holds or `limit` passes; the time it took.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `divvy serve`; killed on drop.
pub struct Server {
    child: Child,
    /// The gRPC address it listens on.
    pub grpc: SocketAddr,
    /// The line-protocol address it listens on.
    pub line: SocketAddr,
    /// The HTTP admin address it listens on.
    pub http: SocketAddr,
    /// Everything it logged so far is sent here, line by line.
    pub log: mpsc::Receiver<String>,
    /// What it logged before it reported its addresses (not sent to `log`).
    pub startup: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Writes `text` to a temp file named `policy.<ext>` and serves it.
    pub fn with_policy(text: &str, ext: &str) -> Server {
        Server::with_policy_args(text, ext, &[])
    }

    /// Like [`Server::with_policy`], with extra `serve` arguments.
    pub fn with_policy_args(text: &str, ext: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(format!("policy.{ext}"));
        std::fs::write(&path, text).expect("write policy");
        let mut s = Server::start(&path, extra);
        s._dir = Some(dir);
        s
    }

    /// Serves the policy at `path` with extra arguments.
    pub fn start(path: &Path, extra: &[&str]) -> Server {
        Server::start_env(path, extra, &[])
    }

    /// Serves the policy at `path` with extra arguments and environment variables.
    pub fn start_env(path: &Path, extra: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut command = Command::new(binary());
        command
            .arg("serve")
            .arg("--config")
            .arg(path)
            .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(extra)
            .env("DIVVY_LOG", "info")
            .envs(envs.iter().copied());
        Server::spawn(command)
    }

    /// Runs `command` (the binary, with its arguments and environment) and
    /// waits for it to report its three addresses.
    pub fn spawn(mut command: Command) -> Server {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn divvy");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (mut grpc, mut line_addr, mut http) = (None, None, None);
        let mut startup = Vec::new();
        while grpc.is_none() || line_addr.is_none() || http.is_none() {
            let Ok(line) = rx.recv_timeout(Duration::from_secs(30)) else {
                // Not left running behind the failed test.
                let _ = child.kill();
                let _ = child.wait();
                panic!("divvy did not report its addresses within 30 s: {startup:?}");
            };
            startup.push(line.clone());
            if let Some(addr) = line.split("grpc listening on ").nth(1) {
                grpc = Some(addr.trim().parse().expect("address"));
            }
            if let Some(addr) = line.split("line protocol listening on ").nth(1) {
                line_addr = Some(addr.trim().parse().expect("address"));
            }
            if let Some(addr) = line.split("http listening on ").nth(1) {
                http = Some(addr.trim().parse().expect("address"));
            }
        }
        Server {
            child,
            grpc: grpc.unwrap(),
            line: line_addr.unwrap(),
            http: http.unwrap(),
            log: rx,
            startup,
            _dir: None,
        }
    }

    /// Sends `input` on one line-protocol connection, closes the write side,
    /// and returns everything the server answered.
    pub fn line_exchange(&self, input: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.line).expect("connect line");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(input).expect("send");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read answers");
        String::from_utf8(out).expect("answers are UTF-8")
    }

    /// An HTTP/1.1 request to the admin API: `(status, body)`.
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http_request(self.http, method, path, body, None)
    }

    /// Every sample of `/metrics`: `name{labels}` → value.
    pub fn metric_samples(&self) -> BTreeMap<String, f64> {
        metric_samples_at(self.http)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.child.wait().expect("wait")
    }

    /// A gRPC client connected to the server.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    /// The grpc.health.v1 status of `service` on the gRPC port (1 SERVING,
    /// 2 NOT_SERVING).
    pub async fn grpc_health(&self, service: &str) -> i32 {
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .expect("address")
            .connect()
            .await
            .expect("connect");
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A descriptor from key/value entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// Sends one `ShouldRateLimit` and returns the answer (panics on a gRPC error).
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

/// One ShouldRateLimit call of `server` in `domain` with descriptor `d`
/// alone, on a fresh connection: its status's code and credits left.
pub async fn one_status(server: &Server, domain: &str, d: RateLimitDescriptor) -> (i32, u32) {
    let mut client = server.client().await;
    let r = ask(&mut client, request(domain, vec![d])).await;
    let s = r.statuses.first().expect("one status");
    (s.code, s.limit_remaining)
}

/// `(allowed, credits, seconds to reset)` of a line-protocol `OK` answer.
pub fn parse_ok(line: &str) -> (bool, u64, i64) {
    let t: Vec<&str> = line.trim_end().split(' ').collect();
    assert!(t.len() == 4 && t[0] == "OK", "unexpected answer {line:?}");
    (
        t[1] == "true",
        t[2].parse().expect("credits"),
        t[3].parse().expect("seconds"),
    )
}

/// A request in `domain`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// An HTTP/1.1 request to `addr` with an optional `Authorization` header
/// value: `(status, body)`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, String) {
    let (status, _, body) = http_exchange(addr, method, path, body, auth);
    (status, body)
}

/// An admin call made with `token` as a Bearer token, which must answer
/// 200 (a knob set or removed): its body.
pub fn admin_ok(addr: SocketAddr, method: &str, path: &str, body: &str, token: &str) -> String {
    let (status, answer) = http_request(addr, method, path, body, Some(&format!("Bearer {token}")));
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer
}

/// Like [`http_request`], also returning the response's head (status line
/// and headers): `(status, head, body)`.
pub fn http_exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    auth: Option<&str>,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = auth.map_or_else(String::new, |a| format!("Authorization: {a}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("http answer");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_owned(), b.to_owned()))
        .unwrap_or((raw.clone(), String::new()));
    (status, head, body)
}

/// Asserts that `haystack` contains every one of `needles`.
pub fn assert_has(haystack: &str, needles: &[&str]) {
    for n in needles {
        assert!(haystack.contains(n), "expected {n:?} in:\n{haystack}");
    }
}

/// Every sample of the `/metrics` of the admin API at `http` (asserting a
/// 200): `name{labels}` → value.
pub fn metric_samples_at(http: SocketAddr) -> BTreeMap<String, f64> {
    let (status, body) = http_request(http, "GET", "/metrics", "", None);
    assert_eq!(status, 200);
    parse_metrics(&body)
}

/// Every sample of a Prometheus text exposition: `name{labels}` → value
/// (comments, blank lines and unparsable values are skipped).
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A free loopback port below the kernel's ephemeral range, for a process
/// that binds it seconds after it was picked (and again after a restart):
/// a port in the ephemeral range could meanwhile be the local port of one
/// of the many short connections the tests make, which makes its bind fail.
pub fn stable_port() -> u16 {
    use std::hash::BuildHasher;
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (from, to) = if low > 12_000 {
        (10_000, low)
    } else {
        (61_000, 65_000)
    };
    for i in 0..1000u32 {
        let r = std::collections::hash_map::RandomState::new().hash_one(i);
        let port = from + (r % u64::from(to - from)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {from}..{to}");
}

/// proptest's ChaCha RNG seeded with `seed`: the same sequence on every
/// run and machine (use `proptest::prelude::RngCore` / `RngExt` on it).
pub fn seeded_rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

impl Server {
    /// What the failure policy decided so far: every nonzero
    /// `divvy_failure_policy_decisions_total{policy,reason}` sample.
    pub fn policy_decisions(&self) -> Vec<(String, f64)> {
        self.metric_samples()
            .into_iter()
            .filter(|(k, v)| k.starts_with("divvy_failure_policy_decisions_total") && *v != 0.0)
            .collect()
    }

    /// Waits until the breaker is closed: it decides from Redis (a replica
    /// whose startup probe missed its time starts with the breaker open,
    /// and its probe closes it within a quarter second of Redis answering).
    pub fn wait_for_breaker_closed(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.metric_samples().get("divvy_store_breaker_state") != Some(&0.0) {
            assert!(
                std::time::Instant::now() < deadline,
                "the breaker did not close within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
