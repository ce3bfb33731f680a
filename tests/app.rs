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
