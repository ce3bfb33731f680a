//! The soak: real processes on loopback (a redis-server behind a fault
//! proxy, two divvy replicas on it, a real Envoy in front of each with
//! Envoy's defaults: a 20 ms timeout and `failure_mode_deny: true`), a
//! steady load through both Envoys (a global limit among its rules), a
//! gRPC load in the xDS domain straight to both replicas, and faults on a
//! random schedule from a printed seed. It asserts, and prints as a report
//! at the end: every request decided (no 5xx but in a replica kill's first
//! second; every gRPC call but to replica 0 while it is down), no limit
//! over-admitted beyond the failure policy's allowance, each fault's
//! recovery within its bound, resources flat, no panic and no ERROR line a
//! fault does not explain. It exits 1 when any of that fails.
//!
//! Two ways to run the one source (see docs/reliability.md, "Soak"):
//! - `cargo test --bench soak -- --minutes 2 --seed 7`: the debug build of
//!   divvy (what `tests/run-all.sh` runs);
//! - `cargo bench --bench soak -- --minutes 60`: the release build.
//!
//! Options: `--minutes M` (default 2; fractions allowed), `--seed N`
//! (default: drawn from the clock, and printed, so a failure can be
//! replayed); `SOAK_MINUTES` and `SOAK_SEED` stand for them.
//! `SOAK_DUMP=DIR` writes every request, fault and log line there;
//! `SOAK_DIVVY=/path/to/divvy` runs another build of divvy (the test
//! command's release build, say) instead of this profile's.

#[path = "../../tests/common/mod.rs"]
mod common;

mod checks;
mod dump;
mod faults;
mod global_limit;
mod governor;
mod grpc_load;
mod health;
mod hostile;
mod load;
mod rig;
mod rlqs;
mod sampler;
mod selfcheck;
mod tls;
mod xds;
mod zookeeper;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When the load began (Unix seconds): the report's times count from it.
pub static START: OnceLock<f64> = OnceLock::new();

/// The time now, in Unix seconds: the load's windows are epoch-aligned.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The run's length and seed.
struct Options {
    minutes: f64,
    seed: u64,
}

/// Reads `--minutes` and `--seed` (and ignores the `--bench` that `cargo
/// bench` passes).
fn options() -> Result<Options, String> {
    let env = |name: &str| std::env::var(name).ok();
    let mut minutes = env("SOAK_MINUTES");
    let mut seed = env("SOAK_SEED");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--minutes" => minutes = args.next(),
            "--seed" => seed = args.next(),
            "--bench" => {}
            other => {
                return Err(format!(
                    "unknown argument {other:?} (expected --minutes M, --seed N)"
                ))
            }
        }
    }
    let minutes = match minutes {
        None => 2.0,
        Some(m) => m.parse::<f64>().ok().filter(|m| *m >= 0.5).ok_or(format!(
            "--minutes {m:?}: a number of minutes, at least 0.5"
        ))?,
    };
    let seed = match seed {
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64),
        Some(s) => s
            .parse()
            .map_err(|_| format!("--seed {s:?}: an unsigned integer"))?,
    };
    Ok(Options { minutes, seed })
}

fn main() -> ExitCode {
    let opts = match options() {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    selfcheck::run();
    let divvy =
        std::env::var_os("SOAK_DIVVY").map_or_else(common::binary, std::path::PathBuf::from);
    println!(
        "soak: seed {} ({} minutes; replay with --seed {}), divvy at {}",
        opts.seed,
        opts.minutes,
        opts.seed,
        divvy.display()
    );
    let mut rng = common::seeded_rng(opts.seed);
    let mut rig = rig::Rig::start(divvy);
    let domain = rig.xds.source();
    for replica in &rig.replicas {
        let http = replica.http();
        let ready = faults::wait_until(60.0, || {
            rig::metric(http, "divvy_store_breaker_state") == Some(0.0)
                && rig::metric(http, "divvy_aux_rules") == Some(1.0)
                && rig::get(http, "/config").is_some_and(|(_, body)| body.contains(&domain))
        });
        let index = replica.index;
        assert!(
            ready.is_some(),
            "replica {index} did not reach Redis, ZooKeeper and the xDS control plane within 60 s"
        );
    }
    let seconds = opts.minutes * 60.0;
    let stop = Arc::new(AtomicBool::new(false));
    let addrs = rig.replicas.iter().map(rig::Replica::http).collect();
    let sampler = sampler::start(rig.pids.clone(), addrs, stop.clone());
    let start = now();
    START.set(start).expect("started once");
    let (records, load) = load::start([rig.envoy_port(0), rig.envoy_port(1)], seconds);
    let (calls, grpc) =
        grpc_load::start([rig.grpc(0), rig.grpc(1)], rig.tls.ca_pem.clone(), seconds);
    let stream = rlqs::start(rig.grpc(1), rig.tls.ca_pem.clone());
    // A quiet start: the report's first seconds show the steady state.
    std::thread::sleep(Duration::from_secs(5));
    let events = faults::run(&mut rig, &mut rng, start + seconds);
    let skipped = load.join().expect("load");
    grpc.join().expect("gRPC load");
    let mut findings = checks::Findings::default();
    stream.finish(start + 2.0, now(), &mut findings);
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler");
    let end = now();
    let records = std::mem::take(&mut *records.lock().unwrap());
    let calls = std::mem::take(&mut *calls.lock().unwrap());
    let log = rig.log.lock().unwrap().clone();
    if let Ok(dir) = std::env::var("SOAK_DUMP") {
        if let Err(e) = dump::write(&dir, &records, &events, &log) {
            eprintln!("soak: SOAK_DUMP={dir}: {e}");
        }
    }
    let tolerated = std::env::var("SOAK_5XX_TOLERATED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    checks::statuses(&records, &events, tolerated, &mut findings);
    let policy = sampler::policy_active(&samples);
    checks::admissions(&records, &events, &policy, &mut findings);
    global_limit::outages(&records, &events, &policy, &mut findings);
    grpc_load::check(&calls, &events, &policy, tolerated, &mut findings);
    global_limit::leases(&rig, &mut findings);
    findings.report += "faults (time, what, recovery):\n";
    checks::recoveries(&events, &mut findings);
    health::resources(&samples, start, end, &mut findings);
    health::timeline(&samples, start, end, &mut findings);
    health::logs(&log, &events, &mut findings);
    report(&opts, &rig, skipped, end - start, findings)
}

/// Prints the report; failure when anything was violated.
fn report(
    opts: &Options,
    rig: &rig::Rig,
    skipped: u64,
    took: f64,
    findings: checks::Findings,
) -> ExitCode {
    println!(
        "\n== soak report: seed {}, {:.0} s of load",
        opts.seed, took
    );
    print!("{}", findings.report);
    for (i, envoy) in rig.envoys.iter().enumerate() {
        let filter = "/stats?filter=(cluster.divvy.(health_check.(failure|success)|upstream_cx_connect_fail|upstream_rq_timeout)|ratelimit.(error|failure_mode_allowed))$";
        let stats = common::envoy::get(envoy.admin, filter, &[])
            .map(|(_, _, body)| {
                body.lines()
                    .filter(|l| l.contains(':'))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!("envoy {i}: {stats}");
    }
    for replica in &rig.replicas {
        let body = rig::get(replica.http(), "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let counts: Vec<String> = common::parse_metrics(&body)
            .into_iter()
            .filter(|(k, v)| {
                *v > 0.0
                    && (k.starts_with("divvy_errors_total")
                        || k.starts_with("divvy_failure_policy_decisions_total"))
            })
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!(
            "replica {} since its last start: {}",
            replica.index,
            counts.join(", ")
        );
    }
    println!("requests the load generator fell behind on and skipped: {skipped}");
    if findings.violations.is_empty() {
        println!("soak: PASSED (seed {})", opts.seed);
        return ExitCode::SUCCESS;
    }
    println!(
        "soak: FAILED (seed {}), {} violations:",
        opts.seed,
        findings.violations.len()
    );
    for v in &findings.violations {
        println!("  - {v}");
    }
    ExitCode::FAILURE
}
