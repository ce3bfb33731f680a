//! The processes of the soak: one redis-server behind a fault proxy (the
//! replicas' counters and their global store), a
//! ZooKeeper with aux rules, a Prometheus a governor reads, an xDS control
//! plane, two
//! divvy replicas on it (each on fixed ports, so a replica killed comes
//! back where Envoy looks for it), and an Envoy in front of each whose
//! rate-limit cluster holds both replicas behind a gRPC health check.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::common::envoy::{self, Bootstrap, Envoy, UpstreamTls};
use crate::common::fault_proxy::FaultProxy;
use crate::common::prometheus::Prometheus;
use crate::common::redis::Redis;
use crate::common::zookeeper::ZooKeeper;
use crate::common::{stable_port, Server};
use crate::now;
use crate::tls::Tls;
use crate::xds::Plane;

/// The admin token the replicas take knob changes with.
pub const TOKEN: &str = "soak-admin-token";

/// The rules the load runs on: (descriptor value, algorithm, most
/// admissions an actor may get in one epoch second while Redis decides).
pub const RULES: [(&str, &str, u64); 4] = [
    ("fixed", "fixed", LIMIT),
    ("sliding", "sliding", LIMIT),
    // A token bucket admits at most burst + rate · T in any T seconds.
    ("bucket", "token_bucket", 2 * LIMIT),
    // `scope: global`: its bound is `global_limit::bound`'s.
    (
        crate::global_limit::RULE,
        "token_bucket, scope global",
        2 * LIMIT,
    ),
];

/// Each rule's `creditLimit` per second (and the bucket's burst).
pub const LIMIT: u64 = 10;

/// The policy file, `version` in a comment (a reload that changes no rule
/// keeps every counter: counters are keyed by rule content), with the
/// governor reading `prometheus`.
pub fn policy(version: u32, prometheus: &str) -> String {
    let mut yaml = format!("# soak policy, version {version}\noverrides:\n");
    for (name, algorithm, _) in RULES.iter().filter(|r| r.0 != crate::global_limit::RULE) {
        yaml += &format!(
            "  - operation: {{rule: {name}, actor: \"*\"}}\n    actorField: actor\n    algorithm: {algorithm}\n    creditLimit: {LIMIT}\n    resetSeconds: 1\n    label: {name}\n"
        );
    }
    yaml += &crate::global_limit::policy_part();
    yaml += "  - operation: {rule: hostile, actor: \"*\"}\n    actorField: actor\n    algorithm: fixed\n    creditLimit: 5\n    resetSeconds: 1\n    label: hostile\n";
    let (rule, governor) = crate::governor::policy_part(prometheus);
    yaml + &rule
        + crate::rlqs::RULE
        + "default:\n  creditLimit: 10\n  resetSeconds: 0\n"
        + &governor
}

/// One line a replica logged: when (Unix seconds), which replica, the line.
pub type LogLine = (f64, usize, String);

/// A divvy replica on its own fixed ports; `server` is `None` while it is
/// down.
pub struct Replica {
    /// 0 or 1.
    pub index: usize,
    /// Its gRPC, line-protocol and admin ports.
    pub ports: [u16; 3],
    /// The running process.
    pub server: Option<Server>,
    /// When the running process was started (Unix seconds).
    pub started: f64,
}

impl Replica {
    /// Its admin address.
    pub fn http(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[2]))
    }

    /// Its line-protocol address.
    pub fn line(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[1]))
    }
}

/// Everything the soak started; every process is killed on drop.
pub struct Rig {
    /// The redis-server.
    pub redis: Redis,
    /// The xDS control plane of an envoyproxy/ratelimit domain.
    pub xds: Plane,
    /// The Prometheus the governor reads.
    pub prometheus: Prometheus,
    /// The gRPC port's certificates.
    pub tls: Tls,
    /// The ZooKeeper the replicas take aux rules from.
    pub zk: ZooKeeper,
    /// The proxy the replicas reach Redis through (to slow it).
    pub proxy: FaultProxy,
    /// The two replicas.
    pub replicas: Vec<Replica>,
    /// An Envoy in front of each replica (both replicas in its cluster).
    pub envoys: Vec<Envoy>,
    /// The policy file both replicas serve (and watch).
    pub policy: PathBuf,
    /// Every line the replicas logged, stamped.
    pub log: Arc<Mutex<Vec<LogLine>>>,
    /// The binary the replicas run.
    pub divvy: PathBuf,
    /// Each replica's process id while it runs (for the resource sampler).
    pub pids: Arc<Mutex<Vec<Option<u32>>>>,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// Starts Redis, the proxy, both replicas and both Envoys.
    pub fn start(divvy: PathBuf) -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let policy = dir.path().join("policy.yaml");
        let prometheus = crate::governor::start();
        std::fs::write(&policy, self::policy(1, &prometheus.url())).expect("write policy");
        let redis = Redis::start_with_port(stable_port());
        let proxy = FaultProxy::start(redis.port);
        let mut rig = Rig {
            xds: Plane::start(),
            prometheus,
            tls: Tls::generate(),
            zk: crate::zookeeper::start(),
            redis,
            proxy,
            replicas: Vec::new(),
            envoys: Vec::new(),
            policy,
            log: Arc::new(Mutex::new(Vec::new())),
            divvy,
            pids: Arc::new(Mutex::new(vec![None, None])),
            _dir: dir,
        };
        for index in 0..2 {
            let ports = [stable_port(), stable_port(), stable_port()];
            rig.replicas.push(Replica {
                index,
                ports,
                server: None,
                started: 0.0,
            });
            rig.start_replica(index);
        }
        let upstream = envoy::upstream("ok");
        let grpc: Vec<u16> = rig.replicas.iter().map(|r| r.ports[0]).collect();
        for _ in 0..2 {
            rig.envoys.push(start_envoy(&grpc, upstream, &rig.tls));
        }
        rig
    }

    /// Starts replica `index` (again) on its ports and collects its log.
    pub fn start_replica(&mut self, index: usize) {
        let [grpc, line, http] = self.replicas[index].ports;
        let mut command = Command::new(&self.divvy);
        command
            .arg("serve")
            .arg("--config")
            .arg(&self.policy)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--line-addr", &format!("127.0.0.1:{line}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--redis-url", &self.proxy.url()])
            .args(["--admin-token", TOKEN])
            .args(crate::global_limit::args(&self.proxy.url()))
            .arg("--grpc-tls-cert")
            .arg(&self.tls.cert)
            .arg("--grpc-tls-key")
            .arg(&self.tls.key)
            .args(["--xds-server", &self.xds.addr.to_string()])
            .args(["--xds-node-id", "soak"])
            .args(["--zk-enabled-for-aux-rules", "true"])
            .args(["--zk-hosts-for-aux-rules", &self.zk.hosts()])
            .args(["--zk-aux-rules-path", crate::zookeeper::PATH])
            .env("DIVVY_LOG", "info");
        let mut server = Server::spawn(command);
        let started = now();
        let (_, quiet) = std::sync::mpsc::channel();
        let lines = std::mem::replace(&mut server.log, quiet);
        let log = self.log.clone();
        for line in &server.startup {
            log.lock().unwrap().push((started, index, line.clone()));
        }
        std::thread::spawn(move || {
            for line in lines {
                log.lock().unwrap().push((now(), index, line));
            }
        });
        self.pids.lock().unwrap()[index] = Some(server.pid());
        let replica = &mut self.replicas[index];
        replica.server = Some(server);
        replica.started = started;
    }

    /// Kills replica `index` (SIGKILL) and waits for it to exit.
    pub fn kill_replica(&mut self, index: usize) {
        self.pids.lock().unwrap()[index] = None;
        // Dropping the server kills and reaps it.
        self.replicas[index].server = None;
    }

    /// Writes the policy file by renaming a full file over it, so a
    /// watcher never reads half of it.
    pub fn write_policy(&self, text: &str) {
        let next = self.policy.with_extension("next");
        std::fs::write(&next, text).expect("write policy");
        std::fs::rename(&next, &self.policy).expect("rename policy");
    }

    /// Replica `index`'s gRPC address.
    pub fn grpc(&self, index: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.replicas[index].ports[0]))
    }

    /// The listener port of Envoy `index`.
    pub fn envoy_port(&self, index: usize) -> u16 {
        self.envoys[index].ports[0]
    }
}

/// Placeholders of the second replica's port in the Envoy bootstrap.
const SECOND_DIVVY: u16 = 8082;

/// An Envoy with Envoy's defaults for the rate-limit filter (a 20 ms
/// timeout, `failure_mode_deny: true`), TLS to divvy from `tls`'s CA, both
/// replicas in its cluster and
/// a gRPC health check every 250 ms, so that a dead replica leaves the
/// rotation within about a quarter second (the no-traffic interval too:
/// Envoy counts a cluster only gRPC calls go to as without traffic, and
/// would check it once a minute).
fn start_envoy(grpc: &[u16], upstream: u16, tls: &Tls) -> Envoy {
    let upstream_tls = UpstreamTls {
        cert: &tls.envoy.0,
        key: &tls.envoy.1,
        ca: &tls.ca_path,
        san: Some("localhost"),
    };
    let yaml = Bootstrap::new("soak", "", "0.02s")
        .descriptor_headers(&[("x-rule", "rule"), ("x-actor", "actor")])
        .listener("soak", "divvy")
        .divvy("divvy", Some(upstream_tls))
        .yaml();
    let endpoint = "port_value: 8081 } } }";
    let both = format!(
        "{endpoint}\n        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {SECOND_DIVVY} }} }} }}"
    );
    let checked = "  - name: divvy\n    type: STATIC\n    connect_timeout: 1s\n";
    let health = format!(
        "{checked}    health_checks:\n    - {{ timeout: 0.2s, interval: 0.25s, no_traffic_interval: 0.25s, unhealthy_threshold: 1, healthy_threshold: 1, grpc_health_check: {{}} }}\n    common_lb_config: {{ healthy_panic_threshold: {{ value: 0 }} }}\n"
    );
    assert!(
        yaml.contains(endpoint) && yaml.contains(checked),
        "bootstrap changed: {yaml}"
    );
    let yaml = yaml.replace(endpoint, &both).replace(checked, &health);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, yaml).expect("write envoy config");
    envoy::start(
        &config,
        9901,
        &[10000],
        &[(8081, grpc[0]), (SECOND_DIVVY, grpc[1]), (8088, upstream)],
        &[],
    )
}

/// A GET to an admin address that tolerates a replica being down:
/// `(status, body)`, or `None` when it does not answer.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    request(addr, "GET", path, "")
}

/// An admin request with the admin token, tolerating failures.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    use std::time::Duration;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split(' ').nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Some((status, body))
}

/// One sample of a replica's `/metrics`, if it answers.
pub fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (status, body) = get(addr, "/metrics")?;
    (status == 200).then_some(())?;
    crate::common::parse_metrics(&body).get(name).copied()
}
