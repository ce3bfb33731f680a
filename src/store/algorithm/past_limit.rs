//! Charging past what is left: a hit that fills (takes what is left, as
//! envoyproxy/ratelimit counts) and one that overdraws (charged in full,
//! leaving a debt), both through each algorithm's own step; and reading a
//! counter's debt with a check.

use super::{step, view, Algorithm, Params, State, Verdict, MAX_CREDIT_LIMIT, MAX_CREDIT_MS};
use crate::store::CounterOp;

/// The verdict of a hit denied by `v` on `state` when it fills (see
/// [`CounterOp::fill`]): the credits left taken instead, answered denied
/// with what is left after them (0) and the reset a retry of the same hit
/// would get; `None` where filling takes nothing (allowed, a refund or a
/// check, nothing left).
pub fn fill(
    algorithm: Algorithm,
    state: Option<State>,
    now: u64,
    p: &Params,
    v: &Verdict,
) -> Option<Verdict> {
    if v.allowed || p.refund || p.cost == 0 || v.remaining == 0 {
        return None;
    }
    let take = Params {
        cost: v.remaining,
        ..*p
    };
    let f = step(algorithm, state, now, &take);
    let next = f.next.filter(|_| f.allowed)?;
    let retry = step(algorithm, Some(next), now, p);
    Some(Verdict {
        allowed: false,
        remaining: f.remaining,
        reset_ms: retry.reset_ms,
        next: Some(next),
    })
}

/// The verdict of a hit denied by `v` on `state` when its op overdraws
/// (see [`CounterOp::overdraft`]): allowed if anything was left before it,
/// the full cost charged past what is left (when allowed, or when `alone`:
/// the op is charged on its own). It answers what the counter shows after
/// (0 left in debt) and, allowed, the ms until full; denied, the ms until a
/// retry of one credit is allowed (something is left again). `None` where
/// overdrawing does not apply (allowed, a refund or a check), or where the
/// debt would pass what every store counts exactly (`overdrawn_params`).
pub fn overdrawn(
    algorithm: Algorithm,
    state: Option<State>,
    now: u64,
    p: &Params,
    v: &Verdict,
    alone: bool,
) -> Option<Verdict> {
    if v.allowed || p.refund || p.cost == 0 {
        return None;
    }
    let allowed = v.remaining > 0;
    let one = Params { cost: 1, ..*p };
    if !allowed && !alone {
        // Denied in a group: nothing is charged, the counter stays.
        return Some(Verdict {
            allowed: false,
            remaining: 0,
            reset_ms: step(algorithm, state, now, &one).reset_ms,
            next: None,
        });
    }
    let raised = step(algorithm, state, now, &overdrawn_params(algorithm, p));
    let next = raised.next.filter(|_| raised.allowed)?;
    let (remaining, full_ms) = view(algorithm, Some(next), now, p);
    let reset_ms = if allowed {
        full_ms
    } else {
        step(algorithm, Some(next), now, &one).reset_ms
    };
    Some(Verdict {
        allowed,
        remaining,
        reset_ms,
        next: Some(next),
    })
}

/// `p` with room for any debt: the algorithm's own step then charges the
/// full cost. A token bucket's capacity is its `burst` (its `limit` is the
/// refill rate); the others' is `limit` (divvy's window counts its stored
/// credits against `burst`, so they become `own - used`, below zero in
/// debt). The room stops where the stores' arithmetic stops being exact,
/// which bounds a debt: a charge past it is not applied.
fn overdrawn_params(algorithm: Algorithm, p: &Params) -> Params {
    if algorithm.spec().has_burst {
        Params {
            burst: (MAX_CREDIT_MS / p.window_ms.max(1)).max(p.burst),
            ..*p
        }
    } else {
        Params {
            limit: MAX_CREDIT_LIMIT.max(p.limit),
            ..*p
        }
    }
}

/// A check of `op`'s counter with its capacity raised as an overdraft
/// raises it, and the credits that adds: the check's credits left, taken
/// from the credits added, are the counter's debt (charged past its limit,
/// not yet paid back). A check, so both stores answer it alike.
pub fn debt_probe(op: &CounterOp) -> (CounterOp, u64) {
    let p = Params::of(op);
    let raised = overdrawn_params(op.algorithm, &p);
    let added = if op.algorithm.spec().has_burst {
        raised.burst.saturating_sub(p.burst)
    } else {
        raised.limit.saturating_sub(p.limit)
    };
    let probe = CounterOp {
        limit: raised.limit,
        burst: raised.burst,
        cost: 0,
        refund: false,
        joint: false,
        ..op.clone()
    };
    (probe, added)
}
