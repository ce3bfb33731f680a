//! OTLP tracing joined to Envoy's trace: a real Envoy with its
//! OpenTelemetry tracer in front of the real divvy binary (counters in a
//! real redis-server), both exporting to an OTLP/gRPC receiver built here on
//! the official `opentelemetry-proto` definitions. divvy's spans must sit
//! in Envoy's trace under the span of Envoy's rate-limit call; with the
//! receiver gone, decisions go on and the dropped spans are counted. A
//! second test sends spans over OTLP/HTTP from a call that carries its own
//! `traceparent`.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::envoy;
use common::redis::Redis;
use common::Server;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One span as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    resource: BTreeMap<String, String>,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: BTreeMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Got>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every span of `request`, with its resource's `service.name`.
fn collect(spans: &Spans, request: ExportTraceServiceRequest) {
    let mut got = spans.lock().unwrap();
    for rs in request.resource_spans {
        let resource: BTreeMap<String, String> = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|kv| {
                let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                (kv.key.clone(), value_text(v))
            })
            .collect();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
            let attributes = span
                .attributes
                .iter()
                .map(|kv| {
                    let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                    (kv.key.clone(), value_text(v))
                })
                .collect();
            got.push(Got {
                service: service.clone(),
                resource: resource.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent: hex(&span.parent_span_id),
                attributes,
            });
        }
    }
}

fn value_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| value_text(v.value.as_ref()))
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    }
}

/// The OTLP/gRPC trace service: keeps what it is sent.
struct Collector(Spans);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        collect(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver on a free loopback port, until `stop`.
struct GrpcReceiver {
    port: u16,
    spans: Spans,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl GrpcReceiver {
    fn start(rt: &tokio::runtime::Runtime) -> GrpcReceiver {
        let _in_runtime = rt.enter();
        let spans = Spans::default();
        let std_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = TraceServiceServer::new(Collector(spans.clone()));
        let task = rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        GrpcReceiver {
            port,
            spans,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops serving and closes the port.
    fn stop(&mut self, rt: &tokio::runtime::Runtime) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ =
                rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await });
        }
    }
}

/// Waits up to 30 s for the spans `done` accepts.
fn wait_for(spans: &Spans, what: &str, done: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = spans.lock().unwrap().clone();
        if done(&now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within 30 s; spans: {now:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

const POLICY: &str = "overrides:
  - label: traced-rule
    domain: edge
    operation: {generic_key: traced}
    creditLimit: 1000
    resetSeconds: 1m
default: {label: unlimited, creditLimit: 1, resetSeconds: 0}
";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn dropped(server: &Server) -> f64 {
    server
        .metric_samples()
        .iter()
        .filter(|(k, _)| k.starts_with("divvy_trace_spans_dropped_total"))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn divvy_spans_join_envoys_trace_and_drops_are_counted_when_the_receiver_is_down() {
    let rt = runtime();
    let mut receiver = GrpcReceiver::start(&rt);
    let redis = Redis::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let service = Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--redis-url",
            &redis.url(),
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "grpc",
            "--otlp-schedule-delay-ms",
            "100",
            "--otlp-export-timeout-ms",
            "1000",
            "--otlp-max-queue-size",
            "8",
        ],
    );
    let upstream = envoy::upstream("hello\n");
    // Envoy traces every request to the receiver and asks divvy about
    // `generic_key=traced` in domain `edge` before the upstream.
    let proxy = envoy::Bootstrap::new("edge", "traced", "2s")
        .listener("ingress", "divvy")
        .divvy("divvy", None)
        .tracing(receiver.port)
        .start(service.grpc.port(), upstream);
    let (status, _, body) = envoy::get(proxy.ports[0], "/hello", &[]).expect("an answer");
    assert_eq!((status, body.as_str()), (200, "hello\n"));

    // divvy's call span, its decision and its Redis call; Envoy's span of
    // the rate-limit call (the one whose id divvy's call names as parent).
    let spans = wait_for(&receiver.spans, "divvy and Envoy spans", |s| {
        let call = s
            .iter()
            .find(|g| g.service == "divvy" && g.name.ends_with("ShouldRateLimit"));
        call.is_some_and(|c| {
            s.iter()
                .any(|g| g.service == "envoy" && g.span_id == c.parent)
        }) && s.iter().any(|g| g.name == "EVALSHA")
    });
    assert_joined(&spans);

    receiver.stop(&rt);
    assert_drops_counted(&service, proxy.ports[0]);
    drop(redis);
}

/// divvy's ShouldRateLimit span sits under Envoy's rate-limit call span
/// (itself under Envoy's request span), with the call's attributes, its
/// decision span as a child, and the Redis call's span under that.
fn assert_joined(spans: &[Got]) {
    let call = spans
        .iter()
        .find(|g| g.service == "divvy" && g.name.ends_with("ShouldRateLimit"))
        .unwrap();
    let envoy_rl = spans
        .iter()
        .find(|g| g.service == "envoy" && g.span_id == call.parent)
        .unwrap();
    assert_eq!(
        call.trace_id, envoy_rl.trace_id,
        "divvy's span is in Envoy's trace"
    );
    assert!(
        envoy_rl.name.contains("RateLimitService.ShouldRateLimit"),
        "the parent is Envoy's rate-limit call: {envoy_rl:#?}"
    );
    // Envoy's rate-limit call sits under Envoy's request span.
    assert!(spans.iter().any(|g| g.service == "envoy"
        && g.span_id == envoy_rl.parent
        && g.trace_id == call.trace_id));
    assert_eq!(
        call.attributes.get("divvy.domain").map(String::as_str),
        Some("edge")
    );
    assert_eq!(
        call.attributes.get("divvy.code").map(String::as_str),
        Some("OK")
    );
    assert_eq!(
        call.attributes.get("divvy.rule_labels").map(String::as_str),
        Some("traced-rule")
    );
    let decide = spans
        .iter()
        .find(|g| g.name == "divvy.decide" && g.parent == call.span_id)
        .expect("the decision span, a child of the call's");
    let store = spans
        .iter()
        .find(|g| g.name == "EVALSHA" && g.parent == decide.span_id)
        .expect("the Redis call's span, a child of the decision's");
    assert_eq!(store.trace_id, call.trace_id);
    assert_eq!(
        store.attributes.get("db.system").map(String::as_str),
        Some("redis")
    );
    assert!(store.attributes.contains_key("divvy.batch.requests"));
    assert!(store.attributes.contains_key("db.redis.slot"));
}

/// With the receiver gone: requests through Envoy port `port` are still
/// decided and answered, and divvy counts the spans it could not export.
fn assert_drops_counted(service: &Server, port: u16) {
    let before = dropped(service);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for _ in 0..10 {
            let (status, _, _) = envoy::get(port, "/hello", &[]).expect("an answer");
            assert_eq!(status, 200, "decisions go on without the receiver");
        }
        if dropped(service) > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no span counted as dropped within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf bodies) on a free
/// loopback port, on threads of its own.
fn http_receiver() -> (u16, Spans) {
    let spans = Spans::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let kept = spans.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let spans = kept.clone();
            std::thread::spawn(move || serve_http(conn, &spans));
        }
    });
    (port, spans)
}

/// One connection's requests: each body decoded as an export request.
fn serve_http(conn: std::net::TcpStream, spans: &Spans) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut length = 0usize;
        let mut path = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if path.is_empty() {
                path = line.split(' ').nth(1).unwrap_or_default().to_owned();
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        assert_eq!(path, "/v1/traces");
        collect(
            spans,
            ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP body"),
        );
        let answer = ExportTraceServiceResponse::default().encode_to_vec();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if conn.write_all(head.as_bytes()).is_err() || conn.write_all(&answer).is_err() {
            return;
        }
    }
}

/// One `ShouldRateLimit` call to `server` about `generic_key=traced` in
/// domain `edge`, carrying `traceparent`; its overall code.
fn call_with_traceparent(server: &Server, traceparent: &str) -> i32 {
    runtime().block_on(async {
        let mut client = server.client().await;
        let mut request = tonic::Request::new(common::request(
            "edge",
            vec![common::desc(&[("generic_key", "traced")])],
        ));
        let value = traceparent.parse().expect("an ASCII header value");
        request.metadata_mut().insert("traceparent", value);
        let answer = client.should_rate_limit(request).await.expect("decided");
        answer.into_inner().overall_code
    })
}

#[test]
fn otlp_http_spans_name_the_callers_traceparent_and_malformed_ones_start_a_trace() {
    let (port, spans) = http_receiver();
    let service = Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{port}"),
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-schedule-delay-ms",
            "100",
            "--otlp-service-name",
            "divvy-http",
        ],
    );
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    // First a call its caller did not sample: no span of its trace may
    // come, though the spans of the later calls (queued after it) do.
    let unsampled = "11111111111111111111111111111111";
    let traceparents = [
        format!("00-{unsampled}-{parent}-00"),
        format!("00-{trace}-{parent}-01"),
        "00-garbage-01".to_owned(),
    ];
    for traceparent in traceparents {
        assert_eq!(call_with_traceparent(&service, &traceparent), 1, "OK");
    }
    let got = wait_for(&spans, "two call spans over OTLP/HTTP", |s| {
        s.iter()
            .filter(|g| g.name.ends_with("ShouldRateLimit"))
            .count()
            == 2
    });
    let calls: Vec<&Got> = got
        .iter()
        .filter(|g| g.name.ends_with("ShouldRateLimit"))
        .collect();
    assert!(calls.iter().all(|c| c.service == "divvy-http"));
    assert!(got.iter().all(|g| g.trace_id != unsampled), "{got:#?}");
    let joined = calls
        .iter()
        .find(|c| c.trace_id == trace)
        .expect("the caller's trace");
    assert_eq!(joined.parent, parent);
    let fresh = calls
        .iter()
        .find(|c| c.trace_id != trace)
        .expect("a trace of its own");
    assert_eq!(fresh.parent, "", "a malformed traceparent names no parent");
    assert!(got
        .iter()
        .any(|g| g.name == "divvy.decide" && g.parent == joined.span_id));
}

#[test]
fn line_protocol_hits_are_traced_only_under_a_ratio_sampler() {
    let (port, spans) = http_receiver();
    let endpoint = format!("http://127.0.0.1:{port}");
    let start = |sampler: &[&str]| {
        let mut args = vec![
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-schedule-delay-ms",
            "100",
        ];
        args.extend_from_slice(sampler);
        Server::with_policy_args(POLICY, "yaml", &args)
    };
    // The default sampler follows callers; a HIT has none: not traced.
    let mut untraced = start(&[]);
    assert!(untraced.line_exchange(b"HIT k=v\n").starts_with("OK true"));
    untraced.terminate();
    let traced = start(&["--otlp-sampler", "traceidratio", "--otlp-sampler-arg", "1"]);
    assert!(traced
        .line_exchange(b"HIT k=v\nHIT k=w\n")
        .starts_with("OK true"));
    let got = wait_for(&spans, "a line-protocol span", |s| {
        s.iter().any(|g| g.name == "divvy.line/HIT")
    });
    let lines: Vec<&Got> = got.iter().filter(|g| g.name == "divvy.line/HIT").collect();
    assert_eq!(
        lines.len(),
        1,
        "one span, from the ratio-sampled server: {got:#?}"
    );
    assert_eq!(
        lines[0].attributes.get("divvy.hits").map(String::as_str),
        Some("2")
    );
    assert!(got
        .iter()
        .any(|g| g.name == "divvy.decide" && g.parent == lines[0].span_id));
}

#[test]
fn ratelimit_mode_traces_with_envoyproxy_ratelimits_variables() {
    let (port, spans) = http_receiver();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let file = "domain: edge
descriptors:
  - key: generic_key
    value: traced
    rate_limit: {unit: minute, requests_per_unit: 100}
";
    std::fs::write(config.join("edge.yaml"), file).unwrap();
    let endpoint = format!("127.0.0.1:{port}");
    let mut command = common::as_ratelimit(dir.path());
    command.envs(common::RATELIMIT_ON_LOOPBACK).envs([
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "http"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("TRACING_SERVICE_NAME", "rl-under-test"),
        ("TRACING_SERVICE_NAMESPACE", "gateway"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-7"),
        ("TRACING_SAMPLING_RATE", "1"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ]);
    let server = Server::spawn(command);
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let parent = "b7ad6b7169203331";
    let code = call_with_traceparent(&server, &format!("00-{trace}-{parent}-01"));
    assert_eq!(code, 1, "OK");
    let got = wait_for(&spans, "the ratelimit-mode call span", |s| {
        s.iter().any(|g| g.name.ends_with("ShouldRateLimit"))
    });
    let call = got
        .iter()
        .find(|g| g.name.ends_with("ShouldRateLimit"))
        .unwrap();
    assert_eq!(
        (call.trace_id.as_str(), call.parent.as_str()),
        (trace, parent)
    );
    assert_eq!(call.service, "rl-under-test");
    assert_eq!(
        call.resource.get("service.namespace").map(String::as_str),
        Some("gateway")
    );
    assert_eq!(
        call.resource.get("service.instance.id").map(String::as_str),
        Some("pod-7")
    );
    assert_eq!(
        call.attributes.get("divvy.engine").map(String::as_str),
        Some("envoy_ratelimit")
    );
}
