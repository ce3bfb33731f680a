//! TLS and mutual TLS on the gRPC and admin ports of the real binary, with
//! certificates made per test: plaintext refused, client certificates
//! checked (CA and SAN), envoyproxy/ratelimit's variables, rotation without
//! a restart, and a real Envoy calling over mutual TLS.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::envoy::{Bootstrap, UpstreamTls};
use common::pki::{self, ask_plain, ask_tls, served_serial, Ca, Pair, San};
use common::{parse_metrics, Server};

/// Envoy's domain `edge`: `generic_key=reports` twice a minute; anything else free.
const POLICY: &str = r#"
overrides:
  - label: reports
    domain: edge
    operation: {generic_key: reports}
    creditLimit: 2
    resetSeconds: 1m
default:
  label: unlimited
  creditLimit: 1
  resetSeconds: 0
"#;

/// `overall_code` OK.
const OK: i32 = 1;

/// A temporary directory with the policy and the server pair of `ca`.
struct Files {
    dir: tempfile::TempDir,
    policy: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new(server: &Pair) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let policy = pki::write(dir.path(), "policy.yaml", POLICY);
        let (cert, key) = server.write(dir.path(), "server");
        Files {
            dir,
            policy,
            cert,
            key,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `text` to `name` in the directory: its path as a string.
    fn put(&self, name: &str, text: &str) -> String {
        s(&pki::write(self.dir.path(), name, text))
    }

    /// The gRPC TLS flags for the server pair.
    fn grpc_flags(&self) -> Vec<String> {
        vec![
            "--grpc-tls-cert".into(),
            s(&self.cert),
            "--grpc-tls-key".into(),
            s(&self.key),
        ]
    }
}

fn s(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn start(files: &Files, flags: &[String], env: &[(&str, &str)]) -> Server {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Server::start_env(&files.policy, &flags, env)
}

#[tokio::test]
async fn grpc_over_tls_answers_and_plaintext_to_it_is_refused() {
    let ca = Ca::new("divvy test ca");
    let files = Files::new(&ca.server(1));
    let server = start(&files, &files.grpc_flags(), &[]);

    // Clients that connect and say nothing do not hold up the next one: it
    // is answered before any of theirs has timed out.
    let silent: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(server.grpc).unwrap())
        .collect();
    assert_eq!(ask_tls(server.grpc, &ca.pem, None).await, Ok(OK));
    let timeouts = "divvy_tls_handshake_failures_total{port=\"grpc\",reason=\"timeout\"}";
    assert_eq!(server.metric_samples().get(timeouts), None);
    drop(silent);
    let plain = ask_plain(server.grpc).await;
    assert!(plain.is_err(), "plaintext gRPC to the TLS port: {plain:?}");
    // The line protocol stays plaintext.
    let answer = server.line_exchange(b"HIT a=b\n");
    assert!(answer.starts_with("OK "), "{answer}");
}

#[tokio::test]
async fn client_certificates_must_chain_to_the_client_ca_and_carry_the_san() {
    let ca = Ca::new("divvy test ca");
    let other = Ca::new("another ca");
    let files = Files::new(&ca.server(1));
    let client_ca = files.put("clients.crt", &ca.pem);
    let mut flags = files.grpc_flags();
    flags.extend(["--grpc-tls-client-ca".into(), client_ca]);
    let server = start(&files, &flags, &[]);

    let no_cert = ask_tls(server.grpc, &ca.pem, None).await;
    assert!(no_cert.is_err(), "no client certificate: {no_cert:?}");
    let stranger = other.issue(&[San::Dns("envoy")], 2);
    let from_other = ask_tls(server.grpc, &ca.pem, Some(&stranger)).await;
    assert!(from_other.is_err(), "another CA's client: {from_other:?}");
    let client = ca.issue(&[San::Dns("envoy")], 3);
    assert_eq!(ask_tls(server.grpc, &ca.pem, Some(&client)).await, Ok(OK));
    drop(server);

    let spiffe = "spiffe://cluster.local/ns/edge/sa/envoy";
    flags.extend(["--grpc-tls-client-san".into(), spiffe.into()]);
    let server = start(&files, &flags, &[]);
    let wrong = ca.issue(&[San::Uri("spiffe://cluster.local/ns/edge/sa/other")], 4);
    let refused = ask_tls(server.grpc, &ca.pem, Some(&wrong)).await;
    assert!(refused.is_err(), "a client with another SAN: {refused:?}");
    let right = ca.issue(&[San::Dns("envoy"), San::Uri(spiffe)], 5);
    assert_eq!(ask_tls(server.grpc, &ca.pem, Some(&right)).await, Ok(OK));
    assert!(ask_tls(server.grpc, &ca.pem, None).await.is_err());
}

#[tokio::test]
async fn envoyproxy_ratelimit_variables_turn_on_tls_and_client_checks() {
    let ca = Ca::new("divvy test ca");
    let other = Ca::new("another ca");
    let files = Files::new(&ca.server(1));
    let client_ca = files.put("clients.crt", &ca.pem);
    let (cert, key) = (s(&files.cert), s(&files.key));
    let base = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];

    // GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN (a DNS name).
    let mut env = base.to_vec();
    env.extend([
        ("GRPC_CLIENT_TLS_CACERT", client_ca.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "ratelimit-client.example"),
    ]);
    let server = start(&files, &[], &env);
    assert!(ask_plain(server.grpc).await.is_err());
    assert!(ask_tls(server.grpc, &ca.pem, None).await.is_err());
    let wrong = ca.issue(&[San::Dns("elsewhere.example")], 2);
    assert!(ask_tls(server.grpc, &ca.pem, Some(&wrong)).await.is_err());
    let right = ca.issue(&[San::Dns("ratelimit-client.example")], 3);
    assert_eq!(ask_tls(server.grpc, &ca.pem, Some(&right)).await, Ok(OK));
    drop(server);

    // GRPC_SERVER_TLS_CA_CERT, the name Envoy Gateway sets.
    let mut env = base.to_vec();
    env.push(("GRPC_SERVER_TLS_CA_CERT", client_ca.as_str()));
    let server = start(&files, &[], &env);
    let stranger = other.issue(&[San::Dns("envoy")], 4);
    assert!(ask_tls(server.grpc, &ca.pem, Some(&stranger))
        .await
        .is_err());
    assert_eq!(ask_tls(server.grpc, &ca.pem, Some(&right)).await, Ok(OK));
    drop(server);

    // Without GRPC_SERVER_USE_TLS=true the variables are ignored.
    let mut env = base.to_vec();
    env[0] = ("GRPC_SERVER_USE_TLS", "false");
    let server = start(&files, &[], &env);
    assert_eq!(ask_plain(server.grpc).await, Ok(OK));
}

/// Polls `check` every 200 ms until it is true, for at most `limit`.
async fn within(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The serial a new connection to `server`'s gRPC port sees.
async fn serial(server: &Server, cas: &[&str]) -> Option<u64> {
    served_serial(server.grpc, cas).await.ok()
}

fn reload_errors(server: &Server) -> f64 {
    server
        .metric_samples()
        .get("divvy_tls_reload_errors_total{port=\"grpc\"}")
        .copied()
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn a_renamed_pair_is_served_to_new_connections_and_a_broken_one_is_refused() {
    let old_ca = Ca::new("old ca");
    let new_ca = Ca::new("new ca");
    let files = Files::new(&old_ca.server(1001));
    let server = start(&files, &files.grpc_flags(), &[]);
    let both = [old_ca.pem.as_str(), new_ca.pem.as_str()];
    assert_eq!(serial(&server, &both).await, Some(1001));
    // A channel that trusts only the old CA: it can answer after the
    // rotation only on the connection it opened before.
    let mut before = pki::grpc_tls(server.grpc, &old_ca.pem, None).await.unwrap();
    assert_eq!(pki::call(&mut before).await, Ok(OK));

    let next = new_ca.server(1002);
    pki::replace_by_rename(&files.key, &next.key);
    pki::replace_by_rename(&files.cert, &next.cert);
    within(Duration::from_secs(10), "the new serial", async || {
        serial(&server, &both).await == Some(1002)
    })
    .await;
    assert_eq!(pki::call(&mut before).await, Ok(OK));
    assert_eq!(ask_tls(server.grpc, &new_ca.pem, None).await, Ok(OK));

    // Garbage in place of the certificate: counted, logged, and the pair in
    // force stays.
    let errors = reload_errors(&server);
    assert_eq!(errors, 0.0);
    pki::replace_by_rename(&files.cert, "-----BEGIN CERTIFICATE-----\ngarbage\n");
    within(
        Duration::from_secs(10),
        "a counted reload error",
        async || reload_errors(&server) > errors,
    )
    .await;
    assert_eq!(serial(&server, &both).await, Some(1002));
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    assert_eq!(pki::call(&mut before).await, Ok(OK));
    // A key that does not match the certificate is refused too.
    pki::replace_by_rename(&files.cert, &next.cert);
    pki::replace_by_rename(&files.key, &new_ca.server(1003).key);
    within(
        Duration::from_secs(10),
        "a second reload error",
        async || reload_errors(&server) > errors + 1.0,
    )
    .await;
    assert_eq!(serial(&server, &both).await, Some(1002));
}

/// Kubernetes' secret volume: `name -> ..data/name`, `..data -> ..<version>`,
/// a new version swapped in by renaming a new `..data` link over the old.
fn secret_version(dir: &Path, version: &str, pair: &Pair) {
    let versioned = dir.join(version);
    std::fs::create_dir(&versioned).unwrap();
    pair.write(&versioned, "tls");
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[tokio::test]
async fn a_kubernetes_symlink_swap_is_picked_up() {
    let ca = Ca::new("divvy test ca");
    let files = Files::new(&ca.server(1));
    let secret = files.path("secret");
    std::fs::create_dir(&secret).unwrap();
    secret_version(&secret, "..2026_01", &ca.server(2001));
    for name in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{name}"), secret.join(name)).unwrap();
    }
    let flags = [
        "--grpc-tls-cert".into(),
        s(&secret.join("tls.crt")),
        "--grpc-tls-key".into(),
        s(&secret.join("tls.key")),
    ];
    let server = start(&files, &flags, &[]);
    assert_eq!(serial(&server, &[&ca.pem]).await, Some(2001));
    secret_version(&secret, "..2026_02", &ca.server(2002));
    within(Duration::from_secs(10), "the swapped serial", async || {
        serial(&server, &[&ca.pem]).await == Some(2002)
    })
    .await;
    assert_eq!(reload_errors(&server), 0.0);
}

#[tokio::test]
async fn the_admin_api_over_https_and_the_expiry_gauges() {
    let ca = Ca::new("divvy test ca");
    let files = Files::new(&ca.server(1));
    let (cert, key) = ca.server(2).write(files.dir.path(), "admin");
    let mut flags = files.grpc_flags();
    flags.extend([
        "--http-tls-cert".into(),
        s(&cert),
        "--http-tls-key".into(),
        s(&key),
    ]);
    let server = start(&files, &flags, &[]);

    let (status, body) = pki::https_get(server.http, &ca.pem, "/healthz")
        .await
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, metrics) = pki::https_get(server.http, &ca.pem, "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let samples = parse_metrics(&metrics);
    for port in ["grpc", "http"] {
        let expiry = samples
            .get(&format!("divvy_tls_cert_expiry_seconds{{port=\"{port}\"}}"))
            .copied();
        assert!(expiry.is_some_and(|s| s > 0.0), "{port}: {expiry:?}");
    }
    // Plain HTTP to the HTTPS port gets no HTTP answer.
    let plain = tokio::task::spawn_blocking(move || plain_http(server.http))
        .await
        .unwrap();
    assert!(!plain.starts_with("HTTP/"), "{plain:?}");
}

/// What a plaintext GET /healthz to `addr` reads back (lossy UTF-8).
fn plain_http(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw).into_owned()
}

/// Runs `divvy serve` with `flags`, expecting it to exit within 30 s: its
/// exit status and stderr.
fn start_fails(files: &Files, flags: &[String]) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let mut child = Command::new(common::binary())
        .arg("serve")
        .arg("--config")
        .arg(&files.policy)
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0"])
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("divvy {flags:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

#[test]
fn bad_files_at_start_are_an_error_naming_the_file() {
    let ca = Ca::new("divvy test ca");
    let files = Files::new(&ca.server(1));
    let garbage = files.put("garbage.crt", "not a certificate\n");
    let other_key = files.put("other.key", &ca.server(2).key);
    let cases = [
        (
            "--grpc-tls-cert",
            garbage.clone(),
            "--grpc-tls-key",
            s(&files.key),
        ),
        (
            "--grpc-tls-cert",
            s(&files.cert),
            "--grpc-tls-key",
            other_key.clone(),
        ),
        (
            "--http-tls-cert",
            garbage.clone(),
            "--http-tls-key",
            s(&files.key),
        ),
        (
            "--grpc-tls-cert",
            s(&files.cert),
            "--grpc-tls-key",
            s(&files.path("absent.key")),
        ),
    ];
    for (cert_flag, cert, key_flag, key) in cases {
        let named = if cert == s(&files.cert) { &key } else { &cert };
        let flags = [cert_flag.into(), cert.clone(), key_flag.into(), key.clone()];
        let (status, stderr) = start_fails(&files, &flags);
        assert!(!status.success(), "{flags:?} started");
        assert!(stderr.contains(named.as_str()), "{flags:?}: {stderr}");
    }
    let (status, stderr) = start_fails(&files, &["--grpc-tls-cert".into(), s(&files.cert)]);
    assert!(!status.success());
    assert!(stderr.contains("--grpc-tls-key"), "{stderr}");
}

#[test]
fn envoy_calls_divvy_over_mutual_tls_and_fails_closed_with_a_stranger_certificate() {
    let ca = Ca::new("divvy test ca");
    let other = Ca::new("another ca");
    let files = Files::new(&ca.server(1));
    let dir = files.dir.path();
    files.put("ca.crt", &ca.pem);
    let spiffe = "spiffe://cluster.local/ns/edge/sa/envoy";
    ca.issue(&[San::Uri(spiffe)], 2).write(dir, "envoy");
    other.issue(&[San::Uri(spiffe)], 3).write(dir, "stranger");
    let mut flags = files.grpc_flags();
    flags.extend([
        "--grpc-tls-client-ca".into(),
        s(&files.path("ca.crt")),
        "--grpc-tls-client-san".into(),
        spiffe.into(),
    ]);
    let service = start(&files, &flags, &[]);
    let upstream = common::envoy::upstream("hello\n");
    // Envoy with two fail-closed listeners asking divvy over mutual TLS:
    // `good` through the cluster with the right client certificate (and
    // checking divvy's name), `stranger` through one whose client
    // certificate comes from another CA.
    let ca_crt = dir.join("ca.crt");
    let (envoy_crt, envoy_key) = (dir.join("envoy.crt"), dir.join("envoy.key"));
    let (stranger_crt, stranger_key) = (dir.join("stranger.crt"), dir.join("stranger.key"));
    let envoy = Bootstrap::new("edge", "reports", "2s")
        .listener("good", "divvy")
        .listener("stranger", "divvy_stranger")
        .divvy(
            "divvy",
            Some(UpstreamTls {
                cert: &envoy_crt,
                key: &envoy_key,
                ca: &ca_crt,
                san: Some("localhost"),
            }),
        )
        .divvy(
            "divvy_stranger",
            Some(UpstreamTls {
                cert: &stranger_crt,
                key: &stranger_key,
                ca: &ca_crt,
                san: None,
            }),
        )
        .start(service.grpc.port(), upstream);

    let get = |port: u16| {
        common::envoy::get(port, "/reports", &[])
            .expect("an answer")
            .0
    };
    let statuses: Vec<u16> = (0..3).map(|_| get(envoy.ports[0])).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    // divvy refuses the handshake; Envoy's call fails and it fails closed.
    assert_eq!(get(envoy.ports[1]), 500);
    let failures = service.metric_samples();
    let refused: f64 = failures
        .iter()
        .filter(|(k, _)| k.starts_with("divvy_tls_handshake_failures_total{port=\"grpc\""))
        .map(|(_, v)| v)
        .sum();
    assert!(refused >= 1.0, "{failures:?}");
}
