//! The process's memory budget: the limit it must stay under (`--memory-limit`,
//! else the cgroup's), what it keeps back for itself, and how many counters
//! the rest holds.
//!
//! The bounded structures other than counters have fixed bounds (the top
//! offenders' sketches, the over-limit cache's entries, a ring per rule);
//! they are reserved first, and the memory store gets what is left, at
//! [`COUNTER_BYTES`] a counter. `--max-counters` becomes the lesser of its
//! own value and that.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Resident bytes one counter may take in the memory store, at worst: its
/// 64-byte slot (the slot array never grows past its shard's cap) and its
/// index entry, whose table grows by doubling (up to about 11.5 bytes a
/// counter just after a growth step).
pub const COUNTER_BYTES: u64 = 80;

/// Kept back, on top of what the process holds when the budget is made,
/// for what it allocates later: the runtime's threads' stacks, connection
/// buffers, the allocator's free pages.
pub const HEADROOM_BYTES: u64 = 8 << 20;

/// The share of the limit kept back on top of [`HEADROOM_BYTES`]: what the
/// process needs grows with its load (connections, requests in flight).
pub const HEADROOM_SHARE: f64 = 0.10;

/// The fewest counters a budget gives the memory store, however small the
/// limit: a process that can count nothing cannot answer.
pub const MIN_COUNTERS: usize = 10_000;

/// A cgroup's memory limit at or above this is "no limit" (cgroup v1 writes
/// a page-rounded `i64::MAX`).
const UNLIMITED: u64 = 1 << 62;

/// A memory size that cannot be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("`{0}` is not a memory size: bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T (as in 256Mi or 1G)")]
pub struct SizeError(pub String);

/// Where the limit in force came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSource {
    /// `--memory-limit` (`DIVVY_MEMORY_LIMIT`).
    Flag,
    /// A cgroup's `memory.max` (v2) or `memory.limit_in_bytes` (v1) file.
    Cgroup(PathBuf),
}

/// The limit the process must stay under and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// Where it came from.
    pub source: LimitSource,
}

/// What the bounded structures other than counters may hold at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// The top offenders' sketches.
    pub offenders: u64,
    /// The over-limit cache in front of Redis.
    pub over_limit_cache: u64,
    /// Each rule's fifteen minutes of decisions.
    pub history: u64,
}

impl Reserved {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.offenders + self.over_limit_cache + self.history
    }
}

/// The budget in force: the limit, what is kept back, and the counters cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBudget {
    /// The limit (`None`: no limit known; `--max-counters` alone caps).
    pub limit: Option<MemoryLimit>,
    /// Kept back for the process itself.
    pub headroom: u64,
    /// Kept for the other bounded structures.
    pub reserved: Reserved,
    /// The memory store's cap in force.
    pub max_counters: usize,
    /// Whether the limit, not `--max-counters`, set the cap.
    pub limited_by_memory: bool,
}

/// Reads a memory size in the forms a limit is usually written in: bytes
/// (`268435456`, what the downward API gives), binary suffixes (`256Mi`,
/// `1Gi`), decimal ones (`1G`, `500M`, `128k`), an optional `B` after them
/// (`256MiB`), a fraction (`0.5Gi`). Kubernetes' rarer forms (exponents,
/// `Pi`, `Ei`) are refused with a clear error.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let err = || SizeError(text.to_owned());
    let t = text.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let factor: u64 = match unit.trim() {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(err()),
    };
    if number.is_empty() || number.matches('.').count() > 1 {
        return Err(err());
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let bytes = value * factor as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

/// The memory limit of the cgroup this process runs in, the tightest of it
/// and its ancestors (v2: `memory.max`; v1: `memory.limit_in_bytes`); `None`
/// when no cgroup sets one.
pub fn cgroup_limit() -> Option<MemoryLimit> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(Path::new("/sys/fs/cgroup"), &own)
}

/// [`cgroup_limit`] with the cgroup file system mounted at `root` and
/// `/proc/self/cgroup`'s text `own`.
pub fn cgroup_limit_in(root: &Path, own: &str) -> Option<MemoryLimit> {
    let mut found: Option<MemoryLimit> = None;
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let rel = path.trim_start_matches('/');
        let candidate = match controllers {
            // cgroup v2, mounted at the root or (hybrid) under `unified`.
            "" => [root.to_path_buf(), root.join("unified")]
                .iter()
                .filter_map(|base| tightest(&base.join(rel), base, "memory.max"))
                .min_by_key(|l| l.bytes),
            c if c.split(',').any(|c| c == "memory") => {
                let base = root.join("memory");
                tightest(&base.join(rel), &base, "memory.limit_in_bytes")
            }
            _ => None,
        };
        if let Some(c) = candidate {
            if found.as_ref().is_none_or(|f| c.bytes < f.bytes) {
                found = Some(c);
            }
        }
    }
    found
}

/// The smallest limit in `file` of `dir` and its ancestors up to `top`.
fn tightest(dir: &Path, top: &Path, file: &str) -> Option<MemoryLimit> {
    let mut best: Option<MemoryLimit> = None;
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| d.starts_with(top)) {
        let path = d.join(file);
        let limit = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&b| b > 0 && b < UNLIMITED);
        if let Some(bytes) = limit {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                best = Some(MemoryLimit {
                    bytes,
                    source: LimitSource::Cgroup(path),
                });
            }
        }
        at = d.parent();
    }
    best
}

/// What the process keeps back for itself under a limit of `limit` bytes,
/// holding `resident` bytes now (its code, the runtime, the rules).
pub fn headroom(limit: u64, resident: u64) -> u64 {
    resident + HEADROOM_BYTES + (limit as f64 * HEADROOM_SHARE) as u64
}

/// This process's resident memory now (`/proc/self/statm`), 0 where
/// it cannot be read.
pub fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf takes an integer and reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// The budget for `limit` (if any) of a process holding `resident` bytes
/// now, with `reserved` for the other bounded structures, and
/// `--max-counters` `max_counters`.
pub fn plan(
    limit: Option<MemoryLimit>,
    resident: u64,
    reserved: Reserved,
    max_counters: usize,
) -> MemoryBudget {
    let Some(l) = limit else {
        return MemoryBudget {
            limit: None,
            headroom: 0,
            reserved,
            max_counters,
            limited_by_memory: false,
        };
    };
    let headroom = headroom(l.bytes, resident);
    let left = l.bytes.saturating_sub(headroom + reserved.total());
    let fit = usize::try_from(left / COUNTER_BYTES)
        .unwrap_or(usize::MAX)
        .max(MIN_COUNTERS);
    MemoryBudget {
        limit: Some(l),
        headroom,
        reserved,
        max_counters: fit.min(max_counters),
        limited_by_memory: fit < max_counters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_kubernetes_writes_them() {
        assert_eq!(parse_size("268435456"), Ok(268_435_456));
        assert_eq!(parse_size("256Mi"), Ok(256 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("128k"), Ok(128_000));
        assert_eq!(parse_size("0.5Gi"), Ok(1 << 29));
        assert_eq!(parse_size(" 64Mi "), Ok(64 << 20));
        for bad in [
            "", "Mi", "64 lots", "1.2.3Gi", "-5Mi", "64mi", "1e400", "64Mb", "1Pi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} was read");
        }
        assert!(parse_size("64x")
            .unwrap_err()
            .to_string()
            .contains("`64x` is not a memory size"));
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// cgroup v2: the tightest `memory.max` of the process's cgroup and its
    /// ancestors; "max" is no limit.
    #[test]
    fn cgroup_v2_takes_the_tightest_ancestor() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(&r.join("kubepods/memory.max"), "134217728\n");
        write(&r.join("kubepods/pod1/memory.max"), "max\n");
        write(&r.join("kubepods/pod1/divvy/memory.max"), "268435456\n");
        let limit = cgroup_limit_in(r, "0::/kubepods/pod1/divvy\n").unwrap();
        assert_eq!(limit.bytes, 134_217_728);
        assert_eq!(
            limit.source,
            LimitSource::Cgroup(r.join("kubepods/memory.max"))
        );
        write(&r.join("kubepods/memory.max"), "max\n");
        write(&r.join("kubepods/pod1/divvy/memory.max"), "max\n");
        assert_eq!(cgroup_limit_in(r, "0::/kubepods/pod1/divvy\n"), None);
        // A namespaced cgroup (`0::/`) reads the root's own file.
        write(&r.join("memory.max"), "67108864\n");
        assert_eq!(cgroup_limit_in(r, "0::/\n").unwrap().bytes, 64 << 20);
        // Hybrid hierarchy: v2 under `unified`.
        let hybrid = tempfile::tempdir().unwrap();
        write(&hybrid.path().join("unified/job/memory.max"), "33554432\n");
        assert_eq!(
            cgroup_limit_in(hybrid.path(), "0::/job\n").unwrap().bytes,
            32 << 20
        );
    }

    /// cgroup v1: the memory controller's `memory.limit_in_bytes`; the
    /// page-rounded `i64::MAX` is no limit.
    #[test]
    fn cgroup_v1_reads_the_memory_controller() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            &r.join("memory/docker/abc/memory.limit_in_bytes"),
            "536870912\n",
        );
        write(
            &r.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let own = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n";
        assert_eq!(cgroup_limit_in(r, own).unwrap().bytes, 512 << 20);
        assert_eq!(cgroup_limit_in(r, "4:memory:/\n"), None);
        assert_eq!(cgroup_limit_in(r, "garbage\n"), None);
    }

    #[test]
    fn the_budget_caps_counters_by_what_is_left() {
        let flag = |bytes| {
            Some(MemoryLimit {
                bytes,
                source: LimitSource::Flag,
            })
        };
        let reserved = Reserved {
            offenders: 8 << 20,
            over_limit_cache: 0,
            history: 0,
        };
        let b = plan(flag(64 << 20), 12 << 20, reserved, 13_000_000);
        let left = (64u64 << 20) - (12 << 20) - (8 << 20) - (64 << 20) / 10 - (8 << 20);
        assert_eq!(b.max_counters as u64, left / COUNTER_BYTES);
        assert!(b.limited_by_memory);
        assert_eq!(b.headroom, (12 << 20) + HEADROOM_BYTES + (64 << 20) / 10);
        // --max-counters below what fits stays in force.
        let b = plan(flag(1 << 30), 12 << 20, reserved, 1000);
        assert_eq!((b.max_counters, b.limited_by_memory), (1000, false));
        // A limit smaller than what is kept back still counts something.
        assert_eq!(
            plan(flag(8 << 20), 12 << 20, reserved, 13_000_000).max_counters,
            MIN_COUNTERS
        );
        // No limit: --max-counters alone.
        let b = plan(None, 12 << 20, reserved, 13_000_000);
        assert_eq!((b.max_counters, b.limited_by_memory), (13_000_000, false));
    }

    #[test]
    fn this_process_has_a_resident_size() {
        let r = resident_bytes();
        assert!(r > 1 << 20 && r < 1 << 40, "{r}");
    }
}
