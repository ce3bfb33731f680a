//! The binary's subcommands.

pub mod counters;
pub mod explain_live;
pub mod inspect;
pub mod knob;
pub mod probe;
pub mod ratelimit;
pub mod replay;
pub mod serve;
pub mod tls;
