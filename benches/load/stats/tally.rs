//! Measuring a load: the CPU time of the servers and of the generator
//! around a run, and the ABBA order of two targets.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::procs::usage::{cpu_times, generator_cpu_time};
use crate::stats::figures::Figures;
use crate::stats::format::{percent, us};

/// A server under load: where to send it, and the processes whose CPU time
/// its requests cost (a label and a pid each).
pub struct Target {
    pub addr: SocketAddr,
    pub pids: Vec<(&'static str, u32)>,
}

/// The figures of one target over one or more runs, with the CPU time its
/// processes and this process (the load generator) spent meanwhile.
pub struct Tally {
    pub f: Figures,
    pub labels: Vec<&'static str>,
    pub cpu: Vec<Option<Duration>>,
    /// The user-space part of `cpu` (the rest is the kernel's).
    pub user: Vec<Option<Duration>>,
    pub load_cpu: Option<Duration>,
    pub wall: Duration,
}

impl Tally {
    pub fn add(self, other: Tally) -> Tally {
        let sum = |a: Option<Duration>, b: Option<Duration>| Some(a? + b?);
        let sums = |a: &[Option<Duration>], b: &[Option<Duration>]| {
            a.iter().zip(b).map(|(a, b)| sum(*a, *b)).collect()
        };
        Tally {
            f: self.f.add(other.f),
            labels: self.labels,
            cpu: sums(&self.cpu, &other.cpu),
            user: sums(&self.user, &other.user),
            load_cpu: sum(self.load_cpu, other.load_cpu),
            wall: self.wall + other.wall,
        }
    }

    pub fn rate(&self) -> f64 {
        self.f.rate()
    }

    /// CPU µs per answered request of process `k`.
    pub fn cpu_us(&self, k: usize) -> Option<f64> {
        let cpu = self.cpu.get(k).copied().flatten()?;
        Some(cpu.as_secs_f64() * 1e6 / self.f.requests.max(1) as f64)
    }

    /// User-space CPU µs per answered request of process `k`.
    pub fn user_us(&self, k: usize) -> Option<f64> {
        let user = self.user.get(k).copied().flatten()?;
        Some(user.as_secs_f64() * 1e6 / self.f.requests.max(1) as f64)
    }

    /// The share of one core process `k` used.
    pub fn util(&self, k: usize) -> Option<f64> {
        let cpu = self.cpu.get(k).copied().flatten()?;
        Some(cpu.as_secs_f64() / self.wall.as_secs_f64().max(1e-9))
    }

    /// The share of one core the load generator used.
    pub fn load_util(&self) -> Option<f64> {
        Some(self.load_cpu?.as_secs_f64() / self.wall.as_secs_f64().max(1e-9))
    }

    /// "cpu/req divvy 12.3 µs (97%), redis ... ; load gen 64%".
    pub fn cpu_note(&self, per: &str) -> String {
        let mut parts = Vec::new();
        for (k, label) in self.labels.iter().enumerate() {
            parts.push(format!(
                "{label} {} ({})",
                us(self.cpu_us(k)),
                percent(self.util(k))
            ));
        }
        format!(
            "cpu/{per} {}; load gen {}",
            parts.join(", "),
            percent(self.load_util())
        )
    }
}

/// Runs `load` on `rt`, reading the CPU time of `pids` and of this process
/// before and after.
pub fn measure<Fut>(rt: &Runtime, pids: &[(&'static str, u32)], load: Fut) -> Tally
where
    Fut: Future<Output = Figures>,
{
    let before: Vec<_> = pids.iter().map(|(_, p)| cpu_times(*p)).collect();
    let load_before = generator_cpu_time();
    let started = Instant::now();
    let f = rt.block_on(load);
    let wall = started.elapsed();
    let delta = |b: Option<Duration>, a: Option<Duration>| Some(a?.saturating_sub(b?));
    let after: Vec<_> = pids.iter().map(|(_, p)| cpu_times(*p)).collect();
    Tally {
        f,
        labels: pids.iter().map(|(l, _)| *l).collect(),
        cpu: before
            .iter()
            .zip(&after)
            .map(|(b, a)| delta(b.0, a.0))
            .collect(),
        user: before
            .iter()
            .zip(&after)
            .map(|(b, a)| delta(b.1, a.1))
            .collect(),
        load_cpu: delta(load_before, generator_cpu_time()),
        wall,
    }
}

/// `load` (given an address and a run length) on two targets, in halves of
/// `run`, in the order a, b, b, a: a noisy neighbour weighs on both alike.
pub fn abba<F, Fut>(rt: &Runtime, targets: [&Target; 2], run: Duration, load: F) -> [Tally; 2]
where
    F: Fn(SocketAddr, Duration) -> Fut,
    Fut: Future<Output = Figures>,
{
    let mut tallies: [Option<Tally>; 2] = [None, None];
    for k in [0, 1, 1, 0] {
        let t = measure(rt, &targets[k].pids, load(targets[k].addr, run / 2));
        tallies[k] = Some(match tallies[k].take() {
            None => t,
            Some(sum) => sum.add(t),
        });
    }
    tallies.map(|t| t.expect("measured"))
}
