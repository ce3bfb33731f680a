//! Real `redis-server` processes on free loopback ports, started and killed
//! by the tests (never a Redis that happens to run on the machine).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::certs::{Certs, Pair};
use super::free_port;

/// Runs `redis-cli -p port args...` and returns its output.
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_tls(port, &[], args)
}

/// Runs `redis-cli` with `tls` options (none: plain) and returns its output.
fn cli_tls(port: u16, tls: &[String], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(tls)
        .args(args)
        .output()
        .expect("redis-cli must be installed (tests/run-all.sh installs it)");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A redis-server (or sentinel) process; killed on drop.
pub struct Redis {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    args: Vec<String>,
    /// redis-cli's TLS and password options; empty for a plain server.
    tls_cli: Vec<String>,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Redis {
    /// A plain server with no persistence.
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// A server that requires `password` (`requirepass`); its own `cli`
    /// gives it.
    pub fn start_with_password(password: &str) -> Redis {
        for _ in 0..4 {
            let mut r = Redis::unstarted(bus_free_port(), &["--requirepass", password]);
            r.tls_cli = password_cli(password);
            if r.try_spawn() {
                return r;
            }
        }
        panic!("redis-server with a password did not start");
    }

    /// A server with extra arguments.
    /// The port is picked free, with its cluster bus port (port + 10000)
    /// free too; if redis-server still exits (another process took either
    /// meanwhile), it is started again on a new port.
    pub fn start_with(extra: &[&str]) -> Redis {
        for _ in 0..4 {
            if let Some(r) = Redis::try_start_on(bus_free_port(), extra) {
                return r;
            }
        }
        Redis::start_on(bus_free_port(), extra)
    }

    /// A plain server on a given port.
    pub fn start_with_port(port: u16) -> Redis {
        Redis::start_on(port, &[])
    }

    fn start_on(port: u16, extra: &[&str]) -> Redis {
        let mut r = Redis::unstarted(port, extra);
        r.spawn();
        r
    }

    fn try_start_on(port: u16, extra: &[&str]) -> Option<Redis> {
        let mut r = Redis::unstarted(port, extra);
        r.try_spawn().then_some(r)
    }

    fn unstarted(port: u16, extra: &[&str]) -> Redis {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            tmp.path().display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let dir = tmp.path().to_path_buf();
        Redis {
            child: None,
            port,
            args,
            tls_cli: Vec::new(),
            dir,
            _tmp: tmp,
        }
    }

    /// A TLS-only server (`--port 0`) presenting `server`, verifying client
    /// certificates against `certs.ca`; `auth_clients`: whether clients
    /// must present one. Its own `cli` connects with `certs.client`.
    pub fn start_tls(certs: &Certs, server: &Pair, auth_clients: bool) -> Redis {
        Redis::start_tls_with(certs, server, auth_clients, &[])
    }

    /// [`Redis::start_tls`] with extra arguments.
    pub fn start_tls_with(
        certs: &Certs,
        server: &Pair,
        auth_clients: bool,
        more: &[&str],
    ) -> Redis {
        let port = free_port();
        let path = |p: &std::path::Path| p.display().to_string();
        let extra = [
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_string(),
            "--tls-cert-file".to_owned(),
            path(&server.cert),
            "--tls-key-file".to_owned(),
            path(&server.key),
            "--tls-ca-cert-file".to_owned(),
            path(&certs.ca),
            "--tls-auth-clients".to_owned(),
            if auth_clients { "yes" } else { "no" }.to_owned(),
        ];
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<String> = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            tmp.path().display().to_string(),
        ];
        args.extend(extra);
        args.extend(more.iter().map(|s| (*s).to_owned()));
        let mut r = Redis {
            child: None,
            port,
            args,
            tls_cli: tls_cli(certs),
            dir: tmp.path().to_path_buf(),
            _tmp: tmp,
        };
        r.spawn();
        r
    }

    /// A Sentinel watching `master_port` as `name`, quorum 1, quick failover.
    pub fn sentinel(master_port: u16, name: &str) -> Redis {
        Redis::sentinel_conf(master_port, name, None, None)
    }

    /// [`Redis::sentinel`] reaching a master that requires
    /// `master_password`, and requiring `password` of its clients if given.
    pub fn sentinel_with_password(
        master_port: u16,
        name: &str,
        master_password: &str,
        password: Option<&str>,
    ) -> Redis {
        Redis::sentinel_conf(master_port, name, None, Some((master_password, password)))
    }

    /// [`Redis::sentinel`] speaking TLS only, to clients and to the master
    /// (see [`Redis::start_tls`]).
    pub fn sentinel_tls(master_port: u16, name: &str, certs: &Certs) -> Redis {
        Redis::sentinel_conf(master_port, name, Some(certs), None)
    }

    /// `passwords`: the master's and the Sentinel's own, if any.
    fn sentinel_conf(
        master_port: u16,
        name: &str,
        certs: Option<&Certs>,
        passwords: Option<(&str, Option<&str>)>,
    ) -> Redis {
        let tmp = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let conf = tmp.path().join("sentinel.conf");
        let listen = match certs {
            None => format!("port {port}\n"),
            Some(c) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                c.server.cert.display(),
                c.server.key.display(),
                c.ca.display()
            ),
        };
        let auth = match passwords {
            None => String::new(),
            Some((master, own)) => {
                let own = own.map(|p| format!("requirepass {p}\n"));
                format!(
                    "{}sentinel auth-pass {name} {master}\n",
                    own.unwrap_or_default()
                )
            }
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}{auth}bind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 3000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = tmp.path().display()
            ),
        )
        .expect("sentinel.conf");
        let mut r = Redis {
            child: None,
            port,
            args: vec![conf.display().to_string(), "--sentinel".into()],
            tls_cli: match (certs, passwords) {
                (Some(c), _) => tls_cli(c),
                (None, Some((_, Some(own)))) => password_cli(own),
                (None, _) => Vec::new(),
            },
            dir: tmp.path().to_path_buf(),
            _tmp: tmp,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis on port {} did not start",
            self.port
        );
    }

    /// Starts redis-server and waits for its PONG; false if it exited
    /// (its port was taken) or did not answer within 20 s.
    fn try_spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(&self.args)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (tests/run-all.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.cli(&["PING"]) != "PONG" {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                if let Some(mut c) = self.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let status = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
        }
    }

    /// SIGSTOP: the process stays, its sockets stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// `redis-cli` against this server (over TLS for a TLS server).
    pub fn cli(&self, args: &[&str]) -> String {
        cli_tls(self.port, &self.tls_cli, args)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// redis-cli's options to give `password`.
fn password_cli(password: &str) -> Vec<String> {
    ["-a", password, "--no-auth-warning"]
        .map(str::to_owned)
        .to_vec()
}

/// redis-cli's options to reach a TLS server of `certs` (with the client
/// certificate).
fn tls_cli(certs: &Certs) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec![
        "--tls".to_owned(),
        "--cacert".to_owned(),
        path(&certs.ca),
        "--cert".to_owned(),
        path(&certs.client.cert),
        "--key".to_owned(),
        path(&certs.client.key),
    ]
}

/// The arguments of a cluster node.
const CLUSTER_NODE: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
];

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn bus_free_port() -> u16 {
    for _ in 0..50 {
        let port = free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    free_port()
}

/// A Redis Cluster of `n` masters (no replicas).
pub struct Cluster {
    /// The nodes.
    pub nodes: Vec<Redis>,
}

impl Cluster {
    /// Starts the nodes and joins them into a cluster.
    pub fn start(n: usize) -> Cluster {
        let nodes: Vec<Redis> = (0..n).map(|_| Redis::start_with(&CLUSTER_NODE)).collect();
        Cluster::join(nodes)
    }

    /// A cluster whose nodes, bus included, speak TLS only (see
    /// [`Redis::start_tls`]).
    pub fn start_tls(n: usize, certs: &Certs) -> Cluster {
        let mut extra = CLUSTER_NODE.to_vec();
        extra.extend(["--tls-cluster", "yes"]);
        let nodes: Vec<Redis> = (0..n)
            .map(|_| Redis::start_tls_with(certs, &certs.server, false, &extra))
            .collect();
        Cluster::join(nodes)
    }

    /// Joins `nodes` into a cluster and waits until it is ok.
    fn join(nodes: Vec<Redis>) -> Cluster {
        let mut args: Vec<String> = nodes[0].tls_cli.clone();
        args.extend(["--cluster".into(), "create".into()]);
        args.extend(nodes.iter().map(|r| format!("127.0.0.1:{}", r.port)));
        args.extend([
            "--cluster-replicas".into(),
            "0".into(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            while !node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }
}
