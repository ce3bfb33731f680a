//! Sliding window: epoch-aligned windows of W; the previous window's count
//! (capped at the limit) weighs `(W − e)/W`, e = time into the current
//! window. A hit of N is allowed iff
//! `floor(prev·(W−e)/W) + current + N ≤ limit`. Denied hits are not counted.
//! Stored as the current window's start and both windows' counts.

use super::{mul_div, round_up_to_second, Params, Spec, State, Verdict};

/// The sliding window, as the rest of the service sees it: its weighing
/// multiplies up to (limit + 1) × window ms; a denial's wait shrinks as the
/// previous window slides out, so the over-limit cache does not answer it;
/// its reset is rounded up.
pub const SPEC: Spec = Spec {
    name: "sliding",
    code: 2,
    credit_ms: |limit, _, window_ms| Some(limit.saturating_add(1).saturating_mul(window_ms)),
    has_burst: false,
    over_limit_cache: false,
    line_reset: round_up_to_second,
    step,
    full_in: Some(window_end_in),
    counted: super::counted_as_set,
    describe: |n, s, _| super::describe_named("sliding", n, s),
};

/// The current window at `now`: its start, the previous and current counts.
/// A state from a later window than `now`'s (the clock went back) is kept.
fn current(state: Option<State>, now: u64, w: u64) -> (u64, u64, u64) {
    let start_now = now - now % w;
    match state {
        Some(State::Sliding { start, prev, cur }) if start >= start_now => (start, prev, cur),
        Some(State::Sliding { start, cur, .. }) if start.saturating_add(w) == start_now => {
            (start_now, cur, 0)
        }
        _ => (start_now, 0, 0),
    }
}

/// The previous window's weight at time `e` into the current one, in credits.
fn weighted(prev: u64, e: u64, p: &Params) -> u64 {
    mul_div(prev.min(p.limit), p.window_ms - e, p.window_ms)
}

/// Ms until the end of the current window.
pub fn window_end_in(state: Option<State>, now: u64, p: &Params) -> u64 {
    let (start, _, _) = current(state, now, p.window_ms);
    start.saturating_add(p.window_ms).saturating_sub(now)
}

/// The smallest time into a window at which a previous count of `prev`
/// weighs at most `k` credits.
fn first_time_weighing(prev: u64, k: u64, w: u64) -> u64 {
    if prev <= k {
        return 0;
    }
    // floor(prev·(w−e)/w) ≤ k  ⟺  prev·(w−e) ≤ (k+1)·w − 1.
    w.saturating_sub(mul_div(k + 1, w, 1).saturating_sub(1) / prev)
}

/// Ms from `now` until a hit of `need` credits would be allowed.
fn wait(start: u64, prev: u64, cur: u64, need: u64, now: u64, p: &Params) -> u64 {
    let w = p.window_ms;
    let at = if need > p.limit {
        // Never: report the end of the window.
        start.saturating_add(w)
    } else if cur + need <= p.limit {
        start + first_time_weighing(prev.min(p.limit), p.limit - cur - need, w)
    } else {
        start.saturating_add(w) + first_time_weighing(cur.min(p.limit), p.limit - need, w)
    };
    at.saturating_sub(now).max(1)
}

/// Applies `p` to a sliding window holding `state` at `now` (ms).
pub fn step(state: Option<State>, now: u64, p: &Params) -> Verdict {
    let w = p.window_ms;
    let (start, prev, cur) = current(state, now, w);
    let e = now.saturating_sub(start).min(w - 1);
    let used = weighted(prev, e, p).saturating_add(cur);
    let reset_ms = start.saturating_add(w).saturating_sub(now);
    let at = |cur: u64| Some(State::Sliding { start, prev, cur });
    if p.refund {
        let left = cur.saturating_sub(p.cost);
        return Verdict {
            allowed: true,
            remaining: p.limit.saturating_sub(used - cur + left),
            reset_ms,
            next: if left != cur { at(left) } else { None },
        };
    }
    let need = p.cost.max(1);
    if need <= p.limit && used <= p.limit - need {
        let taken = used + p.cost;
        return Verdict {
            allowed: true,
            remaining: p.limit - taken,
            reset_ms,
            next: if p.cost > 0 { at(cur + p.cost) } else { None },
        };
    }
    Verdict {
        allowed: false,
        remaining: p.limit.saturating_sub(used),
        reset_ms: wait(start, prev, cur, need, now, p),
        next: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{params, run};
    use super::*;
    use crate::store::Algorithm;

    #[test]
    fn the_previous_window_weighs_by_the_time_left() {
        // 10 per 10 s; 10 hits at t = 5 s (window [0, 10 s)).
        let p = params(10, 10_000, 10, 1);
        let mut seq: Vec<(u64, _)> = (0..10).map(|_| (5_000, p)).collect();
        // At 12.5 s: prev 10 weighs floor(10·7.5/10) = 7: 3 more fit.
        seq.extend([(12_500, p), (12_500, p), (12_500, p), (12_500, p)]);
        let got = run(Algorithm::Sliding, &seq);
        assert_eq!(got[9], (true, 0, 5_000));
        assert_eq!(
            &got[10..13],
            &[(true, 2, 7_500), (true, 1, 7_500), (true, 0, 7_500)]
        );
        // Denied: prev 10 and cur 3 with a hit of 1 needs the weight ≤ 6:
        // floor(10·(10 000−e)/10 000) ≤ 6 from e = 3 001 ms, 501 ms from now.
        assert_eq!(got[13], (false, 0, 501));
    }

    #[test]
    fn a_full_current_window_waits_into_the_next() {
        let p = params(4, 1000, 4, 1);
        let seq: Vec<(u64, _)> = (0..5).map(|i| (100 + i, p)).collect();
        let got = run(Algorithm::Sliding, &seq);
        // Next window: prev 4 must weigh ≤ 3: floor(4·(1000−e)/1000) ≤ 3 from e = 1 ms.
        assert_eq!(got[4], (false, 0, 1000 - 104 + 1));
        // Two windows later nothing is left of it.
        let mut seq2 = seq.clone();
        seq2.push((2_000, p));
        assert_eq!(run(Algorithm::Sliding, &seq2)[5], (true, 3, 1000));
    }

    #[test]
    fn boundaries_cost_zero_and_cost_above_the_limit() {
        let p = params(3, 1000, 3, 3);
        let check = params(3, 1000, 3, 0);
        let big = params(3, 1000, 3, 4);
        let got = run(
            Algorithm::Sliding,
            &[(999, p), (999, check), (1000, check), (1000, big)],
        );
        assert_eq!(got[0], (true, 0, 1));
        assert_eq!(got[1], (false, 0, 2));
        // At the boundary the previous window weighs fully, 1 ms later 2.99.
        assert_eq!(got[2], (false, 0, 1));
        assert_eq!(got[3], (false, 0, 1000));
    }

    #[test]
    fn wait_is_the_first_instant_the_hit_fits() {
        // Brute force over every ms of two windows.
        for limit in 1..6u64 {
            for prev in 0..=limit {
                for cur in 0..=limit {
                    let w = 50;
                    let p = params(limit, w, limit, 1);
                    let st = Some(State::Sliding {
                        start: 1000,
                        prev,
                        cur,
                    });
                    for now in 1000..1050 {
                        let v = step(st, now, &p);
                        if v.allowed {
                            continue;
                        }
                        let t = (now..now + 200).find(|&t| step(st, t, &p).allowed).unwrap();
                        assert_eq!(v.reset_ms, t - now, "l{limit} p{prev} c{cur} now {now}");
                    }
                }
            }
        }
    }
}
