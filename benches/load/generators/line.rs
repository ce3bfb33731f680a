//! Line-protocol load generators: pipelined, one in flight, paced, the
//! memory-per-counter fill and the global section's keep-alive; the
//! request lines they send.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Semaphore;

use crate::stats::figures::Figures;

/// Connection `conn`'s `i`th request of the many-actor loads.
pub fn conn_request_line(conn: u64, i: u64) -> String {
    request_line(conn * 1_000_000 + i)
}

pub fn request_line(i: u64) -> String {
    format!(
        "HIT method=GET path=/api/items ip=10.0.{}.{}\n",
        (i / 256) % 256,
        i % 256
    )
}

/// The request for actor `n` (below 2^24) in the memory-per-counter section:
/// a distinct ip for each `n`, the rule's actorField.
pub fn counter_line(n: u64) -> String {
    format!(
        "HIT path=/bench ip=10.{}.{}.{} user=u\n",
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

/// One connection, up to `window` requests in flight, sending `lines` until
/// they run out or `deadline` passes. Whatever fits in the window goes out in
/// one write (`single`: each line in its own write); latency is from that
/// write to reading the answer, which must be `OK true`.
pub async fn pipelined<I>(
    addr: SocketAddr,
    deadline: Instant,
    (window, single): (usize, bool),
    lines: I,
) -> Figures
where
    I: Iterator<Item = String> + Send + 'static,
{
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (rd, wr) = stream.into_split();
    let permits = Arc::new(Semaphore::new(window));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let start = Instant::now();
    let most = if single { 1 } else { window };
    let writer = tokio::spawn(send_batches(
        wr,
        lines,
        (permits.clone(), most),
        tx,
        deadline,
    ));
    let mut reader = TokioBufReader::new(rd);
    let mut line = String::new();
    let mut latencies = Vec::new();
    while let Some(sent) = rx.recv().await {
        line.clear();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            break;
        }
        assert!(line.starts_with("OK true"), "unexpected answer {line:?}");
        latencies.push(sent.elapsed());
        permits.add_permits(1);
    }
    writer.await.expect("writer");
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// The writing half of [`pipelined`]: takes a permit per line, writes
/// every line whose permit is at hand (up to `most`) in one batch, and
/// sends each line's write time to `tx`, until `lines` run out or
/// `deadline` passes. Dropping `tx` at the end ends the reader after the
/// last answer.
async fn send_batches<I>(
    mut wr: OwnedWriteHalf,
    mut lines: I,
    (permits, most): (Arc<Semaphore>, usize),
    tx: UnboundedSender<Instant>,
    deadline: Instant,
) where
    I: Iterator<Item = String>,
{
    let mut batch = String::new();
    'send: while Instant::now() < deadline {
        permits.acquire().await.expect("semaphore").forget();
        batch.clear();
        let Some(first) = lines.next() else { break };
        batch.push_str(&first);
        let mut n = 1;
        while n < most {
            let Ok(permit) = permits.try_acquire() else {
                break;
            };
            let Some(line) = lines.next() else { break };
            permit.forget();
            batch.push_str(&line);
            n += 1;
        }
        let sent = Instant::now();
        if wr.write_all(batch.as_bytes()).await.is_err() {
            break;
        }
        for _ in 0..n {
            if tx.send(sent).is_err() {
                break 'send;
            }
        }
    }
}

/// `conns` connections side by side, `window` requests pipelined on each
/// (`single`: one per write).
pub async fn line_pipelined(
    addr: SocketAddr,
    run: Duration,
    conns: u64,
    (window, single): (usize, bool),
) -> Figures {
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let lines = (c * 1_000_000..).map(request_line);
            tokio::spawn(pipelined(addr, deadline, (window, single), lines))
        })
        .collect();
    let mut all = Figures::default();
    for t in tasks {
        all = all.alongside(t.await.expect("connection"));
    }
    all
}

/// `conns` connections, one request in flight on each.
pub async fn line_concurrent(addr: SocketAddr, run: Duration, conns: u64) -> Figures {
    line_concurrent_with(addr, run, conns, conn_request_line).await
}

/// The line-protocol load `conns` x `window` (see [`LINE_LOADS`]).
pub async fn line_load(
    addr: SocketAddr,
    run: Duration,
    conns: u64,
    window: usize,
    single: bool,
) -> Figures {
    if window == 1 {
        line_concurrent(addr, run, conns).await
    } else {
        line_pipelined(addr, run, conns, (window, single)).await
    }
}

/// Sends `total` HITs for actors `first`, `first + 1`, ... (see
/// [`counter_line`]) over `conns` connections with `window` pipelined on each.
pub async fn line_fill(
    addr: SocketAddr,
    first: u64,
    total: u64,
    conns: u64,
    window: usize,
) -> Figures {
    let deadline = Instant::now() + Duration::from_secs(3600);
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let lines = (first + c..first + total)
                .step_by(conns as usize)
                .map(counter_line);
            tokio::spawn(pipelined(addr, deadline, (window, false), lines))
        })
        .collect();
    let mut all = Figures::default();
    for t in tasks {
        all = all.alongside(t.await.expect("connection"));
    }
    assert_eq!(all.requests, total, "every HIT answered");
    all
}

/// `conns` connections, one request in flight on each; `line(conn, i)` is
/// the `i`th request of connection `conn`. Every answer must be `OK true`.
pub async fn line_concurrent_with(
    addr: SocketAddr,
    run: Duration,
    conns: u64,
    line: fn(u64, u64) -> String,
) -> Figures {
    line_concurrent_answered(addr, run, conns, (line, "OK true")).await
}

/// [`line_concurrent_with`], where every answer must start with `answer`
/// (`"OK "`: allowed or denied).
pub async fn line_concurrent_answered(
    addr: SocketAddr,
    run: Duration,
    conns: u64,
    (line, answer_prefix): (fn(u64, u64) -> String, &'static str),
) -> Figures {
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (rd, mut wr) = stream.into_split();
                let mut reader = TokioBufReader::new(rd);
                let mut answer = String::new();
                let mut lat = Vec::new();
                let mut i = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    wr.write_all(line(c, i).as_bytes()).await.expect("send");
                    answer.clear();
                    reader.read_line(&mut answer).await.expect("answer");
                    assert!(
                        answer.starts_with(answer_prefix),
                        "unexpected answer {answer:?}"
                    );
                    lat.push(t.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed(),
        latencies,
        ..Figures::default()
    }
}

/// `conns` connections sending `HIT site=partner1` at `rate` requests per
/// second in all for `run` (see [`line_paced_with`]).
pub async fn line_paced(addr: SocketAddr, run: Duration, rate: f64, conns: u64) -> Figures {
    line_paced_with(addr, run, rate, conns, |_, _| {
        String::from("HIT site=partner1\n")
    })
    .await
}

/// `conns` connections sending `line(conn, i)` at `rate` requests per
/// second in all for `run`, each on its own schedule (spread evenly over one
/// interval), one request in flight per connection: a late answer makes
/// only the next send of its connection late. Sends wait on tokio's timer,
/// which fires on whole milliseconds: the connections due within one tick
/// send together, a burst of about `rate / 1000` lines. Latency is from
/// writing the line to reading the answer, which must be `OK true`.
pub async fn line_paced_with(
    addr: SocketAddr,
    run: Duration,
    rate: f64,
    conns: u64,
    line: fn(u64, u64) -> String,
) -> Figures {
    let interval = Duration::from_secs_f64(conns as f64 / rate);
    let start = Instant::now() + Duration::from_millis(20);
    let end = start + run;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.expect("connect");
                stream.set_nodelay(true).expect("nodelay");
                let (rd, mut wr) = stream.into_split();
                let mut reader = TokioBufReader::new(rd);
                let mut answer = String::new();
                let mut lat = Vec::new();
                let mut due = start + interval.mul_f64(c as f64 / conns as f64);
                let mut i = 0;
                while due < end {
                    let text = line(c, i);
                    i += 1;
                    tokio::time::sleep_until(due.into()).await;
                    let t = Instant::now();
                    wr.write_all(text.as_bytes()).await.expect("send");
                    answer.clear();
                    reader.read_line(&mut answer).await.expect("answer");
                    assert!(
                        answer.starts_with("OK true"),
                        "unexpected answer {answer:?}"
                    );
                    lat.push(t.elapsed());
                    due += interval;
                }
                lat
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    Figures {
        requests: latencies.len() as u64,
        elapsed: start.elapsed().min(run),
        latencies,
        ..Figures::default()
    }
}

/// One connection sending `HIT site=partner1` at `rate` requests per second
/// until `stop`: keeps a server's demand alive while the other is measured
/// (a global limit's region with no demand for a lease period is leased
/// nothing, and would deny until its next renewal when the load resumes).
/// Returns the requests sent and the answers that were not `OK true`, with
/// the first of them.
pub fn keep_alive(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, Option<String>)> {
    rt.spawn(async move {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (rd, mut wr) = stream.into_split();
        let mut reader = TokioBufReader::new(rd);
        let mut answer = String::new();
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        let (mut sent, mut bad, mut first_bad) = (0, 0, None);
        while !stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            wr.write_all(b"HIT site=partner1\n").await.expect("send");
            answer.clear();
            reader.read_line(&mut answer).await.expect("answer");
            sent += 1;
            if !answer.starts_with("OK true") {
                bad += 1;
                first_bad.get_or_insert_with(|| answer.trim().to_owned());
            }
        }
        (sent, bad, first_bad)
    })
}
