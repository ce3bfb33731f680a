//! The figures of one or more runs: requests, elapsed time, latencies,
//! send lags, and their percentiles.

use std::time::Duration;

/// The figures of one or more runs against one server.
#[derive(Default)]
pub struct Figures {
    /// Requests answered.
    pub requests: u64,
    /// The time they took (summed over runs one after the other).
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    /// Paced load only: how late the generator sent each request.
    pub lags: Vec<Duration>,
    /// Paced load only: requests still unanswered at the end.
    pub lost: u64,
}

impl Figures {
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// The figures of two runs one after the other.
    pub fn add(mut self, other: Figures) -> Figures {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.lags.extend(other.lags);
        self.lost += other.lost;
        self
    }
    /// The figures of two loads run side by side.
    pub fn alongside(mut self, other: Figures) -> Figures {
        self.elapsed = self.elapsed.max(other.elapsed);
        self.requests += other.requests;
        self.latencies.extend(other.latencies);
        self.lags.extend(other.lags);
        self.lost += other.lost;
        self
    }
    pub fn pct(&mut self, p: f64) -> Duration {
        percentile(&mut self.latencies, p)
    }
    pub fn lag_pct(&mut self, p: f64) -> Duration {
        percentile(&mut self.lags, p)
    }
}

pub fn percentile(values: &mut [Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i]
}
