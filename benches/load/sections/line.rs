//! The `line` section (the constant-answer line server against divvy on
//! the memory store) and the line loads every line section runs ABBA.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::line::{line_concurrent, line_load};
use crate::procs::baseline::{BaselineProc, BASELINE_LINE};
use crate::procs::divvy::start_divvy;
use crate::stats::format::{dur_ratio, print_row, ratio, ratio_opt};
use crate::stats::summary::Summary;
use crate::stats::tally::{abba, Tally, Target};

/// Line-protocol loads: a name, connections, requests in flight on each.
/// (name, connections, requests in flight on each, one HIT per write): the
/// last sends each HIT in its own write as its window refills, as a busy
/// client does, where the others write whatever the window allows at once.
pub const LINE_LOADS: [(&str, u64, usize, bool); 4] = [
    ("64 conns x 1 in flight", 64, 1, true),
    ("16 conns x 16 pipelined", 16, 16, false),
    ("1 conn x 256 pipelined", 1, 256, false),
    ("16 conns x 16, one HIT per write", 16, 16, true),
];

/// The line protocol on the memory store: the constant-answer server and divvy.
pub fn line_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!(
        "\n## line: divvy line protocol, memory store; constant-answer line server vs divvy \
         (every answer OK true, so HIT/s = req/s)\n  \
         baseline: built as divvy is (fat LTO, one codegen unit, mimalloc, divvy's runtime choice), \
         one write per read's answers"
    );
    let base = BaselineProc::start(BASELINE_LINE);
    let divvy = start_divvy();
    let targets = [
        Target {
            addr: base.addr,
            pids: vec![("server", base.pid())],
        },
        Target {
            addr: divvy.line,
            pids: vec![("server", divvy.pid())],
        },
    ];
    for (name, [mut b, mut d]) in line_pairs(rt, &targets, ["constant", "divvy"], run, &LINE_LOADS)
    {
        println!(
            "  divvy / constant: HIT/s {}, p99 {}, server cpu/HIT {}",
            ratio(d.rate(), b.rate()),
            dur_ratio(d.f.pct(0.99), b.f.pct(0.99)),
            ratio_opt(d.cpu_us(0), b.cpu_us(0))
        );
        summary.rate_and_latency("line", name, &mut d, &mut b);
        summary.cpu_split("line", &format!("server CPU µs/HIT, {name}"), &d, &b);
    }
}

/// Warms both targets up, then runs each line load on them in ABBA order
/// and prints a row for each (labelled `labels`): each load's name and
/// the two tallies, in the targets' order. Lazy: a load runs when the
/// caller asks for it, so the caller's lines follow its rows.
pub fn line_pairs<'a>(
    rt: &'a Runtime,
    targets: &'a [Target; 2],
    labels: [&'a str; 2],
    run: Duration,
    loads: &'a [(&'static str, u64, usize, bool)],
) -> impl Iterator<Item = (&'static str, [Tally; 2])> + 'a {
    rt.block_on(async {
        for t in targets {
            line_concurrent(t.addr, Duration::from_millis(500), 8).await;
        }
    });
    loads.iter().map(move |&(name, conns, window, single)| {
        let mut pair = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
            line_load(addr, run, conns, window, single)
        });
        for (t, label) in pair.iter_mut().zip(labels) {
            let note = t.cpu_note("HIT");
            print_row(&format!("{label}: {name}"), &mut t.f, "HIT/s", &note);
        }
        (name, pair)
    })
}
