//! Each replica's resident memory, open file descriptors and threads,
//! read from /proc once a second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::now;

/// One reading of one replica process.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When (Unix seconds).
    pub at: f64,
    /// Which replica.
    pub replica: usize,
    /// Its process id (a restarted replica has a new one).
    pub pid: u32,
    /// VmRSS, bytes.
    pub rss: u64,
    /// Entries in /proc/PID/fd.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
}

/// Reads `/proc/PID/status` and `/proc/PID/fd`; `None` once it is gone.
fn read(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.trim().trim_end_matches("kB").trim().parse().ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((field("VmRSS:")? * 1024, fds, field("Threads:")?))
}

/// Samples the processes of `pids` every second until `stop` is set.
pub fn start(
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now_pids = pids.lock().unwrap().clone();
            for (replica, pid) in now_pids.into_iter().enumerate() {
                let Some(pid) = pid else { continue };
                if let Some((rss, fds, threads)) = read(pid) {
                    let at = now();
                    samples.push(Sample { at, replica, pid, rss, fds, threads });
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        samples
    })
}
