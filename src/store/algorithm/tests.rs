//! Unit tests of `store/algorithm/mod.rs`.

use super::*;

/// Params with the cost given.
pub fn params(limit: u64, window_ms: u64, burst: u64, cost: u64) -> Params {
    Params {
        limit,
        window_ms,
        burst,
        cost,
        refund: false,
    }
}

/// Runs `(time, params)` steps on one counter, charging allowed ones:
/// `(allowed, remaining, reset_ms)` per step.
pub fn run(algorithm: Algorithm, steps: &[(u64, Params)]) -> Vec<(bool, u64, u64)> {
    let mut state = None;
    steps
        .iter()
        .map(|(now, p)| {
            let v = step(algorithm, state, *now, p);
            if let Some(next) = v.next {
                state = Some(next);
            }
            (v.allowed, v.remaining, v.reset_ms)
        })
        .collect()
}

/// One counter's stored state, with every save recorded.
struct One {
    state: Option<State>,
    saves: Vec<State>,
}

impl States for One {
    fn load(&mut self, _: usize) -> Option<State> {
        self.state
    }
    fn save(&mut self, _: usize, state: State) {
        self.state = Some(state);
        self.saves.push(state);
    }
}

/// Several counters (op `i` of a call on counter `of[i]`), every load
/// and save recorded in order (the order matters to a store whose loads
/// mark counters used and whose saves may evict).
struct Many {
    states: Vec<Option<State>>,
    of: Vec<usize>,
    log: Vec<(usize, Option<State>)>,
}

impl States for Many {
    fn load(&mut self, i: usize) -> Option<State> {
        self.log.push((self.of[i], None));
        self.states[self.of[i]]
    }
    fn save(&mut self, i: usize, state: State) {
        self.states[self.of[i]] = Some(state);
        self.log.push((self.of[i], Some(state)));
    }
}

use proptest::prelude::*;

fn any_op() -> impl Strategy<Value = CounterOp> {
    (
        prop_oneof![
            Just(Algorithm::Window),
            Just(Algorithm::Fixed),
            Just(Algorithm::Sliding),
            Just(Algorithm::TokenBucket),
        ],
        1u64..=12,
        1u64..=5,
        1u64..=15,
        0u64..=16,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(algorithm, limit, secs, burst, cost, refund, decides, fill, overdraft)| {
                let burst = if algorithm == Algorithm::TokenBucket {
                    burst
                } else {
                    limit
                };
                CounterOp {
                    burst,
                    refund,
                    decides,
                    fill,
                    overdraft,
                    ..CounterOp::new("k", algorithm, limit, Duration::from_secs(secs), cost)
                }
            },
        )
}

fn any_charge() -> impl Strategy<Value = Charge> {
    prop_oneof![
        Just(Charge::Each),
        Just(Charge::AllOrNothing),
        Just(Charge::Denied)
    ]
}

/// The largest exact limit is the bound each algorithm's product
/// implies: (limit + 1) × window for sliding, burst × window for the
/// token bucket, none for the others.
#[test]
fn largest_exact_limit_follows_each_product() {
    for w in [
        1,
        7,
        1000,
        3_600_000,
        MAX_CREDIT_MS / 3,
        MAX_CREDIT_MS,
        MAX_CREDIT_MS + 1,
    ] {
        assert_eq!(
            Algorithm::Sliding.largest_exact_limit(w),
            (MAX_CREDIT_MS / w).saturating_sub(1)
        );
        assert_eq!(
            Algorithm::TokenBucket.largest_exact_limit(w),
            MAX_CREDIT_MS / w
        );
        assert_eq!(Algorithm::Window.largest_exact_limit(w), MAX_CREDIT_LIMIT);
        assert_eq!(Algorithm::Fixed.largest_exact_limit(w), MAX_CREDIT_LIMIT);
    }
}

/// Every algorithm is found by its name, and its code is its place.
#[test]
fn registry_names_and_codes() {
    for (i, a) in Algorithm::ALL.into_iter().enumerate() {
        assert_eq!(Algorithm::parse(a.as_str()), Some(a));
        assert_eq!(a.code(), i as i64);
    }
    assert_eq!(Algorithm::Window.line_reset_seconds(1499), 1);
    assert_eq!(Algorithm::Fixed.line_reset_seconds(1001), 2);
}

proptest! {
    /// The one-op fast path answers and saves as the general path does,
    /// step after step on one counter.
    #[test]
    fn one_op_fast_path_is_the_general_path(
        steps in prop::collection::vec((0u64..=3_000, any_op(), any_charge()), 1..=30)
    ) {
        let mut fast = One { state: None, saves: Vec::new() };
        let mut general = One { state: None, saves: Vec::new() };
        let mut now = 1_700_000_000_000u64;
        for (advance, op, charge) in steps {
            now += advance;
            let ops = [op];
            let a = apply_one(&mut fast, now, &ops[0], charge);
            let b = apply_groups(&mut general, now, &ops, &[0], charge);
            prop_assert_eq!(vec![a], b);
            prop_assert_eq!(&fast.saves, &general.saves);
            prop_assert_eq!(fast.state, general.state);
        }
    }

    /// Calls of independent ops on distinct counters (the batch path,
    /// `Charge::Each`) answer, load and save as the general path does,
    /// in the same order, call after call on six counters.
    #[test]
    fn independent_distinct_ops_are_the_general_path(
        calls in prop::collection::vec(
            (
                0u64..=3_000,
                Just((0..6usize).collect::<Vec<_>>()).prop_shuffle(),
                prop::collection::vec(any_op(), 2..=6),
            ),
            1..=20,
        )
    ) {
        let many = || Many { states: vec![None; 6], of: Vec::new(), log: Vec::new() };
        let (mut fast, mut general) = (many(), many());
        let mut now = 1_700_000_000_000u64;
        for (advance, counters, ops) in calls {
            now += advance;
            let of = counters[..ops.len()].to_vec();
            let same: Vec<usize> = (0..ops.len()).collect();
            fast.of.clone_from(&of);
            general.of = of;
            let a = apply_request(&mut fast, now, &ops, &same, Charge::Each);
            let b = apply_groups(&mut general, now, &ops, &same, Charge::Each);
            prop_assert_eq!(a, b);
            prop_assert_eq!(&fast.log, &general.log);
        }
    }
}

/// A filled hit takes what is left and answers denied with none left, for
/// every algorithm; under all-or-nothing it is a plain denied hit.
#[test]
fn a_filled_hit_takes_what_is_left() {
    for algorithm in [
        Algorithm::Window,
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::TokenBucket,
    ] {
        let op = |cost, fill| CounterOp {
            fill,
            ..CounterOp::new("k", algorithm, 5, Duration::from_secs(10), cost)
        };
        let mut one = One {
            state: None,
            saves: Vec::new(),
        };
        let now = 1_700_000_004_000;
        let first = apply_request(&mut one, now, &[op(3, false)], &[0], Charge::Each);
        assert!(first[0].allowed, "{algorithm:?}");
        let aon = apply_request(&mut one, now, &[op(4, true)], &[0], Charge::AllOrNothing);
        assert_eq!(
            (aon[0].allowed, aon[0].remaining),
            (false, 2),
            "{algorithm:?}"
        );
        let filled = apply_request(&mut one, now, &[op(4, true)], &[0], Charge::Each);
        assert_eq!(
            (filled[0].allowed, filled[0].remaining),
            (false, 0),
            "{algorithm:?}"
        );
        let after = apply_request(&mut one, now, &[op(1, false)], &[0], Charge::Each);
        assert_eq!(
            (after[0].allowed, after[0].remaining),
            (false, 0),
            "{algorithm:?}"
        );
        // The reset is what a retry of the filled hit gets.
        let retry = apply_request(&mut one, now, &[op(4, false)], &[0], Charge::Each);
        assert_eq!(filled[0].reset_after, retry[0].reset_after, "{algorithm:?}");
        assert_eq!(one.saves.len(), 2, "{algorithm:?}");
    }
}

/// 1,000 credits an hour (a bucket of 1,000 refilling 1,000 an hour).
fn hourly(algorithm: Algorithm, cost: u64) -> CounterOp {
    CounterOp {
        overdraft: true,
        ..CounterOp::new("k", algorithm, 1000, Duration::from_secs(3600), cost)
    }
}

/// One op on counter `one` at `now`, charged on its own: (allowed, left).
fn hit(one: &mut One, now: u64, op: &CounterOp) -> (bool, u64) {
    let a = apply_request(one, now, std::slice::from_ref(op), &[0], Charge::Each);
    (a[0].allowed, a[0].remaining)
}

fn empty() -> One {
    One {
        state: None,
        saves: Vec::new(),
    }
}

/// The start of an hour: the epoch-aligned windows start with it.
const HOUR_START: u64 = 1_699_999_200_000;

/// With a check before each charge of 300: checks answer OK OK OK OK OVER
/// OVER (after three charges 100 are left; the fourth charge of 300 is
/// allowed and leaves a debt of 200), and `remaining` is 0 in debt.
#[test]
fn an_overdraft_admits_while_anything_is_left() {
    for algorithm in Algorithm::ALL {
        let mut one = empty();
        let (check, charge) = (hourly(algorithm, 0), hourly(algorithm, 300));
        let mut checks = Vec::new();
        for _ in 0..4 {
            checks.push(hit(&mut one, HOUR_START, &check).0);
            assert!(hit(&mut one, HOUR_START, &charge).0, "{algorithm:?}");
        }
        checks.push(hit(&mut one, HOUR_START, &check).0);
        checks.push(hit(&mut one, HOUR_START, &check).0);
        assert_eq!(
            checks,
            [true, true, true, true, false, false],
            "{algorithm:?}"
        );
        assert_eq!(hit(&mut one, HOUR_START, &check).1, 0, "{algorithm:?}");
        // The debt of 200 is there: a refund of 250 leaves 50.
        let refund = CounterOp {
            refund: true,
            ..hourly(algorithm, 250)
        };
        assert_eq!(
            hit(&mut one, HOUR_START, &refund),
            (true, 50),
            "{algorithm:?}"
        );
    }
}

/// A first charge of 2,500 is allowed and leaves a debt of 1,500; hits
/// after it are denied, and a denied hit charged on its own deepens the
/// debt; the window's reset pays it back.
#[test]
fn a_first_charge_past_the_limit_is_a_debt_until_the_reset() {
    for algorithm in [Algorithm::Window, Algorithm::Fixed, Algorithm::Sliding] {
        let mut one = empty();
        let now = HOUR_START + 1_000;
        assert_eq!(hit(&mut one, now, &hourly(algorithm, 2500)), (true, 0));
        let denied = apply_request(&mut one, now, &[hourly(algorithm, 300)], &[0], Charge::Each);
        assert_eq!((denied[0].allowed, denied[0].remaining), (false, 0));
        // The reset answered is when something is left again.
        let back = now + u64::try_from(denied[0].reset_after.as_millis()).unwrap_or(0);
        let check = hourly(algorithm, 0);
        assert!(!hit(&mut one, back - 1, &check).0, "{algorithm:?}");
        assert!(hit(&mut one, back, &check).0, "{algorithm:?}");
        // Two windows on, the debt is gone whatever the algorithm.
        let later = now + 2 * 3_600_000;
        assert_eq!(hit(&mut one, later, &check), (true, 1000), "{algorithm:?}");
    }
}

/// A token bucket of 1,000 an hour with a debt of 2,000 (a first charge of
/// 3,000) pays it back in two hours: denied at 1h59m, nothing left at 2h,
/// the first admission when one credit is back (3.6 s later).
#[test]
fn a_token_bucket_pays_a_debt_back_by_its_refill() {
    let mut one = empty();
    let bucket = |cost| hourly(Algorithm::TokenBucket, cost);
    let t0 = HOUR_START + 123;
    let first = apply_request(&mut one, t0, &[bucket(3000)], &[0], Charge::Each);
    assert_eq!((first[0].allowed, first[0].remaining), (true, 0));
    assert_eq!(first[0].reset_after, Duration::from_secs(3 * 3600));
    let at = |ms: u64| t0 + ms;
    let early = apply_request(&mut one, at(7_140_000), &[bucket(0)], &[0], Charge::Each);
    assert_eq!((early[0].allowed, early[0].remaining), (false, 0));
    assert_eq!(early[0].reset_after, Duration::from_millis(63_600));
    assert_eq!(hit(&mut one, at(7_200_000), &bucket(0)), (false, 0));
    assert!(!hit(&mut one, at(7_203_599), &bucket(0)).0);
    assert_eq!(hit(&mut one, at(7_203_600), &bucket(1)), (true, 0));
}

/// In a group (a rule's limits) or an all-or-nothing request, a denied
/// overdraft charges nothing: the debt is taken only when every limit of
/// the group admits the hit, and then it is taken in full.
#[test]
fn a_denied_group_takes_no_debt() {
    for algorithm in Algorithm::ALL {
        let mut many = Many {
            states: vec![None; 2],
            of: vec![0, 1],
            log: Vec::new(),
        };
        let a = hourly(algorithm, 900);
        let b = CounterOp {
            joint: true,
            ..hourly(algorithm, 900)
        };
        let now = HOUR_START;
        let first = apply_request(
            &mut many,
            now,
            &[a.clone(), b.clone()],
            &[0, 1],
            Charge::Each,
        );
        assert!(first.iter().all(|s| s.allowed && s.remaining == 100));
        // Both overdraw: both admit (100 left each), both go into debt.
        let second = apply_request(
            &mut many,
            now,
            &[a.clone(), b.clone()],
            &[0, 1],
            Charge::Each,
        );
        assert!(second.iter().all(|s| s.allowed && s.remaining == 0));
        // Both in debt: denied, and the group charges nothing.
        let saved = many.states.clone();
        let third = apply_request(&mut many, now, &[a.clone(), b], &[0, 1], Charge::Each);
        assert!(third.iter().all(|s| !s.allowed));
        assert_eq!(many.states, saved, "{algorithm:?}");
        // Alone but all-or-nothing: not charged either.
        apply_request(&mut many, now, &[a], &[0], Charge::AllOrNothing);
        assert_eq!(many.states, saved, "{algorithm:?}");
    }
}
