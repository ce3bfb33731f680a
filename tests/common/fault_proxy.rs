//! A TCP proxy on loopback whose faults a test switches at run time: pass
//! bytes on, hold them (a black hole: connections are accepted, nothing
//! comes back, and what was sent arrives once it heals, as TCP would
//! deliver it), or delay every reply.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass them on at once.
    None,
    /// Hold them, both ways, until the fault is lifted.
    BlackHole,
    /// Hold each reply (upstream to client) this long.
    SlowReplies(Duration),
}

/// A proxy to `127.0.0.1:upstream` on a free loopback port.
pub struct FaultProxy {
    /// The port it listens on.
    pub port: u16,
    fault: Arc<Mutex<Fault>>,
}

impl FaultProxy {
    /// Starts passing bytes to `upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        let fault = Arc::new(Mutex::new(Fault::None));
        let shared = fault.clone();
        let port = super::delay_proxy::accept(upstream, move |from, to, replies| {
            pipe(from, to, shared.clone(), replies)
        });
        FaultProxy { port, fault }
    }

    /// Switches the fault (for every connection, open or new).
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    /// The Redis URL of what it proxies.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// Forwards `from` → `to` in order, each chunk when the fault lets it
/// (`replies`: this is the upstream-to-client direction).
fn pipe(from: TcpStream, to: TcpStream, fault: Arc<Mutex<Fault>>, replies: bool) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let Ok(mut reader) = from.try_clone() else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        let mut to = to;
        while let Ok((read_at, bytes)) = rx.recv() {
            loop {
                let now = Instant::now();
                let due = match *fault.lock().unwrap() {
                    Fault::None => now,
                    Fault::BlackHole => now + Duration::from_millis(5),
                    Fault::SlowReplies(d) if replies => read_at + d,
                    Fault::SlowReplies(_) => now,
                };
                if due <= now {
                    break;
                }
                std::thread::sleep((due - now).min(Duration::from_millis(5)));
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
