//! Divvy: a global rate-limit service.
//!
//! A request goes down the floors once: a protocol adapter ([`server`])
//! parses it and calls one [`limiter`] entry point, which alone knows which
//! engine decides the domain; the rule set in force ([`rules`], compiled
//! from [`config`]) returns a complete plan in one call, the limiter applies
//! [`knobs`] and the region's [`global`] leases to it in one place and hands
//! every counter to one [`store`] call (memory, or Redis behind a circuit
//! breaker); the adapter formats what the limiter returned. Beside the core:
//! [`sources`] (the policy file, ZooKeeper and xDS, feeding one install
//! path), [`quota`] (fair shares of a limit, used by [`global`] and by the
//! RLQS server in [`server`]), [`governor`]
//! (sets knobs from Prometheus), [`observe`] (metrics, statsd, OTLP traces,
//! and the dashboard's per-rule history and top offenders), and the
//! leaves [`pattern`] (globs) and [`clock`] (time). [`replay`] decides
//! recorded traffic again, offline, under one policy or two. The binary allocates
//! through [`allocator`] on the runtime [`runtime`] builds.
#![warn(missing_docs)]

pub mod allocator;
pub mod app;
pub mod clock;
pub mod config;
pub mod coord;
pub mod counters;
pub mod fair;
pub mod global;
pub mod governor;
pub mod knobs;
pub mod limiter;
pub mod memory_budget;
pub mod observe;
/// The glob matcher of rule values: a leaf that [`config`] and [`rules`] both use.
pub mod pattern;
pub mod quota;
pub mod replay;
pub mod reuse;
pub mod rules;
pub mod runtime;
pub mod server;
pub mod sources;
pub mod store;
