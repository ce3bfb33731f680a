//! The closing markdown table of key figures and ratios.

use crate::procs::placement::placement;
use crate::stats::format::{pct_ratios, pcts, ratio, ratio_opt, thousands, us};
use crate::stats::tally::Tally;

/// The closing table: key figures and ratios.
#[derive(Default)]
pub struct Summary {
    pub rows: Vec<[String; 5]>,
}

impl Summary {
    /// The rate and latency rows of `d` against the baseline `b`.
    pub fn rate_and_latency(&mut self, section: &str, what: &str, d: &mut Tally, b: &mut Tally) {
        self.rate(section, &format!("HIT/s, {what}"), d, b);
        self.latency(section, what, d, b);
    }

    /// A throughput row, `measure`: `d`'s rate against the baseline `b`'s.
    pub fn rate(&mut self, section: &str, measure: &str, d: &Tally, b: &Tally) {
        self.row(
            section,
            measure,
            thousands(d.rate()),
            thousands(b.rate()),
            ratio(d.rate(), b.rate()),
        );
    }

    /// A server CPU row, `measure`: µs per request of `d`'s server against
    /// the baseline `b`'s.
    pub fn cpu(&mut self, section: &str, measure: &str, d: &Tally, b: &Tally) {
        self.row(
            section,
            measure,
            us(d.cpu_us(0)),
            us(b.cpu_us(0)),
            ratio_opt(d.cpu_us(0), b.cpu_us(0)),
        );
    }

    /// [`Summary::cpu`] and, on a row of its own, its user-space part (the
    /// rest is the kernel's: sockets and scheduling).
    pub fn cpu_split(&mut self, section: &str, measure: &str, d: &Tally, b: &Tally) {
        self.cpu(section, measure, d, b);
        self.row(
            section,
            &format!("{measure}, of which user space"),
            us(d.user_us(0)),
            us(b.user_us(0)),
            ratio_opt(d.user_us(0), b.user_us(0)),
        );
    }

    /// The p50 / p99 / p99.9 row of `d` against `b`.
    pub fn latency(&mut self, section: &str, what: &str, d: &mut Tally, b: &mut Tally) {
        self.row(
            section,
            &format!("p50 / p99 / p99.9, {what}"),
            pcts(&mut d.f),
            pcts(&mut b.f),
            pct_ratios(&mut d.f, &mut b.f),
        );
    }

    pub fn row(
        &mut self,
        section: &str,
        measure: &str,
        divvy: String,
        base: String,
        ratio: String,
    ) {
        self.rows
            .push([section.to_owned(), measure.to_owned(), divvy, base, ratio]);
    }

    pub fn print(&self, command: &str, seconds: f64) {
        println!("\n## Summary\n");
        println!("| section | measurement | divvy | baseline | divvy / baseline |");
        println!("|---|---|---|---|---|");
        for r in &self.rows {
            println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
        }
        println!(
            "\nProduced by `{command}` ({seconds} s per run; {}; loopback, release build).",
            placement().note
        );
        println!(
            "Absolute figures depend on the machine and its neighbours; the ratios to a baseline \
             measured in the same run are the figures to compare."
        );
    }
}
