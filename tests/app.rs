//! The service started in the test's own process through `divvy::app`:
//! `App::build` from `Settings`, `App::serve` until a shutdown future
//! completes. A ShouldRateLimit and a line-protocol HIT are answered, and
//! shutdown drains and returns.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use divvy::app::{App, Settings};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const POLICY: &str = "overrides:\n  - operation: {k: v}\n    creditLimit: 2\n    resetSeconds: 60\ndefault: {creditLimit: 100, resetSeconds: 60}\n";

/// One line-protocol exchange on a fresh connection.
async fn hit(addr: SocketAddr, line: &str) -> String {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (read, mut write) = stream.into_split();
    write.write_all(line.as_bytes()).await.expect("send");
    let mut answer = String::new();
    BufReader::new(read)
        .read_line(&mut answer)
        .await
        .expect("answer");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_in_process_and_answers_both_protocols() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).expect("policy");
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = Settings {
        config: Some(path),
        grpc_addr: loopback,
        line_addr: loopback,
        http_addr: loopback,
        ..Settings::default()
    };
    let app = App::build(settings).await.expect("the service builds");
    let (grpc, line) = (app.grpc_addr(), app.line_addr());
    assert_ne!(grpc.port(), 0, "the bound port is reported");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(app.serve(async move {
        let _ = stopped.await;
    }));

    assert_eq!(hit(line, "HIT k=v\n").await, "OK true 1 60\n");
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://{grpc}"),
    )
    .await
    .expect("gRPC connects");
    let request = common::request("edge", vec![common::desc(&[("k", "v")])]);
    let answer = client.should_rate_limit(request).await.expect("answered");
    assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
    // The counter is the line protocol's too: the third hit is over.
    assert!(hit(line, "HIT k=v\n").await.starts_with("OK false 0 "));

    stop.send(()).expect("the server waits for the shutdown");
    let result = tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("shutdown within 20 s")
        .expect("the task ran");
    assert!(result.is_ok(), "{:?}", result.err());
    assert!(
        tokio::net::TcpStream::connect(line).await.is_err(),
        "the line listener is closed"
    );
}

/// A plain HTTP/1.1 GET of `path`: the answer.
async fn get(addr: SocketAddr, path: &str) -> String {
    exchange(addr, &format!("GET {path} HTTP/1.1\r\n")).await
}

/// One HTTP/1.1 request (`head`: its request line, and any headers and
/// body after a blank line) on a fresh connection: the whole answer.
async fn exchange(addr: SocketAddr, head: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = match head.split_once("\r\n\r\n") {
        Some((start, body)) => format!(
            "{start}\r\nHost: divvy\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
        None => format!("{head}Host: divvy\r\nConnection: close\r\n\r\n"),
    };
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
        .await
        .expect("answer");
    answer
}

/// The value of the sample `series` (name and labels, as exposed) in a
/// Prometheus exposition, 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// No registry is global: two services in one process each count (and
/// serve on `/metrics`) their own decisions only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_in_one_process_keep_their_own_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(
        &path,
        "overrides:\n  - label: mine\n    operation: {k: v}\n    creditLimit: 9\n    resetSeconds: 60\ndefault: {creditLimit: 100, resetSeconds: 60}\n",
    )
    .expect("policy");
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let settings = Settings {
            config: Some(path.clone()),
            grpc_addr: loopback,
            line_addr: loopback,
            http_addr: loopback,
            ..Settings::default()
        };
        apps.push(App::build(settings).await.expect("the service builds"));
    }
    let (mut stops, mut addrs) = (Vec::new(), Vec::new());
    for app in apps {
        addrs.push((app.line_addr(), app.http_addr()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        tokio::spawn(app.serve(async move {
            let _ = stopped.await;
        }));
    }
    for _ in 0..3 {
        assert!(hit(addrs[0].0, "HIT k=v\n").await.starts_with("OK true "));
    }
    assert!(hit(addrs[1].0, "HIT k=v\n").await.starts_with("OK true "));
    // The admin API's own counting (a malformed `POST /json`) goes to its
    // service's registry too.
    let refused = exchange(
        addrs[0].1,
        "POST /json HTTP/1.1\r\nContent-Type: application/json\r\n\r\n[",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let invalid = "divvy_errors_total{code=\"invalid-argument\"}";
    let accepted = "divvy_hits_total{rule_label=\"mine\",status=\"accepted\"}";
    let first = get(addrs[0].1, "/metrics").await;
    let second = get(addrs[1].1, "/metrics").await;
    assert_eq!(sample(&first, accepted), 3.0, "{first}");
    assert_eq!(sample(&second, accepted), 1.0, "{second}");
    assert_eq!(sample(&first, invalid), 1.0, "{first}");
    assert_eq!(sample(&second, invalid), 0.0, "{second}");
    for stop in stops {
        let _ = stop.send(());
    }
}
