//! A limit's numbers as an algorithm counts them when a knob changes them.

/// A limit's numbers: credits per window, the window in seconds, and the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbers {
    /// Credits per window.
    pub credit_limit: u64,
    /// Window in seconds.
    pub reset_seconds: u64,
    /// The burst (its credit limit for an algorithm without one).
    pub burst: u64,
}

/// What a counter op carries: credits per window, the window in seconds,
/// and the op's burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// The op's limit.
    pub limit: u64,
    /// The op's window, in seconds.
    pub window_seconds: u64,
    /// The op's burst.
    pub burst: u64,
}

/// Fixed and sliding windows: the stored counts are used credits, whatever
/// the limit, so a knob's numbers apply as they are.
pub fn counted_as_set(_own: Numbers, effective: Numbers) -> Counted {
    Counted {
        limit: effective.credit_limit,
        window_seconds: effective.reset_seconds,
        burst: effective.credit_limit,
    }
}

/// `<name> 40 per 1s`, for an algorithm described by its name.
pub fn describe_named(name: &str, limit: u64, seconds: u64) -> String {
    format!("{name} {limit} per {seconds}s")
}
