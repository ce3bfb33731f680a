//! Redis over TLS against real `redis-server` processes listening on TLS
//! only, with certificates the test makes (tests/common/certs.rs, with rcgen): counters
//! over `rediss://`, client certificates, a CA that does not sign the
//! server's certificate, envoyproxy/ratelimit's REDIS_TLS* variables, and
//! bad files at start-up.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::certs::Certs;
use common::redis::{Cluster, Redis};
use common::{assert_has, Server};

const POLICY: &str = r#"
overrides:
  - operation: {k: ten, who: "*"}
    creditLimit: 10
    resetSeconds: 1h
    actorField: who
default:
  creditLimit: 3
  resetSeconds: 1h
"#;

/// The counter key of `HIT k=ten who=<who>` (divvy's key shape).
fn key(who: &str) -> String {
    format!("divvy:k=ten who=*:{who}:10:3600")
}

/// One line-protocol connection.
struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(server: &Server) -> Conn {
        let stream = TcpStream::connect(server.line).expect("connect");
        // A hang detector, not a timing assertion.
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Conn { stream, reader }
    }

    /// `(allowed, credits)` of the answer to `line`.
    fn hit(&mut self, line: &str) -> (bool, u64) {
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        let mut answer = String::new();
        self.reader
            .read_line(&mut answer)
            .expect("answered, not hung");
        let (allowed, credits, _) = common::parse_ok(&answer);
        (allowed, credits)
    }
}

/// divvy on `url` with `ca` as the Redis CA, `policy` deciding when Redis
/// fails, and `extra` arguments.
fn over_tls(url: &str, ca: &Path, policy: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--redis-url", url, "--redis-tls-ca", path(ca)];
    args.extend(["--on-store-failure", policy]);
    args.extend(extra);
    Server::with_policy_args(POLICY, "yaml", &args)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

/// The first log line containing `needle`, waiting up to 30 s for it (a
/// hang detector, not a timing assertion).
fn wait_for_log(server: &Server, needle: &str) -> String {
    if let Some(line) = server.startup.iter().find(|l| l.contains(needle)) {
        return line.clone();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(line) = server.log.recv_timeout(Duration::from_millis(200)) {
            if line.contains(needle) {
                return line;
            }
            seen.push(line);
        }
    }
    panic!("no log line with {needle:?} in:\n{}", seen.join("\n"));
}

#[test]
fn counters_work_over_rediss_for_the_counters_and_the_global_store() {
    let certs = Certs::generate();
    let redis = Redis::start_tls(&certs, &certs.server, false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let server = // Only Redis can allow: a failure would deny.
    over_tls(&url, &certs.ca, "deny", &["--global-url", &url]);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=a"), (true, 9));
    assert_eq!(c.hit("HIT k=ten who=a"), (true, 8));
    assert_eq!(c.hit("HIT k=ten who=b"), (true, 9));
    assert_eq!(redis.cli(&["GET", &key("a")]), "8");
    assert_eq!(redis.cli(&["GET", &key("b")]), "9");
    let startup = server.startup.join("\n");
    assert!(
        !startup.contains("global store unreachable"),
        "the global store did not connect over TLS:\n{startup}"
    );
    assert!(startup.contains("global limits coordinated"), "{startup}");
}

#[test]
fn counters_work_over_tls_on_a_cluster() {
    let certs = Certs::generate();
    let cluster = Cluster::start_tls(3, &certs);
    let url = cluster
        .url()
        .replacen("redis+cluster://", "rediss+cluster://", 1);
    let server = over_tls(&url, &certs.ca, "deny", &[]);
    let mut c = Conn::open(&server);
    let actors: Vec<String> = (0..20).map(|i| format!("actor{i}")).collect();
    for actor in &actors {
        assert_eq!(c.hit(&format!("HIT k=ten who={actor}")), (true, 9));
    }
    // Each counter is on exactly one master, and they are spread.
    let mut holders = std::collections::BTreeSet::new();
    for actor in &actors {
        let on: Vec<usize> = (0..cluster.nodes.len())
            .filter(|&i| cluster.nodes[i].cli(&["GET", &key(actor)]) == "9")
            .collect();
        assert_eq!(on.len(), 1, "{actor} on nodes {on:?}");
        holders.insert(on[0]);
    }
    assert!(holders.len() >= 2, "counters on nodes {holders:?}");
}

#[test]
fn counters_work_over_tls_through_sentinel() {
    let certs = Certs::generate();
    let master = Redis::start_tls(&certs, &certs.server, false);
    let sentinel = Redis::sentinel_tls(master.port, "tlsmaster", &certs);
    let url = format!("rediss+sentinel://127.0.0.1:{}/tlsmaster", sentinel.port);
    let server = over_tls(&url, &certs.ca, "deny", &[]);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=s"), (true, 9));
    assert_eq!(c.hit("HIT k=ten who=s"), (true, 8));
    assert_eq!(master.cli(&["GET", &key("s")]), "8");
}

#[test]
fn a_server_that_requires_client_certificates_takes_ours_and_refuses_none() {
    let certs = Certs::generate();
    let redis = Redis::start_tls(&certs, &certs.server, true);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    // A plain URL with --redis-tls is TLS too.
    let plain_url = format!("redis://127.0.0.1:{}", redis.port);
    let with_cert = over_tls(
        &plain_url,
        &certs.ca,
        "deny",
        &[
            "--redis-tls",
            "--redis-tls-cert",
            path(&certs.client.cert),
            "--redis-tls-key",
            path(&certs.client.key),
        ],
    );
    let mut c = Conn::open(&with_cert);
    assert_eq!(c.hit("HIT k=ten who=cert"), (true, 9));
    assert_eq!(redis.cli(&["GET", &key("cert")]), "9");

    let without = over_tls(&url, &certs.ca, "deny", &[]);
    wait_for_log(&without, "Redis connection failed");
    let mut c = Conn::open(&without);
    assert_eq!(c.hit("HIT k=ten who=nocert"), (false, 0));
    assert_eq!(redis.cli(&["EXISTS", &key("nocert")]), "0");
}

#[test]
fn a_ca_that_does_not_sign_redis_is_logged_and_the_failure_policy_decides() {
    let certs = Certs::generate();
    let redis = Redis::start_tls(&certs, &certs.server, false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let server = over_tls(&url, &certs.other_ca, "allow", &[]);
    let line = wait_for_log(&server, "Redis connection failed");
    // rustls's reason, and what to check.
    assert_has(&line, &["UnknownIssuer", "--redis-tls-ca"]);
    // Allowed past the limit of 10: the failure policy decides, not Redis.
    let mut c = Conn::open(&server);
    for _ in 0..12 {
        assert!(c.hit("HIT k=ten who=a").0);
    }
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    let (status, _) = server.http("GET", "/healthz", "");
    assert_eq!(status, 200);
}

#[test]
fn envoyproxy_ratelimit_tls_variables_are_read() {
    let certs = Certs::generate();
    // A certificate for another name, and client certificates required.
    let redis = Redis::start_tls(&certs, &certs.wrong_name, true);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let port = redis.port.to_string();
    let mut env = vec![
        ("REDIS_HOST", "127.0.0.1"),
        ("REDIS_PORT", port.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", path(&certs.ca)),
        ("REDIS_TLS_CLIENT_CERT", path(&certs.client.cert)),
        ("REDIS_TLS_CLIENT_KEY", path(&certs.client.key)),
        ("DIVVY_ON_STORE_FAILURE", "deny"),
    ];
    // Without skipping the name check, the certificate is refused.
    let strict = Server::start_env(&policy, &[], &env);
    let line = wait_for_log(&strict, "Redis connection failed");
    assert_has(
        &line,
        &["NotValidForName", "--redis-tls-skip-hostname-verification"],
    );
    assert_eq!(Conn::open(&strict).hit("HIT k=ten who=strict"), (false, 0));

    env.push(("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"));
    let server = Server::start_env(&policy, &[], &env);
    let mut c = Conn::open(&server);
    assert_eq!(c.hit("HIT k=ten who=env"), (true, 9));
    assert_eq!(c.hit("HIT k=ten who=env"), (true, 8));
    assert_eq!(redis.cli(&["GET", &key("env")]), "8");
}

/// Runs `divvy serve` with `args` expecting it to refuse to start; its stderr.
fn refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let out = std::process::Command::new(common::binary())
        .args(["serve", "--config"])
        .arg(&policy)
        .args(["--http-addr", "127.0.0.1:0"])
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_tls_files_stop_the_start_and_are_named() {
    let certs = Certs::generate();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    // Nothing listens there: the files are refused before any connection.
    let url = format!("rediss://127.0.0.1:{}", common::free_port());
    let stderr = refused(&["--redis-url", &url, "--redis-tls-ca", path(&missing)]);
    assert!(stderr.contains(path(&missing)), "{stderr}");
    let stderr = refused(&["--redis-url", &url, "--redis-tls-ca", path(&garbage)]);
    assert!(
        stderr.contains(path(&garbage)) && stderr.contains("no certificate"),
        "{stderr}"
    );
    let stderr = refused(&[
        "--redis-url",
        &url,
        "--redis-tls-ca",
        path(&certs.ca),
        "--redis-tls-cert",
        path(&certs.client.cert),
        "--redis-tls-key",
        path(&garbage),
    ]);
    assert!(
        stderr.contains(path(&garbage)) && stderr.contains("private key"),
        "{stderr}"
    );
    let stderr = refused(&[
        "--redis-url",
        &url,
        "--redis-tls-cert",
        path(&certs.client.cert),
    ]);
    assert!(stderr.contains("--redis-tls-key"), "{stderr}");
}
