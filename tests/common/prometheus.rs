//! A Prometheus process for the tests: on 127.0.0.1, a private data dir,
//! a configuration the test writes; killed on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Prometheus process (or one stopped, to be launched again).
pub struct Prometheus {
    child: Option<Child>,
    /// Its HTTP port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one on `port` with `config` as its prometheus.yml and waits
    /// until it answers `/-/ready`.
    pub fn start(port: u16, config: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("prometheus.yml");
        let mut p = Prometheus {
            child: None,
            port,
            dir,
        };
        p.launch();
        p
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// Starts the process (again: same port, same data dir) and waits for
    /// `/-/ready`.
    pub fn launch(&mut self) {
        assert!(self.child.is_none(), "Prometheus already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("prometheus.log"))
            .expect("prometheus log");
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", path("prometheus.yml")))
            .arg(format!("--storage.tsdb.path={}", path("data")))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `prometheus` ({e}); this test needs Prometheus \
                     (Debian: apt-get install prometheus, binary /usr/bin/prometheus)"
                )
            });
        self.child = Some(child);
        self.wait_until("/-/ready", |_| true);
    }

    /// Waits (60 s at most) until GET `path` answers 200 with a body
    /// `ready` accepts; panics if the process exits meanwhile.
    pub fn wait_until(&mut self, path: &str, ready: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let child = self.child.as_mut().expect("Prometheus running");
            if let Some(status) = child.try_wait().expect("wait") {
                panic!("prometheus exited with {status}:\n{}", self.log());
            }
            if try_get(self.addr(), path).is_some_and(|(s, body)| s == 200 && ready(&body)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus on port {}: {path} not ready within 60 s:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the process (SIGKILL); [`Prometheus::launch`] starts it again.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A GET that may fail to connect (for processes still starting).
pub fn try_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split(' ').nth(1)?.parse().ok()?;
    let (_, body) = raw.split_once("\r\n\r\n")?;
    Some((status, body.to_owned()))
}
