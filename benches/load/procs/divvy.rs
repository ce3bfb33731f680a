//! The divvy server process under test: its policy, starting it (this
//! build's or `DIVVY_BENCH_BIN`'s) and reading its HTTP port.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::procs::placement::server_command;

/// The policy the line and gRPC loads run against (shared with the core bench).
pub const POLICY: &str = include_str!("../../line_policy.yaml");

pub struct Divvy {
    pub child: Child,
    pub grpc: SocketAddr,
    pub line: SocketAddr,
    pub http: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Divvy {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Divvy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A divvy (memory store) serving [`POLICY`].
pub fn start_divvy() -> Divvy {
    start_divvy_with(POLICY, &[])
}

/// The divvy executable measured: `DIVVY_BENCH_BIN`'s build, else this one's.
pub fn divvy_binary() -> String {
    std::env::var("DIVVY_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_divvy").to_owned())
}

/// A divvy ([`divvy_binary`]) serving `policy` with the flags `extra`, on
/// the servers' CPU.
pub fn start_divvy_with(policy: &str, extra: &[&str]) -> Divvy {
    start_divvy_binary(&divvy_binary(), policy, extra)
}

/// [`start_divvy_with`] for the divvy executable at `binary`.
pub fn start_divvy_binary(binary: &str, policy: &str, extra: &[&str]) -> Divvy {
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

/// `GET path` on divvy's HTTP port: the body.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
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
