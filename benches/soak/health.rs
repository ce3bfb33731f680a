//! The checks on the replicas themselves: resources flat over the run's
//! last part, no panic, and no ERROR log line a fault does not explain.

use std::fmt::Write;

use crate::checks::Findings;
use crate::faults::Event;
use crate::rig::LogLine;
use crate::sampler::Sample;

/// Growth allowed from the mark to the end.
const GROWTH: f64 = 0.10;

/// Open descriptors allowed beyond [`GROWTH`]: a few connections more or
/// less at the moment of a sample is no leak.
const FD_SLACK: f64 = 3.0;

/// Threads allowed beyond [`GROWTH`]: tokio's blocking pool (file reads,
/// name lookups) starts threads on demand and keeps each 10 s past its
/// last use, so a replica of 6 threads reads 6 or 7 (the hour's run: 6 to
/// 7 at minute 40, 7 to its end).
const THREAD_SLACK: f64 = 2.0;

/// A resource: its name, how to read it from a sample, the absolute
/// growth allowed beyond [`GROWTH`].
type Measure = (&'static str, fn(&Sample) -> f64, f64);

/// The mark: ten minutes before the end, or half-way through a shorter
/// run. The mean of the samples within five seconds of it is compared
/// with the mean of the last ten, for each replica process that ran from
/// before the mark to the end.
pub fn resources(samples: &[Sample], from: f64, to: f64, out: &mut Findings) {
    let mark = (to - 600.0).max(from + (to - from) / 2.0);
    let _ = writeln!(
        out.report,
        "resources (at the mark, {:.0} s in → at the end):",
        mark - from
    );
    for replica in 0..2 {
        let Some(last) = samples.iter().rev().find(|s| s.replica == replica) else {
            out.violations
                .push(format!("replica {replica}: never sampled"));
            continue;
        };
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.pid == last.pid).collect();
        if mine.first().is_none_or(|s| s.at > mark - 5.0) {
            let _ = writeln!(
                out.report,
                "  replica {replica}: restarted after the mark, not compared"
            );
            continue;
        }
        let near: Vec<&Sample> = mine
            .iter()
            .copied()
            .filter(|s| (s.at - mark).abs() <= 5.0)
            .collect();
        let end: Vec<&Sample> = mine.iter().rev().take(10).copied().collect();
        let measures: [Measure; 3] = [
            ("RSS MiB", |s| s.rss as f64 / 1048576.0, 0.0),
            ("open fds", |s| s.fds as f64, FD_SLACK),
            ("threads", |s| s.threads as f64, THREAD_SLACK),
        ];
        let mut line = format!("  replica {replica} (pid {}):", last.pid);
        for (name, f, slack) in measures {
            let (at, late) = (mean(&near, f), mean(&end, f));
            let peak = mine.iter().map(|s| f(s)).fold(0.0, f64::max);
            let _ = write!(line, " {name} {at:.1} → {late:.1} (peak {peak:.1});");
            if late > at * (1.0 + GROWTH) + slack {
                out.violations.push(format!(
                    "replica {replica}: {name} grew from {at:.1} to {late:.1}"
                ));
            }
        }
        let _ = writeln!(out.report, "{line}");
    }
}

/// Whether a line is an ERROR line or a panic.
fn is_error(line: &str) -> bool {
    line.contains(" ERROR ") || line.contains("\"level\":\"ERROR\"")
}

/// Panics are always violations; an ERROR line is explained when it was
/// logged while a fault was in force or recovering (from half a second
/// before it began to two seconds after its recovery).
pub fn logs(log: &[LogLine], events: &[Event], out: &mut Findings) {
    let (mut errors, mut explained, mut warnings) = (0, 0, 0);
    for (at, replica, line) in log {
        if line.contains(" WARN ") {
            warnings += 1;
        }
        if line.contains("panicked") {
            out.violations
                .push(format!("replica {replica} panicked: {line}"));
        }
        if !is_error(line) {
            continue;
        }
        errors += 1;
        let cause = events
            .iter()
            .find(|e| *at >= e.injected - 0.5 && *at <= e.over() + 2.0);
        match cause {
            Some(_) => explained += 1,
            None => out
                .violations
                .push(format!("replica {replica}: unexplained ERROR line: {line}")),
        }
    }
    let _ = writeln!(
        out.report,
        "log: {} lines, {warnings} WARN, {errors} ERROR ({explained} during a fault)",
        log.len()
    );
}

/// The mean of `f` over `set` (0 for none).
fn mean(set: &[&Sample], f: fn(&Sample) -> f64) -> f64 {
    set.iter().map(|s| f(s)).sum::<f64>() / set.len().max(1) as f64
}

/// Each replica's RSS, descriptors and threads every ten minutes (the
/// mean of the samples within five seconds of each mark), for the
/// hour's table in docs/reliability.md.
pub fn timeline(samples: &[Sample], from: f64, to: f64, out: &mut Findings) {
    let _ = writeln!(
        out.report,
        "resources every 10 minutes (replica: RSS MiB / fds / threads):"
    );
    let mut minute = 10.0;
    while from + minute * 60.0 <= to + 5.0 {
        let mark = from + minute * 60.0;
        let mut line = format!("  {minute:>3.0} min:");
        for replica in 0..2 {
            let near: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.replica == replica && (s.at - mark).abs() <= 5.0)
                .collect();
            let _ = write!(
                line,
                "  replica {replica} (pid {}) {:.1} / {:.1} / {:.1}",
                near.first().map_or(0, |s| s.pid),
                mean(&near, |s| s.rss as f64 / 1048576.0),
                mean(&near, |s| s.fds as f64),
                mean(&near, |s| s.threads as f64)
            );
        }
        let _ = writeln!(out.report, "{line}");
        minute += 10.0;
    }
}
