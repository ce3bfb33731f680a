//! Token bucket, as GCRA: the bucket refills continuously at `limit`
//! credits per `window` and holds at most `burst`; a new bucket is full; a
//! hit of N is allowed if N credits are in it. This is GCRA's
//! continuous-state form (equivalent to the theoretical-arrival-time form):
//! the stored state is the capacity in use and the time it was computed.
//!
//! Integers only: one credit is `window_ms` units of capacity and the
//! bucket drains (refills) `limit` units per millisecond, so the capacity is
//! `burst × window_ms` and every rate is exact.

use super::{round_up_to_second, Counted, Numbers, Params, Spec, State, Verdict};

/// The token bucket, as the rest of the service sees it: it counts its
/// burst in credit × window ms; it refills continuously, so the over-limit
/// cache does not answer its denials; its reset is rounded up.
pub const SPEC: Spec = Spec {
    name: "token_bucket",
    code: 3,
    credit_ms: |_, burst, window_ms| Some(burst.saturating_mul(window_ms)),
    has_burst: true,
    over_limit_cache: false,
    line_reset: round_up_to_second,
    step,
    full_in: Some(full_in),
    counted,
    describe: |n, s, b| format!("token bucket {n} per {s}s, burst {b}"),
};

/// The bucket keeps `own`'s period as its unit: a knob's period becomes
/// the equivalent rate per that unit (rounded down, at least 1); the
/// knob's creditLimit and burst apply as they are.
fn counted(own: Numbers, effective: Numbers) -> Counted {
    let limit = if effective.reset_seconds == own.reset_seconds {
        effective.credit_limit
    } else {
        let rate = u128::from(effective.credit_limit) * u128::from(own.reset_seconds)
            / u128::from(effective.reset_seconds.max(1));
        u64::try_from(rate).unwrap_or(u64::MAX).max(1)
    };
    Counted {
        limit,
        window_seconds: own.reset_seconds,
        burst: effective.burst,
    }
}

/// The capacity in use at `now`, and the time it is valid at. A state from
/// the future (the clock went back) is kept as it is.
fn current(state: Option<State>, now: u64, p: &Params) -> (u64, u64) {
    match state {
        Some(State::Bucket { used, at }) if now > at => {
            let elapsed = now - at;
            // elapsed·limit could overflow; compare first (as the script does).
            if elapsed >= used.div_ceil(p.limit) {
                (0, now)
            } else {
                (used.saturating_sub(elapsed.saturating_mul(p.limit)), now)
            }
        }
        Some(State::Bucket { used, at }) => (used, at),
        _ => (0, now),
    }
}

/// Ms until a bucket holding `state` is full again.
pub fn full_in(state: Option<State>, now: u64, p: &Params) -> u64 {
    let (used, at) = current(state, now, p);
    at.saturating_sub(now) + used.div_ceil(p.limit)
}

/// Applies `p` to a bucket holding `state` at `now` (ms).
pub fn step(state: Option<State>, now: u64, p: &Params) -> Verdict {
    let (used, at) = current(state, now, p);
    let unit = p.window_ms;
    let capacity = p.burst.saturating_mul(unit);
    let remaining = |used: u64| capacity.saturating_sub(used) / unit;
    // Times are counted from `at`, which is later than `now` only when the clock went back.
    let ahead = at.saturating_sub(now);
    let full_in = |used: u64| ahead.saturating_add(used.div_ceil(p.limit));
    if p.refund {
        let left = used.saturating_sub(p.cost.saturating_mul(unit));
        return Verdict {
            allowed: true,
            remaining: remaining(left),
            reset_ms: full_in(left),
            next: (left != used).then_some(State::Bucket { used: left, at }),
        };
    }
    let need_credits = p.cost.max(1);
    if need_credits > p.burst {
        // Never fits: report when the bucket is full.
        return Verdict {
            allowed: false,
            remaining: remaining(used),
            reset_ms: full_in(used),
            next: None,
        };
    }
    let need = need_credits.saturating_mul(unit);
    if used <= capacity.saturating_sub(need) {
        let after = if p.cost > 0 {
            used.saturating_add(need)
        } else {
            used
        };
        return Verdict {
            allowed: true,
            remaining: remaining(after),
            reset_ms: full_in(after),
            next: (p.cost > 0).then_some(State::Bucket { used: after, at }),
        };
    }
    Verdict {
        allowed: false,
        remaining: remaining(used),
        reset_ms: ahead.saturating_add(
            used.saturating_add(need)
                .saturating_sub(capacity)
                .div_ceil(p.limit),
        ),
        next: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{params, run};
    use super::*;
    use crate::store::Algorithm;

    #[test]
    fn five_burst_one_per_second() {
        let p = params(1, 1000, 5, 1);
        let seq: Vec<(u64, _)> = (0..6).map(|i| (10_000 + i, p)).collect();
        let got = run(Algorithm::TokenBucket, &seq);
        assert_eq!(
            got,
            vec![
                (true, 4, 1000),
                (true, 3, 1999),
                (true, 2, 2998),
                (true, 1, 3997),
                (true, 0, 4996),
                // One credit comes back 995 ms later.
                (false, 0, 995)
            ]
        );
    }

    #[test]
    fn refills_continuously_and_never_above_the_burst() {
        // 40 per second with a burst of 80.
        let p = params(40, 1000, 80, 1);
        let mut seq: Vec<(u64, _)> = (0..80).map(|_| (0, p)).collect();
        seq.push((0, p));
        // 25 ms later one credit is back.
        seq.push((24, p));
        seq.push((25, p));
        seq.push((25, p));
        let got = run(Algorithm::TokenBucket, &seq);
        assert!(got[..80].iter().all(|g| g.0));
        assert_eq!(got[80], (false, 0, 25));
        assert_eq!(got[81], (false, 0, 1));
        assert_eq!(got[82], (true, 0, 2000));
        assert!(!got[83].0);
        // After a long idle period it is full, not fuller.
        let got = run(
            Algorithm::TokenBucket,
            &[(0, p), (1_000_000, params(40, 1000, 80, 0))],
        );
        assert_eq!(got[1], (true, 80, 0));
    }

    #[test]
    fn cost_above_the_burst_exact_fit_and_checks() {
        let p = params(10, 1000, 5, 5);
        let big = params(10, 1000, 5, 6);
        let check = params(10, 1000, 5, 0);
        let got = run(
            Algorithm::TokenBucket,
            &[(0, big), (0, p), (0, check), (0, big)],
        );
        assert_eq!(got[0], (false, 5, 0));
        assert_eq!(got[1], (true, 0, 500));
        // A check needs one credit: back in 100 ms.
        assert_eq!(got[2], (false, 0, 100));
        assert_eq!(got[3], (false, 0, 500));
    }

    #[test]
    fn refunds_never_overfill_and_a_clock_going_back_is_harmless() {
        let p = params(1, 1000, 3, 1);
        let mut refund = params(1, 1000, 3, 5);
        refund.refund = true;
        let got = run(
            Algorithm::TokenBucket,
            &[(5_000, p), (5_000, p), (5_000, refund)],
        );
        assert_eq!(got[2], (true, 3, 0));
        // The clock goes back 2 s: the bucket neither refills nor breaks.
        let got = run(
            Algorithm::TokenBucket,
            &[(5_000, p), (3_000, p), (3_000, p), (3_000, p)],
        );
        assert_eq!(got[1], (true, 1, 4000));
        assert_eq!(got[2], (true, 0, 5000));
        assert_eq!(got[3], (false, 0, 3000));
    }

    #[test]
    fn state_is_full_after_its_expiry() {
        let p = params(3, 1000, 3, 2);
        let v = step(None, 0, &p);
        let st = v.next.unwrap();
        let exp = super::super::expires_at(&st, &p);
        assert_eq!(exp, 667);
        assert_eq!(current(Some(st), exp, &p).0, 0);
        assert_ne!(current(Some(st), exp - 1, &p).0, 0);
    }
}
