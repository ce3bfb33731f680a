//! The counter script's arguments: hints, runs of alike counters, shapes.

use super::*;

/// The hints the script is told of a whole call (its ARGV\[3\]), so that it
/// need not find them out key by key; telling less is always correct.
pub(super) mod hint {
    /// Every op is a lone counter charged or checked on its own: none in
    /// another's group, no request denied beforehand, no refund or undo,
    /// no all-or-nothing request of more than one counter.
    pub const LONE: i64 = 1;
    /// No key appears twice in the call.
    pub const DISTINCT: i64 = 2;
}

/// Tracks, op by op, whether a call is lone ([`hint::LONE`]), from the very
/// flags the script gets and by the script's own rule (its scan for the
/// lone path: the prelude's scan of the flags).
pub(super) struct LoneCall {
    lone: bool,
    /// The request under way is all-or-nothing.
    whole: bool,
}

impl LoneCall {
    fn op(&mut self, flags: i64) {
        let starts = flags & 4 != 0;
        if flags >= 16 || (flags & 8 != 0 && !starts) {
            self.lone = false;
        } else if starts {
            self.whole = flags & 8 != 0;
        } else if self.whole || flags & 1 != 0 {
            self.lone = false;
        }
    }
}

/// Whether no key appears twice ([`hint::DISTINCT`]). (aHash, randomly
/// keyed per process like std's SipHash but measured cheaper here;
/// docs/performance.md, "The counter script: a lean path, hints and runs".)
pub(super) fn distinct(keys: &[&str]) -> bool {
    keys.len() < 2 || {
        let mut seen: HashSet<&str, ahash::RandomState> =
            HashSet::with_capacity_and_hasher(keys.len(), ahash::RandomState::new());
        keys.iter().all(|k| seen.insert(*k))
    }
}

/// A run's head counts its length - 1 in these (see `script_args`).
pub const RUN: i64 = 1 << 32;

/// Most counters in one run (far below the 2^21 at which the head would
/// outgrow Lua's exact integers; a call holds about 512 counters).
pub(super) const MAX_RUN: i64 = 1 << 16;

/// Most counters in one request on the Redis store. Each has at most one
/// shape of its own, so shape * 128 + flags stays below [`RUN`]
/// (2^25 shapes) in any script call, which holds one request and at most
/// [`MAX_BATCH_KEYS`] counters of others.
pub const MAX_REQUEST_COUNTERS: usize = 1 << 24;

/// Refuses a request of more than [`MAX_REQUEST_COUNTERS`] counters, before
/// anything is sent.
pub(super) fn request_size_ok(counters: usize) -> Result<(), StoreError> {
    if counters > MAX_REQUEST_COUNTERS {
        return Err(StoreError::Unavailable(format!(
            "redis: a request of {counters} counters; at most {MAX_REQUEST_COUNTERS}"
        )));
    }
    Ok(())
}

/// The script's arguments as the decimal text Redis receives them as, in
/// one buffer: the same bytes on the wire as fred's encoding of integers,
/// which measures each number's digits with a floating-point `log10` before
/// converting it (measured fewer instructions per call;
/// docs/performance.md, "The Redis store on divvy's side").
pub(super) fn decimal_args(args: &[i64]) -> Vec<Value> {
    // Room for the longest (`-9223372036854775808`): every number is split
    // off the one allocation.
    let mut text = bytes::BytesMut::with_capacity(args.len() * 20);
    let mut digits = itoa::Buffer::new();
    args.iter()
        .map(|&n| {
            text.extend_from_slice(digits.format(n).as_bytes());
            Value::Bytes(text.split().freeze())
        })
        .collect()
}

/// The script's KEYS split off one buffer: fred copies a `&str` key into an
/// allocation of its own, and a call holds up to hundreds of keys
/// (docs/performance.md, "The counter script's answer").
pub(super) fn key_bytes(keys: &[&str]) -> Vec<fred::types::Key> {
    // One key: its own allocation is the cheaper (measured).
    if let [one] = keys {
        return vec![fred::types::Key::from(*one)];
    }
    let mut text = bytes::BytesMut::with_capacity(keys.iter().map(|k| k.len()).sum());
    keys.iter()
        .map(|k| {
            text.extend_from_slice(k.as_bytes());
            fred::types::Key::from(text.split().freeze())
        })
        .collect()
}

/// Adds a counter of shape and flags `x` (shape * 128 + flags) and `cost` to
/// the script's runs (`[head, cost]`, see `script_args`): to the last run
/// when it is alike and not full, else as a run of its own.
pub fn push_run(runs: &mut Vec<[i64; 2]>, x: i64, cost: i64) {
    match runs.last_mut() {
        Some(last) if last[0] % RUN == x && last[1] == cost && last[0] / RUN < MAX_RUN - 1 => {
            last[0] += RUN;
        }
        _ => runs.push([x, cost]),
    }
}

/// The script's KEYS and ARGV for `parts` (`count` counters in all) at `now`:
/// the time, the number of limit shapes, the call's [`hint`]s, the shapes
/// (algorithm, limit, window, burst) the counters use, then the counters'
/// shapes and flags, and costs, in runs of neighbours that share them: a
/// head, (how many - 1) * [`RUN`] + shape * 128 + flags, and the cost. A
/// connection's pipelined requests of one rule are one run; a counter
/// unlike its neighbours costs two values, as it did before runs.
pub(super) fn script_args<'a>(
    parts: &[Part<'a>],
    count: usize,
    undo: bool,
    now: i64,
) -> (Vec<&'a str>, Vec<i64>) {
    let mut keys: Vec<&str> = Vec::with_capacity(count);
    let mut shapes: Vec<[i64; 4]> = Vec::new();
    // [head, cost]
    let mut runs: Vec<[i64; 2]> = Vec::new();
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut call = LoneCall {
        lone: true,
        whole: false,
    };
    for (ops, charge) in parts {
        for (i, op) in ops.iter().enumerate() {
            keys.push(op.key.as_str());
            let shape = [
                // (+ 4: the op fills, + 8: it overdraws; see the
                // prelude's `sfill` and `sover`)
                op.algorithm.code()
                    + if op.fill { 4 } else { 0 }
                    + if op.overdraft { 8 } else { 0 },
                int(op.limit),
                int(window_ms(op.window)),
                int(op.burst.max(1)),
            ];
            let index = match shapes[..shapes.len().min(SHAPES_SEARCHED)]
                .iter()
                .position(|s| *s == shape)
            {
                Some(found) => found,
                None => {
                    shapes.push(shape);
                    shapes.len() - 1
                }
            };
            let mut flags = 0;
            if i == 0 {
                flags |= 4;
                match charge {
                    Charge::Each => {}
                    Charge::AllOrNothing => flags |= 8,
                    Charge::Denied => flags |= 16,
                }
            } else if op.joint {
                flags |= 1;
            }
            if !op.decides {
                flags |= 2;
            }
            // A refund is a flag, not a negative cost: a refund of 0 is still one.
            if op.refund {
                flags |= 32;
            }
            if undo {
                flags |= 64;
            }
            // Shapes count from 1 in the script; at most one per counter,
            // so the product stays far below 2^53.
            let shape_id = i64::try_from(index + 1).unwrap_or(i64::MAX);
            call.op(flags);
            push_run(&mut runs, shape_id * 128 + flags, int(op.cost));
        }
    }
    let mut args: Vec<i64> = Vec::with_capacity(3 + shapes.len() * 4 + runs.len() * 2);
    args.push(now);
    args.push(i64::try_from(shapes.len()).unwrap_or(i64::MAX));
    let mut hints = 0;
    if call.lone {
        hints |= hint::LONE;
    }
    if distinct(&keys) {
        hints |= hint::DISTINCT;
    }
    args.push(hints);
    args.extend(shapes.iter().flatten());
    args.extend(runs.iter().flatten());
    (keys, args)
}
