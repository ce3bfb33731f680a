//! The `compare` section: an older divvy build (`DIVVY_BENCH_BEFORE`)
//! and this one side by side, ABBA.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::grpc::GrpcGenerator;
use crate::procs::divvy::{divvy_binary, start_divvy_binary, POLICY};
use crate::sections::grpc::{grpc_max_pair, summarize_max, GRPC_CHANNELS, GRPC_STREAMS};
use crate::sections::line::{line_pairs, LINE_LOADS};
use crate::stats::format::print_row;
use crate::stats::summary::Summary;
use crate::stats::tally::Target;

/// The environment variable that names an older divvy build for the
/// `compare` section.
pub const COMPARE_ENV: &str = "DIVVY_BENCH_BEFORE";

/// Two divvy builds side by side in one run: `before` (an older build's
/// executable) and this one's (or `DIVVY_BENCH_BIN`'s), each on the
/// memory store, measured in halves in the order before, this, this,
/// before for each load (gRPC's maximum with the gRPC section's generator,
/// then the line loads), so that neither build gets the quieter moments.
/// Separate invocations, one per build, read whichever ran first lower in
/// every one of five pairs of `--only line` runs on these machines.
pub fn compare_section(rt: &Runtime, before: &str, run: Duration, summary: &mut Summary) {
    let generator = GrpcGenerator::pick();
    let this = divvy_binary();
    println!(
        "\n## compare: divvy at {before} ({COMPARE_ENV}) vs divvy at {this}, memory store, ABBA\n  \
         gRPC max: {}, {GRPC_CHANNELS} x {GRPC_STREAMS}; then the line loads",
        generator.describe()
    );
    let old = start_divvy_binary(before, POLICY, &[]);
    let new = start_divvy_binary(&this, POLICY, &[]);
    let grpc = [&old, &new].map(|server| Target {
        addr: server.grpc,
        pids: vec![("server", server.pid())],
    });
    let [mut b, mut d] = grpc_max_pair(rt, generator, &grpc, run);
    let name = format!("gRPC max, {GRPC_CHANNELS} x {GRPC_STREAMS} in flight");
    for (label, t) in [("before", &mut b), ("this", &mut d)] {
        let note = t.cpu_note("req");
        print_row(&format!("{label}: {name}"), &mut t.f, "req/s", &note);
    }
    summarize_max(
        summary,
        "compare",
        "gRPC (baseline: the build before) ",
        &d,
        &b,
    );
    let line = [&old, &new].map(|server| Target {
        addr: server.line,
        pids: vec![("server", server.pid())],
    });
    for (name, [b, d]) in line_pairs(rt, &line, ["before", "this"], run, &LINE_LOADS) {
        let before = "(baseline: the build before)";
        summary.rate("compare", &format!("line HIT/s, {name} {before}"), &d, &b);
        summary.cpu(
            "compare",
            &format!("line server CPU µs/HIT, {name} {before}"),
            &d,
            &b,
        );
    }
}
