//! The counting algorithms (`fixed`, `sliding`, `token_bucket`, next to
//! divvy's `window`), rules with several `limits`, and `charge:
//! all-or-nothing`, against the real binary.
//!
//! Every scenario is one function taking a [`Backend`]; `per_backend!`
//! makes its `#[test]` functions (`scenario::memory`, `::redis`,
//! `::cluster`), which call it once per backend: the embedded memory store,
//! a real `redis-server`, and (for most scenarios) a Redis Cluster of three
//! masters, all started by the test on free loopback ports.
//!
//! Exact counts use one-hour windows (and step past an hour boundary that is
//! only seconds away, see [`clear_of_window_end`]); refill scenarios sleep
//! for real and derive their bounds from the times measured around each
//! exchange, with the tolerance stated beside each assertion.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis::{Cluster, Redis};
use common::{ask, desc, parse_ok, request, Server};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value;
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

/// Where the counters of a scenario live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    Redis,
    Cluster,
}

/// The counter store of one scenario; its Redis processes live as long as it.
struct Store {
    redis: Option<Redis>,
    cluster: Option<Cluster>,
}

impl Store {
    fn start(backend: Backend) -> Store {
        match backend {
            Backend::Memory => Store {
                redis: None,
                cluster: None,
            },
            Backend::Redis => Store {
                redis: Some(Redis::start()),
                cluster: None,
            },
            Backend::Cluster => Store {
                redis: None,
                cluster: Some(Cluster::start(3)),
            },
        }
    }

    fn url(&self) -> Option<String> {
        self.redis
            .as_ref()
            .map(Redis::url)
            .or_else(|| self.cluster.as_ref().map(Cluster::url))
    }

    /// A server for `policy` (YAML) on this store. With Redis, a failing
    /// store call denies (never silently allows) and the command timeout is
    /// long, so a loaded machine does not hand decisions to the failure
    /// policy; each scenario also checks that no store call failed.
    fn serve(&self, policy: &str) -> Server {
        match self.url() {
            None => Server::with_policy(policy, "yaml"),
            Some(url) => Server::with_policy_args(
                policy,
                "yaml",
                &[
                    "--redis-url",
                    &url,
                    "--on-store-failure",
                    "deny",
                    "--redis-timeout-ms",
                    "3000",
                ],
            ),
        }
    }
}

/// The tests of each scenario, one per backend: the entry `#[test] fn name =
/// scenario(args) on memory, redis, cluster;` is a module `name` whose test
/// `memory` calls `scenario(Backend::Memory, args)`, and so on.
macro_rules! per_backend {
    (@backend memory) => {
        super::Backend::Memory
    };
    (@backend redis) => {
        super::Backend::Redis
    };
    (@backend cluster) => {
        super::Backend::Cluster
    };
    (@call $scenario:ident $backend:ident ($($arg:expr),*)) => {
        super::$scenario(per_backend!(@backend $backend) $(, $arg)*)
    };
    () => {};
    (#[$test:meta] fn $name:ident = $scenario:ident $args:tt on $($backend:ident),+; $($rest:tt)*) => {
        mod $name {
            $(
                #[$test]
                fn $backend() {
                    per_backend!(@call $scenario $backend $args);
                }
            )+
        }
        per_backend!($($rest)*);
    };
    (#[$test:meta] async fn $name:ident = $scenario:ident $args:tt on $($backend:ident),+; $($rest:tt)*) => {
        mod $name {
            $(
                #[$test]
                async fn $backend() {
                    per_backend!(@call $scenario $backend $args).await;
                }
            )+
        }
        per_backend!($($rest)*);
    };
}

/// `divvy_store_errors_total` of `server`.
fn store_errors(server: &Server) -> u64 {
    let (status, text) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix("divvy_store_errors_total "))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

fn assert_no_store_errors(servers: &[&Server]) {
    for s in servers {
        assert_eq!(
            store_errors(s),
            0,
            "a store call failed: the failure policy decided some hits"
        );
    }
}

// ---------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64
}

/// Seconds left in the current epoch-aligned window of `window_secs`.
fn secs_to_window_end(window_secs: u64) -> f64 {
    let w = window_secs * 1000;
    (w - now_ms() % w) as f64 / 1000.0
}

/// If the current epoch-aligned window of `window_secs` ends within
/// `margin_secs`, waits until it has ended, so exact counts never straddle
/// two windows.
async fn clear_of_window_end(window_secs: u64, margin_secs: u64) {
    let left = secs_to_window_end(window_secs);
    if left < margin_secs as f64 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }
}

// ---------------------------------------------------------------------------
// gRPC helpers
// ---------------------------------------------------------------------------

/// A request with a request-level `hits_addend`.
fn req(descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend,
        ..request("algorithms", descriptors)
    }
}

/// `d` with its own `hits_addend` (0: check only).
fn hits(mut d: RateLimitDescriptor, n: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: n });
    d
}

/// `d` giving `n` credits back (`is_negative_hits`).
fn refund(d: RateLimitDescriptor, n: u64) -> RateLimitDescriptor {
    let mut d = hits(d, n);
    d.is_negative_hits = true;
    d
}

/// `d` with a limit override of `n` per hour.
fn per_hour_override(mut d: RateLimitDescriptor, n: u32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit: n,
        unit: RateLimitUnit::Hour as i32,
    });
    d
}

/// The one status of a one-descriptor answer (the overall code must agree).
fn only(r: &RateLimitResponse) -> &DescriptorStatus {
    assert_eq!(r.statuses.len(), 1, "{r:?}");
    assert_eq!(r.overall_code, r.statuses[0].code, "{r:?}");
    &r.statuses[0]
}

fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

/// `duration_until_reset` in seconds.
fn reset_secs(s: &DescriptorStatus) -> f64 {
    let d = s
        .duration_until_reset
        .as_ref()
        .expect("duration_until_reset");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// `got` is within 2 s of `want` (the answer is exact to the ms; the test
/// reads its own clock a few ms apart from the server's).
fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 2.0,
        "{what}: duration_until_reset {got:.3} s, expected {want:.3} s ± 2 s"
    );
}

// ---------------------------------------------------------------------------
// 1. The token bucket over the line protocol: exact strings
// ---------------------------------------------------------------------------

const BUCKET_LINE_POLICY: &str = r#"
overrides:
  - operation: {k: tb}
    creditLimit: 1
    resetSeconds: 1
    algorithm: token_bucket
    burst: 5
default: {creditLimit: 0}
"#;

fn bucket_over_the_line_protocol(backend: Backend) {
    let store = Store::start(backend);
    let server = store.serve(BUCKET_LINE_POLICY);
    let t_a = Instant::now();
    let first = server.line_exchange("HIT k=tb\n".repeat(6).as_bytes());
    let t_b = Instant::now();
    assert_eq!(
        first.lines().collect::<Vec<_>>(),
        vec![
            "OK true 4 1",
            "OK true 3 2",
            "OK true 2 3",
            "OK true 1 4",
            "OK true 0 5",
            "OK false 0 1",
        ],
        "{backend:?}"
    );
    // One credit per second comes back: after 1.2 s one hit fits, and the
    // bucket is then full in 4.8 s (rounded up: 5); the next one waits 0.8 s
    // (rounded up: 1). Exact while the time between the two exchanges is
    // in [1 s, 2 s), which the measured bounds below confirm first.
    std::thread::sleep(Duration::from_millis(1200));
    let t_c = Instant::now();
    let second = server.line_exchange(b"HIT k=tb\nHIT k=tb\n");
    let t_d = Instant::now();
    let (lo, hi) = ((t_c - t_b).as_secs_f64(), (t_d - t_a).as_secs_f64());
    let answers: Vec<&str> = second.lines().collect();
    if lo >= 1.0 && hi < 2.0 {
        assert_eq!(answers, vec!["OK true 0 5", "OK false 0 1"], "{backend:?}");
    } else {
        // A very slow machine: between 1 and 3 credits came back.
        let (allowed, _, _) = parse_ok(answers[0]);
        assert!(allowed, "{backend:?}: {answers:?} after {lo:.3}..{hi:.3} s");
    }
    assert_no_store_errors(&[&server]);
}

const ROUNDING_POLICY: &str = r#"
overrides:
  - operation: {k: fixed}
    actorField: who
    creditLimit: 2
    resetSeconds: 1
    algorithm: fixed
  - operation: {k: sliding}
    actorField: who
    creditLimit: 2
    resetSeconds: 1
    algorithm: sliding
  - operation: {k: window}
    actorField: who
    creditLimit: 3
    resetSeconds: 1
default: {creditLimit: 0}
"#;

/// `nextResetSeconds` is rounded up for fixed and sliding windows, and to
/// the nearest second for divvy's window. Each attempt uses fresh counters;
/// an attempt whose timing left the intended range (measured) is retried.
fn line_rounding(backend: Backend) {
    let store = Store::start(backend);
    let server = store.serve(ROUNDING_POLICY);
    let mut done = (false, false);
    for attempt in 0..5 {
        if !done.0 {
            // 600..850 ms into a second: the epoch-aligned 1 s windows end
            // in 150..400 ms, which rounds to 0 but up to 1.
            let into = now_ms() % 1000;
            if !(600..850).contains(&into) {
                std::thread::sleep(Duration::from_millis((1600 - into) % 1000));
            }
            let before = now_ms();
            let input = format!("HIT k=fixed who={attempt}\n").repeat(3)
                + &format!("HIT k=sliding who={attempt}\n").repeat(3);
            let answers = server.line_exchange(input.as_bytes());
            let after = now_ms();
            // Exact while every HIT fell in one window.
            if before / 1000 == after / 1000 {
                let want = ["OK true 1 1", "OK true 0 1", "OK false 0 1"];
                assert_eq!(
                    answers.lines().collect::<Vec<_>>(),
                    [want, want].concat(),
                    "{backend:?}: fixed, then sliding, at {before}..{after} ms"
                );
                done.0 = true;
            }
        }
        if !done.1 {
            let first = Instant::now();
            let a = server.line_exchange(format!("HIT k=window who={attempt}\n").as_bytes());
            std::thread::sleep(Duration::from_millis(650));
            let b = server.line_exchange(format!("HIT k=window who={attempt}\n").as_bytes());
            let elapsed = first.elapsed();
            // The window opened at the first HIT; 0.65..1 s later less than
            // 0.35 s of it is left: 0 to the nearest second.
            if elapsed < Duration::from_millis(950) {
                assert_eq!(a, "OK true 2 1\n", "{backend:?}");
                assert_eq!(b, "OK true 1 0\n", "{backend:?} after {elapsed:?}");
                done.1 = true;
            }
        }
        if done == (true, true) {
            break;
        }
    }
    assert_eq!(done, (true, true), "{backend:?}: no attempt ran in time");
    assert_no_store_errors(&[&server]);
}

// ---------------------------------------------------------------------------
// 2. Exact gRPC sequences: hits_addend, checks, refunds, overrides
// ---------------------------------------------------------------------------

const SEQUENCE_POLICY: &str = r#"
overrides:
  - label: window
    operation: {alg: window, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
  - label: fixed
    operation: {alg: fixed, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
    algorithm: fixed
  - label: sliding
    operation: {alg: sliding, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
    algorithm: sliding
  - label: token-bucket
    operation: {alg: token_bucket, who: "*"}
    actorField: who
    creditLimit: 10
    resetSeconds: 1h
    algorithm: token_bucket
default: {creditLimit: 0}
"#;

/// The exact answers of one algorithm (10 per hour) to a scripted sequence.
async fn sequence(c: &mut Client, alg: &str) {
    clear_of_window_end(3600, 10).await;
    charges_and_checks(c, alg).await;
    refunds(c, alg).await;
    one_counter_thrice_and_an_override(c, alg).await;
}

/// `who`'s descriptor for algorithm `alg`.
fn alg_desc(alg: &str, who: &str) -> RateLimitDescriptor {
    desc(&[("alg", alg), ("who", who)])
}

/// When a counter of `alg` with `used` of its `limit` credits taken is
/// full again.
fn full_after(alg: &str, used: f64, limit: f64) -> f64 {
    match alg {
        // Refills `limit` per hour: 3600/limit seconds per credit.
        "token_bucket" => used * 3600.0 / limit,
        // The window opened at the first hit, moments ago.
        "window" => 3600.0,
        // The end of the epoch-aligned hour.
        _ => secs_to_window_end(3600),
    }
}

/// Asserts `r`'s only status has `code` and `remaining` (at `step` of
/// `alg`'s sequence); that status.
fn expect(
    alg: &str,
    r: &RateLimitResponse,
    code: i32,
    remaining: u32,
    step: &str,
) -> DescriptorStatus {
    let s = only(r);
    assert_eq!(
        (s.code, s.limit_remaining),
        (code, remaining),
        "{alg}: {step}: {r:?}"
    );
    s.clone()
}

/// Request and descriptor hits_addend, a denial that charges nothing, and
/// checks (hits_addend 0), each with its reset.
async fn charges_and_checks(c: &mut Client, alg: &str) {
    let d = |who: &str| alg_desc(alg, who);
    // hits_addend 3 on the request, twice.
    let r = ask(c, req(vec![d("seq")], 3)).await;
    let s = expect(alg, &r, OK, 7, "request hits_addend 3");
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Hour as i32)
    );
    close(reset_secs(&s), full_after(alg, 3.0, 10.0), alg);
    let r = ask(c, req(vec![d("seq")], 3)).await;
    let s = expect(alg, &r, OK, 4, "request hits_addend 3 again");
    close(reset_secs(&s), full_after(alg, 6.0, 10.0), alg);
    // The descriptor's own hits_addend wins over the request's.
    let r = ask(c, req(vec![hits(d("seq"), 3)], 7)).await;
    let s = expect(alg, &r, OK, 1, "descriptor hits_addend 3 (request 7)");
    close(reset_secs(&s), full_after(alg, 9.0, 10.0), alg);
    // 3 more do not fit in the 1 left: denied and not charged.
    let r = ask(c, req(vec![d("seq")], 3)).await;
    let s = expect(alg, &r, OVER, 1, "3 with 1 left");
    let wait = match alg {
        // 9 of 10 used, 3 needed: 2 credits short, 360 s each.
        "token_bucket" => 720.0,
        // Into the next hour, this hour's 9 must weigh at most 7:
        // floor(9·(W−e)/W) ≤ 7 from e = 400.001 s.
        "sliding" => secs_to_window_end(3600) + 400.001,
        "window" => 3600.0,
        _ => secs_to_window_end(3600),
    };
    close(reset_secs(&s), wait, &format!("{alg}: denied"));
    // A check (descriptor hits_addend 0) consumes nothing.
    let r = ask(c, req(vec![hits(d("seq"), 0)], 0)).await;
    let s = expect(alg, &r, OK, 1, "check only");
    close(reset_secs(&s), full_after(alg, 9.0, 10.0), alg);
    let r = ask(c, req(vec![d("seq")], 0)).await;
    let s = expect(alg, &r, OK, 0, "the last credit");
    close(reset_secs(&s), full_after(alg, 10.0, 10.0), alg);
    // A check with nothing left is over the limit (it needs one credit).
    let r = ask(c, req(vec![hits(d("seq"), 0)], 0)).await;
    let s = expect(alg, &r, OVER, 0, "check only, empty");
    let wait = match alg {
        "token_bucket" => 360.0,
        // 10 this hour must weigh at most 9 into the next: 1 ms in.
        "sliding" => secs_to_window_end(3600) + 0.001,
        "window" => 3600.0,
        _ => secs_to_window_end(3600),
    };
    close(reset_secs(&s), wait, &format!("{alg}: check when empty"));
}

/// is_negative_hits gives credit back, never above the limit, and adds
/// nothing to a fresh counter.
async fn refunds(c: &mut Client, alg: &str) {
    let d = |who: &str| alg_desc(alg, who);
    // is_negative_hits gives credit back, never above the limit.
    let r = ask(c, req(vec![refund(d("seq"), 4)], 0)).await;
    expect(alg, &r, OK, 4, "refund 4");
    let r = ask(c, req(vec![hits(d("seq"), 0)], 0)).await;
    expect(alg, &r, OK, 4, "check after the refund");
    let r = ask(c, req(vec![refund(d("seq"), 100)], 0)).await;
    expect(alg, &r, OK, 10, "refund 100");
    let r = ask(c, req(vec![hits(d("seq"), 10)], 0)).await;
    expect(alg, &r, OK, 0, "10 after the refunds");
    let r = ask(c, req(vec![d("seq")], 0)).await;
    expect(alg, &r, OVER, 0, "one more after the refunds");
    // A refund to a counter that never took anything adds nothing.
    let r = ask(c, req(vec![refund(d("fresh"), 5)], 0)).await;
    expect(alg, &r, OK, 10, "refund to a fresh counter");
    let r = ask(c, req(vec![hits(d("fresh"), 10)], 0)).await;
    expect(alg, &r, OK, 0, "10 after a refund to a fresh counter");
    let r = ask(c, req(vec![d("fresh")], 0)).await;
    expect(
        alg,
        &r,
        OVER,
        0,
        "one more after a refund to a fresh counter",
    );
}

/// One counter named three times in one request, and a limit override
/// with a counter of its own.
async fn one_counter_thrice_and_an_override(c: &mut Client, alg: &str) {
    let d = |who: &str| alg_desc(alg, who);
    // One counter named three times in one request: each sees the charges
    // before it.
    let four = hits(d("multi"), 4);
    let r = ask(c, req(vec![four.clone(), four.clone(), four], 0)).await;
    assert_eq!(r.overall_code, OVER, "{alg}: {r:?}");
    assert_eq!(
        codes(&r),
        vec![(OK, 6), (OK, 2), (OVER, 2)],
        "{alg}: same counter thrice"
    );

    // A limit override (2 per hour) has its own counter and applies.
    let o = per_hour_override(d("ovr"), 2);
    let r = ask(c, req(vec![o.clone()], 0)).await;
    let s = expect(alg, &r, OK, 1, "override 2/h, first");
    let limit = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, Unit::Hour as i32)
    );
    close(
        reset_secs(&s),
        full_after(alg, 1.0, 2.0),
        &format!("{alg}: override"),
    );
    let r = ask(c, req(vec![o.clone()], 0)).await;
    expect(alg, &r, OK, 0, "override 2/h, second");
    let r = ask(c, req(vec![o], 0)).await;
    expect(alg, &r, OVER, 0, "override 2/h, third");
    let r = ask(c, req(vec![d("ovr")], 0)).await;
    expect(
        alg,
        &r,
        OK,
        9,
        "the rule's own counter after the override's",
    );
}

async fn exact_sequences(backend: Backend) {
    let store = Store::start(backend);
    let server = store.serve(SEQUENCE_POLICY);
    let mut c = server.client().await;
    for alg in ["window", "fixed", "sliding", "token_bucket"] {
        sequence(&mut c, alg).await;
    }
    assert_no_store_errors(&[&server]);
}

// ---------------------------------------------------------------------------
// 3. Refill after real sleeps
// ---------------------------------------------------------------------------

const REFILL_POLICY: &str = r#"
overrides:
  - operation: {k: tb}
    creditLimit: 10
    resetSeconds: 1
    algorithm: token_bucket
    burst: 10
  - operation: {k: sliding}
    creditLimit: 10
    resetSeconds: 2
    algorithm: sliding
default: {creditLimit: 0}
"#;

/// `allowed` of each answer of a line exchange; allowed ones must come first.
fn allowed_prefix(answers: &str) -> usize {
    let allowed: Vec<bool> = answers.lines().map(|l| parse_ok(l).0).collect();
    let n = allowed.iter().take_while(|a| **a).count();
    assert!(
        allowed[n..].iter().all(|a| !a),
        "an allowed hit after a denied one in one batch: {answers}"
    );
    n
}

fn refill(backend: Backend) {
    let store = Store::start(backend);
    let server = store.serve(REFILL_POLICY);

    // Token bucket, 10 per second, burst 10: drain it, wait 0.5 s, about 5
    // credits are back. The bucket refills from its first hit, so the
    // credits back are floor(10 × t) for t between the two exchanges,
    // bounded by the times measured around them. Tolerance: at least 4;
    // at most 6, or floor(10 × the measured upper bound) on a machine so
    // slow that more than 0.6 s passed.
    let t_a = Instant::now();
    let first = server.line_exchange("HIT k=tb\n".repeat(12).as_bytes());
    let t_b = Instant::now();
    assert_eq!(allowed_prefix(&first), 10, "{backend:?}: {first}");
    std::thread::sleep(Duration::from_millis(500));
    let t_c = Instant::now();
    let second = server.line_exchange("HIT k=tb\n".repeat(20).as_bytes());
    let t_d = Instant::now();
    let n = allowed_prefix(&second);
    let hi = (t_d - t_a).as_secs_f64();
    let upper = 6.max((10.0 * hi).floor() as usize);
    assert!(
        (4..=upper).contains(&n),
        "{backend:?}: {n} credits back after {:.3}..{hi:.3} s, expected 4..={upper}",
        (t_c - t_b).as_secs_f64()
    );
    // Whole credits left, floored: the allowed hits count down to 0; the
    // first denied one waits for the rest of a credit (at most 0.1 s),
    // rounded up to 1 s.
    let lines: Vec<&str> = second.lines().collect();
    for (i, line) in lines[..n].iter().enumerate() {
        assert_eq!(
            parse_ok(line).1,
            (n - 1 - i) as u64,
            "{backend:?}: {second}"
        );
    }
    assert_eq!(lines[n], "OK false 0 1", "{backend:?}: {second}");

    // Sliding window, 10 per 2 s: fill a window early on, then 1 s into
    // the next one the previous 10 weigh floor(10·(2000−e)/2000) ≈ 5, so
    // about 5 fit. The bounds follow from e measured before and after the
    // exchange, ± 1 for the server's clock against this process's.
    let w = 2000;
    let into = now_ms() % w;
    if !(50..600).contains(&into) {
        std::thread::sleep(Duration::from_millis((w - into + 50) % w));
    }
    let start = now_ms() / w * w;
    let first = server.line_exchange("HIT k=sliding\n".repeat(12).as_bytes());
    assert!(
        now_ms() < start + w,
        "the first exchange took more than a window"
    );
    assert_eq!(allowed_prefix(&first), 10, "{backend:?}: {first}");
    let next = start + w;
    std::thread::sleep(Duration::from_millis(
        (next + 1000).saturating_sub(now_ms()),
    ));
    let e_lo = now_ms() - next;
    let second = server.line_exchange("HIT k=sliding\n".repeat(12).as_bytes());
    let e_hi = now_ms() - next;
    assert!(e_hi < w, "the second exchange ran into a third window");
    let fits = |e: u64| 10 - (10 * (w - e) / w) as usize;
    let (lo, hi) = (fits(e_lo).saturating_sub(1), fits(e_hi) + 1);
    let n = allowed_prefix(&second);
    assert!(
        (lo..=hi).contains(&n),
        "{backend:?}: {n} fit at {e_lo}..{e_hi} ms into the next window, expected {lo}..={hi}"
    );
    // The denied hits say when the next one fits: within the next window.
    let last = second.lines().last().expect("answers");
    let (allowed, _, seconds) = parse_ok(last);
    assert!(
        !allowed && (1..=2).contains(&seconds),
        "{backend:?}: {last}"
    );
    assert_no_store_errors(&[&server]);
}

// ---------------------------------------------------------------------------
// 4. One bucket shared by two replicas, hammered concurrently
// ---------------------------------------------------------------------------

const RATE: f64 = 20.0;
const BURST: f64 = 50.0;

const SHARED_BUCKET_POLICY: &str = r#"
overrides:
  - operation: {k: shared}
    creditLimit: 20
    resetSeconds: 1
    algorithm: token_bucket
    burst: 50
default: {creditLimit: 0}
"#;

async fn shared_bucket(backend: Backend) {
    let store = Store::start(backend);
    // The memory store is not shared: one replica there.
    let replicas: Vec<Server> = (0..if backend == Backend::Memory { 1 } else { 2 })
        .map(|_| store.serve(SHARED_BUCKET_POLICY))
        .collect();
    let mut clients = Vec::new();
    for i in 0..8 {
        clients.push(replicas[i % replicas.len()].client().await);
    }
    let origin = Instant::now();
    let run_for = Duration::from_secs(2);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut log = Vec::new();
                while origin.elapsed() < run_for {
                    let sent = origin.elapsed();
                    let r = ask(&mut c, request("d", vec![desc(&[("k", "shared")])])).await;
                    let answered = origin.elapsed();
                    let code = only(&r).code;
                    assert!(code == OK || code == OVER, "{r:?}");
                    log.push((sent, answered, code == OK));
                }
                log
            })
        })
        .collect();
    let mut log = Vec::new();
    for t in tasks {
        log.extend(t.await.expect("client task"));
    }
    let admitted = log.iter().filter(|e| e.2).count() as f64;
    let first_sent = log.iter().map(|e| e.0).min().expect("requests");
    let first_answered = log.iter().map(|e| e.1).min().expect("requests");
    let last_sent = log.iter().map(|e| e.0).max().expect("requests");
    let last_answered = log.iter().map(|e| e.1).max().expect("requests");
    // The bucket starts full (BURST) and refills RATE per second from the
    // first charge on; hammered by 8 clients, every credit that comes back
    // is taken at once, so at most about one is left at the end. The server
    // time between the first charge and the last request lies between
    // (last sent − first answered) and (last answered − first sent).
    // Tolerance: ± 3 credits for what is left in the bucket and rounding.
    let t_max = (last_answered - first_sent).as_secs_f64();
    let t_min = (last_sent - first_answered).as_secs_f64();
    let upper = BURST + RATE * t_max + 3.0;
    let lower = BURST + RATE * t_min - 3.0;
    assert!(
        admitted <= upper && admitted >= lower,
        "{backend:?}: admitted {admitted} of {} requests; expected {lower:.1}..={upper:.1} \
         (burst {BURST} + {RATE}/s over {t_min:.3}..{t_max:.3} s)",
        log.len()
    );
    assert!(
        (log.len() as f64) > admitted,
        "{backend:?}: the bucket was never empty: the test did not hammer it"
    );
    let refs: Vec<&Server> = replicas.iter().collect();
    assert_no_store_errors(&refs);
}

// ---------------------------------------------------------------------------
// 5 and 7. A rule with several limits (per key and per customer)
// ---------------------------------------------------------------------------

fn api_policy(algorithm: &str) -> String {
    format!(
        r#"
overrides:
  - operation: {{path: "/api/*"}}
    label: api
    limits:
      - {{creditLimit: 10, resetSeconds: 1h, algorithm: {algorithm}, actorField: apiKey, label: per-key}}
      - {{creditLimit: 25, resetSeconds: 1h, algorithm: {algorithm}, actorField: customer, label: per-customer}}
default: {{creditLimit: 0}}
"#
    )
}

fn api(key: &str, customer: &str) -> RateLimitDescriptor {
    desc(&[("path", "/api/x"), ("apiKey", key), ("customer", customer)])
}

/// One hit of `key` of `customer`: whether it was allowed.
async fn api_hit(c: &mut Client, key: &str, customer: &str) -> bool {
    let r = ask(c, request("api", vec![api(key, customer)])).await;
    let code = only(&r).code;
    assert!(code == OK || code == OVER, "{r:?}");
    code == OK
}

/// The api rule's limits for (key, customer) as `/explain` shows them
/// (nothing is consumed).
fn explain_api(server: &Server, key: &str, customer: &str) -> Vec<Value> {
    let (status, body) = server.http(
        "GET",
        &format!("/explain?path=/api/x&apiKey={key}&customer={customer}"),
        "",
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("explain JSON");
    v["decider"]["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("no decider.limits in {body}"))
        .clone()
}

/// Credits left in the per-key and the per-customer limit.
fn api_remaining(server: &Server, key: &str, customer: &str) -> (u64, u64) {
    let limits = explain_api(server, key, customer);
    let left = |i: usize| {
        limits[i]["counter"]["remaining"]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter.remaining in {limits:?}"))
    };
    (left(0), left(1))
}

/// The Redis keys of the per-key and per-customer counters.
fn api_counter_keys(server: &Server, key: &str, customer: &str) -> (String, String) {
    let limits = explain_api(server, key, customer);
    let k = |i: usize| {
        limits[i]["counterKey"]
            .as_str()
            .unwrap_or_else(|| panic!("no counterKey in {limits:?}"))
            .to_owned()
    };
    (k(0), k(1))
}

/// The port of the cluster node that holds `key`'s slot.
fn owner(cluster: &Cluster, key: &str) -> u16 {
    let first = &cluster.nodes[0];
    let answer = first.cli(&["EXISTS", key]);
    match answer.strip_prefix("MOVED ") {
        Some(rest) => rest
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected answer {answer:?}")),
        None => first.port,
    }
}

/// The names a multi-limit scenario uses.
struct ApiNames {
    /// Three keys of `customer`, hit concurrently.
    keys: Vec<String>,
    /// A key of `customer` first used once the customer is exhausted.
    fresh: String,
    customer: String,
    /// A customer `fresh` is used with afterwards.
    other: String,
}

/// Fixed names; in a Cluster, names whose per-key and per-customer counters
/// lie on different nodes (so in different slots), as read from /explain.
fn api_names(server: &Server, cluster: Option<&Cluster>) -> ApiNames {
    let Some(cluster) = cluster else {
        return ApiNames {
            keys: vec!["k1".into(), "k2".into(), "k3".into()],
            fresh: "k4".into(),
            customer: "acme".into(),
            other: "globex".into(),
        };
    };
    let customer = "acme".to_owned();
    let (_, customer_key) = api_counter_keys(server, "k", &customer);
    let customer_node = owner(cluster, &customer_key);
    let keys: Vec<String> = (0..)
        .map(|i| format!("key-{i}"))
        .filter(|k| owner(cluster, &api_counter_keys(server, k, &customer).0) != customer_node)
        .take(4)
        .collect();
    let (fresh_key, _) = api_counter_keys(server, &keys[3], &customer);
    let fresh_node = owner(cluster, &fresh_key);
    let other = (0..)
        .map(|i| format!("other-{i}"))
        .find(|c| owner(cluster, &api_counter_keys(server, "k", c).1) != fresh_node)
        .expect("a customer");
    ApiNames {
        fresh: keys[3].clone(),
        keys: keys[..3].to_vec(),
        customer,
        other,
    }
}

/// `per_key` concurrent hits for each key of `customer` over 6 connections;
/// how many were allowed, per key.
async fn concurrent_api_hits(
    server: &Server,
    keys: &[String],
    customer: &str,
    per_key: usize,
) -> Vec<u64> {
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(server.client().await);
    }
    let mut tasks = Vec::new();
    for round in 0..per_key {
        for (k, key) in keys.iter().enumerate() {
            let mut c = clients[(round * keys.len() + k) % clients.len()].clone();
            let (key, customer) = (key.clone(), customer.to_owned());
            tasks.push(tokio::spawn(async move {
                (k, api_hit(&mut c, &key, &customer).await)
            }));
        }
    }
    let mut admitted = vec![0; keys.len()];
    for t in tasks {
        let (k, ok) = t.await.expect("hit task");
        admitted[k] += u64::from(ok);
    }
    admitted
}

async fn multi_limit(backend: Backend, algorithm: &str) {
    clear_of_window_end(3600, 10).await;
    let store = Store::start(backend);
    let server = store.serve(&api_policy(algorithm));
    let names = api_names(&server, store.cluster.as_ref());
    let ApiNames {
        keys,
        fresh,
        customer,
        other,
    } = &names;
    let what = format!("{backend:?}, {algorithm}");

    // 60 concurrent hits, 20 per key: the customer's 25 run out first.
    let mut admitted = concurrent_api_hits(&server, keys, customer, 20).await;
    let total: u64 = admitted.iter().sum();
    assert!(
        admitted.iter().all(|&n| n <= 10) && total <= 25,
        "{what}: over a limit: {admitted:?}"
    );
    if backend != Backend::Cluster {
        assert_eq!(total, 25, "{what}: {admitted:?}");
    }
    // In a Cluster, a hit another slot denied holds its credit for a moment
    // before it is given back, so a concurrent hit may be denied that a
    // single store would allow (never the reverse): the remaining credit is
    // taken now, one hit at a time.
    let mut c = server.client().await;
    for (k, key) in keys.iter().enumerate() {
        while api_hit(&mut c, key, customer).await {
            admitted[k] += 1;
        }
    }
    let total: u64 = admitted.iter().sum();
    assert!(
        admitted.iter().all(|&n| n <= 10),
        "{what}: over the per-key limit: {admitted:?}"
    );
    assert_eq!(total, 25, "{what}: {admitted:?}");
    for (k, key) in keys.iter().enumerate() {
        assert_eq!(
            api_remaining(&server, key, customer),
            (10 - admitted[k], 0),
            "{what}: {key}"
        );
    }

    // The customer is spent: a fresh key of it is denied, and a denied hit
    // charges none of the limits: the key keeps all 10 credits...
    for _ in 0..3 {
        assert!(!api_hit(&mut c, fresh, customer).await, "{what}");
    }
    assert_eq!(api_remaining(&server, fresh, customer), (10, 0), "{what}");
    // ... and the keys with credit left keep it after their denied hits.
    for (k, key) in keys.iter().enumerate() {
        assert_eq!(
            api_remaining(&server, key, customer),
            (10 - admitted[k], 0),
            "{what}: {key} after denied hits"
        );
    }
    // The fresh key with another customer: its 10 credits, then its own
    // limit denies, and that denial charges nothing of the customer's.
    for i in 0..10 {
        assert!(api_hit(&mut c, fresh, other).await, "{what}: hit {i}");
    }
    for _ in 0..3 {
        assert!(!api_hit(&mut c, fresh, other).await, "{what}");
    }
    assert_eq!(api_remaining(&server, fresh, other), (0, 15), "{what}");

    if let Some(cluster) = &store.cluster {
        // The counters did land on different nodes (so in different slots).
        let (key_counter, customer_counter) = api_counter_keys(&server, &keys[0], customer);
        let (a, b) = (
            owner(cluster, &key_counter),
            owner(cluster, &customer_counter),
        );
        assert_ne!(a, b, "{what}");
        for (key, port) in [(&key_counter, a), (&customer_counter, b)] {
            let node = cluster.nodes.iter().find(|n| n.port == port).expect("node");
            assert_eq!(node.cli(&["EXISTS", key]), "1", "{what}: {key}");
        }
    }
    assert_no_store_errors(&[&server]);
}

const WINDOW_AND_CUSTOMER_POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*"}
    label: api
    limits:
      - {creditLimit: 5, resetSeconds: 2, actorField: apiKey, label: per-key}
      - {creditLimit: 8, resetSeconds: 1h, algorithm: fixed, actorField: customer, label: per-customer}
default: {creditLimit: 0}
"#;

/// A hit denied by one limit leaves divvy's window of another limit as it
/// was: the window still opens at its first charged hit. (In a Cluster the
/// names put the two counters on different nodes, so the denied hit is
/// charged there and given back.)
async fn denied_hit_opens_no_window(backend: Backend) {
    clear_of_window_end(3600, 10).await;
    let store = Store::start(backend);
    let server = store.serve(WINDOW_AND_CUSTOMER_POLICY);
    let names = api_names(&server, store.cluster.as_ref());
    let (k1, k2, k3) = (&names.keys[0], &names.keys[1], &names.keys[2]);
    let (spent, c2, c3) = (&names.customer, &names.other, "third");
    let mut c = server.client().await;
    for key in [k1, k1, k1, k1, k1, k3, k3, k3] {
        assert!(api_hit(&mut c, key, spent).await, "{backend:?}");
    }
    // The customer is spent: k2's hit is denied and charges nothing.
    assert!(!api_hit(&mut c, k2, spent).await, "{backend:?}");
    let t0 = Instant::now();
    assert_eq!(api_remaining(&server, k2, spent), (5, 0), "{backend:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // k2's first charged hit opens its 2 s window now (k2 has fewer
    // credits left than the customer, so its limit speaks). Both checks
    // below are reported together.
    let mut problems = Vec::new();
    let r = ask(&mut c, request("api", vec![api(k2, c2)])).await;
    let s = only(&r);
    assert_eq!(s.code, OK, "{backend:?}");
    let reset = reset_secs(s);
    if !(1.5..=2.0).contains(&reset) {
        problems.push(format!(
            "k2's window, opened by its first charged hit, ends in {reset:.3} s, expected 2 s \
             (the denied hit {:.3} s before opened it)",
            t0.elapsed().as_secs_f64()
        ));
    }
    for _ in 0..4 {
        assert!(api_hit(&mut c, k2, c2).await, "{backend:?}");
    }
    // 2.3 s after the denied hit, 1.1 s into k2's window: its 5 are spent.
    tokio::time::sleep(Duration::from_millis(2300).saturating_sub(t0.elapsed())).await;
    let r = ask(&mut c, request("api", vec![api(k2, c3)])).await;
    if only(&r).code != OVER {
        problems.push(format!(
            "k2 admitted a 6th hit 1.1 s into its 2 s window of 5: {:?}",
            codes(&r)
        ));
    }
    assert!(problems.is_empty(), "{backend:?}: {problems:#?}");
    assert_no_store_errors(&[&server]);
}

/// The brief's example: Close's API limits, token buckets per key and per
/// customer.
const CLOSE_POLICY: &str = r#"
overrides:
  - operation: {path: "/api/*"}
    label: api
    limits:
      - {creditLimit: 40, resetSeconds: 1, algorithm: token_bucket, burst: 80, actorField: apiKey, label: per-key}
      - {creditLimit: 120, resetSeconds: 1, algorithm: token_bucket, burst: 120, actorField: customer, label: per-customer}
default: {creditLimit: 0}
"#;

/// Pipelined HITs over the line protocol: a key's burst of 80, then the
/// customer's 120 in all. The buckets refill 40 and 120 per second while
/// the test runs, so the upper bounds add what can have come back in the
/// measured time (+1 for a credit partly back).
fn close_example(backend: Backend) {
    let store = Store::start(backend);
    let server = store.serve(CLOSE_POLICY);
    let start = Instant::now();
    let burst = |key: &str| {
        let line = format!("HIT path=/api/x apiKey={key} customer=close\n");
        allowed_prefix(&server.line_exchange(line.repeat(100).as_bytes())) as f64
    };
    let k1 = burst("k1");
    let t1 = start.elapsed().as_secs_f64();
    assert!(
        (80.0..=80.0 + 40.0 * t1 + 1.0).contains(&k1),
        "{backend:?}: key k1 got {k1} in {t1:.3} s"
    );
    let k2 = burst("k2");
    let t2 = start.elapsed().as_secs_f64();
    assert!(
        (120.0..=120.0 + 120.0 * t2 + 1.0).contains(&(k1 + k2)),
        "{backend:?}: the customer got {k1} + {k2} in {t2:.3} s"
    );
    let k3 = burst("k3");
    let t3 = start.elapsed().as_secs_f64();
    assert!(
        k1 + k2 + k3 <= 120.0 + 120.0 * t3 + 1.0,
        "{backend:?}: the customer got {k1} + {k2} + {k3} in {t3:.3} s"
    );
    assert_no_store_errors(&[&server]);
}

// ---------------------------------------------------------------------------
// 6. charge: all-or-nothing against the default (each)
// ---------------------------------------------------------------------------

const ALGORITHMS: [&str; 4] = ["window", "fixed", "sliding", "token_bucket"];

fn charge_policy(charge: Option<&str>) -> String {
    let mut p = String::new();
    if let Some(charge) = charge {
        p.push_str(&format!("charge: {charge}\n"));
    }
    p.push_str("overrides:\n");
    for alg in ALGORITHMS {
        p.push_str(&format!(
            "  - {{operation: {{a: {alg}}}, actorField: who, creditLimit: 5, resetSeconds: 1h, algorithm: {alg}}}\n"
        ));
    }
    p.push_str(
        "  - {operation: {b: \"*\"}, actorField: b, creditLimit: 1, resetSeconds: 1h, algorithm: fixed}\n\
         \x20 - {operation: {zero: \"*\"}, creditLimit: 0}\n\
         default: {creditLimit: 0}\n",
    );
    p
}

async fn charging(backend: Backend, all_or_nothing: bool) {
    clear_of_window_end(3600, 10).await;
    let store = Store::start(backend);
    let policy = charge_policy(all_or_nothing.then_some("all-or-nothing"));
    let server = store.serve(&policy);
    let mut c = server.client().await;
    let what = format!(
        "{backend:?}, charge {}",
        if all_or_nothing {
            "all-or-nothing"
        } else {
            "each"
        }
    );
    let b = desc(&[("b", "x")]);
    let zero = desc(&[("zero", "z")]);
    let send = |descriptors: Vec<RateLimitDescriptor>| request("d", descriptors);
    // B has one credit: spend it.
    assert_eq!(codes(&ask(&mut c, send(vec![b.clone()])).await), [(OK, 0)]);
    assert_eq!(
        codes(&ask(&mut c, send(vec![b.clone()])).await),
        [(OVER, 0)]
    );
    for alg in ALGORITHMS {
        let a = desc(&[("a", alg)]);
        let what = format!("{what}, {alg}");
        let r = ask(&mut c, send(vec![a.clone(), b.clone()])).await;
        assert_eq!(r.overall_code, OVER, "{what}");
        if all_or_nothing {
            // A is allowed but not charged: its remaining is unchanged.
            assert_eq!(codes(&r), [(OK, 5), (OVER, 0)], "{what}");
            let r = ask(&mut c, send(vec![a.clone()])).await;
            assert_eq!(codes(&r), [(OK, 4)], "{what}: A was charged");
            let r = ask(&mut c, send(vec![a.clone(), b.clone()])).await;
            assert_eq!(codes(&r), [(OK, 4), (OVER, 0)], "{what}");
            // A rule that always denies (no counter) blocks the charge too.
            let r = ask(&mut c, send(vec![a.clone(), zero.clone()])).await;
            assert_eq!(r.overall_code, OVER, "{what}");
            assert_eq!(codes(&r), [(OK, 4), (OVER, 0)], "{what}");
            let r = ask(&mut c, send(vec![a.clone()])).await;
            assert_eq!(codes(&r), [(OK, 3)], "{what}: A was charged");
        } else {
            // Each descriptor on its own: A is charged.
            assert_eq!(codes(&r), [(OK, 4), (OVER, 0)], "{what}");
            let r = ask(&mut c, send(vec![a.clone()])).await;
            assert_eq!(codes(&r), [(OK, 3)], "{what}");
            let r = ask(&mut c, send(vec![a.clone(), zero.clone()])).await;
            assert_eq!(codes(&r), [(OK, 2), (OVER, 0)], "{what}");
            let r = ask(&mut c, send(vec![a.clone()])).await;
            assert_eq!(codes(&r), [(OK, 1)], "{what}");
        }
        // Everything allowed: everything charged, in both modes.
        let fresh_b = desc(&[("b", alg)]);
        let r = ask(&mut c, send(vec![a.clone(), fresh_b.clone()])).await;
        let left = if all_or_nothing { 2 } else { 0 };
        assert_eq!(r.overall_code, OK, "{what}");
        assert_eq!(codes(&r), [(OK, left), (OK, 0)], "{what}");
        let r = ask(&mut c, send(vec![fresh_b])).await;
        assert_eq!(codes(&r), [(OVER, 0)], "{what}: B was not charged");
    }

    // Over the line protocol each HIT is a request of its own, pipelined or
    // not: B (1 credit) admits one of two pipelined HITs, and a HIT next to
    // a denied one is charged.
    let answers = server.line_exchange(b"HIT b=line\nHIT b=line\nHIT a=fixed who=line\n");
    let got: Vec<(bool, u64)> = answers
        .lines()
        .map(|l| {
            let (allowed, credits, _) = parse_ok(l);
            (allowed, credits)
        })
        .collect();
    assert_eq!(
        got,
        [(true, 0), (false, 0), (true, 4)],
        "{what}: pipelined HITs"
    );
    let answers = server.line_exchange(b"HIT b=line\nHIT a=fixed who=line\n");
    let got: Vec<(bool, u64)> = answers
        .lines()
        .map(|l| {
            let (allowed, credits, _) = parse_ok(l);
            (allowed, credits)
        })
        .collect();
    assert_eq!(
        got,
        [(false, 0), (true, 3)],
        "{what}: B admitted more than its one credit"
    );
    assert_no_store_errors(&[&server]);
}

// ---------------------------------------------------------------------------
// The tests: each scenario on each backend
// ---------------------------------------------------------------------------

per_backend! {
    #[test]
    fn bucket_line_protocol = bucket_over_the_line_protocol() on memory, redis, cluster;

    #[test]
    fn line_rounding = line_rounding() on memory, redis;

    #[tokio::test]
    async fn exact_sequences = exact_sequences() on memory, redis, cluster;

    #[test]
    fn refill = refill() on memory, redis;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn shared_bucket = shared_bucket() on memory, redis, cluster;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn multi_limit_fixed = multi_limit("fixed") on memory, redis, cluster;

    // On the cluster, scenario 7: the limits' counters in different slots (on
    // different nodes): never over either limit, and a denied hit leaves the
    // other limit's credit intact once it is given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn multi_limit_token_bucket = multi_limit("token_bucket") on memory, redis, cluster;

    #[tokio::test]
    async fn denied_hit_opens_no_window = denied_hit_opens_no_window() on memory, redis, cluster;

    #[test]
    fn close_example = close_example() on memory, redis, cluster;

    #[tokio::test]
    async fn all_or_nothing = charging(true) on memory, redis, cluster;

    #[tokio::test]
    async fn charge_each = charging(false) on memory, redis, cluster;
}

// ---------------------------------------------------------------------------
// The schema's field names and what the validator refuses
// ---------------------------------------------------------------------------

/// `divvy check` on a YAML policy: (success, stdout + stderr).
fn check(policy: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy).expect("write policy");
    let out = std::process::Command::new(common::binary())
        .arg("check")
        .arg(&path)
        .output()
        .expect("run divvy check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn burst_is_only_for_token_buckets() {
    for policy in [
        SEQUENCE_POLICY,
        BUCKET_LINE_POLICY,
        REFILL_POLICY,
        SHARED_BUCKET_POLICY,
        ROUNDING_POLICY,
        CLOSE_POLICY,
        WINDOW_AND_CUSTOMER_POLICY,
        &api_policy("fixed"),
        &api_policy("sliding"),
        &api_policy("token_bucket"),
        &charge_policy(Some("all-or-nothing")),
        &charge_policy(Some("each")),
    ] {
        let (ok, text) = check(policy);
        assert!(ok, "{text}\n{policy}");
    }
    for alg in ["window", "fixed", "sliding"] {
        let rule = format!(
            "overrides:\n  - {{operation: {{a: b}}, creditLimit: 5, resetSeconds: 60, algorithm: {alg}, burst: 10}}\ndefault: {{creditLimit: 0}}\n"
        );
        let (ok, text) = check(&rule);
        assert!(!ok && text.contains("burst"), "{alg}: {text}");
        let limits = format!(
            "overrides:\n  - operation: {{a: b}}\n    limits:\n      - {{creditLimit: 5, resetSeconds: 60, algorithm: {alg}, burst: 10}}\ndefault: {{creditLimit: 0}}\n"
        );
        let (ok, text) = check(&limits);
        assert!(!ok && text.contains("burst"), "{alg} in limits: {text}");
    }
    // The default algorithm is divvy's window, so a burst needs token_bucket.
    let (ok, text) = check(
        "overrides:\n  - {operation: {a: b}, creditLimit: 5, resetSeconds: 60, burst: 10}\ndefault: {creditLimit: 0}\n",
    );
    assert!(!ok && text.contains("burst"), "{text}");
    let (ok, text) = check(
        "overrides:\n  - {operation: {a: b}, creditLimit: 5, resetSeconds: 60, algorithm: leaky}\ndefault: {creditLimit: 0}\n",
    );
    assert!(!ok && text.contains("leaky"), "{text}");
    let (ok, text) = check("charge: some\ndefault: {creditLimit: 0}\n");
    assert!(!ok && text.contains("charge"), "{text}");
}
