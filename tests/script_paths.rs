//! The counter script's two paths answer and write alike.
//!
//! The counter script (`src/store/lua/`, joined in `SCRIPT`) takes a lean
//! path when every op of a call is a lone counter charged or checked on its
//! own (requests of one counter, and a connection's pipelined requests:
//! most calls), and the general path otherwise (groups, all-or-nothing
//! requests of several counters, refunds, requests denied beforehand).
//! Random calls run here twice on a real `redis-server` this test starts,
//! on two copies of the same counters: once as they are, by a copy of the
//! script that fails if it leaves the lean path (a call with a group: the
//! plain script); once with one more request, all-or-nothing, of two
//! counters on keys of their own, which sends the whole call down the
//! general path without touching the other counters. Every answer, and
//! every key's type, value and expiry afterwards, must be the same.
//!
//! The counters start in every state Redis may hold: none, credits with
//! an expiry, credits in their window's last millisecond (a PTTL of 0,
//! planted in both copies of the script), credits without an expiry (an
//! older writer), a number Redis cannot count with (`5.0`), text, a hash;
//! and divvy's window is charged under a knob's limit as well as its own. The script gets a simulated time (it
//! only decides the fixed, sliding and token bucket windows; divvy's
//! window lives in the key's TTL, on Redis's clock): its resets, and
//! expiries, are compared to within [`TTL_SLACK_MS`], everything else
//! exactly.

mod common;

use std::time::Duration;

use divvy::store::redis::{push_run, SCRIPT};
use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::config::Config as FredConfig;
use fred::types::Builder;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

/// A simulated "now" (2023-11-14), a multiple of 10 s.
const T0: i64 = 1_700_000_000_000;

/// Counters of a case.
const COUNTERS: usize = 5;

/// How far apart the two copies' expiries may read: the real time between
/// their calls and reads (a few ms; more on a loaded machine).
const TTL_SLACK_MS: i64 = 250;

/// Sets a key to one of the states a counter may be found in (ARGV[1]),
/// with ARGV[2] as the number it holds.
const SETUP: &str = r#"
local k, kind, v = KEYS[1], ARGV[1], ARGV[2]
redis.call('DEL', k)
if kind == 'ttl' then redis.call('SET', k, v, 'PX', 600000)
elseif kind == 'ending' then redis.call('SET', k, v, 'PX', 600000)
elseif kind == 'forever' then redis.call('SET', k, v)
elseif kind == 'float' then redis.call('SET', k, v .. '.0', 'PX', 600000)
elseif kind == 'text' then redis.call('SET', k, 'abc', 'PX', 600000)
elseif kind == 'hash' then redis.call('HSET', k, 'f', v)
elseif kind == 'huge' then redis.call('SET', k, '1e19', 'PX', 600000)
elseif kind == 'inf' then redis.call('SET', k, '-inf', 'PX', 600000)
elseif kind == 'nan' then redis.call('SET', k, 'nan', 'PX', 600000)
elseif kind == 'raw' then redis.call('SET', k, v, 'PX', 600000) end
return 1
"#;

/// SETUP's arguments for counter `c`. The window-start kinds are written
/// as fixed and sliding windows hold their counters (`start:count`,
/// `start:previous:count`), with the window that holds T0 as `current`,
/// the same start with a leading zero as `zeros`, and the windows after
/// and before it: the script reads a counter of the current window by its
/// start's text and every other value in full, and both must agree.
fn setup_args(c: &Counter) -> Vec<String> {
    let s = T0 - T0 % c.window_ms;
    let tail = if c.algorithm == 2 {
        format!("{}:{}", c.stored, c.stored)
    } else {
        c.stored.to_string()
    };
    let text = match c.start {
        "current" => format!("{s}:{tail}"),
        "zeros" => format!("0{s}:{tail}"),
        "later" => format!("{}:{tail}", s + c.window_ms),
        "earlier" => format!("{}:{tail}", s - c.window_ms),
        _ => return vec![c.start.to_owned(), c.stored.to_string()],
    };
    vec!["raw".to_owned(), text]
}

/// Each key's type, value (strings) and PTTL, as text.
const STATE: &str = r#"
local out = {}
for _, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k).ok
  local v = ''
  if t == 'string' then v = redis.call('GET', k) end
  out[#out + 1] = t .. ' ' .. v
  out[#out + 1] = tostring(redis.call('PTTL', k))
end
return out
"#;

/// One counter: its limit shape and the state its key starts in.
#[derive(Debug, Clone)]
struct Counter {
    /// 0 divvy window, 1 fixed, 2 sliding, 3 token bucket.
    algorithm: i64,
    /// The rule's own limit (the burst the script gets for divvy's window).
    own: i64,
    window_ms: i64,
    /// The token bucket's burst.
    burst: i64,
    start: &'static str,
    stored: i64,
}

/// One request of one counter.
#[derive(Debug, Clone)]
struct Op {
    counter: usize,
    /// The limit in force: the rule's own, or a knob's above or below it.
    knob: i64,
    cost: i64,
    /// 4 (a request starts), with 2 (canary) or 8 (all-or-nothing) at
    /// times; or 0 or 2: a counter of its own in the request before it; or
    /// 1 or 3: in the group (one rule's limits) of the counter before it.
    flags: i64,
    /// Whether the op overdraws (its shape's algorithm + 8).
    overdraft: bool,
}

#[derive(Debug, Clone)]
struct Case {
    counters: Vec<Counter>,
    /// Calls, one after another, each `advance_ms` after the one before.
    calls: Vec<(i64, Vec<Op>)>,
    /// Whether the lean side's calls carry the hints the store sends (every
    /// op a lone counter, no key twice), or none (0, which is always
    /// correct): both must answer as the general path does.
    hinted: bool,
}

fn counter() -> impl Strategy<Value = Counter> {
    (
        prop_oneof![4 => Just(0i64), 1 => Just(1i64), 1 => Just(2i64), 1 => Just(3i64)],
        1i64..=5,
        // Not shorter: the expiries the script sets from the simulated time
        // (a token bucket's can be window / limit) run on Redis's clock,
        // and must not run out between the two copies' calls.
        prop_oneof![Just(60_000i64), Just(3_600_000i64)],
        1i64..=4,
        prop::sample::select(vec![
            "none", "ttl", "ending", "forever", "float", "text", "hash", "huge", "inf", "nan",
            "current", "zeros", "later", "earlier",
        ]),
        0i64..=6,
    )
        .prop_map(
            |(algorithm, own, window_ms, burst, start, stored)| Counter {
                algorithm,
                own,
                window_ms,
                burst,
                start,
                stored,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    (
        0..COUNTERS,
        prop_oneof![3 => Just(0i64), 1 => Just(-1i64), 1 => Just(2i64)],
        prop_oneof![1 => Just(0i64), 4 => Just(1i64), 1 => Just(2i64), 1 => Just(7i64)],
        prop::sample::select(vec![4i64, 4, 4, 6, 12, 0, 0, 2, 1, 1, 3]),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(counter, shift, cost, flags, overdraft)| Op {
            counter,
            knob: shift,
            cost,
            flags,
            overdraft,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(counter(), COUNTERS),
        prop::collection::vec(
            (
                prop_oneof![Just(0i64), 1i64..=2_000, Just(3_600_000i64)],
                prop::collection::vec(op(), 1..10).prop_map(requests),
            ),
            1..4,
        ),
        any::<bool>(),
    )
        .prop_map(|(counters, calls, hinted)| Case {
            counters,
            calls,
            hinted,
        })
}

/// `ops` as the store sends them: the first starts a request, and an
/// all-or-nothing request is one counter (the lean path's calls; one of
/// several counters takes the general path, which the property compares
/// to).
fn requests(mut ops: Vec<Op>) -> Vec<Op> {
    let mut whole = false;
    for (n, op) in ops.iter_mut().enumerate() {
        if op.flags < 4 && (n == 0 || whole) {
            op.flags += 4;
        }
        if op.flags >= 4 {
            whole = op.flags >= 8;
        }
    }
    ops
}

/// Counter `i`'s key in one copy of the counters.
fn key(prefix: &str, case: &Case, i: usize) -> String {
    // `:ending` keys read a PTTL of 0 (see `with_ending_keys`).
    let ending = if case.counters[i].start == "ending" {
        ":ending"
    } else {
        ""
    };
    format!("{prefix}:{i}{ending}")
}

/// SCRIPT where every key named `...:ending` reads a PTTL of 0: divvy's
/// window in its last millisecond, which real time cannot hit on purpose.
fn with_ending_keys() -> String {
    let mut script = SCRIPT.to_owned();
    let mut replaced = 0;
    for k in ["k", "key"] {
        let call = format!("rcall('PTTL', {k})");
        let ending = format!("(string.find({k}, ':ending', 1, true) and 0 or {call})");
        replaced += script.matches(&call).count();
        script = script.replace(&call, &ending);
    }
    // Every PTTL of the script reads `:ending` keys as ending.
    assert_eq!(replaced, SCRIPT.matches("rcall('PTTL'").count());
    script
}

/// [`with_ending_keys`] with a Lua error planted where the general path
/// starts: a call it answers took the lean path.
fn lean_only() -> String {
    let script = with_ending_keys();
    let planted = script.replacen(
        "local stored, loaded, owner, dirty = {}, {}, {}, {}",
        "error('general path')",
        1,
    );
    assert_ne!(planted, script, "the general path's first line moved");
    planted
}

/// The hints (ARGV[3]) the store sends with `ops` on `keys`, worked out
/// from their flags by the rule `src/store/redis.rs` (`LoneCall`) uses: 1
/// when every op is a lone counter (none in another's group, none denied
/// beforehand or refunded, no all-or-nothing request of more than one
/// counter), 2 when no key comes twice.
fn hints(ops: &[Op], keys: &[String]) -> i64 {
    let mut lone = true;
    let mut start = 0;
    for (n, op) in ops.iter().enumerate() {
        let f = op.flags;
        if f % 8 >= 4 {
            start = n;
        } else if f % 2 == 1 || ops[start].flags % 16 >= 8 {
            lone = false;
        }
        if f >= 16 {
            lone = false;
        }
    }
    let distinct = keys.len() == keys.iter().collect::<std::collections::HashSet<_>>().len();
    i64::from(lone) | (i64::from(distinct) << 1)
}

/// The script's keys and arguments for `ops` on the keys `prefix:i` at
/// `now`; with `general`, one more request, all-or-nothing, of two counters
/// on keys of its own; with `hinted`, the hints the store would send.
fn call_args(
    case: &Case,
    ops: &[Op],
    prefix: &str,
    now: i64,
    general: bool,
    hinted: bool,
) -> (Vec<String>, Vec<i64>) {
    let mut keys = Vec::new();
    // [algorithm, limit, window ms, burst], each once, as the store sends them
    let mut shapes: Vec<[i64; 4]> = Vec::new();
    // (shape * 128 + flags, cost) by op, sent in runs of equal neighbours
    let mut per_key: Vec<(i64, i64)> = Vec::new();
    let mut shape_of = |shape: [i64; 4]| {
        let at = shapes.iter().position(|s| *s == shape).unwrap_or_else(|| {
            shapes.push(shape);
            shapes.len() - 1
        });
        at as i64 + 1
    };
    for op in ops {
        let c = &case.counters[op.counter];
        keys.push(key(prefix, case, op.counter));
        let limit = (c.own + op.knob).max(1);
        let burst = if c.algorithm == 0 { c.own } else { c.burst };
        let code = c.algorithm + if op.overdraft { 8 } else { 0 };
        let p = shape_of([code, limit, c.window_ms, burst]);
        per_key.push((p * 128 + op.flags, op.cost));
    }
    if general {
        keys.push(format!("{prefix}:whole:a"));
        keys.push(format!("{prefix}:whole:b"));
        let p = shape_of([1, 5, 60_000, 5]);
        // An all-or-nothing request starts (4 + 8), and a second counter of
        // its own (0) follows.
        per_key.extend([(p * 128 + 12, 1), (p * 128, 1)]);
    }
    // (The general side's extra request is all-or-nothing of two
    // counters: no call of it is lone.)
    let hints = match (hinted, general) {
        (false, _) => 0,
        (true, false) => hints(ops, &keys),
        (true, true) => hints(ops, &keys) & 2,
    };
    let mut args = vec![now, shapes.len() as i64, hints];
    args.extend(shapes.iter().flatten());
    // Runs, as the store makes them: (how many - 1) * 2^32 + shape * 128 +
    // flags, cost.
    let mut runs: Vec<[i64; 2]> = Vec::new();
    for (x, cost) in per_key {
        push_run(&mut runs, x, cost);
    }
    args.extend(runs.iter().flatten());
    (keys, args)
}

/// Calls a counter script and reads its answer (a MessagePack array, as
/// divvy reads it) as integers.
async fn eval_ints<K, V>(
    client: &Client,
    script: &str,
    keys: K,
    args: V,
) -> Result<Vec<i64>, fred::error::Error>
where
    K: Into<fred::types::MultipleKeys> + Send,
    V: TryInto<fred::types::MultipleValues> + Send,
    V::Error: Into<fred::error::Error> + Send,
{
    let raw: fred::bytes::Bytes = client.eval(script, keys, args).await?;
    divvy::store::redis::answer_integers(&raw)
        .map_err(|e| fred::error::Error::new(fred::error::ErrorKind::Parse, e.to_string()))
}

/// A client of `server`, connected.
async fn connect(server: &common::redis::Redis) -> Client {
    let client = Builder::from_config(FredConfig::from_url(&server.url()).expect("url"))
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
        .build()
        .expect("fred client");
    client.init().await.expect("connection");
    client
}

/// The two scripts of the property: the lean side's and the general side's.
struct Scripts {
    lean: String,
    general: String,
}

async fn run_case(client: &Client, scripts: &Scripts, case: &Case) -> Result<(), String> {
    client
        .flushall::<()>(false)
        .await
        .map_err(|e| e.to_string())?;
    for prefix in ["lean", "general"] {
        for (i, c) in case.counters.iter().enumerate() {
            let _: i64 = client
                .eval(SETUP, vec![key(prefix, case, i)], setup_args(c))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let mut now = T0;
    for (advance, ops) in &case.calls {
        now += advance;
        let (answers, pasts) = call_both(client, scripts, case, ops, now).await?;
        if pasts[0] != pasts[1] {
            return Err(format!(
                "at {now}: credits charged past what was left, lean path {:?}, general path {:?}",
                pasts[0], pasts[1]
            ));
        }
        compare_answers(case, ops, now, &answers)?;
        compare_state(client, case, now).await?;
    }
    Ok(())
}

/// One call of `ops` at `now` on each side (lean, general): each side's
/// answers (two values per op) and its credits charged past what was left.
async fn call_both(
    client: &Client,
    scripts: &Scripts,
    case: &Case,
    ops: &[Op],
    now: i64,
) -> Result<(Vec<Vec<i64>>, Vec<Vec<(i64, i64)>>), String> {
    let (mut answers, mut pasts) = (Vec::new(), Vec::new());
    for (prefix, general) in [("lean", false), ("general", true)] {
        let (keys, args) = call_args(case, ops, prefix, now, general, case.hinted);
        // A group (one rule's limits) takes the general path on both
        // sides: only calls of lone counters take the lean one.
        let grouped = ops.iter().any(|op| op.flags % 2 == 1);
        let script = if general || grouped {
            &scripts.general
        } else {
            &scripts.lean
        };
        let got = eval_ints(client, script.as_str(), keys, args)
            .await
            .map_err(|e| format!("{prefix} call: {e}"))?;
        // The general side's extra request answers last; then two
        // values per op charged past what was left (an overdraft's).
        let want = ops.len() * 2 + if general { 4 } else { 0 };
        if got.len() < want || !(got.len() - want).is_multiple_of(2) {
            return Err(format!(
                "{prefix} call: {} values, not {want} and pairs",
                got.len()
            ));
        }
        let mut past: Vec<(i64, i64)> = got[want..].chunks_exact(2).map(|p| (p[0], p[1])).collect();
        past.sort_unstable();
        pasts.push(past);
        answers.push(got[..ops.len() * 2].to_vec());
    }
    Ok((answers, pasts))
}

/// The lean side's answers to `ops` at `now` are the general side's:
/// allowed and remaining exactly, the reset within the TTL slack.
fn compare_answers(case: &Case, ops: &[Op], now: i64, answers: &[Vec<i64>]) -> Result<(), String> {
    for (n, (l, g)) in answers[0]
        .chunks_exact(2)
        .zip(answers[1].chunks_exact(2))
        .enumerate()
    {
        // Allowed and remaining exactly; the reset too, but divvy's
        // window reads it from a TTL on Redis's clock.
        let slack = if case.counters[ops[n].counter].algorithm == 0 {
            TTL_SLACK_MS
        } else {
            0
        };
        // (Two values each: the credits left if allowed, else -1 minus
        // them; the ms to reset.)
        if l[0] != g[0] || (l[1] - g[1]).abs() > slack {
            return Err(format!(
                "at {now}, op {n} ({:?}): lean path answered {l:?}, general path {g:?}",
                ops[n]
            ));
        }
    }
    Ok(())
}

/// Both sides' counters after the call at `now` hold the same and expire
/// alike.
async fn compare_state(client: &Client, case: &Case, now: i64) -> Result<(), String> {
    let state = |prefix: &'static str| {
        let keys: Vec<String> = (0..COUNTERS).map(|i| key(prefix, case, i)).collect();
        async move {
            client
                .eval::<Vec<String>, _, _, _>(STATE, keys, Vec::<String>::new())
                .await
                .map_err(|e| e.to_string())
        }
    };
    let (lean, general) = (state("lean").await?, state("general").await?);
    if lean.len() != COUNTERS * 2 || general.len() != COUNTERS * 2 {
        return Err(format!("state: {lean:?} / {general:?}"));
    }
    for (i, (l, g)) in lean
        .chunks_exact(2)
        .zip(general.chunks_exact(2))
        .enumerate()
    {
        let (lt, gt): (i64, i64) = (
            l[1].parse().map_err(|_| format!("PTTL {}", l[1]))?,
            g[1].parse().map_err(|_| format!("PTTL {}", g[1]))?,
        );
        // An expiry on both or neither, the same but for the time between
        // the two copies' calls.
        if l[0] != g[0] || (lt < 0) != (gt < 0) || (lt - gt).abs() > TTL_SLACK_MS {
            return Err(format!(
                "at {now}, counter {i} ({:?}): lean path left `{}` PTTL {lt}, general path `{}` PTTL {gt}",
                case.counters[i], l[0], g[0]
            ));
        }
    }
    Ok(())
}

#[test]
fn the_lean_and_general_paths_answer_and_write_alike() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = common::redis::Redis::start();
    let client = runtime.block_on(connect(&server));
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    });
    let scripts = Scripts {
        lean: lean_only(),
        general: with_ending_keys(),
    };
    let result = runner.run(&case(), |case| {
        runtime
            .block_on(run_case(&client, &scripts, &case))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Which calls take the lean path (the property relies on it): requests of
/// one counter, of several counters each charged on its own; not a group,
/// nor an all-or-nothing request of several counters.
#[tokio::test]
async fn only_counters_charged_on_their_own_take_the_lean_path() {
    let server = common::redis::Redis::start();
    let client = connect(&server).await;
    let window = Counter {
        algorithm: 0,
        own: 3,
        window_ms: 60_000,
        burst: 1,
        start: "none",
        stored: 0,
    };
    let case = Case {
        counters: vec![window.clone(), window],
        calls: Vec::new(),
        hinted: false,
    };
    let op = |counter: usize, flags: i64| Op {
        counter,
        knob: 0,
        cost: 1,
        flags,
        overdraft: false,
    };
    // The lean path returns before the general path starts: with a Lua
    // error planted there, a lean call still works, and another fails.
    let planted = lean_only();
    let calls: [(&str, Vec<Op>, bool, bool); 7] = [
        ("one counter", vec![op(0, 4)], false, true),
        ("a canary", vec![op(0, 6)], false, true),
        ("pipelined", vec![op(0, 4), op(1, 0), op(0, 2)], false, true),
        ("a group", vec![op(0, 4), op(1, 1)], false, false),
        (
            "all-or-nothing of two",
            vec![op(0, 12), op(1, 0)],
            false,
            false,
        ),
        (
            "all-or-nothing group",
            vec![op(0, 12), op(1, 1)],
            false,
            false,
        ),
        ("the property's general side", vec![op(0, 4)], true, false),
    ];
    // With the store's hints or none: the hints never send a call down
    // the other path.
    for hinted in [false, true] {
        for (n, (what, ops, group, lean)) in calls.iter().enumerate() {
            let prefix = format!("c{n}:{hinted}");
            let (keys, args) = call_args(&case, ops, &prefix, T0, *group, hinted);
            let got = eval_ints(&client, planted.as_str(), keys, args).await;
            match got {
                Ok(answers) => {
                    assert!(
                        lean,
                        "{what}, hinted {hinted}: answered on the lean path: {answers:?}"
                    );
                    assert_eq!(answers.len(), ops.len() * 2, "{what}, hinted {hinted}");
                    assert_eq!(answers[..2], [2, 60_000], "{what}, hinted {hinted}");
                }
                Err(e) => {
                    assert!(!lean, "{what}, hinted {hinted}: {e}");
                    assert!(
                        e.to_string().contains("general path"),
                        "{what}, hinted {hinted}: {e}"
                    );
                }
            }
        }
    }
}

/// A divvy window's key holding a number Redis could not return as an
/// integer (beyond 2^53, infinite, not a number: written by someone else)
/// is no counter, on either path: the request is allowed and the key
/// written afresh.
#[tokio::test]
async fn a_window_value_beyond_exact_integers_is_no_counter() {
    let server = common::redis::Redis::start();
    let client = connect(&server).await;
    for start in ["huge", "inf", "nan"] {
        let (case, op) = one_counter(0, 1, start);
        for (prefix, general, hinted) in PATHS {
            let k = key(prefix, &case, 0);
            let _: i64 = client
                .eval(
                    SETUP,
                    vec![k.clone()],
                    vec![start.to_owned(), String::from("0")],
                )
                .await
                .expect("setup");
            let (keys, args) = call_args(
                &case,
                std::slice::from_ref(&op),
                prefix,
                T0,
                general,
                hinted,
            );
            let got = eval_ints(&client, SCRIPT, keys, args).await.expect("call");
            // Allowed, 2 of 3 credits left, the window's whole length.
            assert_eq!(got[..2], [2, 60_000], "{start}, {prefix} path");
            let state: Vec<String> = client
                .eval(STATE, vec![k], Vec::<String>::new())
                .await
                .expect("state");
            assert_eq!(state[0], "string 2", "{start}, {prefix} path");
        }
    }
}

/// The script's paths, as (key prefix, general, hinted) for `call_args`.
const PATHS: [(&str, bool, bool); 3] = [
    ("lean", false, false),
    ("hinted", false, true),
    ("general", true, false),
];

/// A case of one counter (own limit 3, a 60 s window) whose key starts as
/// `start`, and a request charging it 1.
fn one_counter(algorithm: i64, burst: i64, start: &'static str) -> (Case, Op) {
    let case = Case {
        counters: vec![Counter {
            algorithm,
            own: 3,
            window_ms: 60_000,
            burst,
            start,
            stored: 0,
        }],
        calls: Vec::new(),
        hinted: false,
    };
    let op = Op {
        counter: 0,
        knob: 0,
        cost: 1,
        flags: 4,
        overdraft: false,
    };
    (case, op)
}

/// A token-bucket value beyond Lua's exact integers (never divvy's own: it
/// stores at most burst x window ms, 2^52) is no counter, on every path: the
/// call answers and writes what it does on an absent key. (The bucket's
/// arithmetic divides without `math.floor`, exact only below 2^53.)
#[tokio::test]
async fn a_token_bucket_value_beyond_exact_integers_is_no_counter() {
    let server = common::redis::Redis::start();
    let client = connect(&server).await;
    let (case, op) = one_counter(3, 5, "raw");
    let huge_used = format!("10000000000000000000000:{T0}");
    let huge_time = String::from("5:99999999999999999999");
    for value in [huge_used, huge_time] {
        for (prefix, general, hinted) in PATHS {
            let mut seen = Vec::new();
            for (which, setup) in [("absent", "none"), ("huge", "raw")] {
                let at = format!("{prefix}-{which}");
                let k = key(&at, &case, 0);
                let _: i64 = client
                    .eval(
                        SETUP,
                        vec![k.clone()],
                        vec![setup.to_owned(), value.clone()],
                    )
                    .await
                    .expect("setup");
                let (keys, args) =
                    call_args(&case, std::slice::from_ref(&op), &at, T0, general, hinted);
                let got = eval_ints(&client, SCRIPT, keys, args).await.expect("call");
                let state: Vec<String> = client
                    .eval(STATE, vec![k], Vec::<String>::new())
                    .await
                    .expect("state");
                seen.push((got[..2].to_vec(), state[0].clone()));
            }
            assert!(
                seen[0].0[0] >= 0,
                "{prefix}: an absent bucket allows: {seen:?}"
            );
            assert_eq!(seen[0], seen[1], "{value}, {prefix} path");
        }
    }
}

/// Under a knob far beyond Lua's exact integers (2^60), divvy's window
/// arithmetic rounds (the stored credits are shifted by the knob's limit and
/// back); the lean path, with or without the hints, must answer and write
/// what the general path does (it rewrites the key whole when `DECRBY`'s
/// exact result is not the rounded value).
#[tokio::test]
async fn a_knob_beyond_exact_integers_answers_and_writes_alike() {
    let server = common::redis::Redis::start();
    let client = connect(&server).await;
    let scripts = Scripts {
        lean: lean_only(),
        general: with_ending_keys(),
    };
    for hinted in [false, true] {
        for stored in [0, 2, 5] {
            let window = Counter {
                algorithm: 0,
                own: 3,
                window_ms: 60_000,
                burst: 1,
                start: "ttl",
                stored,
            };
            let case = Case {
                // (`run_case` compares every counter's key.)
                counters: vec![window; COUNTERS],
                calls: vec![(
                    0,
                    vec![Op {
                        counter: 0,
                        knob: 1 << 60,
                        cost: 1,
                        flags: 4,
                        overdraft: false,
                    }],
                )],
                hinted,
            };
            run_case(&client, &scripts, &case)
                .await
                .unwrap_or_else(|e| panic!("stored {stored}, hinted {hinted}: {e}"));
        }
    }
}

#[tokio::test]
async fn malformed_runs_of_keys_are_an_error_and_write_nothing() {
    let server = common::redis::Redis::start();
    let client = connect(&server).await;
    let keys = vec!["bad:a".to_string(), "bad:b".to_string()];
    // The time, one shape (divvy's window, limit 5, 1 min), then the hints
    // (filled in below), then runs that do not describe the two keys as
    // they should. Where the first key's run is good, the lean path must
    // not write it before it finds the second's wrong.
    let call = |hints: &str, runs: &[&str]| -> Vec<String> {
        ["1000", "1", hints, "0", "5", "60000", "5"]
            .iter()
            .chain(runs)
            .map(|s| s.to_string())
            .collect()
    };
    let malformed: [&[&str]; 14] = [
        &["132"],                       // a run cut short
        &["132", "1"],                  // too few keys
        &[],                            // none
        &["8589934724", "1"],           // too many: a run of 3 (2 * 2^32 + 132)
        &["132", "1", "132", "1", "1"], // a value beyond the runs
        &["4294967428.5", "1"],         // a head that is not whole
        &["132", "1", "abc", "1"],      // a head not a number
        &["132", "1", "260", "1"],      // shape 2 of a call of 1
        &["132", "1", "4", "1"],        // shape 0
        &["-4294967164", "1"],          // a negative head
        &["9007199254740996", "1"],     // a head beyond exact integers
        &["4294967428", "-1"],          // a negative cost
        &["4294967428", "0.5"],         // a cost that is not whole
        &["132", "1", "inf", "1"],      // not finite
    ];
    for hints in ["0", "3"] {
        for runs in malformed {
            let got = eval_ints(&client, SCRIPT, keys.clone(), call(hints, runs)).await;
            let err = got.expect_err(&format!("runs {runs:?}, hints {hints}"));
            assert!(
                err.details().contains("malformed runs"),
                "runs {runs:?}, hints {hints}: {err}"
            );
            let n: i64 = client.exists(keys.clone()).await.expect("exists");
            assert_eq!(n, 0, "runs {runs:?}, hints {hints}: a key was written");
        }
        // The same call well formed: both keys charged.
        let got = eval_ints(
            &client,
            SCRIPT,
            keys.clone(),
            call(hints, &["4294967428", "1"]),
        )
        .await
        .expect("a well-formed call");
        assert_eq!(got, [4, 60_000, 4, 60_000], "hints {hints}");
        let n: i64 = client.exists(keys.clone()).await.expect("exists");
        assert_eq!(n, 2, "hints {hints}");
        let _: i64 = client.del(keys.clone()).await.expect("del");
        // A cost beyond every limit (a request's addend is any u64, sent as
        // at most i64::MAX) is well formed: denied, nothing written, and
        // the call's other requests answered.
        let got = eval_ints(
            &client,
            SCRIPT,
            keys.clone(),
            call(hints, &["132", "9223372036854775807", "132", "1"]),
        )
        .await
        .expect("a call with a huge cost");
        assert_eq!(got, [-6, 60_000, 4, 60_000], "hints {hints}");
        let n: i64 = client.exists(keys.clone()).await.expect("exists");
        assert_eq!(n, 1, "hints {hints}: only the second key is charged");
        let _: i64 = client.del(keys.clone()).await.expect("del");
    }
}
