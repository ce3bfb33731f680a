//! The `over-limit` section: the Redis store under the common shape of
//! abuse (90 % of HITs on 10 actors over their limit), with the over-limit
//! cache off and on; Redis script calls and CPU per HIT.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::line::line_concurrent_answered;
use crate::procs::divvy::start_divvy_with;
use crate::procs::redis::{script_calls, start_redis};
use crate::stats::format::{print_row, ratio_opt, us};
use crate::stats::summary::Summary;
use crate::stats::tally::{abba, Target};

/// 10 HITs an hour per client address: the hot actors are over it at once.
const POLICY: &str = "default: {creditLimit: 10, resetSeconds: 3600, actorField: ip}\n";

/// Connection `conn`'s `i`th HIT: nine in ten from one of 10 hot actors,
/// the tenth from an actor of its own (allowed).
fn abuse_line(conn: u64, i: u64) -> String {
    if i.is_multiple_of(10) {
        let n = conn * 1_000_000 + i;
        format!(
            "HIT ip=10.{}.{}.{}\n",
            (n >> 16) & 255,
            (n >> 8) & 255,
            n & 255
        )
    } else {
        format!("HIT ip=192.0.2.{}\n", (conn + i) % 10)
    }
}

/// Two divvy servers, each on its own redis-server, one with
/// `--over-limit-cache 0`: 64 connections x 1 in flight, ABBA.
pub fn over_limit_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!("\n## over-limit: Redis store, 90% of HITs on 10 actors over their limit, 64 conns x 1; over-limit cache off vs on");
    let (redis_off, redis_on) = (start_redis(), start_redis());
    let url = |port: u16| format!("redis://127.0.0.1:{port}");
    let off = start_divvy_with(
        POLICY,
        &[
            "--redis-url",
            &url(redis_off.port),
            "--over-limit-cache",
            "0",
        ],
    );
    let on = start_divvy_with(POLICY, &["--redis-url", &url(redis_on.port)]);
    let targets = [
        Target {
            addr: off.line,
            pids: vec![("divvy", off.pid()), ("redis", redis_off.child.id())],
        },
        Target {
            addr: on.line,
            pids: vec![("divvy", on.pid()), ("redis", redis_on.child.id())],
        },
    ];
    let before = [script_calls(redis_off.port), script_calls(redis_on.port)];
    let [mut b, mut d] = abba(rt, [&targets[0], &targets[1]], run, |addr, run| {
        line_concurrent_answered(addr, run, 64, (abuse_line, "OK "))
    });
    let after = [script_calls(redis_off.port), script_calls(redis_on.port)];
    let per_hit = |k: usize, hits: u64| {
        after[k]
            .zip(before[k])
            .map(|(a, b)| a.saturating_sub(b) as f64 / hits.max(1) as f64)
    };
    let calls = [per_hit(0, b.f.requests), per_hit(1, d.f.requests)];
    for (label, t, c) in [
        ("cache off", &mut b, calls[0]),
        ("cache on", &mut d, calls[1]),
    ] {
        let note = format!(
            "{}; Redis script calls/HIT {}",
            t.cpu_note("HIT"),
            c.map_or_else(|| String::from("?"), |c| format!("{c:.3}"))
        );
        print_row(label, &mut t.f, "HIT/s", &note);
    }
    println!(
        "  on / off: divvy cpu/HIT {}, redis cpu/HIT {}",
        ratio_opt(d.cpu_us(0), b.cpu_us(0)),
        ratio_opt(d.cpu_us(1), b.cpu_us(1))
    );
    summary.rate(
        "over-limit",
        "HIT/s, 90% on 10 actors over their limit, 64 x 1 (baseline: cache off)",
        &d,
        &b,
    );
    summary.cpu(
        "over-limit",
        "divvy CPU µs/HIT (baseline: cache off)",
        &d,
        &b,
    );
    summary.row(
        "over-limit",
        "Redis script calls per HIT / Redis CPU µs per HIT (baseline: cache off)",
        format!("{} / {}", fmt_calls(calls[1]), us(d.cpu_us(1))),
        format!("{} / {}", fmt_calls(calls[0]), us(b.cpu_us(1))),
        format!(
            "{} calls, {} Redis CPU",
            ratio_opt(calls[1], calls[0]),
            ratio_opt(d.cpu_us(1), b.cpu_us(1))
        ),
    );
}

fn fmt_calls(c: Option<f64>) -> String {
    c.map_or_else(|| String::from("?"), |c| format!("{c:.3}"))
}
