//! Floods through the line protocol and the resident memory they leave:
//! what the hostile-traffic and memory-limit tests share.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes in a MiB, as a float.
pub const MB: f64 = 1024.0 * 1024.0;

/// The resident set of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status");
    kb * 1024
}

/// `bytes` in MiB.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / MB
}

/// Samples a process's RSS every 20 ms on a thread of its own, keeping the peak.
pub struct RssWatch {
    stop: Arc<AtomicBool>,
    peak: Arc<Mutex<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssWatch {
    /// Starts sampling `pid`.
    pub fn start(pid: u32) -> RssWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(Mutex::new(rss(pid)));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let now = rss(pid);
                    let mut p = peak.lock().unwrap();
                    *p = (*p).max(now);
                    drop(p);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        RssWatch {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the peak seen.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let peak = *self.peak.lock().unwrap();
        peak
    }
}

/// Sends `n` line-protocol requests, `line(i)` (no newline), over `conns`
/// connections, pipelined: connection `c` carries the `i ≡ c (mod conns)`
/// in order, one thread writing while another reads. The answers, by `i`.
pub fn line_flood(
    addr: SocketAddr,
    n: usize,
    conns: usize,
    line: &(dyn Fn(usize) -> String + Sync),
) -> Vec<String> {
    let mut answers = vec![String::new(); n];
    std::thread::scope(|s| {
        let mut readers = Vec::new();
        for c in 0..conns {
            let stream = TcpStream::connect(addr).expect("connect line");
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .unwrap();
            let write_half = stream.try_clone().unwrap();
            s.spawn(move || {
                let mut w = BufWriter::with_capacity(64 * 1024, &write_half);
                for i in (c..n).step_by(conns) {
                    w.write_all(line(i).as_bytes()).expect("send");
                    w.write_all(b"\n").expect("send");
                }
                w.flush().expect("send");
                drop(w);
                write_half.shutdown(Shutdown::Write).expect("shutdown");
            });
            readers.push(s.spawn(move || {
                let mut r = BufReader::new(stream);
                let mut got = Vec::new();
                for i in (c..n).step_by(conns) {
                    let mut answer = String::new();
                    r.read_line(&mut answer).expect("answer");
                    assert!(answer.ends_with('\n'), "answer {i} cut short: {answer:?}");
                    got.push((i, answer.trim_end().to_owned()));
                }
                got
            }));
        }
        for r in readers {
            for (i, a) in r.join().expect("reader") {
                answers[i] = a;
            }
        }
    });
    answers
}
