//! Each replica's resident memory, open file descriptors and threads,
//! read from /proc once a second.

use std::net::SocketAddr;
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
    /// Its failure-policy decisions so far (`divvy_failure_policy_decisions_total`,
    /// every label), if its admin API answered.
    pub policy: Option<f64>,
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

/// The sum of a replica's `divvy_failure_policy_decisions_total`.
fn policy_decisions(http: SocketAddr) -> Option<f64> {
    let (status, body) = crate::rig::get(http, "/metrics")?;
    (status == 200).then_some(())?;
    let samples = crate::common::parse_metrics(&body);
    let decisions = samples
        .iter()
        .filter(|(k, _)| k.starts_with("divvy_failure_policy_decisions_total"));
    Some(decisions.map(|(_, v)| v).sum())
}

/// When the failure policy decided something, as seen by the sampler:
/// each `[from, to]` between two samples of one process over which its
/// count of policy decisions grew.
pub fn policy_active(samples: &[Sample]) -> Vec<(f64, f64)> {
    let mut spans = Vec::new();
    for replica in 0..2 {
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.replica == replica).collect();
        for pair in mine.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let grew = matches!((a.policy, b.policy), (Some(x), Some(y)) if y > x);
            if a.pid == b.pid && grew {
                spans.push((a.at, b.at));
            }
        }
    }
    spans
}

/// Samples the processes of `pids` every second until `stop` is set.
pub fn start(
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now_pids = pids.lock().unwrap().clone();
            for (replica, pid) in now_pids.into_iter().enumerate() {
                let Some(pid) = pid else { continue };
                let http = addrs[replica];
                if let Some((rss, fds, threads)) = read(pid) {
                    let (at, policy) = (now(), policy_decisions(http));
                    samples.push(Sample {
                        at,
                        replica,
                        pid,
                        rss,
                        fds,
                        threads,
                        policy,
                    });
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        samples
    })
}
