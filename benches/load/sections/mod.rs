//! The sections `--only` may name, one module each.

pub mod algorithms;
pub mod compare;
pub mod global;
pub mod grpc;
pub mod line;
pub mod memory_per_counter;
pub mod over_limit;
pub mod redis;
pub mod redis_far;
