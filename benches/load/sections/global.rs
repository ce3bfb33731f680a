//! The `global` section: a `scope: global` token bucket against the same
//! bucket local to the region, the global store 40 ms away each way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::delay_proxy::DelayProxy;
use crate::generators::line::{keep_alive, line_paced};
use crate::procs::divvy::{http_get, start_divvy_with, Divvy};
use crate::procs::placement::{any_cpu_command, placement, unpin_thread};
use crate::procs::redis::{start_redis_with, RedisProc};
use crate::procs::usage::cpu_time;
use crate::stats::figures::Figures;
use crate::stats::format::{dur_ratio, pcts, ratio, us};
use crate::stats::summary::Summary;

/// The latency proxy's delay, each way, between divvy and the global store.
pub const GLOBAL_DELAY: Duration = Duration::from_millis(40);
/// `--global-lease-ms` of the global divvy.
pub const GLOBAL_LEASE_MS: u64 = 2000;
/// Paced load of the global section: requests per second in all, over
/// this many connections.
pub const GLOBAL_RATE: f64 = 2000.0;
pub const GLOBAL_CONNS: u64 = 16;
/// Rounds of the global section: baseline and global take turns.
pub const GLOBAL_ROUNDS: u32 = 2;
/// Paced load on each server before measuring: past the global limit's
/// first lease (its 1% floor until then).
pub const GLOBAL_WARMUP: Duration = Duration::from_secs(2);
/// Requests per second each server gets all through the section (see
/// [`keep_alive`]).
pub const GLOBAL_KEEP_ALIVE: f64 = 10.0;

/// One token bucket per site, huge so nothing is denied; `scope: global`
/// or local to the region.
pub fn global_policy(global: bool) -> String {
    let scope = if global { " scope: global," } else { "" };
    format!(
        "overrides:\n  - operation: {{site: \"*\"}}\n    limits:\n      \
         - {{label: partner, actorField: site,{scope} creditLimit: 1000000, resetSeconds: 1, \
         algorithm: token_bucket, burst: 1000000}}\n\
         default: {{creditLimit: 0}}\n"
    )
}

/// The global divvy's lease after the warm-up, from `/global`.
pub fn lease_summary(divvy: &Divvy) -> String {
    let body = http_get(divvy.http, "/global");
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return format!("/global unreadable: {body:?}");
    };
    match v["leases"].as_array().and_then(|l| l.first()) {
        Some(l) => format!(
            "region {} lease: rate {} /s, burst {}, fallback {}, expires in {} s",
            v["region"], l["rate"], l["burst"], l["fallback"], l["expiresInSeconds"]
        ),
        None => format!("no lease yet: {v}"),
    }
}

/// Rows of the global section: rate, p50, p99, p99.9, then `note`.
pub fn print_global_row(name: &str, f: &mut Figures, note: &str) {
    println!(
        "{name:<30} {:>7.0} req/s  p50 {:>8.1?}  p99 {:>8.1?}  p99.9 {:>8.1?}  {note}",
        f.rate(),
        f.pct(0.50),
        f.pct(0.99),
        f.pct(0.999)
    );
}

/// A global limit's decision latency next to the same limit local to the
/// region, both on one regional redis-server, the global store 40 ms away
/// each way; see the file's documentation.
pub fn global_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!("\n## global: a scope: global token bucket vs the same bucket local to the region");
    let setup = start_servers();
    print_load(run);
    let servers = [
        ("baseline (local limit)", &setup.baseline),
        ("global (scope: global)", &setup.global),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let keep: Vec<_> = servers
        .iter()
        .map(|(_, divvy)| keep_alive(rt, divvy.line, GLOBAL_KEEP_ALIVE, stop.clone()))
        .collect();
    rt.block_on(async {
        for (_, divvy) in &servers {
            line_paced(divvy.line, GLOBAL_WARMUP, GLOBAL_RATE, GLOBAL_CONNS).await;
        }
    });
    println!("  after warm-up, {}", lease_summary(&setup.global));
    let totals = run_rounds(rt, &servers, &setup.regional, run);
    stop.store(true, Ordering::Relaxed);
    for ((name, _), k) in servers.iter().zip(keep) {
        let (sent, bad, first) = rt.block_on(k).expect("keep-alive");
        if bad > 0 {
            println!(
                "  keep-alive of {name}: {bad} of {sent} answers not OK true (first: {})",
                first.unwrap_or_default()
            );
        }
    }
    report(&servers, totals, summary);
    println!("  after the runs, {}", lease_summary(&setup.global));
}

/// The global section's processes, dropped (stopped) in this order.
struct Setup {
    global: Divvy,
    baseline: Divvy,
    _proxy: DelayProxy,
    regional: RedisProc,
    _global_redis: RedisProc,
}

/// Starts the global store behind its proxy, the regional redis-server and
/// both divvy servers, and prints the topology and the placement.
fn start_servers() -> Setup {
    // The redis-servers run on any CPU (not pinned with the servers).
    let global_redis = start_redis_with(any_cpu_command("redis-server"));
    let regional = start_redis_with(any_cpu_command("redis-server"));
    let proxy = DelayProxy::start(global_redis.port, GLOBAL_DELAY, unpin_thread);
    println!(
        "  topology: global redis :{} <- proxy :{} ({} ms each way, PING round trip, median of 5: {:.1} ms) \
         <- divvy; regional redis :{} <- both divvy",
        global_redis.port,
        proxy.port,
        GLOBAL_DELAY.as_millis(),
        proxy.round_trip().as_secs_f64() * 1000.0,
        regional.port,
    );
    let regional_url = format!("redis://127.0.0.1:{}", regional.port);
    let global_url = proxy.url();
    let lease_ms = GLOBAL_LEASE_MS.to_string();
    let baseline = start_divvy_with(&global_policy(false), &["--redis-url", &regional_url]);
    let global = start_divvy_with(
        &global_policy(true),
        &[
            "--redis-url",
            &regional_url,
            "--region",
            "r1",
            "--global-url",
            &global_url,
            "--global-lease-ms",
            &lease_ms,
        ],
    );
    println!(
        "  placement: {} (the proxy runs in this process, its threads unpinned); redis-servers unpinned",
        placement().note
    );
    Setup {
        global,
        baseline,
        _proxy: proxy,
        regional,
        _global_redis: global_redis,
    }
}

/// The load line of the section's header.
fn print_load(run: Duration) {
    println!(
        "  load: line protocol HIT site=partner1, {GLOBAL_RATE:.0} req/s paced over {GLOBAL_CONNS} conns \
         (1 in flight each), {:.0} s per run, {GLOBAL_ROUNDS} rounds each, interleaved; \
         {:.0} s warm-up per server; every answer OK true; {GLOBAL_KEEP_ALIVE:.0} req/s on \
         1 more conn to each server all along, so neither sits idle while the other is measured",
        run.as_secs_f64(),
        GLOBAL_WARMUP.as_secs_f64()
    );
}

/// One server's figures over every round, and the CPU time divvy and the
/// regional redis-server spent on them (runs with both readings only).
#[derive(Default)]
struct Total {
    f: Option<Figures>,
    divvy_cpu: Duration,
    redis_cpu: Duration,
}

/// [`GLOBAL_ROUNDS`] rounds of paced load, each server in turn, a row per
/// run; the totals in the order of `servers`.
fn run_rounds(
    rt: &Runtime,
    servers: &[(&str, &Divvy); 2],
    regional: &RedisProc,
    run: Duration,
) -> [Total; 2] {
    let mut totals: [Total; 2] = Default::default();
    for round in 0..GLOBAL_ROUNDS as usize {
        for k in 0..servers.len() {
            // Each round starts with the other server.
            let k = (round + k) % servers.len();
            let (name, divvy) = servers[k];
            let (mut f, note) = one_run(rt, divvy, regional, run, &mut totals[k]);
            print_global_row(&format!("  round {}: {name}", round + 1), &mut f, &note);
            totals[k].f = Some(match totals[k].f.take() {
                None => f,
                Some(sum) => sum.add(f),
            });
        }
    }
    totals
}

/// One paced run on `divvy`: its figures and a note of the CPU time per
/// request of divvy and of the `regional` redis-server, that CPU time
/// added to `total`.
fn one_run(
    rt: &Runtime,
    divvy: &Divvy,
    regional: &RedisProc,
    run: Duration,
    total: &mut Total,
) -> (Figures, String) {
    let before = (cpu_time(divvy.child.id()), cpu_time(regional.child.id()));
    let f = rt.block_on(line_paced(divvy.line, run, GLOBAL_RATE, GLOBAL_CONNS));
    let after = (cpu_time(divvy.child.id()), cpu_time(regional.child.id()));
    let per_request = |b: Option<Duration>, a: Option<Duration>| match (b, a) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b)),
        _ => None,
    };
    let (d, r) = (
        per_request(before.0, after.0),
        per_request(before.1, after.1),
    );
    let n = f.requests.max(1) as f64;
    let note = match (d, r) {
        (Some(d), Some(r)) => {
            total.divvy_cpu += d;
            total.redis_cpu += r;
            format!(
                "cpu/req divvy {:.1} µs, redis {:.1} µs",
                d.as_secs_f64() * 1e6 / n,
                r.as_secs_f64() * 1e6 / n
            )
        }
        _ => String::from("(no /proc cpu times)"),
    };
    (f, note)
}

/// The rows of all rounds, the global / baseline ratios and the summary's
/// rows.
fn report(servers: &[(&str, &Divvy); 2], totals: [Total; 2], summary: &mut Summary) {
    println!("  all rounds:");
    let mut rows = Vec::new();
    for (k, total) in totals.into_iter().enumerate() {
        let mut f = total.f.expect("at least one round");
        let n = f.requests.max(1) as f64;
        let cpu = total.divvy_cpu.as_secs_f64() * 1e6 / n;
        let note = format!(
            "{} requests, cpu/req divvy {cpu:.1} µs, redis {:.1} µs",
            f.requests,
            total.redis_cpu.as_secs_f64() * 1e6 / n
        );
        print_global_row(&format!("  {}", servers[k].0), &mut f, &note);
        rows.push(([f.pct(0.50), f.pct(0.99), f.pct(0.999)], pcts(&mut f), cpu));
    }
    let (b, g) = (&rows[0], &rows[1]);
    let ratios = format!(
        "{} / {} / {}",
        dur_ratio(g.0[0], b.0[0]),
        dur_ratio(g.0[1], b.0[1]),
        dur_ratio(g.0[2], b.0[2])
    );
    println!("  global / baseline: p50 / p99 / p99.9 {ratios}");
    summary.row(
        "global",
        &format!(
            "p50 / p99 / p99.9 at {GLOBAL_RATE:.0} req/s paced, global store {} ms away (baseline: local limit)",
            GLOBAL_DELAY.as_millis()
        ),
        g.1.clone(),
        b.1.clone(),
        ratios,
    );
    summary.row(
        "global",
        "divvy CPU µs/req (baseline: local limit)",
        us(Some(g.2)),
        us(Some(b.2)),
        ratio(g.2, b.2),
    );
}
