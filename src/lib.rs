//! Divvy: a global rate-limit service.
//!
//! A request goes down the floors once: a protocol adapter ([`server`])
//! parses it into hits; the [`limiter`] plans it against the rule set in
//! force ([`rules`], compiled from [`config`]), applies [`knobs`] and the
//! region's [`global`] leases, and hands every counter to one [`store`] call
//! (memory, or Redis behind a circuit breaker); the adapter formats the
//! decisions. Beside the core: [`sources`] (the policy file and ZooKeeper,
//! feeding one reload path), [`governor`] (sets knobs from Prometheus),
//! [`metrics`] and [`statsd`], and the leaves [`pattern`] (globs) and
//! [`clock`] (time). The binary allocates through [`allocator`] on the
//! runtime [`runtime`] builds.
#![warn(missing_docs)]

pub mod allocator;
pub mod clock;
pub mod config;
pub mod global;
pub mod governor;
pub mod knobs;
pub mod limiter;
pub mod metrics;
/// The glob matcher of rule values: a leaf that [`config`] and [`rules`] both use.
pub mod pattern;
pub mod rules;
pub mod runtime;
pub mod server;
pub mod sources;
pub mod statsd;
pub mod store;
