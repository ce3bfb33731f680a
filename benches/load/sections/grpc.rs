//! The `grpc` section: ShouldRateLimit on the memory store, the do-nothing
//! tonic server against divvy, maximum throughput and paced latency.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::grpc::{grpc_answers_ok, grpc_concurrent, GrpcGenerator};
use crate::generators::h2::{grpc_paced, paced_bodies, PACED_ACTORS, PACE_QUANTUM};
use crate::generators::h2load::h2load_grpc;
use crate::procs::baseline::{BaselineProc, BASELINE_GRPC};
use crate::procs::divvy::start_divvy;
use crate::stats::figures::Figures;
use crate::stats::format::{pct_ratios, pcts, percent, print_row, ratio, ratio_opt};
use crate::stats::summary::Summary;
use crate::stats::tally::{abba, Tally, Target};

/// gRPC load: this many HTTP/2 connections (tonic Channels), ...
pub const GRPC_CHANNELS: u64 = 16;
/// ... with this many calls in flight on each at maximum throughput.
pub const GRPC_STREAMS: u64 = 32;
/// Paced gRPC load, as fractions of the do-nothing server's maximum.
pub const GRPC_PACED: [f64; 2] = [0.25, 0.5];

/// Maximum-throughput gRPC load through `generator`.
pub async fn grpc_max(generator: GrpcGenerator, addr: SocketAddr, run: Duration) -> Figures {
    match generator {
        GrpcGenerator::H2load => h2load_grpc(addr, run, GRPC_CHANNELS, GRPC_STREAMS).await,
        GrpcGenerator::Tonic => {
            grpc_concurrent(addr, run, GRPC_CHANNELS * GRPC_STREAMS, GRPC_CHANNELS).await
        }
    }
}

/// Checks each target's answer to the call h2load repeats (h2load sees
/// HTTP statuses only; the counter only grows, so OK after the runs means
/// OK throughout).
pub fn grpc_all_ok(rt: &Runtime, targets: &[Target]) {
    rt.block_on(async {
        for t in targets {
            grpc_answers_ok(t.addr).await;
        }
    });
}

/// gRPC's maximum on both targets, ABBA, after their answers are checked
/// and each is warmed up for 500 ms; the answers are checked again after.
pub fn grpc_max_pair(
    rt: &Runtime,
    generator: GrpcGenerator,
    targets: &[Target; 2],
    run: Duration,
) -> [Tally; 2] {
    grpc_all_ok(rt, targets);
    rt.block_on(async {
        for t in targets {
            grpc_max(generator, t.addr, Duration::from_millis(500)).await;
        }
    });
    let pair = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
        grpc_max(generator, addr, run)
    });
    grpc_all_ok(rt, targets);
    pair
}

/// gRPC on the memory store: the do-nothing tonic server and divvy, maximum
/// throughput and paced latency.
pub fn grpc_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    let generator = GrpcGenerator::pick();
    print_header(generator);
    let base = BaselineProc::start(BASELINE_GRPC);
    let divvy = start_divvy();
    let targets = [
        Target {
            addr: base.addr,
            pids: vec![("server", base.pid())],
        },
        Target {
            addr: divvy.grpc,
            pids: vec![("server", divvy.pid())],
        },
    ];
    let max = max_rows(rt, generator, &targets, run, summary);
    let bodies = paced_bodies();
    for share in GRPC_PACED {
        paced_rows(rt, &targets, (share, max * share), run, &bodies, summary);
    }
    grpc_all_ok(rt, &targets);
}

/// The section's header: the generators and the loads.
fn print_header(generator: GrpcGenerator) {
    let paced = format!(
        "this program's h2 client (the `h2` crate, no tonic), a thread keeping the schedule \
         to {:?} over {PACED_ACTORS} actors, latency from each call's scheduled send",
        PACE_QUANTUM
    );
    println!(
        "\n## grpc: ShouldRateLimit, memory store; do-nothing tonic server vs divvy\n  \
         baseline: built as divvy is (the bench profile inherits release: fat LTO, one codegen \
         unit; mimalloc; the runtime divvy picks for its CPUs)\n  \
         generator: {}\n  \
         max: {GRPC_CHANNELS} HTTP/2 connections x {GRPC_STREAMS} calls in flight each; \
         paced: open loop at {:?} of the do-nothing maximum, {paced}",
        generator.describe(),
        GRPC_PACED.map(|p| format!("{:.0}%", p * 100.0))
    );
}

/// The maximum on the do-nothing server and divvy (`targets`): their rows,
/// the ratios and the summary's rows; the do-nothing server's maximum.
fn max_rows(
    rt: &Runtime,
    generator: GrpcGenerator,
    targets: &[Target; 2],
    run: Duration,
    summary: &mut Summary,
) -> f64 {
    let [mut b, mut d] = grpc_max_pair(rt, generator, targets, run);
    let name = format!("max, {GRPC_CHANNELS} x {GRPC_STREAMS} in flight");
    let note = b.cpu_note("req");
    print_row(&format!("do-nothing: {name}"), &mut b.f, "req/s", &note);
    let note = d.cpu_note("req");
    print_row(&format!("divvy: {name}"), &mut d.f, "req/s", &note);
    println!(
        "  divvy / do-nothing: throughput {}, server cpu/req {}",
        ratio(d.rate(), b.rate()),
        ratio_opt(d.cpu_us(0), b.cpu_us(0))
    );
    summarize_max(summary, "grpc", "", &d, &b);
    b.rate()
}

/// Paced load at `rate` calls/s (`share` of the do-nothing maximum) on both
/// `targets`, ABBA: each one's row with the generator's send lag, the
/// ratios and the summary's row. `bodies` are [`paced_bodies`].
fn paced_rows(
    rt: &Runtime,
    targets: &[Target; 2],
    (share, rate): (f64, f64),
    run: Duration,
    bodies: &Arc<Vec<bytes::Bytes>>,
    summary: &mut Summary,
) {
    let [mut b, mut d] = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
        grpc_paced(addr, run, rate, GRPC_CHANNELS, bodies.clone())
    });
    let label = format!("paced {:.0}% ({rate:.0}/s)", share * 100.0);
    for (who, t) in [("do-nothing", &mut b), ("divvy", &mut d)] {
        let note = format!(
            "send lag p50 {:.1?} p99 {:.1?}; {}{}",
            t.f.lag_pct(0.5),
            t.f.lag_pct(0.99),
            if t.f.lost > 0 {
                format!("{} calls unanswered; ", t.f.lost)
            } else {
                String::new()
            },
            t.cpu_note("req")
        );
        print_row(&format!("{who}: {label}"), &mut t.f, "req/s", &note);
    }
    println!(
        "  divvy / do-nothing at {:.0}%: p50 / p99 / p99.9 {}, server cpu/req {}",
        share * 100.0,
        pct_ratios(&mut d.f, &mut b.f),
        ratio_opt(d.cpu_us(0), b.cpu_us(0))
    );
    let behind = behind_schedule(&mut b, &mut d);
    if !behind.is_empty() {
        println!("  {}", behind.trim_start_matches("; "));
    }
    summary.row(
        "grpc",
        &format!(
            "p50 / p99 / p99.9 paced at {:.0}% of do-nothing max ({rate:.0}/s){behind}",
            share * 100.0
        ),
        pcts(&mut d.f),
        pcts(&mut b.f),
        pct_ratios(&mut d.f, &mut b.f),
    );
}

/// A note for a paced pair of runs in which the generator could not keep its
/// schedule (a send lag p50 over [`PACE_QUANTUM`] in either run): its own
/// queue then counts in both servers' latencies, and the pair measures the
/// generator as much as the servers. Empty when it kept up.
pub fn behind_schedule(b: &mut Tally, d: &mut Tally) -> String {
    let (lb, ld) = (b.f.lag_pct(0.5), d.f.lag_pct(0.5));
    if lb <= PACE_QUANTUM && ld <= PACE_QUANTUM {
        return String::new();
    }
    format!(
        "; the generator fell behind its schedule (send lag p50 {lb:.1?} do-nothing, \
         {ld:.1?} divvy): its queue counts in both"
    )
}

/// The rows of gRPC's maximum in `section`, each measurement named
/// after `prefix`: throughput, server CPU per call and the generator's
/// CPU, `d` against the baseline `b`.
pub fn summarize_max(summary: &mut Summary, section: &str, prefix: &str, d: &Tally, b: &Tally) {
    let streams = format!("{GRPC_CHANNELS} conns x {GRPC_STREAMS} streams");
    summary.rate(section, &format!("{prefix}max req/s, {streams}"), d, b);
    summary.cpu_split(section, &format!("{prefix}server CPU µs/req at max"), d, b);
    summary.row(
        section,
        &format!("{prefix}load generator CPU at max (near 100%: the generator bounds max)"),
        percent(d.load_util()),
        percent(b.load_util()),
        String::from("–"),
    );
}
