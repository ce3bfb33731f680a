//! Paced load, one thread and one connection per user: each user's
//! requests are sent on a schedule (the `n`th due at `from + n / rate`),
//! and each answer is kept with the time it was sent, so admitted rates can
//! be measured afterwards over any window.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

/// A late user catches up by at most this many requests at once; further
/// behind, the missed ones are skipped (and counted in [`Trace::skipped`]).
pub const CATCH_UP: f64 = 3.0;

/// One user's load: `rate` requests per second from `from` to `to`
/// seconds after the run's start.
#[derive(Debug, Clone)]
pub struct Load {
    /// The user (what the request names it by).
    pub user: String,
    /// Requests per second.
    pub rate: f64,
    /// Seconds after the start when the first is due.
    pub from: f64,
    /// Seconds after the start when the user stops (none due at or after it).
    pub to: f64,
}

impl Load {
    /// `user` asking `rate` per second from `from` to `to` seconds.
    pub fn new(user: &str, rate: f64, from: f64, to: f64) -> Load {
        Load {
            user: user.to_owned(),
            rate,
            from,
            to,
        }
    }
}

/// One request's answer: allowed, denied, or anything else (an error, a
/// 500 from Envoy...), with what it was.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Allowed (`OK true`, gRPC `OK`, HTTP 200).
    Allowed,
    /// Denied (`OK false`, gRPC `OVER_LIMIT`, HTTP 429).
    Denied,
    /// Anything else.
    Failed(String),
}

/// Sends one request of a user and answers its outcome.
pub type Sender = Box<dyn FnMut() -> Outcome>;

/// What one user sent and got.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The load it ran.
    pub load: Load,
    /// Each request: seconds after the start it was sent, and its outcome.
    pub sent: Vec<(f64, Outcome)>,
    /// Requests skipped because the user fell more than [`CATCH_UP`] behind.
    pub skipped: u64,
}

impl Trace {
    fn count(&self, from: f64, to: f64, what: impl Fn(&Outcome) -> bool) -> usize {
        self.sent
            .iter()
            .filter(|(t, o)| *t >= from && *t < to && what(o))
            .count()
    }

    /// Requests allowed among those sent in `[from, to)`.
    pub fn allowed(&self, from: f64, to: f64) -> usize {
        self.count(from, to, |o| *o == Outcome::Allowed)
    }

    /// Allowed per second among those sent in `[from, to)`.
    pub fn allowed_rate(&self, from: f64, to: f64) -> f64 {
        self.allowed(from, to) as f64 / (to - from)
    }

    /// Requests sent per second in `[from, to)`.
    pub fn asked_rate(&self, from: f64, to: f64) -> f64 {
        self.count(from, to, |_| true) as f64 / (to - from)
    }

    /// The requests sent in `[from, to)` that were neither allowed nor denied.
    pub fn failed(&self, from: f64, to: f64) -> Vec<String> {
        self.sent
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .filter_map(|(_, o)| match o {
                Outcome::Failed(why) => Some(why.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Runs every load on a thread of its own, each with the sender `connect`
/// makes for it (on its thread, before the start: its connection); the
/// start is when every user is connected. The traces, in the loads' order.
pub fn run(loads: &[Load], connect: &(dyn Fn(usize, &Load) -> Sender + Sync)) -> Vec<Trace> {
    let (ready, go) = (Barrier::new(loads.len() + 1), Barrier::new(loads.len() + 1));
    let start = OnceLock::new();
    std::thread::scope(|s| {
        let threads: Vec<_> = loads
            .iter()
            .enumerate()
            .map(|(i, load)| {
                let (ready, go, start) = (&ready, &go, &start);
                s.spawn(move || {
                    let mut send = connect(i, load);
                    ready.wait();
                    go.wait();
                    pace(load, *start.get().expect("start"), &mut send)
                })
            })
            .collect();
        ready.wait();
        start.set(Instant::now()).unwrap();
        go.wait();
        threads
            .into_iter()
            .map(|t| t.join().expect("paced user"))
            .collect()
    })
}

/// Sends `load` from `start` on its schedule.
fn pace(load: &Load, start: Instant, send: &mut Sender) -> Trace {
    let mut trace = Trace {
        load: load.clone(),
        sent: Vec::new(),
        skipped: 0,
    };
    let mut n = 0u64;
    loop {
        let due = load.from + n as f64 / load.rate;
        if due >= load.to {
            return trace;
        }
        let now = start.elapsed().as_secs_f64();
        if due > now {
            std::thread::sleep(Duration::from_secs_f64(due - now));
        } else if now - due > CATCH_UP / load.rate {
            // Too far behind: skip to the request due just before now.
            let at = ((now - load.from) * load.rate).floor() as u64;
            trace.skipped += at.saturating_sub(n);
            n = at.max(n);
        }
        let t = start.elapsed().as_secs_f64();
        let outcome = send();
        trace.sent.push((t, outcome));
        n += 1;
    }
}

/// A line-protocol sender: `line` (no newline) on its own connection to
/// `addr`, each answer parsed.
pub fn line_sender(addr: SocketAddr, line: String) -> Sender {
    let stream = TcpStream::connect(addr).expect("connect line");
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let line = format!("{line}\n");
    Box::new(move || {
        if let Err(e) = writer.write_all(line.as_bytes()) {
            return Outcome::Failed(format!("send: {e}"));
        }
        let mut answer = String::new();
        match reader.read_line(&mut answer) {
            Ok(0) => Outcome::Failed("connection closed".into()),
            Err(e) => Outcome::Failed(format!("answer: {e}")),
            Ok(_) if answer.starts_with("OK true ") => Outcome::Allowed,
            Ok(_) if answer.starts_with("OK false ") => Outcome::Denied,
            Ok(_) => Outcome::Failed(answer.trim_end().to_owned()),
        }
    })
}

/// An HTTP/1.1 sender: GETs of `path` with `headers` on one kept-alive
/// connection to `127.0.0.1:port` (opened again if the peer closes it);
/// 200 is allowed, 429 denied.
pub fn http_sender(port: u16, path: &str, headers: &[(&str, &str)]) -> Sender {
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let request = format!("GET {path} HTTP/1.1\r\nHost: example\r\n{extra}\r\n");
    let connect = move || -> std::io::Result<BufReader<TcpStream>> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(BufReader::new(s))
    };
    let mut conn = Some(connect().expect("connect http"));
    Box::new(move || {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match connect() {
                Ok(c) => c,
                Err(e) => return Outcome::Failed(format!("connect: {e}")),
            },
        };
        match http_exchange(&mut c, &request) {
            Ok((status, close)) => {
                if !close {
                    conn = Some(c);
                }
                match status {
                    200 => Outcome::Allowed,
                    429 => Outcome::Denied,
                    other => Outcome::Failed(format!("HTTP {other}")),
                }
            }
            Err(e) => Outcome::Failed(format!("http: {e}")),
        }
    })
}

/// Sends `request` and reads one answer by its content-length: its status
/// and whether the peer closes the connection after it.
fn http_exchange(c: &mut BufReader<TcpStream>, request: &str) -> std::io::Result<(u16, bool)> {
    c.get_mut().write_all(request.as_bytes())?;
    let mut status = None;
    let (mut length, mut close) = (0usize, false);
    loop {
        let mut line = String::new();
        if c.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if status.is_none() {
            status = line.split(' ').nth(1).and_then(|s| s.parse().ok());
            continue;
        }
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().unwrap_or(0),
            "connection" => close = v.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    c.read_exact(&mut body)?;
    let status = status.ok_or_else(|| std::io::Error::other("no status line"))?;
    Ok((status, close))
}

/// A gRPC sender: `ShouldRateLimit` in `domain` with one descriptor of
/// `entries`, on its own HTTP/2 connection to `addr` (driven by a runtime
/// of its own on the user's thread); `OK` is allowed, `OVER_LIMIT` denied.
pub fn grpc_sender(addr: SocketAddr, domain: &str, entries: &[(&str, &str)]) -> Sender {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut client = runtime
        .block_on(RateLimitServiceClient::connect(format!("http://{addr}")))
        .expect("connect grpc");
    let request = super::request(domain, vec![super::desc(entries)]);
    Box::new(
        move || match runtime.block_on(client.should_rate_limit(request.clone())) {
            Ok(answer) => match answer.into_inner().overall_code {
                c if c == Code::Ok as i32 => Outcome::Allowed,
                c if c == Code::OverLimit as i32 => Outcome::Denied,
                c => Outcome::Failed(format!("code {c}")),
            },
            Err(status) => Outcome::Failed(format!("{status}")),
        },
    )
}
