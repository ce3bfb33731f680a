//! gRPC's maximum through h2load (nghttp2-client): one run, its counts
//! and its per-call latency log.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::generators::grpc::{grpc_body, grpc_request, grpc_url};
use crate::stats::figures::Figures;

/// One h2load run against `addr` for `run`: `clients` HTTP/2 connections,
/// at most `streams` calls in flight on each, every call the request of
/// [`grpc_request`]`(0)`, as fast as answers come. Latency is h2load's,
/// from sending a call to the end of its answer, read from its per-call
/// log. h2load sees HTTP statuses only: the caller checks the gRPC answer
/// to this request before and after its runs.
///
/// Paced load does not use h2load: its `--rps` timer fires at most every
/// 10 ms and sends every call then due at once, so at 18,000 calls/s over
/// 16 connections about 180 calls came every 10 ms and the p50 was the
/// time a server took to drain them (one connection per 100 calls/s ticked
/// in phase, the same bursts; `--timing-script-file` fell behind its
/// schedule). [`grpc_paced`] keeps a 100 µs schedule instead.
pub async fn h2load_grpc(addr: SocketAddr, run: Duration, clients: u64, streams: u64) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let body = dir.path().join("body");
    let log = dir.path().join("log");
    std::fs::write(&body, grpc_body(&grpc_request(0))).expect("body");
    let output = Command::new("h2load")
        .arg(format!("--clients={clients}"))
        .arg(format!("--max-concurrent-streams={streams}"))
        .arg(format!("--duration={}ms", run.as_millis().max(1)))
        .arg(format!("--data={}", body.display()))
        .arg(format!("--log-file={}", log.display()))
        .args([
            "--header=content-type: application/grpc",
            "--header=te: trailers",
        ])
        .arg(grpc_url(addr))
        .stdin(Stdio::null())
        .output()
        .expect("run h2load");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "h2load failed:\n{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let succeeded = succeeded_calls(&text);
    let latencies = logged_latencies(&log, succeeded);
    Figures {
        requests: succeeded,
        elapsed: run,
        latencies,
        ..Figures::default()
    }
}

/// The calls h2load's output `text` says succeeded; none may have failed
/// or errored.
fn succeeded_calls(text: &str) -> u64 {
    // "requests: 137039 total, 137039 started, 137039 done, 137039 succeeded, 0 failed, 0 errored, 0 timeout"
    let counts = text
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .unwrap_or_else(|| panic!("no request counts in h2load's output:\n{text}"));
    let count = |what: &str| -> u64 {
        counts
            .split(", ")
            .find_map(|part| part.strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{what}` in h2load's `{counts}`"))
    };
    let (succeeded, failed, errored) = (count(" succeeded"), count(" failed"), count(" errored"));
    // Calls still in flight when the run ends are counted nowhere.
    assert!(failed == 0 && errored == 0, "h2load: {counts}\n{text}");
    succeeded
}

/// The latency of every call with a 2xx status in h2load's per-call `log`
/// (tab-separated: start, status, microseconds); room for `calls`.
fn logged_latencies(log: &Path, calls: u64) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(calls as usize);
    for row in std::fs::read_to_string(log).expect("h2load log").lines() {
        let mut cols = row.split('\t');
        let (_, status, micros) = (cols.next(), cols.next(), cols.next());
        if status.is_some_and(|s| s.starts_with('2')) {
            if let Some(us) = micros.and_then(|m| m.trim().parse::<u64>().ok()) {
                latencies.push(Duration::from_micros(us));
            }
        }
    }
    latencies
}
