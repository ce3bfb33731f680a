//! Processes and pinning: where each process runs, and the server
//! processes the benchmark starts (divvy, Redis, the baselines).

pub mod baseline;
pub mod divvy;
pub mod placement;
pub mod redis;
pub mod usage;
