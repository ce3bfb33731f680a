//! Placement: which CPU runs the servers and which the load generator
//! (`taskset`), and commands started on either.

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where the servers and the load generator run.
pub struct Placement {
    /// The CPU of every server process, when pinned.
    pub server: Option<u32>,
    /// The CPU of this process (the load generator), when pinned.
    pub load: Option<u32>,
    /// Every CPU this process was allowed at start, as taskset writes them.
    pub all: String,
    /// One line describing the above.
    pub note: String,
}

pub static PLACEMENT: OnceLock<Placement> = OnceLock::new();

pub fn placement() -> &'static Placement {
    PLACEMENT.get_or_init(|| Placement {
        server: None,
        load: None,
        all: String::new(),
        note: String::from("unpinned"),
    })
}

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status),
/// and that list as written there.
pub fn allowed_cpus() -> (Vec<u32>, String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    (cpus, list)
}

/// Pins this process to the second allowed CPU, servers to go on the first;
/// unpinned (with the reason) on a machine with one CPU or without taskset.
pub fn place() -> Placement {
    let (cpus, all) = allowed_cpus();
    if cpus.len() < 2 {
        return Placement {
            server: None,
            load: None,
            note: format!(
                "unpinned: {} CPU allowed ({all}), servers and load generator share it",
                cpus.len()
            ),
            all,
        };
    }
    match pin_self(cpus[1]) {
        Ok(()) => Placement {
            server: Some(cpus[0]),
            load: Some(cpus[1]),
            note: format!(
                "servers pinned to CPU {} (taskset -c {}), load generator (this process) to CPU {}",
                cpus[0], cpus[0], cpus[1]
            ),
            all,
        },
        Err(why) => Placement {
            server: None,
            load: None,
            note: format!("unpinned: {why}"),
            all,
        },
    }
}

/// `program` through `taskset -c CPUS` (so the child's pid is the program's
/// own), or plain without `cpus`.
pub fn on_cpus(program: impl AsRef<OsStr>, cpus: Option<String>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// `program` on the servers' CPU.
pub fn server_command(program: impl AsRef<OsStr>) -> Command {
    on_cpus(program, placement().server.map(|c| c.to_string()))
}

/// `program` on any CPU this process was allowed at start (not the load
/// generator's only).
pub fn any_cpu_command(program: impl AsRef<OsStr>) -> Command {
    let p = placement();
    on_cpus(program, p.load.map(|_| p.all.clone()))
}

/// Pins every thread of this process to `cpu` with `taskset`; `Err` says why not.
pub fn pin_self(cpu: u32) -> Result<(), String> {
    let pid = std::process::id().to_string();
    match Command::new("taskset")
        .args(["-a", "-cp", &cpu.to_string(), &pid])
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "taskset -a -cp {cpu} {pid} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("taskset not available ({e})")),
    }
}

/// Lets the calling thread run on any CPU: the proxy stands for the
/// network, and on the load generator's CPU (which this process is pinned
/// to) its delays would grow with the load.
pub fn unpin_thread() {
    let cpus = placement().all.clone();
    // `taskset -p` on this thread's id changes this thread alone; the id
    // is the last part of /proc/thread-self's target (`<pid>/task/<tid>`).
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    if !cpus.is_empty() && !tid.is_empty() {
        let _ = Command::new("taskset")
            .args(["-cp", &cpus, &tid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
