//! The governor: turns a rule's rate up and down from a live load metric.
//! So far only its controller ([`pid`]) exists; the task that queries
//! Prometheus, holds the lease and sets the rule's knob is not built yet.

pub mod pid;
