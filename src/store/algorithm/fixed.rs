//! Epoch-aligned fixed windows, as envoyproxy/ratelimit counts: the window
//! of time `now` is `[floor(now/W)·W, +W)`; a hit of N is allowed if the
//! credits used in it plus N are at most the limit. Denied hits are not
//! counted. Stored as the window's start and the credits used in it.

use super::{round_up_to_second, Params, Spec, State, Verdict};

/// The fixed window, as the rest of the service sees it: it counts credits
/// only; its denials last until its window ends, so the over-limit cache
/// may answer them; its reset is rounded up.
pub const SPEC: Spec = Spec {
    name: "fixed",
    code: 1,
    credit_ms: |_, _, _| None,
    has_burst: false,
    over_limit_cache: true,
    line_reset: round_up_to_second,
    step,
    full_in: Some(window_end_in),
    counted: super::counted_as_set,
    describe: |n, s, _| super::describe_named("fixed", n, s),
};

/// The counted window at `now`: its start and the credits used in it. A
/// state from a later window than `now`'s (the clock went back) is kept.
fn current(state: Option<State>, now: u64, w: u64) -> (u64, u64) {
    let start_now = now - now % w;
    match state {
        Some(State::Fixed { start, count }) if start >= start_now => (start, count),
        _ => (start_now, 0),
    }
}

/// Ms until the end of the counted window.
pub fn window_end_in(state: Option<State>, now: u64, p: &Params) -> u64 {
    let (start, _) = current(state, now, p.window_ms);
    start.saturating_add(p.window_ms).saturating_sub(now)
}

/// Applies `p` to a fixed window holding `state` at `now` (ms).
pub fn step(state: Option<State>, now: u64, p: &Params) -> Verdict {
    let (start, count) = current(state, now, p.window_ms);
    let reset_ms = start.saturating_add(p.window_ms).saturating_sub(now);
    let at = |count: u64| Some(State::Fixed { start, count });
    if p.refund {
        let left = count.saturating_sub(p.cost);
        return Verdict {
            allowed: true,
            remaining: p.limit.saturating_sub(left),
            reset_ms,
            next: if left != count { at(left) } else { None },
        };
    }
    if p.cost == 0 {
        return Verdict {
            allowed: count < p.limit,
            remaining: p.limit.saturating_sub(count),
            reset_ms,
            next: None,
        };
    }
    if p.cost <= p.limit && count <= p.limit - p.cost {
        return Verdict {
            allowed: true,
            remaining: p.limit - count - p.cost,
            reset_ms,
            next: at(count + p.cost),
        };
    }
    Verdict {
        allowed: false,
        remaining: p.limit.saturating_sub(count),
        reset_ms,
        next: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{params, run};
    use crate::store::Algorithm;

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        let p = params(2, 10_000, 2, 1);
        // t = 1 000 003 000 ms: the window is [1 000 000 000, 1 000 010 000).
        let t = 1_000_003_000;
        let seq = run(
            Algorithm::Fixed,
            &[
                (t, p),
                (t + 1, p),
                (t + 2, p),
                (t + 6_999, p),
                (t + 7_000, p),
            ],
        );
        assert_eq!(
            seq,
            vec![
                (true, 1, 7_000),
                (true, 0, 6_999),
                (false, 0, 6_998),
                (false, 0, 1),
                (true, 1, 10_000)
            ]
        );
    }

    #[test]
    fn exactly_at_the_limit_and_multi_credit_hits() {
        let p3 = params(5, 1000, 5, 3);
        let p2 = params(5, 1000, 5, 2);
        let p1 = params(5, 1000, 5, 1);
        let check = params(5, 1000, 5, 0);
        let seq = run(
            Algorithm::Fixed,
            &[(0, p3), (1, p3), (2, p2), (3, check), (4, p1)],
        );
        assert_eq!(
            seq,
            vec![
                (true, 2, 1000),
                (false, 2, 999),
                (true, 0, 998),
                (false, 0, 997),
                (false, 0, 996)
            ]
        );
        let big = params(5, 1000, 5, 6);
        assert_eq!(run(Algorithm::Fixed, &[(0, big)]), vec![(false, 5, 1000)]);
    }

    #[test]
    fn a_clock_going_back_keeps_the_later_window() {
        let p = params(2, 1000, 2, 1);
        let seq = run(Algorithm::Fixed, &[(5_500, p), (4_900, p), (4_950, p)]);
        // The second and third hits are counted in the window of the first.
        assert_eq!(
            seq,
            vec![(true, 1, 500), (true, 0, 1_100), (false, 0, 1_050)]
        );
    }
}
