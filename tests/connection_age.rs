//! Connection age: at a gRPC connection's age (±10%) divvy sends GOAWAY,
//! lets the calls in flight finish within the grace, then closes it. A
//! client holding one HTTP/2 connection loses no call, and Envoy in front
//! reconnects and keeps getting answers.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::envoy::{get, upstream, Bootstrap};
use common::{desc, metric_samples_at, request, Server};

/// Every ShouldRateLimit is answered: no rule limits it.
const POLICY: &str = "default: {label: unlimited, creditLimit: 1, resetSeconds: 0}\n";

/// The flags of the tests: a 2 s age (1.8 s to 2.2 s with the jitter), 1 s grace.
const AGE_FLAGS: [&str; 4] = [
    "--grpc-max-connection-age",
    "2s",
    "--grpc-max-connection-age-grace",
    "1s",
];

/// When the client may see the GOAWAY, from its connect: the age ±10%
/// (1.8 s to 2.2 s), plus up to 1.1 s for a loaded machine's scheduling
/// (timers, the client's next call noticing it).
const GOAWAY_WINDOW: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1800)..=Duration::from_millis(3300);

/// A ShouldRateLimit request as a gRPC message: uncompressed flag, length, bytes.
fn grpc_body() -> Bytes {
    let message = prost::Message::encode_to_vec(&request("edge", vec![desc(&[("k", "v")])]));
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&message);
    Bytes::from(body)
}

/// One HTTP/2 connection (the `h2` crate, no tonic: nothing reconnects
/// behind the test's back) and the task driving it, which ends when the
/// connection closes and says when.
async fn connect(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Instant>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let closed = tokio::spawn(async move {
        let _ = connection.await;
        Instant::now()
    });
    (send, closed)
}

/// How a call ended.
enum Call {
    /// Answered on the stream of this id, with this grpc-status.
    Answered(u32, String),
    /// Refused before its stream was opened: the connection is going away.
    NotStarted(h2::Error),
    /// The stream of this id was opened and then failed.
    Failed(u32, h2::Error),
}

/// One unary ShouldRateLimit on `send`.
async fn call(send: h2::client::SendRequest<Bytes>) -> Call {
    let mut send = match send.ready().await {
        Ok(s) => s,
        Err(e) => return Call::NotStarted(e),
    };
    let request = http::Request::post(
        "http://divvy/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut stream) = match send.send_request(request, false) {
        Ok(r) => r,
        Err(e) => return Call::NotStarted(e),
    };
    let id = u32::from(response.stream_id());
    let answer = async move {
        stream.send_data(grpc_body(), true)?;
        let (head, mut body) = response.await?.into_parts();
        while let Some(chunk) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk?.len());
        }
        let trailers = body.trailers().await?;
        let status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| head.headers.get("grpc-status"))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        Ok::<_, h2::Error>(status.unwrap_or_default())
    };
    match answer.await {
        Ok(status) => Call::Answered(id, status),
        Err(e) => Call::Failed(id, e),
    }
}

/// What a client calling continuously on one connection saw.
#[derive(Default)]
struct Seen {
    /// When the first call was refused for a GOAWAY, from the connect.
    goaway: Option<Duration>,
    /// Calls answered with grpc-status 0.
    ok: usize,
    /// The highest stream id answered with grpc-status 0.
    last_ok: u32,
    /// Calls whose stream was opened and that did not end with grpc-status 0:
    /// stream id, what happened, whether the GOAWAY (NO_ERROR) failed it.
    failed: Vec<(u32, String, bool)>,
}

impl Seen {
    /// The calls the server lost. A stream the server never processed is
    /// not lost: the final GOAWAY names the last stream processed, and the
    /// client fails the streams above it, which may be retried elsewhere
    /// (RFC 9113, 6.8). The `h2` client sends its PING answer ahead of the
    /// requests it has queued, so a request or two can arrive after the
    /// final GOAWAY. Lost, then, is a stream failed otherwise, or one below
    /// a stream answered.
    fn lost(&self) -> Vec<&(u32, String, bool)> {
        self.failed
            .iter()
            .filter(|(id, _, by_goaway)| !by_goaway || *id < self.last_ok)
            .collect()
    }
}

/// `workers` calls at a time on one connection to `addr`, each followed at
/// once by the next, until the connection refuses one for a GOAWAY (or
/// `limit` passes); then waits for the connection to close. Returns what
/// was seen and when the connection closed, from the connect.
async fn call_until_goaway(addr: SocketAddr, workers: usize, limit: Duration) -> (Seen, Duration) {
    let start = Instant::now();
    let (send, closed) = connect(addr).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (send, seen) = (send.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < limit {
                let outcome = call(send.clone()).await;
                let mut seen = seen.lock().unwrap();
                match outcome {
                    Call::Answered(id, s) if s == "0" => {
                        seen.ok += 1;
                        seen.last_ok = seen.last_ok.max(id);
                    }
                    Call::Answered(id, s) => {
                        seen.failed.push((id, format!("grpc-status {s}"), false))
                    }
                    Call::Failed(id, e) => {
                        let by_goaway = e.is_go_away()
                            && e.is_remote()
                            && e.reason() == Some(h2::Reason::NO_ERROR);
                        seen.failed.push((id, e.to_string(), by_goaway));
                    }
                    Call::NotStarted(e) => {
                        assert!(e.is_go_away(), "refused, not for a GOAWAY: {e}");
                        seen.goaway.get_or_insert(start.elapsed());
                        return;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(send);
    let closed = tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the connection closes")
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (seen, closed - start)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gets_goaway_at_its_age_and_loses_no_call() {
    let server = Server::with_policy_args(POLICY, "yaml", &AGE_FLAGS);
    let (seen, closed) = call_until_goaway(server.grpc, 8, Duration::from_secs(6)).await;
    let goaway = seen.goaway.expect("a GOAWAY within 6 s");
    println!(
        "GOAWAY after {goaway:?}, connection closed after {closed:?}, {} calls answered, \
         {} not processed (above the GOAWAY's last stream)",
        seen.ok,
        seen.failed.len()
    );
    assert!(GOAWAY_WINDOW.contains(&goaway), "GOAWAY after {goaway:?}");
    assert!(seen.lost().is_empty(), "calls lost: {:?}", seen.lost());
    assert!(
        seen.failed.len() <= 8,
        "more calls failed than were in flight: {:?}",
        seen.failed
    );
    assert!(seen.ok > 50, "only {} calls answered", seen.ok);
    // The calls in flight were done at once: no need for the grace.
    assert!(
        closed < goaway + Duration::from_millis(900),
        "closed after {closed:?}"
    );
    let aged = metric_samples_at(server.http)["divvy_grpc_connections_aged_total"];
    assert!(aged >= 1.0, "divvy_grpc_connections_aged_total {aged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_outlives_the_grace_is_cut_off() {
    let server = Server::with_policy_args(POLICY, "yaml", &AGE_FLAGS);
    let start = Instant::now();
    let (send, closed) = connect(server.grpc).await;
    // A call whose request never ends: it is in flight until the grace ends.
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(
        "http://divvy/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    )
    .header("content-type", "application/grpc")
    .body(())
    .unwrap();
    let (_response, _stream) = send.send_request(request, false).unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("closed within 10 s")
        .unwrap()
        - start;
    println!("a stalled call's connection closed after {closed:?}");
    // Age (1.8 s to 2.2 s) plus grace (1 s), plus scheduling slack.
    assert!(
        (Duration::from_millis(2700)..=Duration::from_millis(4300)).contains(&closed),
        "closed after {closed:?}"
    );
}

/// The binary as envoyproxy/ratelimit's `/bin/ratelimit`, with only `envs`
/// and a configuration directory in that project's file form.
fn as_ratelimit(dir: &std::path::Path, envs: &[(&str, &str)]) -> Command {
    let root = dir.join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100000}\n",
    )
    .unwrap();
    let mut command = common::as_ratelimit(dir);
    command.envs(common::RATELIMIT_ON_LOOPBACK).envs([
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ]);
    command.envs(envs.iter().copied());
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_mode_honours_grpc_max_connection_age() {
    let dir = tempfile::tempdir().unwrap();
    let command = as_ratelimit(dir.path(), &[("GRPC_MAX_CONNECTION_AGE", "2s")]);
    let server = Server::spawn(command);
    let (seen, _) = call_until_goaway(server.grpc, 2, Duration::from_secs(6)).await;
    let goaway = seen.goaway.expect("a GOAWAY within 6 s");
    println!("ratelimit mode: GOAWAY after {goaway:?}");
    assert!(GOAWAY_WINDOW.contains(&goaway), "GOAWAY after {goaway:?}");
    assert!(seen.lost().is_empty(), "calls lost: {:?}", seen.lost());
}

#[test]
fn ratelimit_mode_refuses_an_age_that_is_no_duration() {
    let dir = tempfile::tempdir().unwrap();
    let out = as_ratelimit(dir.path(), &[("GRPC_MAX_CONNECTION_AGE", "soon")])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("GRPC_MAX_CONNECTION_AGE=soon"), "{stderr}");
}

#[test]
fn envoy_reconnects_and_keeps_getting_answers() {
    let policy = "overrides:\n  - {label: aged, domain: edge, operation: {generic_key: aged}, creditLimit: 50, resetSeconds: 1}\n"
        .to_owned()
        + POLICY;
    let service = Server::with_policy_args(&policy, "yaml", &AGE_FLAGS);
    let upstream = upstream("hello\n");
    // Envoy's rate-limit filter with failure_mode_deny: a call that fails
    // shows as a 500. A reset or refused stream fails at once, whatever the
    // timeout; the timeout is 250 ms rather than Envoy's 20 ms, which a
    // loaded test machine misses now and then with or without a connection
    // age.
    let envoy = Bootstrap::new("edge", "aged", "0.25s")
        .listener("ingress", "divvy")
        .divvy("divvy", None)
        .start(service.grpc.port(), upstream);
    // Several requests at a time, so that calls are in flight whenever a
    // connection goes away.
    let port = envoy.ports[0];
    let start = Instant::now();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut allowed, mut limited, mut other) = (0, 0, Vec::new());
                while start.elapsed() < Duration::from_secs(7) {
                    let (status, _, _) = get(port, "/", &[]).expect("an answer");
                    match status {
                        200 => allowed += 1,
                        429 => limited += 1,
                        _ => other.push((status, start.elapsed())),
                    }
                }
                (allowed, limited, other)
            })
        })
        .collect();
    let (mut allowed, mut limited, mut other) = (0, 0, Vec::new());
    for c in clients {
        let (a, l, o) = c.join().expect("a client");
        allowed += a;
        limited += l;
        other.extend(o);
    }
    let (_, _, stats) = get(
        envoy.admin,
        "/stats?filter=ratelimit|cluster.divvy.upstream_(cx|rq)",
        &[],
    )
    .expect("Envoy's stats");
    let stats: Vec<&str> = stats.lines().filter(|l| !l.ends_with(": 0")).collect();
    println!("Envoy's stats: {stats:#?}");
    assert!(
        other.is_empty(),
        "statuses other than 200 and 429 (and when): {other:?}"
    );
    let aged = metric_samples_at(service.http)["divvy_grpc_connections_aged_total"];
    println!(
        "through Envoy for 7 s: {allowed} allowed, {limited} limited, {aged} connections aged"
    );
    assert!(allowed > 0);
    // Envoy's connection went away at about 2 s and 4 s (and 6 s): it
    // reconnected each time (and counted each close it made on the GOAWAY
    // as upstream_cx_protocol_error: "closed while dispatching frames",
    // with no request reset).
    assert!(aged >= 2.0, "divvy_grpc_connections_aged_total {aged}");
    let opened: f64 = stats
        .iter()
        .find_map(|l| l.strip_prefix("cluster.divvy.upstream_cx_total: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("upstream_cx_total in {stats:?}"));
    assert!(opened >= 3.0, "Envoy opened {opened} connections to divvy");
}
