//! divvy's window: it opens at a counter's first charged hit with `limit`
//! credits and lasts `window`; a hit of N takes N credits if N are left.
//! Stored in Redis as divvy stores it: the credits left, with the window as
//! the key's TTL.

use super::{round_to_nearest_second, Counted, Numbers, Params, Spec, State, Verdict};

/// divvy's window, as the rest of the service sees it: it counts credits
/// only (every limit is exact); its denials last until its window ends,
/// which no charge moves, so the over-limit cache may answer them; its
/// reset is the key's TTL, which Redis reports to the nearest second.
pub const SPEC: Spec = Spec {
    name: "window",
    code: 0,
    credit_ms: |_, _, _| None,
    has_burst: false,
    over_limit_cache: true,
    line_reset: round_to_nearest_second,
    step,
    full_in: None,
    counted,
    describe: |n, s, _| format!("{n} per {s}s"),
};

/// The stored credits count against `own`'s limit, sent as the op's
/// burst, and are shifted by the difference (see `shift`).
fn counted(own: Numbers, effective: Numbers) -> Counted {
    Counted {
        limit: effective.credit_limit,
        window_seconds: effective.reset_seconds,
        burst: own.credit_limit,
    }
}

/// `remaining` in the state counts against the rule's own limit, carried in
/// `p.burst` (a knob may set another `p.limit`): the credits left under the
/// limit in force are `remaining + limit − burst`, so consumption carries
/// over when a knob changes the limit, and without a knob the stored value
/// is exactly divvy's.
fn shift(p: &Params) -> i128 {
    i128::from(p.limit) - i128::from(p.burst)
}

fn clamp(n: i128) -> u64 {
    u64::try_from(n.max(0)).unwrap_or(u64::MAX)
}

fn stored(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(if n < 0 { i64::MIN } else { i64::MAX })
}

/// Applies `p` to a divvy window holding `state` at `now` (ms).
pub fn step(state: Option<State>, now: u64, p: &Params) -> Verdict {
    let open = match state {
        Some(State::Window {
            remaining,
            expires_at,
        }) if expires_at > now => Some((remaining, expires_at)),
        _ => None,
    };
    let Some((kept, expires_at)) = open else {
        // No open window: the first charged hit opens one.
        if !p.refund && p.cost > 0 && p.cost <= p.limit {
            let left = p.limit - p.cost;
            return Verdict {
                allowed: true,
                remaining: left,
                reset_ms: p.window_ms,
                next: Some(State::Window {
                    remaining: stored(i128::from(left) - shift(p)),
                    expires_at: now.saturating_add(p.window_ms),
                }),
            };
        }
        return Verdict {
            allowed: p.refund || p.cost <= p.limit,
            remaining: p.limit,
            reset_ms: p.window_ms,
            next: None,
        };
    };
    let reset_ms = expires_at - now;
    let remaining = i128::from(kept) + shift(p);
    let save = |left: i128| {
        let value = stored(left - shift(p));
        (value != kept).then_some(State::Window {
            remaining: value,
            expires_at,
        })
    };
    let cost = i128::from(p.cost);
    if p.refund {
        let left = (remaining + cost).min(i128::from(p.limit));
        return Verdict {
            allowed: true,
            remaining: clamp(left),
            reset_ms,
            next: save(left),
        };
    }
    if p.cost == 0 {
        return Verdict {
            allowed: remaining > 0,
            remaining: clamp(remaining),
            reset_ms,
            next: None,
        };
    }
    if remaining >= cost {
        return Verdict {
            allowed: true,
            remaining: clamp(remaining - cost),
            reset_ms,
            next: save(remaining - cost),
        };
    }
    Verdict {
        allowed: false,
        remaining: clamp(remaining),
        reset_ms,
        next: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{params, run};
    use crate::store::Algorithm;

    #[test]
    fn opens_at_first_hit_and_resets_at_its_end() {
        let p = params(3, 60_000, 3, 1);
        let seq = run(Algorithm::Window, &[(0, p), (10, p), (20, p), (30, p)]);
        assert_eq!(
            seq,
            vec![
                (true, 2, 60_000),
                (true, 1, 59_990),
                (true, 0, 59_980),
                (false, 0, 59_970)
            ]
        );
        let seq = run(Algorithm::Window, &[(0, p), (59_999, p), (60_000, p)]);
        assert_eq!(seq[1], (true, 1, 1));
        assert_eq!(seq[2], (true, 2, 60_000));
    }

    #[test]
    fn a_changed_limit_carries_consumption_over() {
        // The rule's own limit is 10 (burst); 10 hits spend it.
        let own = params(10, 60_000, 10, 10);
        let mut raised = params(20, 60_000, 10, 1);
        let seq = run(Algorithm::Window, &[(0, own), (1, raised), (2, raised)]);
        assert_eq!(seq[0], (true, 0, 60_000));
        assert_eq!(seq[1], (true, 9, 59_999));
        // Lowered below what is used: denied until the window ends.
        let lowered = params(5, 60_000, 10, 1);
        let seq = run(
            Algorithm::Window,
            &[(0, params(10, 60_000, 10, 7)), (1, lowered)],
        );
        assert_eq!(seq[1], (false, 0, 59_999));
        // A window opened under a raised limit: 15 of 20 used, then back to 10.
        raised.cost = 15;
        let seq = run(
            Algorithm::Window,
            &[(0, raised), (1, params(10, 60_000, 10, 0))],
        );
        assert_eq!(seq[0], (true, 5, 60_000));
        assert_eq!(seq[1], (false, 0, 59_999));
    }

    #[test]
    fn cost_zero_and_cost_above_the_limit_open_nothing() {
        let check = params(3, 1000, 3, 0);
        let big = params(3, 1000, 3, 4);
        let one = params(3, 1000, 3, 1);
        let seq = run(Algorithm::Window, &[(0, check), (0, big), (5, one)]);
        assert_eq!(
            seq,
            vec![(true, 3, 1000), (false, 3, 1000), (true, 2, 1000)]
        );
    }
}
