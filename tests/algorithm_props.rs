//! The memory store and the Redis store answer alike.
//!
//! Random sequences of requests run through both stores on ONE simulated
//! clock: the memory store runs the Rust arithmetic (`src/store/algorithm`),
//! the Redis store runs its mirror (the script joined from `src/store/lua/`, given the
//! simulated time instead of Redis `TIME`) on a real `redis-server` this
//! test starts. Every answer of every request must be identical. A few
//! hand-written sequences check the same on the edges, with the expected
//! answers spelled out.
//!
//! Redis's real clock. The script stores each counter with a TTL computed
//! in simulated time (the counter's expiry minus the simulated now), but
//! Redis expires keys on its own, real clock, while the simulated clock
//! jumps by seconds between requests a fraction of a millisecond apart (and
//! sometimes goes back). So after every step one small script reads each
//! counter's PTTL and then PERSISTs it: nothing expires on the real clock,
//! and, as in the memory store (which holds a counter until it is swept; no
//! sweeper runs here), a stale counter is left to the algorithms, which
//! must read it as a fresh one. The PTTL the store's script set is checked
//! against the memory store's expiry of the same counter (see
//! [`Bench::step`]). A key whose simulated TTL was a millisecond or two can
//! still expire on the real clock between the store's script and that
//! PERSIST; Redis's `expired_keys` counter shows it, and the rest of that
//! case is inconclusive (counted and reported, never a failure).
//!
//! [`Algorithm::Window`] is left out: divvy's layout keeps that window in
//! the key's TTL (the script reads it back with PTTL), which runs on Redis's
//! real clock and cannot follow a simulated one.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use divvy::store::memory::Clock;
use divvy::store::redis::{RedisOptions, RedisStore};
use divvy::store::redis_url::parse_redis_url;
use divvy::store::{Algorithm, Charge, CounterOp, CounterState, MemoryStore, Store};
use fred::clients::Client;
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::config::Config as FredConfig;
use fred::types::Builder;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

/// A simulated "now" (2023-11-14), a multiple of 10 s.
const T0: u64 = 1_700_000_000_000;

/// Random cases of the property test.
const CASES: u32 = 128;

/// A clock the test sets by hand: ms since the epoch.
#[derive(Debug, Default)]
struct SimClock(AtomicU64);

impl SimClock {
    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    fn ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.ms())
    }
}

/// Per key: its PTTL before it is made persistent (-2: no key, -1: no
/// TTL, i.e. not written since the last call); then Redis's count of keys
/// it expired on its own clock.
const SETTLE: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('PTTL', k)
  redis.call('PERSIST', k)
end
local info = redis.call('INFO', 'stats')
out[#out + 1] = tonumber(string.match(info, 'expired_keys:(%d+)'))
return out
"#;

/// The Redis store on the simulated clock, and a plain client beside it.
struct RedisSide {
    store: RedisStore,
    admin: Client,
}

impl RedisSide {
    async fn connect(url: &str, clock: Arc<SimClock>) -> RedisSide {
        let options = RedisOptions {
            target: parse_redis_url(url, None).expect("redis url"),
            timeout: Duration::from_secs(5),
            clock: Some(clock),
            batches_in_flight: divvy::store::redis::DEFAULT_BATCHES_IN_FLIGHT,
            tls: None,
        };
        let (store, connected) = RedisStore::connect(&options, Duration::from_secs(10))
            .await
            .expect("redis store");
        assert!(connected, "the redis store did not connect to {url}");
        let admin = Builder::from_config(FredConfig::from_url(url).expect("fred config"))
            .build()
            .expect("fred client");
        admin.init().await.expect("admin connection");
        RedisSide { store, admin }
    }

    /// Empties Redis; returns its expired-keys count.
    async fn flush(&self) -> u64 {
        self.admin.flushall::<()>(false).await.expect("FLUSHALL");
        self.settle(&[]).await.1
    }

    /// PTTL of each key, then PERSIST; and the expired-keys count.
    async fn settle(&self, keys: &[String]) -> (Vec<i64>, u64) {
        let mut got: Vec<i64> = self
            .admin
            .eval(SETTLE, keys.to_vec(), Vec::<String>::new())
            .await
            .expect("settle script");
        let expired = got.pop().expect("expired_keys");
        (got, u64::try_from(expired).unwrap_or(0))
    }
}

/// One counter: its key and numbers; always used with these.
#[derive(Debug, Clone)]
struct Counter {
    key: String,
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
}

impl Counter {
    fn new(key: &str, algorithm: Algorithm, limit: u64, window_ms: u64, burst: u64) -> Counter {
        Counter {
            key: key.to_owned(),
            algorithm,
            limit,
            window_ms,
            burst: if algorithm == Algorithm::TokenBucket {
                burst
            } else {
                limit
            },
        }
    }

    /// A deciding op of its own group taking `cost`.
    fn op(&self, cost: u64) -> CounterOp {
        CounterOp {
            burst: self.burst,
            ..CounterOp::new(
                self.key.clone(),
                self.algorithm,
                self.limit,
                Duration::from_millis(self.window_ms),
                cost,
            )
        }
    }
}

/// The ops of one request and how it is charged.
type Request = (Vec<CounterOp>, Charge);

/// Both stores over one set of counters.
struct Bench<'a> {
    clock: Arc<SimClock>,
    memory: MemoryStore,
    redis: &'a RedisSide,
    counters: Vec<Counter>,
    /// Redis's expired-keys count when the bench started.
    expired: u64,
}

impl<'a> Bench<'a> {
    /// Empties Redis, starts a fresh memory store, sets the clock to `start`.
    async fn new(
        clock: Arc<SimClock>,
        redis: &'a RedisSide,
        counters: Vec<Counter>,
        start: u64,
    ) -> Bench<'a> {
        let expired = redis.flush().await;
        clock.set(start);
        Bench {
            memory: MemoryStore::with_clock(clock.clone()),
            clock,
            redis,
            counters,
            expired,
        }
    }

    /// The memory store's live state of `op`'s counter at `at` (ms).
    async fn peek_at(&self, op: &CounterOp, at: u64) -> Option<CounterState> {
        self.clock.set(at);
        self.memory.peek(op).await.expect("memory peek")
    }

    /// Applies `requests` at the clock's time, in order: one by one to the
    /// memory store, together to the Redis store (so a single-threaded
    /// runtime hands them to one script call). Returns the answers if both
    /// stores gave the same ones and keep their counters until the same
    /// time; `None` if Redis expired a key on its own clock (inconclusive).
    async fn step(
        &mut self,
        requests: &[Request],
    ) -> Result<Option<Vec<Vec<CounterState>>>, String> {
        let now = self.clock.ms();
        let started = Instant::now();
        let memory: Vec<Vec<CounterState>> = requests
            .iter()
            .map(|(ops, charge)| self.memory.apply_now(ops, *charge))
            .collect();
        let redis = futures_util::future::join_all(
            requests
                .iter()
                .map(|(ops, charge)| self.redis.store.apply(ops, *charge)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("at {now}: the redis store failed: {e}"))?;
        if memory != redis {
            return Err(format!(
                "answers differ at t = T0 + {} ms\nrequests: {requests:#?}\nmemory: {memory:#?}\nredis:  {redis:#?}",
                now.wrapping_sub(T0)
            ));
        }
        let keys: Vec<String> = self.counters.iter().map(|c| c.key.clone()).collect();
        let (pttls, expired) = self.redis.settle(&keys).await;
        if expired != self.expired {
            return Ok(None);
        }
        // Redis's PTTL p was read at most `slack` ms (real) after the
        // script set the TTL T: p ≤ T ≤ p + slack. The memory store must
        // hold the counter until now + T too.
        let slack = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX) + 2;
        let mut problem = None;
        for (counter, pttl) in self.counters.iter().zip(pttls) {
            let check = counter.op(0);
            let what = match pttl {
                -1 => None,
                -2 => self
                    .peek_at(&check, now)
                    .await
                    .map(|_| "Redis holds no counter but the memory store holds a live one"),
                p => {
                    let p = u64::try_from(p).unwrap_or(0);
                    if p >= 1 && self.peek_at(&check, now + p - 1).await.is_none() {
                        Some("the memory store drops the counter before the TTL Redis was given")
                    } else if self.peek_at(&check, now + p + slack).await.is_some() {
                        Some("the memory store keeps the counter after the TTL Redis was given")
                    } else {
                        None
                    }
                }
            };
            if let Some(what) = what {
                problem = Some(format!(
                    "at t = T0 + {} ms, key {}: {what} (PTTL {pttl} ms, slack {slack} ms)\nrequests: {requests:#?}",
                    now.wrapping_sub(T0),
                    counter.key
                ));
                break;
            }
        }
        self.clock.set(now);
        match problem {
            Some(p) => Err(p),
            None => Ok(Some(memory)),
        }
    }

    /// One request at the current time; panics unless both stores agree.
    async fn one(&mut self, ops: &[CounterOp], charge: Charge) -> Vec<CounterState> {
        match self.step(&[(ops.to_vec(), charge)]).await {
            Ok(Some(mut answers)) => answers.pop().expect("one answer"),
            Ok(None) => panic!("inconclusive: Redis expired a counter on its real clock"),
            Err(e) => panic!("{e}"),
        }
    }

    /// One op of counter `i` on its own, at the current time.
    async fn hit(&mut self, i: usize, cost: u64) -> CounterState {
        let op = self.counters[i].op(cost);
        self.one(&[op], Charge::Each).await[0]
    }

    fn at(&self, ms: u64) {
        self.clock.set(ms);
    }
}

// ---------------------------------------------------------------------------
// The property.

/// How the clock moves before a step.
#[derive(Debug, Clone)]
enum Advance {
    Stay,
    /// A few ms.
    Ms(u64),
    /// A fraction (‰, up to 2 windows) of a counter's window.
    Windows {
        counter: usize,
        permille: u64,
    },
    /// To the next boundary of a counter's window, ± 2 ms.
    Boundary {
        counter: usize,
        offset: i64,
    },
    /// Back by up to 1 s.
    Back(u64),
}

impl Advance {
    fn apply(&self, now: u64, counters: &[Counter]) -> u64 {
        match *self {
            Advance::Stay => now,
            Advance::Ms(d) => now + d,
            Advance::Windows { counter, permille } => {
                now + counters[counter].window_ms * permille / 1000
            }
            Advance::Boundary { counter, offset } => {
                let w = counters[counter].window_ms;
                let next = (now / w + 1) * w;
                next.saturating_add_signed(offset)
            }
            Advance::Back(d) => now - d,
        }
    }
}

/// One op of a generated request.
#[derive(Debug, Clone)]
struct OpGen {
    counter: usize,
    /// Brought into range by [`OpGen::op`].
    cost: u64,
    refund: bool,
    joint: bool,
    decides: bool,
    /// [`CounterOp::fill`].
    fill: bool,
    /// [`CounterOp::overdraft`].
    overdraft: bool,
}

#[derive(Debug, Clone)]
struct RequestGen {
    charge: Charge,
    ops: Vec<OpGen>,
}

#[derive(Debug, Clone)]
struct Step {
    advance: Advance,
    /// Usually one request; sometimes a few at once (one script call).
    requests: Vec<RequestGen>,
}

#[derive(Debug, Clone)]
struct Case {
    start: u64,
    counters: Vec<Counter>,
    steps: Vec<Step>,
}

/// Counter `i`: one algorithm and one set of numbers for the whole case
/// (mixing algorithms on one key is not meaningful).
fn counter(i: usize) -> impl Strategy<Value = Counter> {
    let window = prop_oneof![(1u64..=60).prop_map(|s| s * 1000), 1000u64..=60_000,];
    (
        prop_oneof![
            Just(Algorithm::Fixed),
            Just(Algorithm::Sliding),
            Just(Algorithm::TokenBucket),
        ],
        1u64..=20,
        window,
        1u64..=30,
    )
        .prop_map(move |(algorithm, limit, window_ms, burst)| {
            Counter::new(&format!("prop:k{i}"), algorithm, limit, window_ms, burst)
        })
}

fn op_gen() -> impl Strategy<Value = OpGen> {
    (
        0..3usize,
        prop_oneof![3 => Just(1u64), 6 => 0u64..=31],
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(counter, cost, refund, joint, decides, fill, overdraft)| OpGen {
                counter,
                cost,
                refund,
                joint,
                decides,
                fill,
                overdraft,
            },
        )
}

fn request_gen() -> impl Strategy<Value = RequestGen> {
    (
        prop_oneof![
            6 => Just(Charge::Each),
            3 => Just(Charge::AllOrNothing),
            1 => Just(Charge::Denied),
        ],
        prop::collection::vec(op_gen(), 1..=4),
    )
        .prop_map(|(charge, ops)| RequestGen { charge, ops })
}

fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        3 => Just(Advance::Stay),
        3 => (1u64..=5).prop_map(Advance::Ms),
        3 => (0..3usize, 0u64..=2000)
            .prop_map(|(counter, permille)| Advance::Windows { counter, permille }),
        2 => (0..3usize, -2i64..=2)
            .prop_map(|(counter, offset)| Advance::Boundary { counter, offset }),
        1 => (1u64..=1000).prop_map(Advance::Back),
    ]
}

fn step_gen() -> impl Strategy<Value = Step> {
    (
        advance(),
        prop_oneof![
            8 => prop::collection::vec(request_gen(), 1..=1),
            1 => prop::collection::vec(request_gen(), 2..=3),
        ],
    )
        .prop_map(|(advance, requests)| Step { advance, requests })
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u64..1_000_000_000,
        (counter(0), counter(1), counter(2)),
        prop::collection::vec(step_gen(), 1..=40),
    )
        .prop_map(|(offset, (a, b, c), steps)| Case {
            start: T0 + offset,
            counters: vec![a, b, c],
            steps,
        })
}

impl OpGen {
    /// The op, its cost brought into 0..=max(limit, burst) + 1.
    fn op(&self, counters: &[Counter]) -> CounterOp {
        let c = &counters[self.counter];
        let cost = self.cost % (c.limit.max(c.burst) + 2);
        CounterOp {
            refund: self.refund,
            joint: self.joint,
            decides: self.decides,
            fill: self.fill,
            overdraft: self.overdraft,
            ..c.op(cost)
        }
    }
}

/// One line per request: `k1 cost 2 refund joint canary, ... (AllOrNothing)`.
fn describe(requests: &[Request]) -> String {
    let line = |(ops, charge): &Request| {
        let ops: Vec<String> = ops
            .iter()
            .map(|o| {
                let mut s = format!("{} cost {}", o.key, o.cost);
                for (on, word) in [
                    (o.refund, " refund"),
                    (o.joint, " joint"),
                    (!o.decides, " canary"),
                    (o.fill, " fill"),
                    (o.overdraft, " overdraft"),
                ] {
                    if on {
                        s.push_str(word);
                    }
                }
                s
            })
            .collect();
        format!("[{}] {charge:?}", ops.join(", "))
    };
    requests.iter().map(line).collect::<Vec<_>>().join(" + ")
}

/// Runs one case; `Ok(false)` when it became inconclusive.
async fn run_case(redis: &RedisSide, clock: &Arc<SimClock>, case: &Case) -> Result<bool, String> {
    let mut bench = Bench::new(clock.clone(), redis, case.counters.clone(), case.start).await;
    let mut now = case.start;
    let mut history = Vec::new();
    for (i, step) in case.steps.iter().enumerate() {
        now = step.advance.apply(now, &case.counters);
        clock.set(now);
        let requests: Vec<Request> = step
            .requests
            .iter()
            .map(|r| {
                (
                    r.ops.iter().map(|o| o.op(&case.counters)).collect(),
                    r.charge,
                )
            })
            .collect();
        history.push(format!(
            "  step {i}, t = T0 + {} ms: {}",
            now.wrapping_sub(T0),
            describe(&requests)
        ));
        match bench.step(&requests).await {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(false),
            Err(e) => {
                return Err(format!(
                    "step {i}: {e}\ncounters: {:?}\nthe steps so far:\n{}",
                    case.counters,
                    history.join("\n")
                ))
            }
        }
    }
    Ok(true)
}

#[test]
fn memory_and_redis_stores_answer_alike() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = common::redis::Redis::start();
    let clock = Arc::new(SimClock::default());
    let redis = runtime.block_on(RedisSide::connect(&server.url(), clock.clone()));
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    });
    let (ran, inconclusive) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let result = runner.run(&case(), |case| {
        ran.fetch_add(1, Ordering::Relaxed);
        match runtime.block_on(run_case(&redis, &clock, &case)) {
            Ok(true) => Ok(()),
            Ok(false) => {
                inconclusive.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(TestCaseError::fail(e)),
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (ran, inconclusive) = (ran.into_inner(), inconclusive.into_inner());
    println!("{ran} cases, {inconclusive} inconclusive (a key expired on Redis's real clock)");
    assert!(
        inconclusive * 4 <= ran,
        "{inconclusive} of {ran} cases inconclusive: keys keep expiring on Redis's real clock"
    );
}

// ---------------------------------------------------------------------------
// Hand-written sequences.

fn st(allowed: bool, remaining: u64, reset_ms: u64) -> CounterState {
    CounterState {
        allowed,
        remaining,
        reset_after: Duration::from_millis(reset_ms),
        overdrawn: 0,
    }
}

/// A Redis, a clock and a connected Redis store for one test.
async fn setup() -> (common::redis::Redis, Arc<SimClock>, RedisSide) {
    let server = common::redis::Redis::start();
    let clock = Arc::new(SimClock::default());
    let redis = RedisSide::connect(&server.url(), clock.clone()).await;
    (server, clock, redis)
}

#[tokio::test]
async fn token_bucket_above_the_burst_checks_and_exact_fits() {
    let (_server, clock, redis) = setup().await;
    let counters = vec![
        // 10 per second, up to 5.
        Counter::new("tb", Algorithm::TokenBucket, 10, 1000, 5),
        // 3 per second, up to 3.
        Counter::new("tb3", Algorithm::TokenBucket, 3, 1000, 3),
    ];
    let mut b = Bench::new(clock, &redis, counters, T0 + 500).await;
    // More than the burst never fits: the bucket stays full.
    assert_eq!(b.hit(0, 6).await, st(false, 5, 0));
    // A check takes nothing.
    assert_eq!(b.hit(0, 0).await, st(true, 5, 0));
    // Exactly the burst: empty, full again in 5 × 100 ms.
    assert_eq!(b.hit(0, 5).await, st(true, 0, 500));
    // A check on an empty bucket waits for one credit.
    assert_eq!(b.hit(0, 0).await, st(false, 0, 100));
    assert_eq!(b.hit(0, 6).await, st(false, 0, 500));
    b.at(T0 + 600);
    // One credit came back and is taken.
    assert_eq!(b.hit(0, 1).await, st(true, 0, 500));
    // Two given back.
    let refund = CounterOp {
        refund: true,
        ..b.counters[0].op(2)
    };
    assert_eq!(b.one(&[refund], Charge::Each).await, vec![st(true, 2, 300)]);
    // Exactly at the limit (burst = limit), then one more.
    assert_eq!(b.hit(1, 3).await, st(true, 0, 1000));
    assert_eq!(b.hit(1, 1).await, st(false, 0, 334));
    // The clock goes back 200 ms: the bucket neither refills nor breaks.
    b.at(T0 + 400);
    assert_eq!(b.hit(1, 1).await, st(false, 0, 534));
    assert_eq!(b.hit(0, 2).await, st(true, 0, 700));
}

#[tokio::test]
async fn sliding_window_across_a_window_boundary() {
    let (_server, clock, redis) = setup().await;
    // 10 per 10 s; T0 is a window boundary.
    let counters = vec![Counter::new("sl", Algorithm::Sliding, 10, 10_000, 10)];
    let mut b = Bench::new(clock, &redis, counters, T0 + 5_000).await;
    assert_eq!(b.hit(0, 10).await, st(true, 0, 5_000));
    // 1 ms before the boundary: full; the next window's first ms still
    // weighs all 10, so the first hit fits 2 ms from now.
    b.at(T0 + 9_999);
    assert_eq!(b.hit(0, 1).await, st(false, 0, 2));
    b.at(T0 + 10_000);
    assert_eq!(b.hit(0, 1).await, st(false, 0, 1));
    // 2.5 s in: the previous 10 weigh floor(10 × 0.75) = 7.
    b.at(T0 + 12_500);
    assert_eq!(b.hit(0, 3).await, st(true, 0, 7_500));
    // Next fit: the weight must fall to 6, at 3.001 s into the window.
    assert_eq!(b.hit(0, 1).await, st(false, 0, 501));
    b.at(T0 + 13_001);
    assert_eq!(b.hit(0, 1).await, st(true, 0, 6_999));
    // One window later the 4 of [10 s, 20 s) weigh 2 at 25 s.
    b.at(T0 + 25_000);
    assert_eq!(b.hit(0, 1).await, st(true, 7, 5_000));
    // Two windows later nothing is left.
    b.at(T0 + 40_000);
    assert_eq!(b.hit(0, 0).await, st(true, 10, 10_000));
}

#[tokio::test]
async fn fixed_window_when_the_clock_goes_back_across_a_boundary() {
    let (_server, clock, redis) = setup().await;
    // 3 per 10 s; T0 is a window boundary.
    let counters = vec![Counter::new("fx", Algorithm::Fixed, 3, 10_000, 3)];
    let mut b = Bench::new(clock, &redis, counters, T0 + 9_000).await;
    assert_eq!(b.hit(0, 2).await, st(true, 1, 1_000));
    b.at(T0 + 10_500);
    assert_eq!(b.hit(0, 3).await, st(true, 0, 9_500));
    // Back 700 ms, into the previous window: the later window is kept.
    b.at(T0 + 9_800);
    assert_eq!(b.hit(0, 1).await, st(false, 0, 10_200));
    assert_eq!(b.hit(0, 0).await, st(false, 0, 10_200));
    let refund = CounterOp {
        refund: true,
        ..b.counters[0].op(1)
    };
    assert_eq!(
        b.one(&[refund], Charge::Each).await,
        vec![st(true, 1, 10_200)]
    );
    b.at(T0 + 10_600);
    assert_eq!(b.hit(0, 1).await, st(true, 0, 9_400));
    b.at(T0 + 20_000);
    assert_eq!(b.hit(0, 3).await, st(true, 0, 10_000));
}

#[tokio::test]
async fn a_group_whose_second_op_denies_charges_nothing() {
    let (_server, clock, redis) = setup().await;
    let counters = vec![
        Counter::new("a", Algorithm::Fixed, 5, 10_000, 5),
        Counter::new("b", Algorithm::TokenBucket, 1, 10_000, 1),
        Counter::new("c", Algorithm::Sliding, 5, 10_000, 5),
    ];
    let mut b = Bench::new(clock, &redis, counters, T0 + 1_000).await;
    let a = b.counters[0].op(1);
    let joint_b = CounterOp {
        joint: true,
        ..b.counters[1].op(1)
    };
    let group = [a.clone(), joint_b];
    assert_eq!(
        b.one(&group, Charge::Each).await,
        vec![st(true, 4, 9_000), st(true, 0, 10_000)]
    );
    // b is spent: a is allowed but not charged.
    assert_eq!(
        b.one(&group, Charge::Each).await,
        vec![st(true, 4, 9_000), st(false, 0, 10_000)]
    );
    assert_eq!(b.hit(0, 1).await, st(true, 3, 9_000));
    // An already denied request charges nothing.
    assert_eq!(b.one(&[a], Charge::Denied).await, vec![st(true, 3, 9_000)]);
    // Three ops on one counter in one group: the third denies, none is charged.
    let c2 = b.counters[2].op(2);
    let c2j = CounterOp {
        joint: true,
        ..c2.clone()
    };
    assert_eq!(
        b.one(&[c2, c2j.clone(), c2j], Charge::Each).await,
        vec![st(true, 5, 9_000), st(true, 3, 9_000), st(false, 1, 9_001)]
    );
    assert_eq!(b.hit(2, 1).await, st(true, 4, 9_000));
}

#[tokio::test]
async fn all_or_nothing_with_a_denied_deciding_op() {
    let (_server, clock, redis) = setup().await;
    let counters = vec![
        Counter::new("s", Algorithm::Fixed, 1, 10_000, 1),
        Counter::new("a", Algorithm::Sliding, 5, 10_000, 5),
        Counter::new("canary", Algorithm::TokenBucket, 1, 10_000, 1),
    ];
    let mut b = Bench::new(clock, &redis, counters, T0 + 2_000).await;
    assert_eq!(b.hit(0, 1).await, st(true, 0, 8_000));
    let (s, a) = (b.counters[0].op(1), b.counters[1].op(1));
    // s (deciding) is spent: a is allowed but nothing is charged.
    assert_eq!(
        b.one(&[a.clone(), s.clone()], Charge::AllOrNothing).await,
        vec![st(true, 5, 8_000), st(false, 0, 8_000)]
    );
    assert_eq!(
        b.one(&[s, b.counters[1].op(2)], Charge::AllOrNothing).await,
        vec![st(false, 0, 8_000), st(true, 5, 8_000)]
    );
    assert_eq!(b.hit(1, 1).await, st(true, 4, 8_000));
    // A denied canary does not block the request.
    assert_eq!(b.hit(2, 1).await, st(true, 0, 10_000));
    let canary = CounterOp {
        decides: false,
        ..b.counters[2].op(1)
    };
    assert_eq!(
        b.one(&[a, canary], Charge::AllOrNothing).await,
        vec![st(true, 3, 8_000), st(false, 0, 10_000)]
    );
    assert_eq!(b.hit(1, 1).await, st(true, 2, 8_000));
}

/// A refund of 0 credits (an Envoy descriptor with `hits_addend: 0` and
/// `is_negative_hits`) is a refund like any other: allowed, nothing changes.
#[tokio::test]
async fn a_refund_of_nothing_is_allowed_by_both_stores() {
    let (_server, clock, redis) = setup().await;
    let counters = vec![Counter::new("f", Algorithm::Fixed, 1, 10_000, 1)];
    let mut b = Bench::new(clock, &redis, counters, T0 + 1_000).await;
    assert_eq!(b.hit(0, 1).await, st(true, 0, 9_000));
    let refund = CounterOp {
        refund: true,
        ..b.counters[0].op(0)
    };
    assert_eq!(
        b.one(&[refund], Charge::Each).await,
        vec![st(true, 0, 9_000)]
    );
}

#[tokio::test]
async fn one_call_of_more_counters_than_lua_unpacks_at_once() {
    // 9,000 counters in one request: the script reads them in several
    // MGETs (Lua's unpack stops near 8,000 values), and answers each.
    let (_server, clock, redis) = setup().await;
    clock.set(T0);
    let ops: Vec<CounterOp> = (0..9_000)
        .map(|i| {
            let c = Counter::new(&format!("big:{i}"), Algorithm::Fixed, 10, 1000, 10);
            c.op(1 + i % 3)
        })
        .collect();
    let got = redis
        .store
        .apply(&ops, Charge::Each)
        .await
        .expect("one script call of 9,000 counters");
    assert_eq!(got.len(), 9_000);
    for (i, state) in got.iter().enumerate() {
        let cost = 1 + (i as u64) % 3;
        assert_eq!(*state, st(true, 10 - cost, 1000), "counter {i}");
    }
}

#[tokio::test]
async fn a_filled_hit_takes_what_is_left_in_both_stores() {
    let (_server, clock, redis) = setup().await;
    // 5 per 10 s; T0 is a window boundary.
    let counters = vec![
        Counter::new("fx", Algorithm::Fixed, 5, 10_000, 5),
        Counter::new("win", Algorithm::Window, 5, 10_000, 5),
        Counter::new("tb", Algorithm::TokenBucket, 10, 1000, 5),
    ];
    let mut b = Bench::new(clock, &redis, counters, T0 + 4_000).await;
    let fill = |b: &Bench, i: usize, cost: u64| CounterOp {
        fill: true,
        ..b.counters[i].op(cost)
    };
    assert_eq!(b.hit(0, 3).await, st(true, 2, 6_000));
    // 4 does not fit in the 2 left: they are taken, the hit is denied.
    let f = fill(&b, 0, 4);
    assert_eq!(
        b.one(std::slice::from_ref(&f), Charge::Each).await,
        vec![st(false, 0, 6_000)]
    );
    // The counter reads exhausted.
    assert_eq!(b.hit(0, 1).await, st(false, 0, 6_000));
    // Nothing left: filling takes nothing.
    assert_eq!(b.one(&[f], Charge::Each).await, vec![st(false, 0, 6_000)]);
    // divvy's window: the same.
    assert_eq!(b.hit(1, 4).await, st(true, 1, 10_000));
    let f = fill(&b, 1, 3);
    assert_eq!(b.one(&[f], Charge::Each).await, vec![st(false, 0, 10_000)]);
    assert_eq!(b.hit(1, 1).await, st(false, 0, 10_000));
    // A token bucket: the reset is a retry's of the same hit.
    assert_eq!(b.hit(2, 3).await, st(true, 2, 300));
    let f = fill(&b, 2, 4);
    assert_eq!(b.one(&[f], Charge::Each).await, vec![st(false, 0, 400)]);
    // All or nothing: the fill is a plain denied hit.
    b.at(T0 + 14_000);
    assert_eq!(b.hit(0, 4).await, st(true, 1, 6_000));
    let f = fill(&b, 0, 2);
    let g = b.counters[2].op(1);
    let answers = b.one(&[f, g], Charge::AllOrNothing).await;
    assert_eq!(answers[0], st(false, 1, 6_000));
    assert_eq!(b.hit(0, 1).await, st(true, 0, 6_000));
}

/// Overdraft in both stores, every algorithm (divvy's window included, which
/// the random cases leave out): checks before charges of 300 on 1,000
/// answer OK four times, then the debt denies; a first charge of 2,500 is
/// allowed and a denied one charged alone deepens the debt; a group whose
/// overdraft limit is in debt charges nothing.
#[tokio::test]
async fn overdraft_answers_alike_in_both_stores() {
    let (_server, clock, redis) = setup().await;
    let counters: Vec<Counter> = Algorithm::ALL
        .iter()
        .enumerate()
        .flat_map(|(i, &a)| {
            [
                Counter::new(&format!("od{i}"), a, 1000, 60_000, 1000),
                Counter::new(&format!("big{i}"), a, 1000, 60_000, 1000),
            ]
        })
        .collect();
    let mut b = Bench::new(clock, &redis, counters, T0 + 4_000).await;
    let over = |b: &Bench, i: usize, cost: u64| CounterOp {
        overdraft: true,
        ..b.counters[i].op(cost)
    };
    for a in 0..Algorithm::ALL.len() {
        let (od, big) = (2 * a, 2 * a + 1);
        let (mut checks, mut past) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            let check = b.one(&[over(&b, od, 0)], Charge::Each).await[0];
            checks.push(check.allowed);
            if check.allowed {
                let charged = b.one(&[over(&b, od, 300)], Charge::Each).await[0];
                assert!(charged.allowed);
                past.push(charged.overdrawn);
            }
        }
        assert_eq!(checks, [true, true, true, true, false, false], "{a}");
        // Only the fourth charge (100 left) goes past what was left.
        assert_eq!(past, [0, 0, 0, 200], "{a}");
        let first = b.one(&[over(&b, big, 2500)], Charge::Each).await[0];
        assert_eq!((first.allowed, first.remaining), (true, 0), "{a}");
        assert_eq!(first.overdrawn, 1500, "{a}");
        let denied = b.one(&[over(&b, big, 7)], Charge::Each).await[0];
        assert!(!denied.allowed, "{a}");
        assert_eq!(denied.overdrawn, 7, "{a}: charged alone, all of it past");
        // A group: the second limit in debt denies; the first takes nothing.
        let group = [
            over(&b, od, 5),
            CounterOp {
                joint: true,
                ..over(&b, big, 5)
            },
        ];
        let answers = b.one(&group, Charge::Each).await;
        assert!(!answers[1].allowed, "{a}");
        assert_eq!((answers[0].overdrawn, answers[1].overdrawn), (0, 0), "{a}");
        b.one(&[over(&b, od, 1)], Charge::AllOrNothing).await;
        b.clock.set(b.clock.ms() + 1_500);
    }
    // A window later the stores still agree (divvy's window left out: its
    // Redis TTL runs on Redis's real clock, not the simulated one).
    b.clock.set(T0 + 70_000);
    for i in 2..b.counters.len() {
        let _ = b.one(&[over(&b, i, 0)], Charge::Each).await;
    }
}
