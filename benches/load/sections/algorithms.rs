//! The `algorithms` section: each counting algorithm's rule, one divvy
//! each, on the memory and Redis stores, as ratios to `window`.

use std::time::Duration;

use tokio::runtime::Runtime;

use crate::generators::line::line_concurrent_with;
use crate::procs::divvy::{start_divvy_with, Divvy};
use crate::procs::redis::RedisProc;
use crate::stats::format::{dur_ratio, print_row, ratio, ratio_opt, thousands, us};
use crate::stats::summary::Summary;
use crate::stats::tally::{measure, Tally};

/// Rounds of the algorithms section: each rule runs `--seconds / ROUNDS` per
/// round, the rules in turn, so that noise on a shared machine spreads over
/// all of them instead of landing on one.
pub const ROUNDS: u32 = 4;

/// The rules of the algorithms section, one divvy each: a name and the rule's
/// limit fields. Limits are huge so nothing is denied; `window` (the
/// default algorithm, written as before algorithms existed) is the baseline.
pub const ALGORITHM_RULES: [(&str, &str); 7] = [
    (
        "window",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip",
    ),
    (
        "fixed",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: fixed",
    ),
    (
        "sliding",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: sliding",
    ),
    (
        "token_bucket",
        "creditLimit: 1000000000\n    resetSeconds: 1h\n    actorField: ip\n    algorithm: token_bucket\n    burst: 1000000000",
    ),
    (
        "2 token_bucket limits",
        "limits:
      - {creditLimit: 1000000000, resetSeconds: 1h, algorithm: token_bucket, burst: 1000000000, actorField: ip}
      - {creditLimit: 1000000000, resetSeconds: 1h, algorithm: token_bucket, burst: 1000000000, actorField: user}",
    ),
    // One counter for the whole rule, and the same divided among its 64 users.
    (
        "token_bucket, one counter",
        "creditLimit: 1000000\n    resetSeconds: 1s\n    algorithm: token_bucket\n    burst: 1000000",
    ),
    (
        "token_bucket, one counter, fairShare: user",
        "creditLimit: 1000000\n    resetSeconds: 1s\n    algorithm: token_bucket\n    burst: 1000000\n    fairShare: user",
    ),
];

/// A policy whose one override is `rule` (see [`ALGORITHM_RULES`]).
pub fn algorithm_policy(rule: &str) -> String {
    format!(
        "overrides:\n  - operation: {{path: /bench, ip: \"*\", user: \"*\"}}\n    {rule}\n\
         default:\n  creditLimit: 1000000000\n  resetSeconds: 1h\n"
    )
}

/// The one request of connection `conn` in the algorithms section: the
/// same actor (ip and user) on every request of a connection.
pub fn actor_line(conn: u64, _i: u64) -> String {
    format!(
        "HIT path=/bench ip=10.2.{}.{} user=u{conn}\n",
        conn / 256,
        conn % 256
    )
}

/// The algorithms section on both stores: the memory store, then the
/// Redis store on `redis`; `seconds` is `--seconds` as given.
pub fn algorithms_sections(
    rt: &Runtime,
    redis: &RedisProc,
    seconds: f64,
    run: Duration,
    summary: &mut Summary,
) {
    let url = format!("redis://127.0.0.1:{}", redis.port);
    println!(
        "\n## algorithms: line, 64 conns x 1 in flight, one actor per conn, nothing denied \
         (req/s = HIT/s);\n  {seconds} s per rule in {ROUNDS} interleaved rounds, one divvy per rule"
    );
    algorithms_section(rt, "memory store", &[], None, run, summary);
    algorithms_section(
        rt,
        "redis store",
        &["--redis-url", &url],
        Some(redis.child.id()),
        run,
        summary,
    );
}

/// Each rule of [`ALGORITHM_RULES`] on one store (`extra`: divvy's store
/// flags; `redis`: the redis-server's pid, whose CPU time is counted too),
/// one divvy per rule, line protocol, 64 connections x 1 in flight, `run` in
/// all per rule, interleaved in [`ROUNDS`] rounds. Ratios are to `window`;
/// a second divvy with the window rule shows the noise floor.
fn algorithms_section(
    rt: &Runtime,
    store: &str,
    extra: &[&str],
    redis: Option<u32>,
    run: Duration,
    summary: &mut Summary,
) {
    let rules: Vec<(&str, &str)> = ALGORITHM_RULES
        .into_iter()
        .chain([("window, 2nd divvy", ALGORITHM_RULES[0].1)])
        .collect();
    let tallies = measure_rules(rt, &rules, extra, redis, run);
    report(store, &rules, tallies, summary);
}

/// One divvy per rule of `rules` (started with `extra`), warmed up, then
/// measured `run` in all per rule over [`ROUNDS`] rounds; a tally per rule.
fn measure_rules(
    rt: &Runtime,
    rules: &[(&str, &str)],
    extra: &[&str],
    redis: Option<u32>,
    run: Duration,
) -> Vec<Tally> {
    let servers: Vec<Divvy> = rules
        .iter()
        .map(|(_, rule)| start_divvy_with(&algorithm_policy(rule), extra))
        .collect();
    let mut tallies: Vec<Option<Tally>> = rules.iter().map(|_| None).collect();
    rt.block_on(async {
        for divvy in &servers {
            line_concurrent_with(divvy.line, Duration::from_millis(300), 8, actor_line).await;
        }
    });
    for round in 0..ROUNDS as usize {
        for k in 0..servers.len() {
            // Each round starts one rule later, so no rule always runs first.
            let k = (round + k) % servers.len();
            let mut pids = vec![("divvy", servers[k].pid())];
            pids.extend(redis.map(|p| ("redis", p)));
            let t = measure(
                rt,
                &pids,
                line_concurrent_with(servers[k].line, run / ROUNDS, 64, actor_line),
            );
            tallies[k] = Some(match tallies[k].take() {
                None => t,
                Some(sum) => sum.add(t),
            });
        }
    }
    drop(servers);
    tallies
        .into_iter()
        .map(|t| t.expect("at least one round"))
        .collect()
}

/// HIT/s and CPU µs per HIT (divvy's, then Redis's on the Redis store).
fn cell(t: &Tally) -> String {
    match t.cpu_us(1) {
        Some(r) => format!(
            "{} HIT/s, {} + redis {}",
            thousands(t.rate()),
            us(t.cpu_us(0)),
            us(Some(r))
        ),
        None => format!("{} HIT/s, {}", thousands(t.rate()), us(t.cpu_us(0))),
    }
}

/// A row per rule on `store`, the first (`window`) the baseline of the
/// others' ratios and summary rows.
fn report(store: &str, rules: &[(&str, &str)], tallies: Vec<Tally>, summary: &mut Summary) {
    let mut window: Option<(f64, Duration, Option<f64>, String)> = None;
    for ((name, _), mut t) in rules.iter().zip(tallies) {
        let (rate, p99, cpu) = (t.rate(), t.f.pct(0.99), t.cpu_us(0));
        let Some((w, w99, wcpu, wcell)) = &window else {
            let note = format!("(baseline); {}", t.cpu_note("HIT"));
            print_row(&format!("{store}: {name}"), &mut t.f, "HIT/s", &note);
            window = Some((rate, p99, cpu, cell(&t)));
            continue;
        };
        let note = format!(
            "{name} / window = {}, p99 {}, divvy cpu/HIT {}; {}",
            ratio(rate, *w),
            dur_ratio(p99, *w99),
            ratio_opt(cpu, *wcpu),
            t.cpu_note("HIT")
        );
        print_row(&format!("{store}: {name}"), &mut t.f, "HIT/s", &note);
        summary.row(
            "algorithms",
            &format!("{store}: {name} vs window, 64 x 1: HIT/s, divvy CPU/HIT"),
            cell(&t),
            wcell.clone(),
            format!(
                "{} (divvy CPU/HIT {})",
                ratio(rate, *w),
                ratio_opt(cpu, *wcpu)
            ),
        );
    }
}
