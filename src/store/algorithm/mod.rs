//! The arithmetic of every counting algorithm, once.
//!
//! Each algorithm is a pure function from (stored state, time now, op) to a
//! [`Verdict`]: whether the credits are available, the answer, and the state
//! to store if charged. The memory store runs these under its shard locks;
//! the Redis script ([`SCRIPT`], one Lua piece per algorithm) mirrors them (a
//! property test compares the two). Time is whole epoch milliseconds, and
//! the validator keeps every number below 2^53, so Lua's doubles are exact.
//!
//! [`apply_request`] applies one request: a rule's limits form a group
//! (allowed only if every limit allows, then all charged), and an
//! all-or-nothing request charges nothing if any deciding group is denied.

pub mod fixed;
mod numbers;
mod past_limit;
pub mod sliding;
pub mod token_bucket;

pub use numbers::{counted_as_set, describe_named, Counted, Numbers};
pub use past_limit::{debt_probe, fill, overdrawn};
pub mod window;

use super::{Charge, CounterOp, CounterState};
use std::time::Duration;

/// Largest credit limit (or burst) any algorithm counts: exact in a Lua
/// number (2^53 - 1), so the Redis script counts it exactly.
pub const MAX_CREDIT_LIMIT: u64 = (1 << 53) - 1;
/// Largest product of credits and window ms an algorithm's arithmetic may
/// reach ([`Spec::credit_ms`]): the script's products stay exact.
pub const MAX_CREDIT_MS: u64 = 1 << 52;

/// How a counter is spent and refilled. Each is one module here (its
/// arithmetic, its [`Spec`]) and one Lua piece in `lua/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Algorithm {
    /// divvy's window: it opens at the counter's first hit with `limit`
    /// credits and lasts `window`; a hit of N takes N credits if N are left.
    #[default]
    Window,
    /// Windows aligned to the Unix epoch, `[floor(now/W)·W, +W)`.
    Fixed,
    /// Epoch-aligned windows, the previous one weighted by the time left of it.
    Sliding,
    /// A token bucket (GCRA) refilling `limit` per `window`, holding `burst`.
    TokenBucket,
}

/// Everything the rest of the service asks of an algorithm, said by its
/// own module (`<module>::SPEC`).
pub struct Spec {
    /// The config spelling (`window`, `fixed`, ...).
    pub name: &'static str,
    /// The number the Redis script knows it by (its Lua piece's `build[n]`).
    pub code: i64,
    /// The largest product of credits and window ms its arithmetic reaches
    /// for `limit` credits, `burst` and `window_ms` (`None`: it only counts
    /// credits). Validation, knobs and the planner hold it to
    /// [`MAX_CREDIT_MS`].
    pub credit_ms: fn(limit: u64, burst: u64, window_ms: u64) -> Option<u64>,
    /// Whether it holds a `burst` of its own (else its burst is its limit),
    /// counted in the rule's own period whatever a knob's.
    pub has_burst: bool,
    /// Whether the over-limit cache may answer a denial of it without the
    /// store: its denials last until a reset that a charge cannot move.
    pub over_limit_cache: bool,
    /// The line protocol's reset in whole seconds for `reset_ms`.
    pub line_reset: fn(reset_ms: u128) -> u128,
    /// Its arithmetic (see [`step`]).
    pub step: fn(Option<State>, u64, &Params) -> Verdict,
    /// Ms until a counter is full again, where a check's reset does not say
    /// it (a denied check reports its wait instead).
    pub full_in: Option<FullIn>,
    /// What a counter of the limit `own` (as written) counts with when a
    /// knob sets the numbers `effective`; the counter keeps `own`'s key, so
    /// consumption carries over (see each algorithm's function).
    pub counted: fn(own: Numbers, effective: Numbers) -> Counted,
    /// A limit's description: `40 per 1s`, `token bucket 40 per 1s, burst 80`.
    pub describe: fn(limit: u64, seconds: u64, burst: u64) -> String,
}

/// Ms until a counter holding a state is full again, at a time, for an op.
pub type FullIn = fn(Option<State>, u64, &Params) -> u64;

/// Seconds rounded to the nearest, as Redis TTL reports them.
pub fn round_to_nearest_second(ms: u128) -> u128 {
    (ms + 500) / 1000
}

/// Seconds rounded up, so a client waiting as told is not denied again.
pub fn round_up_to_second(ms: u128) -> u128 {
    ms.div_ceil(1000)
}

impl Algorithm {
    /// Every algorithm, in the order of their codes.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Window,
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::TokenBucket,
    ];

    /// What its module says of it: the registry.
    pub fn spec(self) -> &'static Spec {
        match self {
            Algorithm::Window => &window::SPEC,
            Algorithm::Fixed => &fixed::SPEC,
            Algorithm::Sliding => &sliding::SPEC,
            Algorithm::TokenBucket => &token_bucket::SPEC,
        }
    }

    /// The config spelling (`window`, `fixed`, `sliding`, `token_bucket`).
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The algorithm a config spelling names.
    pub fn parse(text: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.as_str() == text)
    }

    /// The number the Redis script knows the algorithm by.
    pub fn code(self) -> i64 {
        self.spec().code
    }

    /// Whether `limit` credits (with `burst`) over `window_ms` stay within
    /// what every store counts exactly.
    pub fn exact(self, limit: u64, burst: u64, window_ms: u64) -> bool {
        (self.spec().credit_ms)(limit, burst, window_ms).is_none_or(|p| p <= MAX_CREDIT_MS)
    }

    /// The largest limit (as its own burst too) that stays exact over
    /// `window_ms`, at most [`MAX_CREDIT_LIMIT`] (0: none does).
    pub fn largest_exact_limit(self, window_ms: u64) -> u64 {
        let (mut low, mut high) = (0, MAX_CREDIT_LIMIT);
        if self.exact(high, high, window_ms) {
            return high;
        }
        if !self.exact(0, 0, window_ms) {
            return 0;
        }
        // exact(low) and not exact(high): the products grow with the limit.
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if self.exact(mid, mid, window_ms) {
                low = mid;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The line protocol's reset for `reset_ms`, in whole seconds.
    pub fn line_reset_seconds(self, reset_ms: u128) -> u128 {
        (self.spec().line_reset)(reset_ms)
    }
}

/// The Redis counter script: the prelude (arguments, helpers, the keys'
/// values), each algorithm's Lua piece, and the driver, joined here once.
pub const SCRIPT: &str = concat!(
    include_str!("../lua/prelude.lua"),
    include_str!("../lua/window.lua"),
    include_str!("../lua/fixed.lua"),
    include_str!("../lua/sliding.lua"),
    include_str!("../lua/token_bucket.lua"),
    include_str!("../lua/lone.lua"),
    include_str!("../lua/driver.lua"),
);

/// What a counter holds between requests. Each algorithm has its own shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// divvy's window: credits left, and when the window ends (ms).
    Window {
        /// Credits left, counted against the rule's own limit (below zero
        /// when a knob raised the limit and more than the own limit is used).
        remaining: i64,
        /// Epoch ms at which the window ends.
        expires_at: u64,
    },
    /// Epoch-aligned fixed window: its start (ms) and the credits used in it.
    Fixed {
        /// Epoch ms at which the counted window starts.
        start: u64,
        /// Credits used in it.
        count: u64,
    },
    /// Sliding window: the current window's start (ms), the previous
    /// window's count and the current one's.
    Sliding {
        /// Epoch ms at which the current window starts.
        start: u64,
        /// Credits used in the previous window.
        prev: u64,
        /// Credits used in the current window.
        cur: u64,
    },
    /// Token bucket (GCRA): credits used, in units of `window_ms` per credit,
    /// as of time `at` (ms). The bucket refills `limit` units per millisecond.
    Bucket {
        /// Used capacity, `credits × window_ms`.
        used: u64,
        /// Epoch ms the `used` figure is valid at.
        at: u64,
    },
}

/// The numbers of one op an algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Credits per window (> 0).
    pub limit: u64,
    /// Window (or refill period) in ms (> 0).
    pub window_ms: u64,
    /// Token bucket capacity in credits. For divvy's window: the rule's own
    /// limit, which the stored credits are counted against.
    pub burst: u64,
    /// Credits to take (or give back); 0 checks without consuming.
    pub cost: u64,
    /// Give `cost` back instead of taking it.
    pub refund: bool,
}

impl Params {
    /// The numbers of `op`.
    pub fn of(op: &CounterOp) -> Params {
        Params {
            limit: op.limit,
            window_ms: window_ms(op.window),
            burst: op.burst,
            cost: op.cost,
            refund: op.refund,
        }
    }
}

/// A window in whole milliseconds, at least 1.
pub fn window_ms(window: Duration) -> u64 {
    u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The outcome of one op against one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the credits are available (a refund always is).
    pub allowed: bool,
    /// Whole credits left (after the charge when allowed).
    pub remaining: u64,
    /// Allowed: ms until the counter is full again (bucket full, window
    /// over). Denied: ms until the same hit would be allowed.
    pub reset_ms: u64,
    /// The state to store if this op is charged; `None`: nothing to store.
    pub next: Option<State>,
}

impl Verdict {
    /// The answer the store returns for this verdict.
    pub fn answer(&self) -> CounterState {
        CounterState {
            allowed: self.allowed,
            remaining: self.remaining,
            reset_after: Duration::from_millis(self.reset_ms),
            overdrawn: 0,
        }
    }
}

/// The verdict of `op` on `state`, overdrawn or filled where it applies
/// (`may_fill`: the op is charged on its own).
fn decide(op: &CounterOp, state: Option<State>, now: u64, may_fill: bool) -> Decided {
    let p = Params::of(op);
    let v = step(op.algorithm, state, now, &p);
    if op.overdraft {
        if let Some(o) = overdrawn(op.algorithm, state, now, &p, &v, may_fill) {
            let takes = o.next.is_some();
            // `v` was denied with what was left: the rest goes past it.
            let past = if takes {
                p.cost.saturating_sub(v.remaining)
            } else {
                0
            };
            return Decided { v: o, takes, past };
        }
    }
    if op.fill && may_fill {
        if let Some(f) = fill(op.algorithm, state, now, &p, &v) {
            return Decided {
                v: f,
                takes: true,
                past: 0,
            };
        }
    }
    Decided {
        v,
        takes: v.allowed,
        past: 0,
    }
}

/// An op's verdict, whether it takes credits (allowed, filled, or a
/// denied overdraft charged alone) and the credits it takes past what was
/// left (an overdraft's).
struct Decided {
    v: Verdict,
    takes: bool,
    past: u64,
}

/// Applies `p` to a counter of `algorithm` holding `state` at time `now` (ms).
pub fn step(algorithm: Algorithm, state: Option<State>, now: u64, p: &Params) -> Verdict {
    (algorithm.spec().step)(state, now, p)
}

/// What a counter holding `state` shows without being charged: credits
/// left and ms until it is full again.
pub fn view(algorithm: Algorithm, state: Option<State>, now: u64, p: &Params) -> (u64, u64) {
    let check = Params {
        cost: 0,
        refund: false,
        ..*p
    };
    let v = step(algorithm, state, now, &check);
    (
        v.remaining,
        full_in(algorithm, state, now, p).unwrap_or(v.reset_ms),
    )
}

/// Ms until a counter holding `state` is full again, where that differs
/// from a check's reset (a denied check reports its wait instead).
fn full_in(algorithm: Algorithm, state: Option<State>, now: u64, p: &Params) -> Option<u64> {
    algorithm.spec().full_in.map(|f| f(state, now, p))
}

/// Epoch ms after which `state` no longer matters (a fresh counter answers
/// the same): the memory store drops it then, the Redis key expires then.
pub fn expires_at(state: &State, p: &Params) -> u64 {
    match *state {
        State::Window { expires_at, .. } => expires_at,
        State::Fixed { start, .. } => start.saturating_add(p.window_ms),
        State::Sliding { start, .. } => start.saturating_add(p.window_ms.saturating_mul(2)),
        State::Bucket { used, at } => at.saturating_add(used.div_ceil(p.limit.max(1))),
    }
}

/// `a × b / c`, floored, without overflow.
pub(crate) fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let q = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// Access to the stored states of the counters one request touches.
pub trait States {
    /// The stored state of op `i`'s counter (`None`: no counter).
    fn load(&mut self, i: usize) -> Option<State>;
    /// Stores the state of op `i`'s counter (called once per op that changed it, in order).
    fn save(&mut self, i: usize, state: State);
}

/// Applies the counter ops of one request in order and returns one answer
/// per op (each op's own verdict; the caller combines a group's).
///
/// - Ops with `joint` set belong to the group of the op before them. A group
///   is charged only if every op in it is allowed; otherwise none is.
/// - [`Charge::AllOrNothing`]: if any group whose ops `decide` is denied,
///   nothing of the request is charged. [`Charge::Denied`]: the request is
///   already denied elsewhere; nothing is charged.
/// - An op that was allowed but not charged answers allowed with the
///   counter's unchanged credits.
///
/// Several ops on one counter see each other's charges in order; `same[i]`
/// is the index of the first op on op `i`'s counter (the memory store finds
/// them by its counters' ids).
pub fn apply_request<S: States>(
    states: &mut S,
    now: u64,
    ops: &[CounterOp],
    same: &[usize],
    charge: Charge,
) -> Vec<CounterState> {
    if let [op] = ops {
        let mut answer = super::state_list();
        answer.push(apply_one(states, now, op, charge));
        return answer;
    }
    // Independent ops on distinct counters (a line connection's batch, a
    // canary and its decider, descriptors charged each on their own).
    if charge == Charge::Each
        && same.iter().enumerate().all(|(i, &k)| k == i)
        && !ops.iter().any(|op| op.joint)
    {
        return apply_each(states, now, ops);
    }
    apply_groups(states, now, ops, same, charge)
}

/// [`apply_request`] for independent ops on distinct counters under
/// [`Charge::Each`]: each op is its own group, charged when allowed. It
/// loads, answers and saves as [`apply_groups`] does, in the same order:
/// every counter loaded, in op order, before any is saved (a memory store's
/// load marks its counter used, and a save of a new counter into a full
/// shard evicts the least recently used one, which must not be one this
/// call has yet to read). A property test compares the two, loads and
/// saves in order. What it leaves out is the general path's bookkeeping:
/// several vectors a call and one per group.
fn apply_each<S: States>(states: &mut S, now: u64, ops: &[CounterOp]) -> Vec<CounterState> {
    let verdicts: Vec<(Option<State>, Decided)> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let st = states.load(i);
            (st, decide(op, st, now, true))
        })
        .collect();
    verdicts
        .into_iter()
        .enumerate()
        .map(|(i, (st, d))| {
            save_if_charged(states, i, st, &d.v, d.takes);
            CounterState {
                overdrawn: if d.takes { d.past } else { 0 },
                ..d.v.answer()
            }
        })
        .collect()
}

/// Saves op `i`'s counter after verdict `v` on its state `st`: when the op
/// took credits (allowed or filled) and changed the counter (its own group,
/// charged).
fn save_if_charged<S: States>(
    states: &mut S,
    i: usize,
    st: Option<State>,
    v: &Verdict,
    takes: bool,
) {
    if let (true, Some(new)) = (takes, v.next) {
        if Some(new) != st {
            states.save(i, new);
        }
    }
}

/// [`apply_request`] for any number of ops: groups, all-or-nothing, and
/// several ops on one counter.
fn apply_groups<S: States>(
    states: &mut S,
    now: u64,
    ops: &[CounterOp],
    same: &[usize],
    charge: Charge,
) -> Vec<CounterState> {
    let n = ops.len();
    // Per distinct counter (indexed by `same`): the stored state, loaded on
    // first use, and the state after the groups charged so far.
    let mut stored: Vec<Option<Option<State>>> = vec![None; n];
    let mut charged_state: Vec<Option<Option<State>>> = vec![None; n];
    let mut verdicts = Vec::with_capacity(n);
    // Per op: the state it saw, and whether its group was charged.
    let mut before: Vec<Option<State>> = Vec::with_capacity(n);
    let mut charged = vec![false; n];
    let mut blocked = charge == Charge::Denied;
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n && ops[end].joint {
            end += 1;
        }
        // The group's tentative states (a rule has a handful of limits).
        let mut overlay: Vec<(usize, Option<State>)> = Vec::with_capacity(end - start);
        let mut all = true;
        for (i, op) in ops.iter().enumerate().take(end).skip(start) {
            let k = same[i];
            let st = match overlay.iter().rev().find(|(j, _)| *j == k) {
                Some(&(_, s)) => s,
                None => match charged_state[k] {
                    Some(s) => s,
                    None => load(states, &mut stored, k),
                },
            };
            let may_fill = charge == Charge::Each && end - start == 1;
            let Decided { v, takes, past } = decide(op, st, now, may_fill);
            all &= takes;
            overlay.push((k, v.next.or(st)));
            before.push(st);
            verdicts.push((v, past));
        }
        if all {
            for (k, s) in overlay {
                charged_state[k] = Some(s);
            }
            charged[start..end].fill(true);
        } else if ops[start].decides && charge != Charge::Each {
            blocked = true;
        }
        start = end;
    }
    let mut out = Vec::with_capacity(n);
    for (i, (v, past)) in verdicts.iter().enumerate() {
        if v.allowed && v.next.is_some() && (blocked || !charged[i]) {
            // Allowed, but its group (or the request) was denied: the counter
            // stays as it was.
            let st = if blocked {
                load(states, &mut stored, same[i])
            } else {
                before[i]
            };
            let op = &ops[i];
            let (remaining, reset_ms) = view(op.algorithm, st, now, &Params::of(op));
            out.push(CounterState {
                allowed: true,
                remaining,
                reset_after: Duration::from_millis(reset_ms),
                overdrawn: 0,
            });
        } else {
            let charged_past = if charged[i] && !blocked { *past } else { 0 };
            out.push(CounterState {
                overdrawn: charged_past,
                ..v.answer()
            });
        }
    }
    if !blocked {
        for k in 0..n {
            if same[k] != k {
                continue;
            }
            if let Some(Some(new)) = charged_state[k] {
                if stored[k] != Some(Some(new)) {
                    states.save(k, new);
                }
            }
        }
    }
    out
}

/// [`apply_request`] for a request of one op (most requests), without the
/// bookkeeping of groups: the op is its own group, charged when allowed
/// unless the request is already denied. It answers and saves exactly as
/// [`apply_groups`] does for one op (a property test compares them).
fn apply_one<S: States>(states: &mut S, now: u64, op: &CounterOp, charge: Charge) -> CounterState {
    let p = Params::of(op);
    let st = states.load(0);
    let Decided { v, takes, past } = decide(op, st, now, charge == Charge::Each);
    if charge == Charge::Denied {
        if v.allowed && v.next.is_some() {
            // Allowed, but the request was denied: the counter stays as it was.
            let (remaining, reset_ms) = view(op.algorithm, st, now, &p);
            return CounterState {
                allowed: true,
                remaining,
                reset_after: Duration::from_millis(reset_ms),
                overdrawn: 0,
            };
        }
        return v.answer();
    }
    save_if_charged(states, 0, st, &v, takes);
    CounterState {
        overdrawn: if takes { past } else { 0 },
        ..v.answer()
    }
}

fn load<S: States>(
    states: &mut S,
    stored: &mut [Option<Option<State>>],
    k: usize,
) -> Option<State> {
    *stored[k].get_or_insert_with(|| states.load(k))
}

#[cfg(test)]
pub(crate) mod tests;
