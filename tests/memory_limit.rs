//! The memory budget through the real binary: a flood of distinct actors
//! under `--memory-limit 64Mi` (and under a cgroup's memory limit, where
//! the machine lets a test make one) keeps the process's resident memory
//! under the limit, every request is answered, and eviction is counted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::flood::{line_flood, mb, rss, RssWatch};
use common::{binary, parse_ok, Server};

const LIMIT: u64 = 64 << 20;
const ACTORS: usize = 2_000_000;
const POLICY: &str = "overrides:\n  - operation: {path: /flood}\n    label: flood\n    actorField: ip\n    creditLimit: 5\n    resetSeconds: 3600\ndefault: {creditLimit: 0}\n";

/// The `i`th distinct actor.
fn actor(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255) + &format!("-{i}")
}

/// Floods `server` with [`ACTORS`] distinct actors and checks what the
/// budget promises: RSS under [`LIMIT`] throughout, every request answered
/// (a fresh counter each: `OK true 4`), evictions counted, the caps exported.
fn flood_under_the_limit(server: &Server, what: &str) {
    let pid = server.pid();
    let samples = server.metric_samples();
    assert_eq!(
        samples.get("divvy_memory_budget_bytes").copied(),
        Some(LIMIT as f64),
        "{what}: the budget in force"
    );
    let cap = samples["divvy_max_counters"];
    assert!(
        cap >= 10_000.0 && cap < ACTORS as f64 / 2.0,
        "{what}: divvy_max_counters {cap} does not fit 64 MiB and the flood does not overflow it"
    );
    let before = rss(pid);
    let watch = RssWatch::start(pid);
    let started = Instant::now();
    let answers = line_flood(server.line, ACTORS, 8, &|i| {
        format!("HIT path=/flood ip={}", actor(i))
    });
    let took = started.elapsed();
    let (after, peak) = (rss(pid), watch.stop());
    for (i, a) in answers.iter().enumerate() {
        let (allowed, left, _) = parse_ok(a);
        assert!(allowed && left == 4, "{what}: request {i}: {a:?}");
    }
    let evicted = server.metric_samples()["divvy_counters_evicted_total"];
    println!(
        "{what}: {ACTORS} distinct actors in {:.1} s; cap {cap} counters; RSS before {:.1} MiB, after {:.1} MiB, peak {:.1} MiB (limit {:.0} MiB); {evicted} evicted",
        took.as_secs_f64(),
        mb(before),
        mb(after),
        mb(peak),
        mb(LIMIT),
    );
    assert!(peak < LIMIT, "{what}: RSS peaked at {:.1} MiB", mb(peak));
    assert!(
        evicted >= ACTORS as f64 - cap,
        "{what}: {evicted} evictions counted for {ACTORS} actors and a cap of {cap}"
    );
    // Still deciding after the flood: a counter of the flood's last actors
    // is still there (most recently used), and new ones still start fresh.
    let last =
        server.line_exchange(format!("HIT path=/flood ip={}\n", actor(ACTORS - 1)).as_bytes());
    assert!(last.starts_with("OK true 3 "), "{what}: {last}");
}

#[test]
fn a_flood_of_distinct_actors_stays_under_the_memory_limit() {
    let server = Server::with_policy_args(POLICY, "yaml", &["--memory-limit", "64Mi"]);
    flood_under_the_limit(&server, "--memory-limit 64Mi");
}

#[test]
fn a_bad_memory_limit_stops_the_start_with_its_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("divvy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let out = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&policy)
        .args(["--memory-limit", "lots"])
        .output()
        .expect("run divvy");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("`lots` is not a memory size"), "{err}");
}

/// A fresh memory cgroup with a 64 MiB limit: v2 where the unified
/// hierarchy has the memory controller, else v1's memory controller. `None`
/// (with the reason) where the machine does not let a test make one.
struct Cgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl Cgroup {
    fn make() -> Result<Cgroup, String> {
        let name = format!("divvy-test-{}", std::process::id());
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(Path::new)
            .find(|root| {
                std::fs::read_to_string(root.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            });
        let (dir, file) = match v2 {
            Some(root) => (root.join(&name), "memory.max"),
            None => (
                Path::new("/sys/fs/cgroup/memory").join(&name),
                "memory.limit_in_bytes",
            ),
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = Cgroup {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        std::fs::write(cgroup.dir.join(file), LIMIT.to_string())
            .map_err(|e| format!("cannot set {file}: {e}"))?;
        Ok(cgroup)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Without `--memory-limit`, the cgroup's limit is the budget.
#[test]
fn a_cgroup_memory_limit_is_the_default_budget() {
    let cgroup = match Cgroup::make() {
        Ok(c) => c,
        Err(why) => {
            println!("SKIPPED: no memory cgroup can be made on this machine ({why}); --memory-limit is tested on its own");
            return;
        }
    };
    println!("cgroup {}", cgroup.dir.display());
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("divvy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    // The shell joins the cgroup, then becomes divvy: the limit is in
    // force before divvy reads it.
    let mut command = Command::new("sh");
    command
        .args(["-c", r#"echo $$ > "$1" && shift && exec "$@""#, "sh"])
        .arg(&cgroup.procs)
        .arg(binary())
        .args(["serve", "--config"])
        .arg(&policy)
        .args(["--grpc-addr", "127.0.0.1:0", "--line-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0"])
        .env("DIVVY_LOG", "info")
        .env_remove("DIVVY_MEMORY_LIMIT");
    let server = Server::spawn(command);
    flood_under_the_limit(&server, "cgroup memory limit 64 MiB");
    drop(server);
}
