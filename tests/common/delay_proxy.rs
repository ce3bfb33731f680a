//! A TCP proxy on loopback that delays every chunk, standing for a distant
//! network: the global store of `tests/global.rs`, and the far Redis and
//! global store of the load benchmark (which includes this file).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A TCP proxy on a free loopback port to `127.0.0.1:upstream` that holds
/// every chunk for a delay in each direction (order kept: one FIFO queue of
/// timestamped chunks and one writer thread per direction). A connection
/// whose upstream refuses is closed at once; when either side closes, both
/// are closed, and its threads end.
pub struct DelayProxy {
    /// The port it listens on.
    pub port: u16,
}

impl DelayProxy {
    /// A proxy to `upstream` delaying each chunk by `delay` each way; each
    /// of its forwarding threads runs `on_thread` first (the benchmark moves
    /// them off its load generator's CPU).
    pub fn start(upstream: u16, delay: Duration, on_thread: fn()) -> DelayProxy {
        let port = accept(upstream, move |from, to, _| {
            pipe(from, to, delay, on_thread)
        });
        DelayProxy { port }
    }

    /// The Redis URL of what it proxies.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `PING`s through the proxy on one connection: the median round trip
    /// of five, after a first one that waits for the proxy's new threads.
    pub fn round_trip(&self) -> Duration {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect proxy");
        s.set_nodelay(true).expect("nodelay");
        let mut times: Vec<Duration> = (0..6)
            .map(|_| {
                let started = Instant::now();
                s.write_all(b"PING\r\n").expect("ping");
                let mut buf = [0u8; 7];
                s.read_exact(&mut buf).expect("pong");
                assert_eq!(&buf, b"+PONG\r\n");
                started.elapsed()
            })
            .skip(1)
            .collect();
        times.sort();
        times[times.len() / 2]
    }
}

/// Listens on a free loopback port (returned) and connects each client to
/// `127.0.0.1:upstream` (closing the client at once when it refuses); hands
/// `forward` each direction, `(from, to, replies)`: client → upstream, then
/// upstream → client (`replies`).
pub fn accept(upstream: u16, forward: impl Fn(TcpStream, TcpStream, bool) + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let port = listener.local_addr().expect("proxy address").port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                continue;
            };
            forward(client, s2, false);
            forward(server, c2, true);
        }
    });
    port
}

/// Forwards `from` → `to`, each chunk `delay` after it was read.
fn pipe(from: TcpStream, to: TcpStream, delay: Duration, on_thread: fn()) {
    let (tx, rx) = mpsc::channel::<Option<(Instant, Vec<u8>)>>();
    let Ok(mut reader) = from.try_clone() else {
        return;
    };
    std::thread::spawn(move || {
        on_thread();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let chunk = match reader.read(&mut buf) {
                Ok(0) | Err(_) => None,
                Ok(n) => Some((Instant::now() + delay, buf[..n].to_vec())),
            };
            let end = chunk.is_none();
            if tx.send(chunk).is_err() || end {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        on_thread();
        let mut to = to;
        while let Ok(Some((due, bytes))) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
