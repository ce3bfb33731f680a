//! The binary's subcommands.

pub mod inspect;
pub mod serve;
