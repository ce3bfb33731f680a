//! The over-limit cache in front of the Redis store answers exactly as the
//! store alone does, and spares Redis the calls of counters already full.
//!
//! Two real `redis-server`s; the same sequence of calls goes to a plain
//! Redis store on one and to the cached store on the other, and every
//! answer is compared. Fixed windows run on one simulated clock (given to
//! both scripts and to the cache), so answers must be identical to the
//! millisecond; divvy windows keep their window in the key's TTL on Redis's
//! real clock, so they run in real time with 1 s windows. Script calls are
//! read from each server's `INFO commandstats`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis::Redis;
use divvy::store::memory::{Clock, SystemClock};
use divvy::store::over_limit::OverLimitCache;
use divvy::store::redis::{RedisOptions, RedisStore};
use divvy::store::redis_url::parse_redis_url;
use divvy::store::{Algorithm, Charge, CounterOp, CounterState, Store, StoreError, StoreFuture};

/// A metrics registry of the test's own.
fn registry() -> Arc<divvy::observe::metrics::Metrics> {
    Arc::new(divvy::observe::metrics::Metrics::new())
}

/// A small deterministic generator (xorshift64*): the same calls every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// 0..n
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A clock the test moves by hand: ms since the epoch.
#[derive(Debug)]
struct SimClock(AtomicU64);

impl Clock for SimClock {
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::SeqCst))
    }
}

async fn store(redis: &Redis, clock: Option<Arc<dyn Clock>>) -> RedisStore {
    let options = RedisOptions {
        target: parse_redis_url(&redis.url(), None).expect("redis url"),
        timeout: Duration::from_secs(5),
        clock,
        batches_in_flight: divvy::store::redis::DEFAULT_BATCHES_IN_FLIGHT,
        tls: None,
    };
    let (store, connected) = RedisStore::connect(&options, Duration::from_secs(10))
        .await
        .expect("redis store");
    assert!(connected, "no connection to {}", redis.url());
    store
}

/// Script calls Redis has run (`EVALSHA` and `EVAL`).
fn script_calls(redis: &Redis) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|v| v.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// One call's ops: 90 % of calls on one of 10 hot keys, the rest on 1000
/// cold ones. Not `mixed`: one HIT. `mixed`: some calls are pipelined HITs
/// (several single-op groups), some a rule of two limits (a joint group),
/// some a token bucket or a quota check (never cached).
fn call(rng: &mut Rng, algorithm: Algorithm, window: Duration, mixed: bool) -> Vec<CounterOp> {
    let key = |rng: &mut Rng| {
        if rng.below(10) < 9 {
            format!("hot:{}", rng.below(10))
        } else {
            format!("cold:{}", rng.below(1000))
        }
    };
    let op = |key: String| CounterOp::new(key, algorithm, 5, window, 1);
    if !mixed {
        return vec![op(key(rng))];
    }
    match rng.below(20) {
        // A rule's limits have counters of their own (their keys differ).
        0 => {
            let mut second = op(format!("second-limit:{}", key(rng)));
            second.joint = true;
            second.limit = 3;
            vec![op(key(rng)), second]
        }
        1 => vec![CounterOp {
            burst: 5,
            ..CounterOp::new(
                format!("bucket:{}", key(rng)),
                Algorithm::TokenBucket,
                5,
                window,
                1,
            )
        }],
        2 => vec![CounterOp {
            cost: 0,
            ..op(key(rng))
        }],
        3 | 4 => (0..4).map(|_| op(key(rng))).collect(),
        _ => vec![op(key(rng))],
    }
}

/// Runs `n` calls through both stores, 5 ms apart on the simulated clock,
/// and asserts every answer is the same; returns (counters, script calls
/// without the cache, with it).
async fn compare(
    plain: (&RedisStore, &Redis),
    cached: (&OverLimitCache, &Redis),
    clock: &SimClock,
    rng: &mut Rng,
    (n, mixed): (u32, bool),
) -> (u64, u64, u64) {
    let before = (script_calls(plain.1), script_calls(cached.1));
    let mut counters = 0u64;
    for i in 0..n {
        let ops = call(rng, Algorithm::Fixed, Duration::from_secs(10), mixed);
        let a: Vec<CounterState> = plain.0.apply(&ops, Charge::Each).await.expect("plain");
        let b: Vec<CounterState> = cached.0.apply(&ops, Charge::Each).await.expect("cached");
        assert_eq!(a, b, "call {i}: {ops:?}");
        counters += ops.len() as u64;
        clock.0.fetch_add(5, Ordering::SeqCst);
    }
    (
        counters,
        script_calls(plain.1) - before.0,
        script_calls(cached.1) - before.1,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_answer_exactly_as_redis_alone_with_a_tenth_of_the_calls() {
    let (plain_redis, cached_redis) = (Redis::start(), Redis::start());
    let clock = Arc::new(SimClock(AtomicU64::new(1_700_000_000_000)));
    let plain = store(&plain_redis, Some(clock.clone())).await;
    let inner = store(&cached_redis, Some(clock.clone())).await;
    let cached = OverLimitCache::new(Arc::new(inner), 1000, clock.clone(), registry());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Calls 5 ms apart on the simulated clock: a 10 s window ends every
    // 2000 calls. Redis's real clock runs far slower, so no key expires on
    // it before its simulated end.
    let sides = ((&plain, &plain_redis), (&cached, &cached_redis));
    let (counters, _, _) = compare(sides.0, sides.1, &clock, &mut rng, (10_000, true)).await;
    println!("{counters} counters of mixed calls answered alike");
    let hits = 20_000;
    let (_, without, with) = compare(sides.0, sides.1, &clock, &mut rng, (hits, false)).await;
    let per_hit = with as f64 / f64::from(hits);
    println!(
        "{hits} HITs, 90 % on 10 keys over their limit: Redis script calls {without} without the cache, {with} with it ({per_hit:.3} per HIT)"
    );
    assert_eq!(without, u64::from(hits));
    assert!(per_hit <= 0.15, "{per_hit} script calls per HIT");
    assert!(cached.len() <= 1000);
}

/// The Redis store, noting the calls that reach it.
struct Seen {
    inner: RedisStore,
    calls: AtomicU64,
}

impl Store for Seen {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.apply(ops, charge)
    }

    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        self.inner.peek(op)
    }

    fn name(&self) -> &'static str {
        "seen"
    }
}

/// Divvy windows live in the key's TTL on Redis's real clock, so this runs
/// in real time: every HIT the cache answers without a call is checked
/// against the counter Redis holds right after (full, and the same time
/// left within a few milliseconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn divvy_windows_answered_by_the_cache_are_full_in_redis() {
    let redis = Redis::start();
    let seen = Arc::new(Seen {
        inner: store(&redis, None).await,
        calls: AtomicU64::new(0),
    });
    let cached = OverLimitCache::new(
        seen.clone(),
        1000,
        Arc::new(SystemClock::default()),
        registry(),
    );
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut hits, mut answered) = (0u64, 0u64);
    let start = std::time::Instant::now();
    // 1 s windows for 3.5 s: each hot key's window ends three times.
    while start.elapsed() < Duration::from_millis(3500) {
        let ops = call(&mut rng, Algorithm::Window, Duration::from_secs(1), false);
        let before = seen.calls.load(Ordering::SeqCst);
        let asked = std::time::Instant::now();
        let got = cached.apply(&ops, Charge::Each).await.expect("cached");
        hits += 1;
        if seen.calls.load(Ordering::SeqCst) == before {
            answered += 1;
            let held = seen.inner.peek(&ops[0]).await.expect("peek");
            let later = asked.elapsed() + Duration::from_millis(1);
            assert_eq!((got[0].allowed, got[0].remaining), (false, 0));
            // The window may end between the answer and the peek (which
            // then finds no counter, or a fresh one): only if the cache
            // said it had less time left than has passed since.
            let Some(held) = held.filter(|h| h.remaining == 0) else {
                assert!(got[0].reset_after <= later, "{got:?} / {held:?}");
                continue;
            };
            // Redis counts the time left from the peek, later than the
            // cache's answer; the cache's entry ends no later than the window.
            let (got, held) = (got[0].reset_after, held.reset_after);
            assert!(got <= held + later, "{got:?} / {held:?} (+{later:?})");
            assert!(got + Duration::from_millis(5) >= held, "{got:?} / {held:?}");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let calls = seen.calls.load(Ordering::SeqCst);
    println!("{hits} HITs in real time: {answered} answered by the cache, each full in Redis; {calls} store calls");
    assert!(answered > hits / 2, "{answered} of {hits}");
}

/// The real binary on a real redis-server: a flood of HITs on one actor
/// over its limit is answered as before, and the cache (on by default)
/// answers most of it.
#[test]
fn the_binary_answers_a_flood_over_the_limit_from_the_cache() {
    let redis = Redis::start();
    let server = common::Server::with_policy_args(
        "default: {creditLimit: 3, resetSeconds: 60, actorField: ip}\n",
        "yaml",
        &["--redis-url", &redis.url()],
    );
    let before = script_calls(&redis);
    let flood: String = (0..1000).map(|_| "HIT ip=1.2.3.4\n").collect();
    let answers = server.line_exchange(flood.as_bytes());
    let lines: Vec<&str> = answers.lines().collect();
    assert_eq!(lines.len(), 1000);
    assert_eq!(lines[0], "OK true 2 60");
    assert!(
        lines[3..].iter().all(|l| l.starts_with("OK false 0 ")),
        "{lines:?}"
    );
    let calls = script_calls(&redis) - before;
    let hits = server
        .metric_samples()
        .get("divvy_over_limit_cache_hits_total")
        .copied()
        .unwrap_or(0.0);
    println!(
        "1000 HITs on one actor over its limit: {calls} script calls, {hits} answered by the cache"
    );
    // Pipelined HITs read together go to Redis in one call: the first
    // read's HITs teach the cache, the rest is answered by it.
    assert!(hits >= 500.0, "{hits}");
    assert!(calls <= 10, "{calls}");
}

/// The overall code of `hits` credits for user `ann` in domain `r` (given
/// back with `refund`).
async fn code(server: &common::Server, hits: u64, refund: bool) -> i32 {
    let mut d = common::desc(&[("user", "ann")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d.is_negative_hits = refund;
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(common::request("r", vec![d]))
        .await;
    r.expect("answer").into_inner().overall_code
}

/// Two replicas on one redis-server, the cache on (the default): a user
/// exhausted, replica B answering its denials from the cache; a refund
/// (`is_negative_hits`) on replica A gives credits back, and within about
/// a second B admits the user again instead of denying until the window
/// ends (the refund is announced to the other replicas' caches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_one_replica_frees_the_counter_on_the_others() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let redis = Redis::start();
    let policy = "overrides:\n  - {domain: r, operation: {user: '*'}, actorField: user, creditLimit: 3, resetSeconds: 3600}\ndefault: {creditLimit: 1, resetSeconds: 60}\n";
    let args = ["--redis-url", &redis.url()];
    let (a, b) = (
        common::Server::with_policy_args(policy, "yaml", &args),
        common::Server::with_policy_args(policy, "yaml", &args),
    );
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(code(&a, 3, false).await, ok);
    for _ in 0..3 {
        assert_eq!(code(&b, 1, false).await, over);
    }
    let cached = b
        .metric_samples()
        .get("divvy_over_limit_cache_hits_total")
        .copied();
    assert!(
        cached.unwrap_or(0.0) >= 1.0,
        "B's denials did not come from its cache"
    );
    // Two credits back on A: B admits ann again soon, not in an hour.
    assert_eq!(code(&a, 2, true).await, ok);
    let given = std::time::Instant::now();
    while code(&b, 1, false).await != ok {
        let waited = given.elapsed();
        assert!(
            waited < Duration::from_secs(2),
            "B still denies ann {waited:?} after A's refund"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("B admitted ann {:?} after A's refund", given.elapsed());
}
