//! The `redis-far` section: the Redis store with its redis-server 250 µs
//! away each way, one script call out at a time against several.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::delay_proxy::DelayProxy;
use crate::procs::divvy::{start_divvy_with, Divvy, POLICY};
use crate::procs::placement::{any_cpu_command, unpin_thread};
use crate::procs::redis::{start_redis_with, RedisProc};
use crate::sections::line::{line_pairs, LINE_LOADS};
use crate::sections::redis::paced_pair;
use crate::stats::format::{pct_ratios, ratio};
use crate::stats::summary::Summary;
use crate::stats::tally::Target;

/// The redis-far section's delay each way between divvy and its Redis: a
/// redis-server in the same zone (half a millisecond of round trip asked;
/// the proxy's sleeps overshoot, and the section prints the `PING` round
/// trip it measures).
pub const REDIS_FAR_DELAY: Duration = Duration::from_micros(250);
/// `--redis-batches-in-flight` of the redis-far section's second divvy.
pub const REDIS_FAR_IN_FLIGHT: &str = "8";

/// The Redis store with Redis half a millisecond away: the default of one
/// script call out at a time next to [`REDIS_FAR_IN_FLIGHT`], at the maximum
/// and paced (see the file's documentation).
pub fn redis_far_section(rt: &Runtime, run: Duration, summary: &mut Summary) {
    println!(
        "\n## redis-far: Redis store, redis-server {} µs away each way; \
         --redis-batches-in-flight 1 (the default) vs {REDIS_FAR_IN_FLIGHT}",
        REDIS_FAR_DELAY.as_micros()
    );
    let setup = start_servers();
    let redis = setup.redis.child.id();
    let targets = [
        Target {
            addr: setup.one.line,
            pids: vec![("divvy", setup.one.pid()), ("redis", redis)],
        },
        Target {
            addr: setup.more.line,
            pids: vec![("divvy", setup.more.pid()), ("redis", redis)],
        },
    ];
    let more_label = format!("{REDIS_FAR_IN_FLIGHT} calls out");
    let Some(max) = max_rows(rt, &targets, &more_label, run, summary) else {
        return;
    };
    paced_pair(
        rt,
        &targets,
        ["1 call out", &more_label],
        (max, run),
        "redis-far",
        |share, rate| {
            format!(
                "{} conns paced at {share:.0}% of the default's maximum ({rate:.0}/s), {more_label} (baseline: 1)",
                LINE_LOADS[0].1
            )
        },
        summary,
    );
}

/// The section's processes, dropped (stopped) in this order.
struct Setup {
    more: Divvy,
    one: Divvy,
    _proxy: DelayProxy,
    redis: RedisProc,
}

/// Starts the redis-server behind its delaying proxy and both divvy
/// servers on it, and prints the topology.
fn start_servers() -> Setup {
    let redis = start_redis_with(any_cpu_command("redis-server"));
    let proxy = DelayProxy::start(redis.port, REDIS_FAR_DELAY, unpin_thread);
    println!(
        "  topology: redis :{} (not pinned) <- proxy :{} in this process (PING round trip, median of 5: {:.2} ms) <- both divvy",
        redis.port,
        proxy.port,
        proxy.round_trip().as_secs_f64() * 1000.0
    );
    let url = proxy.url();
    let one = start_divvy_with(POLICY, &["--redis-url", &url]);
    let more = start_divvy_with(
        POLICY,
        &[
            "--redis-url",
            &url,
            "--redis-batches-in-flight",
            REDIS_FAR_IN_FLIGHT,
        ],
    );
    Setup {
        more,
        one,
        _proxy: proxy,
        redis,
    }
}

/// [`LINE_LOADS`]' 64 x 1 on both `targets` (one call out, then
/// `more_label`): rows, ratios and summary rows; the default's HIT/s.
fn max_rows(
    rt: &Runtime,
    targets: &[Target; 2],
    more_label: &str,
    run: Duration,
    summary: &mut Summary,
) -> Option<f64> {
    let loads = [LINE_LOADS[0]];
    let mut max = None;
    for (name, [mut a, mut b]) in line_pairs(rt, targets, ["1 call out", more_label], run, &loads) {
        max = Some(a.rate());
        println!(
            "  {more_label} / 1: {name}: HIT/s {}, p50 / p99 / p99.9 {}",
            ratio(b.rate(), a.rate()),
            pct_ratios(&mut b.f, &mut a.f)
        );
        summary.rate_and_latency(
            "redis-far",
            &format!("{name}, {more_label} (baseline: 1, the default)"),
            &mut b,
            &mut a,
        );
    }
    max
}
