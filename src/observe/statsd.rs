//! statsd output with divvy's metric names, when `STATSD_HOST` and
//! `STATSD_PORT` are set: `<prefix>hit.accepted`, `hit.rejected`,
//! `hit.canary-accepted`, `hit.canary-rejected` (each also `.<label>` when
//! the rule has a label), `error.<code>`, the `hit` timer and the
//! `connections` gauge. UDP by default (lines batched into datagrams of at
//! most 1,400 bytes), TCP when `STATSD_USE_TCP` is non-empty. The request
//! path only queues a line (dropped if the queue is full); a background
//! task sends, so a slow or absent statsd never slows a decision.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;

/// Where statsd is and how to talk to it.
#[derive(Debug, Clone)]
pub struct StatsdConfig {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Prepended to every name as is (divvy's `STATSD_PREFIX`, e.g. `divvy.`).
    pub prefix: String,
    /// TCP instead of UDP.
    pub tcp: bool,
}

struct Sink {
    prefix: String,
    tx: mpsc::Sender<String>,
}

static SINK: OnceLock<Sink> = OnceLock::new();

const MAX_DATAGRAM: usize = 1400;

/// Starts sending to statsd (once per process; later calls are ignored).
pub fn init(config: StatsdConfig) {
    let (tx, rx) = mpsc::channel(16 * 1024);
    if SINK
        .set(Sink {
            prefix: config.prefix.clone(),
            tx,
        })
        .is_ok()
    {
        tokio::spawn(run(config, rx));
    }
}

fn send(line: String) {
    if let Some(sink) = SINK.get() {
        let _ = sink.tx.try_send(format!("{}{line}", sink.prefix));
    }
}

/// Whether statsd is configured (callers skip formatting names otherwise).
pub fn enabled() -> bool {
    SINK.get().is_some()
}

/// Counts one event named `name`.
pub fn count(name: &str) {
    if SINK.get().is_some() {
        send(format!("{name}:1|c"));
    }
}

/// Records a duration in milliseconds.
pub fn timing(name: &str, d: Duration) {
    if SINK.get().is_some() {
        send(format!("{name}:{:.3}|ms", d.as_secs_f64() * 1000.0));
    }
}

/// Sets a gauge.
pub fn gauge(name: &str, value: i64) {
    if SINK.get().is_some() {
        send(format!("{name}:{value}|g"));
    }
}

async fn run(config: StatsdConfig, mut rx: mpsc::Receiver<String>) {
    let target = format!("{}:{}", config.host, config.port);
    let mut udp: Option<UdpSocket> = None;
    let mut tcp: Option<TcpStream> = None;
    let mut packet = String::with_capacity(MAX_DATAGRAM);
    while let Some(first) = rx.recv().await {
        packet.clear();
        packet.push_str(&first);
        while packet.len() < MAX_DATAGRAM {
            match rx.try_recv() {
                Ok(line) if packet.len() + 1 + line.len() <= MAX_DATAGRAM || config.tcp => {
                    packet.push('\n');
                    packet.push_str(&line);
                }
                Ok(line) => {
                    flush(&config, &target, &mut udp, &mut tcp, &packet).await;
                    packet.clear();
                    packet.push_str(&line);
                }
                Err(_) => break,
            }
        }
        flush(&config, &target, &mut udp, &mut tcp, &packet).await;
    }
}

async fn flush(
    config: &StatsdConfig,
    target: &str,
    udp: &mut Option<UdpSocket>,
    tcp: &mut Option<TcpStream>,
    packet: &str,
) {
    if config.tcp {
        if tcp.is_none() {
            *tcp = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(target))
                .await
                .ok()
                .and_then(Result::ok);
        }
        if let Some(stream) = tcp.as_mut() {
            let mut bytes = packet.as_bytes().to_vec();
            bytes.push(b'\n');
            if stream.write_all(&bytes).await.is_err() {
                *tcp = None;
            }
        }
        return;
    }
    if udp.is_none() {
        let Ok(mut addrs) = tokio::net::lookup_host(target).await else {
            return;
        };
        let Some(addr) = addrs.next() else { return };
        let bind = if addr.is_ipv6() {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        if let Ok(socket) = UdpSocket::bind(bind).await {
            if socket.connect(addr).await.is_ok() {
                *udp = Some(socket);
            }
        }
    }
    if let Some(socket) = udp.as_ref() {
        let _ = socket.send(packet.as_bytes()).await;
    }
}
