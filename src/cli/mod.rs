//! The binary's subcommands.

pub mod inspect;
pub mod knob;
pub mod serve;
pub mod tls;
