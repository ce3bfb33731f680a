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
    )
        .prop_map(
            |(algorithm, limit, secs, burst, cost, refund, decides, fill)| {
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
