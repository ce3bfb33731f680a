//! divvy's window: it opens at a counter's first charged hit with `limit`
//! credits and lasts `window`; a hit of N takes N credits if N are left.
//! Stored in Redis as divvy stores it: the credits left, with the window as
//! the key's TTL.

use super::{Params, State, Verdict};

/// Applies `p` to a divvy window holding `state` at `now` (ms).
pub fn step(state: Option<State>, now: u64, p: &Params) -> Verdict {
    let open = match state {
        Some(State::Window {
            remaining,
            expires_at,
        }) if expires_at > now => Some((remaining, expires_at)),
        _ => None,
    };
    let Some((remaining, expires_at)) = open else {
        // No open window: the first charged hit opens one.
        if !p.refund && p.cost > 0 && p.cost <= p.limit {
            let left = p.limit - p.cost;
            return Verdict {
                allowed: true,
                remaining: left,
                reset_ms: p.window_ms,
                next: Some(State::Window {
                    remaining: left,
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
    let changed = |left: u64| {
        (left != remaining).then_some(State::Window {
            remaining: left,
            expires_at,
        })
    };
    if p.refund {
        let left = remaining.saturating_add(p.cost).min(p.limit);
        return Verdict {
            allowed: true,
            remaining: left,
            reset_ms,
            next: changed(left),
        };
    }
    if p.cost == 0 {
        return Verdict {
            allowed: remaining > 0,
            remaining,
            reset_ms,
            next: None,
        };
    }
    if remaining >= p.cost {
        let left = remaining - p.cost;
        return Verdict {
            allowed: true,
            remaining: left,
            reset_ms,
            next: changed(left),
        };
    }
    Verdict {
        allowed: false,
        remaining,
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
