//! Divvy: a global rate-limit service.
//!
//! One policy of ordered divvy-style rules ([`config`], [`rules`]), one core
//! that applies it to counters ([`limiter`], [`store`]), and thin protocol
//! adapters ([`server`]). The binary allocates through [`allocator`].
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
