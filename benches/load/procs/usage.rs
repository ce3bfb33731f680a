//! What a process has used so far, from `/proc`: CPU time (a server's, or
//! the load generator's with its waited-for children) and resident memory.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// User plus system CPU time of process `pid` so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    stat_cpu_time(pid, 2)
}

/// CPU time of process `pid` so far, from one read of `/proc/PID/stat`:
/// user plus system, and user alone.
pub fn cpu_times(pid: u32) -> (Option<Duration>, Option<Duration>) {
    let Some(fields) = stat_fields(pid) else {
        return (None, None);
    };
    (ticks(&fields, 2), ticks(&fields, 1))
}

/// This process's CPU time plus that of the children it has waited for
/// (h2load runs), from `/proc/self/stat`.
pub fn generator_cpu_time() -> Option<Duration> {
    stat_cpu_time(std::process::id(), 4)
}

/// The sum of the first `n` CPU-time fields of `/proc/PID/stat`: utime,
/// stime, then cutime and cstime (children waited for).
pub fn stat_cpu_time(pid: u32, n: usize) -> Option<Duration> {
    ticks(&stat_fields(pid)?, n)
}

/// The fields of `/proc/PID/stat` after the command name (state first,
/// utime the 12th).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// The sum of the first `n` CPU-time fields, from utime on.
fn ticks(fields: &[String], n: usize) -> Option<Duration> {
    let mut ticks = 0u64;
    for f in fields.get(11..11 + n)? {
        ticks += f.parse::<u64>().ok()?;
    }
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks()))
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 if that fails).
pub fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Resident memory of process `pid` (`VmRSS` of /proc/PID/status), in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
