//! The paced (open-loop) gRPC generator: the `h2` crate's client without
//! tonic, on a schedule kept by a thread of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tokio::net::TcpStream;

use crate::generators::grpc::{grpc_body, grpc_request, grpc_url};
use crate::stats::figures::Figures;

/// How early the paced generator may send a call: the pacer thread sends
/// every call due within this much of its waking in one batch, so that it
/// wakes the runtime once per batch rather than once per call.
pub const PACE_QUANTUM: Duration = Duration::from_micros(100);

/// Actors the paced generator spreads its calls over (as [`grpc_request`]).
pub const PACED_ACTORS: u64 = 65_536;

/// One HTTP/2 connection of the paced generator: the `h2` crate's client
/// alone (no tonic, no tower buffer task between a call and its
/// connection), several times cheaper per call than a tonic client. Its
/// budget for small DATA frames received and not yet read (h2's guard
/// against a peer flooding them) is raised: every answer's message is one
/// small DATA frame before its trailers, and at 50% a connection can hold a
/// few hundred unread when the generator's core falls behind, which closed
/// a run's connection once with ENHANCE_YOUR_CALM.
pub async fn h2_connection(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (send, connection) = h2::client::Builder::new()
        .data_frame_budget(64 << 20)
        .handshake(stream)
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("paced gRPC generator: connection to {addr} failed: {e}");
        }
    });
    send
}

/// One unary ShouldRateLimit call over `send`: `body` (a [`grpc_body`]) to
/// `uri`; the answer's `overall_code`, or what went wrong (an HTTP or gRPC
/// status other than OK, a reset stream, an answer that does not decode).
pub async fn h2_call(
    send: h2::client::SendRequest<bytes::Bytes>,
    uri: http::Uri,
    body: bytes::Bytes,
) -> Result<i32, String> {
    let mut send = send.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    stream.send_data(body, true).map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    let (head, mut answer) = response.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("HTTP status {}", head.status));
    }
    let mut data = Vec::new();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        // Gives the window back; it fails only for a stream already gone,
        // whose next read reports that.
        let _ = answer.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = answer.trailers().await.map_err(|e| e.to_string())?;
    grpc_status_ok(&head.headers, trailers.as_ref())?;
    decode_answer(&data)
}

/// `Ok` if the answer's grpc-status is 0 (OK): it comes in the `trailers`,
/// or in the `headers` of a trailers-only answer. Else the status and
/// grpc-message.
fn grpc_status_ok(
    headers: &http::HeaderMap,
    trailers: Option<&http::HeaderMap>,
) -> Result<(), String> {
    let status = trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .map(|v| v.as_bytes().to_vec());
    if status.as_deref() != Some(b"0") {
        let message = trailers
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| headers.get("grpc-message"))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Err(format!(
            "grpc-status {:?}, grpc-message {message:?}",
            status.map(|s| String::from_utf8_lossy(&s).into_owned())
        ));
    }
    Ok(())
}

/// The `overall_code` of the answer whose body is `data`: one
/// uncompressed message, flag 0, then its big-endian length.
fn decode_answer(data: &[u8]) -> Result<i32, String> {
    let (frame, message) = data
        .split_at_checked(5)
        .ok_or("answer shorter than its frame header")?;
    let length = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]);
    if frame[0] != 0 || usize::try_from(length).ok() != Some(message.len()) {
        return Err(format!(
            "answer not one uncompressed message: flag {}, length {length} for {} bytes",
            frame[0],
            message.len()
        ));
    }
    let answer: RateLimitResponse =
        prost::Message::decode(message).map_err(|e| format!("answer: {e}"))?;
    Ok(answer.overall_code)
}

/// The bodies of the paced generator's calls: [`grpc_request`] of each of
/// [`PACED_ACTORS`] actors, as [`grpc_body`].
pub fn paced_bodies() -> Arc<Vec<bytes::Bytes>> {
    Arc::new(
        (0..PACED_ACTORS)
            .map(|i| bytes::Bytes::from(grpc_body(&grpc_request(i))))
            .collect(),
    )
}

/// Open-loop load: ShouldRateLimit calls at `rate` per second for `run`,
/// round robin over `channels` HTTP/2 connections (the `h2` crate's client,
/// see [`h2_connection`]) and over [`PACED_ACTORS`] actors, each sent at its
/// scheduled time whatever became of the earlier ones (no cap on calls in
/// flight). A thread of its own keeps the schedule (tokio's timer ticks in
/// whole milliseconds), handing the runtime every call due within the next
/// [`PACE_QUANTUM`] at once. Latency runs from the scheduled send time, or
/// from the actual one when that was earlier, to the end of the answer, so
/// a stall (of the server or of this generator) counts against every call
/// it delays: no coordinated omission. `lags` is how late each call
/// started. Every answer must be OK; calls unanswered 5 s after the run
/// are `lost`. `bodies` are [`paced_bodies`], built once per section.
pub async fn grpc_paced(
    addr: SocketAddr,
    run: Duration,
    rate: f64,
    channels: u64,
    bodies: Arc<Vec<bytes::Bytes>>,
) -> Figures {
    let mut conns = Vec::new();
    for _ in 0..channels {
        conns.push(h2_connection(addr).await);
    }
    let uri: http::Uri = grpc_url(addr).parse().expect("uri");
    let total = (run.as_secs_f64() * rate) as u64;
    let start = Instant::now() + Duration::from_millis(20);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<(u64, Instant)>>();
    let pacer = spawn_pacer(start, 1.0 / rate, total, tx);
    let mut calls = Vec::with_capacity(total as usize);
    while let Some(batch) = rx.recv().await {
        for (i, due) in batch {
            let send = conns[(i % channels) as usize].clone();
            let body = bodies[(i % PACED_ACTORS) as usize].clone();
            let uri = uri.clone();
            calls.push(tokio::spawn(async move {
                let now = Instant::now();
                let lag = now.saturating_duration_since(due);
                let from = due.min(now);
                let answer = h2_call(send, uri, body).await;
                (from.elapsed(), lag, answer)
            }));
        }
    }
    pacer.join().expect("pacer");
    collect_calls(calls, start + run + Duration::from_secs(5), run).await
}

/// A call of the paced generator: its latency, its send lag, its answer.
type PacedCall = tokio::task::JoinHandle<(Duration, Duration, Result<i32, String>)>;

/// The thread that keeps the paced generator's schedule: calls `0..total`,
/// call `i` due `interval * i` seconds after `start`, sent to `tx` in
/// batches of every call due within [`PACE_QUANTUM`] of waking.
fn spawn_pacer(
    start: Instant,
    interval: f64,
    total: u64,
    tx: tokio::sync::mpsc::UnboundedSender<Vec<(u64, Instant)>>,
) -> std::thread::JoinHandle<()> {
    let due = move |i: u64| start + Duration::from_secs_f64(interval * i as f64);
    std::thread::spawn(move || {
        let mut i = 0;
        while i < total {
            let now = Instant::now();
            if due(i) > now + PACE_QUANTUM {
                std::thread::sleep(due(i) - now - PACE_QUANTUM);
            }
            let until = Instant::now() + PACE_QUANTUM;
            let mut batch = Vec::new();
            while i < total && due(i) <= until {
                batch.push((i, due(i)));
                i += 1;
            }
            if tx.send(batch).is_err() {
                return;
            }
        }
    })
}

/// The figures of a paced run of length `run`: every call answered OK by
/// `grace`, and those still unanswered then `lost` (aborted).
async fn collect_calls(calls: Vec<PacedCall>, grace: Instant, run: Duration) -> Figures {
    let mut f = Figures {
        elapsed: run,
        ..Figures::default()
    };
    for mut call in calls {
        match tokio::time::timeout_at(grace.into(), &mut call).await {
            Ok(Ok((latency, lag, Ok(code)))) => {
                assert_eq!(code, Code::Ok as i32, "answer not OK");
                f.latencies.push(latency);
                f.lags.push(lag);
            }
            Ok(Ok((_, _, Err(e)))) => panic!("call: {e}"),
            Ok(Err(e)) => panic!("call task: {e}"),
            Err(_) => {
                call.abort();
                f.lost += 1;
            }
        }
    }
    f.requests = f.latencies.len() as u64;
    f
}
