//! Unit tests of `store/redis/`.

use super::*;

#[test]
fn a_request_beyond_the_most_counters_is_refused() {
    assert!(request_size_ok(0).is_ok());
    assert!(request_size_ok(MAX_REQUEST_COUNTERS).is_ok());
    let e = request_size_ok(MAX_REQUEST_COUNTERS + 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "counter store unavailable: redis: a request of 16777217 counters; at most 16777216"
    );
    // Within the bound, a call's shapes (one a counter at most: the
    // request's and a batch's others) and flags stay below a run's head
    // unit, as the script's runs need.
    let shapes = i64::try_from(MAX_REQUEST_COUNTERS + MAX_BATCH_KEYS).unwrap();
    assert!(shapes * 128 + 127 < RUN);
}

#[test]
fn keys_are_split_off_one_buffer_byte_for_byte() {
    let keys = ["divvy:a", "", "divvy-rl:\u{e9}:x", "{slot}k"];
    let got = key_bytes(&keys);
    let got: Vec<&[u8]> = got.iter().map(|k| k.as_bytes()).collect();
    let want: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    assert_eq!(got, want);
    assert!(key_bytes(&[]).is_empty());
    assert_eq!(key_bytes(&["one"])[0].as_bytes(), b"one");
}

#[test]
fn decimal_args_are_each_number_as_text() {
    let args = decimal_args(&[0, -1, 7, i64::MAX, i64::MIN, 1_700_000_000_123]);
    let text: Vec<&[u8]> = args
        .iter()
        .map(|v| match v {
            Value::Bytes(b) => &b[..],
            other => panic!("not bytes: {other:?}"),
        })
        .collect();
    assert_eq!(
        text,
        [
            &b"0"[..],
            b"-1",
            b"7",
            b"9223372036854775807",
            b"-9223372036854775808",
            b"1700000000123"
        ]
    );
    assert!(decimal_args(&[]).is_empty());
}

fn op(key: &str, limit: u64, cost: u64) -> CounterOp {
    CounterOp::new(key, Algorithm::Window, limit, Duration::from_secs(60), cost)
}

#[test]
fn counter_state_reads_allowed_from_the_sign() {
    let state = |c, t| {
        let s = counter_state(c, t);
        (s.allowed, s.remaining, s.reset_after.as_millis())
    };
    assert_eq!(state(0, 5), (true, 0, 5));
    assert_eq!(state(7, 100), (true, 7, 100));
    assert_eq!(state(-1, 5), (false, 0, 5));
    assert_eq!(state(-8, 0), (false, 7, 0));
    assert_eq!(state(i64::MIN, -3), (false, i64::MAX as u64, 0));
}

#[test]
fn an_answer_s_extra_pairs_are_credits_charged_past_what_was_left() {
    let states = parse_answer(&[0, 5, -1, 9, 2, 200], 2).expect("well formed");
    assert_eq!((states[0].overdrawn, states[1].overdrawn), (0, 200));
    assert_eq!(parse_answer(&[0, 5], 1).expect("plain")[0].overdrawn, 0);
    // Too short, odd, or naming an op that is not there: refused.
    assert!(parse_answer(&[0, 5], 2).is_err());
    assert!(parse_answer(&[0, 5, 1], 1).is_err());
    assert!(parse_answer(&[0, 5, 3, 10], 1).is_err());
    assert!(parse_answer(&[0, 5, 0, 10], 1).is_err());
    assert!(parse_answer(&[0, 5, 1, -10], 1).is_err());
}

#[test]
fn script_args_send_each_shape_once() {
    let a = [op("a", 10, 1), op("b", 10, 2), op("c", 20, 1)];
    let b = [op("d", 10, 3)];
    let parts: Vec<Part<'_>> = vec![(&a, Charge::Each), (&b, Charge::AllOrNothing)];
    let (keys, args) = script_args(&parts, 4, false, 1_000);
    assert_eq!(keys, ["a", "b", "c", "d"]);
    let shape = |limit: i64| [0, limit, 60_000, limit];
    // The time, 2 shapes, hints: every op lone (`d`, all-or-nothing, is
    // one counter) and no key twice.
    let mut want = vec![1_000, 2, hint::LONE | hint::DISTINCT];
    want.extend(shape(10));
    want.extend(shape(20));
    // Runs of one: shape * 128 + flags (4: a request starts; 8:
    // all-or-nothing), cost.
    want.extend([128 + 4, 1, 128, 2, 256, 1, 128 + 4 + 8, 3]);
    assert_eq!(args, want);
}

#[test]
fn script_args_send_alike_neighbours_as_one_run() {
    // Pipelined requests of one rule: one run. A different cost, shape
    // or flag starts a new one; runs are never reordered.
    let same: Vec<CounterOp> = (0..5).map(|i| op(&format!("k{i}"), 10, 1)).collect();
    let costly = [op("x", 10, 2)];
    let other = [op("y", 20, 1)];
    let mut parts: Vec<Part<'_>> = same.chunks(1).map(|c| (c, Charge::Each)).collect();
    parts.extend([(&costly[..], Charge::Each), (&other[..], Charge::Each)]);
    parts.push((&same[..1], Charge::Each));
    let (keys, args) = script_args(&parts, 8, false, 7);
    assert_eq!(keys.len(), 8);
    assert_eq!(args[..3], [7, 2, hint::LONE]);
    // Heads: (how many - 1) * RUN + shape * 128 + flags; then costs.
    let runs = &args[3 + 2 * 4..];
    assert_eq!(
        runs,
        [4 * RUN + 128 + 4, 1, 128 + 4, 2, 256 + 4, 1, 128 + 4, 1]
    );
    // A request of several counters: its first starts it (flag 4), so
    // the others are a run of their own.
    let many = [op("a", 10, 1), op("b", 10, 1), op("c", 10, 1)];
    let (_, args) = script_args(&[(&many, Charge::Each)], 3, false, 7);
    assert_eq!(args[3 + 4..], [128 + 4, 1, RUN + 128, 1]);
}

#[test]
fn a_run_ends_before_its_head_outgrows_exact_integers() {
    let ops: Vec<CounterOp> = (0..MAX_RUN + 3).map(|_| op("k", 10, 1)).collect();
    let parts: Vec<Part<'_>> = ops.chunks(1).map(|c| (c, Charge::Each)).collect();
    let (_, args) = script_args(&parts, ops.len(), false, 7);
    let runs = &args[3 + 4..];
    assert_eq!(runs, [(MAX_RUN - 1) * RUN + 132, 1, 2 * RUN + 132, 1]);
    assert!(runs[0] < 1 << 53);
}

#[test]
fn script_args_past_the_searched_shapes_add_their_own() {
    // 20 limits, then the 20th again: past the first SHAPES_SEARCHED
    // shapes it is not looked up, so it is sent twice; every counter
    // still names a shape with its own numbers.
    let ops: Vec<CounterOp> = (1..=20)
        .chain([20, 1])
        .map(|limit| op(&format!("k{limit}"), limit, 1))
        .collect();
    let parts: Vec<Part<'_>> = vec![(&ops, Charge::Each)];
    let (_, args) = script_args(&parts, ops.len(), false, -1);
    let shapes = usize::try_from(args[1]).unwrap();
    assert_eq!(shapes, 21);
    // Every counter is a request of its own with its own shape: one
    // run each.
    let runs = &args[3 + shapes * 4..];
    assert_eq!(runs.len(), ops.len() * 2);
    for (op, run) in ops.iter().zip(runs.chunks_exact(2)) {
        assert!(run[0] < RUN, "a run of one");
        let shape = usize::try_from(run[0] / 128).unwrap();
        let limit = args[3 + (shape - 1) * 4 + 1];
        assert_eq!(limit, i64::try_from(op.limit).unwrap());
    }
    // The last counter's shape (limit 1) is the first one, found.
    assert_eq!(runs[runs.len() - 2] / 128, 1);
}

#[test]
fn hints_tell_a_lone_call_and_distinct_keys() {
    let a = [op("a", 10, 1), op("b", 10, 1)];
    let one = [op("c", 10, 1)];
    let hints_of = |parts: &[Part<'_>], undo: bool| {
        let count = parts.iter().map(|(ops, _)| ops.len()).sum();
        script_args(parts, count, undo, -1).1[2]
    };
    assert_eq!(
        hints_of(&[(&a, Charge::Each), (&one, Charge::AllOrNothing)], false),
        hint::LONE | hint::DISTINCT
    );
    // Every op is still lone, but a key comes twice.
    assert_eq!(
        hints_of(&[(&one, Charge::Each), (&one, Charge::Each)], false),
        hint::LONE
    );
    // Not lone: an all-or-nothing request of two counters, a request
    // denied beforehand, an undo, a refund, a group.
    assert_eq!(
        hints_of(&[(&a, Charge::AllOrNothing)], false),
        hint::DISTINCT
    );
    assert_eq!(hints_of(&[(&one, Charge::Denied)], false), hint::DISTINCT);
    assert_eq!(hints_of(&[(&one, Charge::Each)], true), hint::DISTINCT);
    let mut refund = op("r", 10, 1);
    refund.refund = true;
    assert_eq!(
        hints_of(&[(std::slice::from_ref(&refund), Charge::Each)], false),
        hint::DISTINCT
    );
    let mut group = [op("g", 10, 1), op("h", 20, 1)];
    group[1].joint = true;
    assert_eq!(hints_of(&[(&group, Charge::Each)], false), hint::DISTINCT);
    assert_eq!(hints_of(&[], false), hint::LONE | hint::DISTINCT);
}

#[test]
fn a_batched_request_carries_no_client_future() {
    // Every request through the batcher allocates this future; the
    // client's command futures are several KB, and when they were part
    // of it, each request paid for faulting in and zeroing the pages.
    fn size<F: std::future::Future>(_: &F) -> usize {
        std::mem::size_of::<F>()
    }
    let (tx, _rx) = mpsc::channel(1);
    let ops = [op("a", 10, 1)];
    let f = batched(&tx, &ops, Charge::Each, 0);
    assert!(size(&f) < 1024, "{} bytes", size(&f));
}
