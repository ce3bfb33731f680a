//! Unit tests of `store/memory.rs`.

use super::*;
use crate::clock::ManualClock;
use crate::store::Algorithm;
use proptest::prelude::*;

proptest! {
    /// Both of `same_ids`' branches (up to 16 ids, and the hash table
    /// past that) give each op the first op with its id.
    #[test]
    fn same_ids_finds_the_first_op_with_each_id(
        picks in proptest::collection::vec(0usize..24, 0..64),
    ) {
        // Few distinct ids, many repeats; ids that share their low 64
        // bits (the table's hash) but differ above.
        let ids: Vec<Id> = picks.iter().map(|&p| ((p as u128 % 3) << 64) | (p as u128 / 3)).collect();
        let naive: Vec<usize> = ids
            .iter()
            .map(|id| ids.iter().position(|o| o == id).unwrap_or(usize::MAX))
            .collect();
        prop_assert_eq!(same_ids(&ids), naive);
    }
}

fn op(key: &str, limit: u64, secs: u64, cost: u64) -> CounterOp {
    CounterOp::new(
        key,
        Algorithm::Window,
        limit,
        Duration::from_secs(secs),
        cost,
    )
}

fn store() -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    clock.advance(Duration::from_secs(1_700_000_000));
    (MemoryStore::with_clock(clock.clone()), clock)
}

fn has(s: &MemoryStore, key: &str) -> bool {
    let id = s.id_of(key);
    lock(&s.shards[s.shard_of(id)]).map.contains(id)
}

/// A batch of independent ops reads every counter before it saves any:
/// a new counter saved into a full shard evicts the least recently used
/// one, which must not be a counter the batch has yet to read (it would
/// be read as fresh and allowed).
#[test]
fn a_batch_reads_every_counter_before_a_new_one_evicts() {
    let clock = Arc::new(ManualClock::default());
    clock.advance(Duration::from_secs(1_700_000_000));
    // One counter per shard.
    let metrics = Arc::new(Metrics::new());
    let s = MemoryStore::with_max_counters(clock, 1, metrics.clone());
    let shard = |k: &str| s.shard_of(s.id_of(k));
    let fresh = (0..10_000)
        .map(|i| format!("a{i}"))
        .find(|a| shard(a) == shard("b"))
        .expect("a key in b's shard");
    assert!(s.apply_one(&op("b", 1, 60, 1)).allowed);
    let states = s.apply_now(&[op(&fresh, 1, 60, 1), op("b", 1, 60, 1)], Charge::Each);
    let allowed: Vec<bool> = states.iter().map(|st| st.allowed).collect();
    assert_eq!(allowed, [true, false], "b was spent before the batch");
    // The eviction is shown in the registry handed in.
    assert_eq!(metrics.store.counters_evicted.get(), 1);
    let evictions = metrics.rejected.with_label_values(&["eviction"]).get();
    assert_eq!(evictions, 1);
}

#[test]
fn window_opens_at_first_hit_and_resets() {
    let (s, clock) = store();
    let o = op("k", 3, 60, 1);
    let seq: Vec<(bool, u64)> = (0..5)
        .map(|_| {
            let st = s.apply_one(&o);
            (st.allowed, st.remaining)
        })
        .collect();
    assert_eq!(
        seq,
        vec![(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)]
    );
    clock.advance(Duration::from_secs(59));
    let st = s.apply_one(&o);
    assert_eq!(
        (st.allowed, st.reset_after),
        (false, Duration::from_secs(1))
    );
    clock.advance(Duration::from_secs(1));
    let st = s.apply_one(&o);
    assert_eq!(
        (st.allowed, st.remaining, st.reset_after),
        (true, 2, Duration::from_secs(60))
    );
}

#[test]
fn multi_credit_hits_and_checks() {
    let (s, _) = store();
    assert_eq!(s.apply_one(&op("k", 10, 60, 3)).remaining, 7);
    assert_eq!(s.apply_one(&op("k", 10, 60, 7)).remaining, 0);
    let st = s.apply_one(&op("k", 10, 60, 1));
    assert!(!st.allowed);
    // A check (cost 0) never opens a window or takes credit.
    let st = s.apply_one(&op("fresh", 10, 60, 0));
    assert!(st.allowed && st.remaining == 10);
    assert!(!has(&s, "fresh"));
    // Too big a hit on a fresh counter is denied and opens nothing.
    let st = s.apply_one(&op("big", 2, 60, 3));
    assert!(!st.allowed && st.remaining == 2);
    assert!(!has(&s, "big"));
    // Denied hits are not charged.
    s.apply_one(&op("p", 5, 60, 4));
    assert!(!s.apply_one(&op("p", 5, 60, 2)).allowed);
    assert_eq!(s.apply_one(&op("p", 5, 60, 1)).remaining, 0);
}

#[test]
fn sweep_reclaims_expired_counters_of_every_algorithm() {
    let (s, clock) = store();
    for algorithm in [
        Algorithm::Window,
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::TokenBucket,
    ] {
        for round in 0..5u64 {
            for i in 0..10_000u64 {
                let mut o = op(&format!("ip-{round}-{i}"), 5, 60, 1);
                o.algorithm = algorithm;
                s.apply_one(&o);
            }
            assert!(s.len() >= 10_000);
            clock.advance(Duration::from_secs(121));
            s.sweep();
            assert_eq!(s.len(), 0, "{algorithm:?} round {round}");
        }
    }
    s.apply_one(&op("live", 5, 60, 1));
    clock.advance(Duration::from_secs(30));
    s.apply_one(&op("young", 5, 60, 1));
    clock.advance(Duration::from_secs(31));
    assert_eq!(s.sweep(), 1);
    assert_eq!(s.len(), 1);
}

#[test]
fn a_group_is_charged_together_or_not_at_all() {
    let (s, _) = store();
    let a = op("a", 2, 60, 1);
    let mut b = op("b", 1, 60, 1);
    b.joint = true;
    let got = s.apply_now(&[a.clone(), b.clone()], Charge::Each);
    assert!(got[0].allowed && got[1].allowed);
    // b is spent: a is allowed on its own but not charged.
    let got = s.apply_now(&[a.clone(), b], Charge::Each);
    assert!(got[0].allowed && !got[1].allowed);
    assert_eq!(got[0].remaining, 1);
    assert_eq!(s.apply_one(&a).remaining, 0);
}

#[test]
fn all_or_nothing_charges_nothing_when_a_deciding_group_is_denied() {
    let (s, _) = store();
    let a = op("a", 5, 60, 1);
    let spent = op("spent", 1, 60, 1);
    s.apply_one(&spent);
    let mut canary = op("canary", 1, 60, 1);
    canary.decides = false;
    s.apply_one(&canary);
    // A denied canary does not block the request.
    let got = s.apply_now(&[a.clone(), canary.clone()], Charge::AllOrNothing);
    assert!(got[0].allowed && got[0].remaining == 4);
    let got = s.apply_now(&[a.clone(), spent.clone()], Charge::AllOrNothing);
    assert!(got[0].allowed && !got[1].allowed);
    assert_eq!(got[0].remaining, 4, "allowed but not charged: unchanged");
    let got = s.apply_now(std::slice::from_ref(&a), Charge::Denied);
    assert_eq!((got[0].allowed, got[0].remaining), (true, 4));
    assert_eq!(s.apply_one(&a).remaining, 3);
}

#[test]
fn concurrent_hits_are_exact() {
    let s = Arc::new(MemoryStore::new());
    let allowed = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            let allowed = allowed.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    if s.apply_one(&op("shared", 777, 600, 1)).allowed {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(allowed.load(Ordering::SeqCst), 777);
}

#[test]
fn concurrent_groups_never_exceed_either_limit_nor_deadlock() {
    let s = Arc::new(MemoryStore::new());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut allowed = 0u64;
                for i in 0..2000u64 {
                    // Keys in both orders, so shard locks are taken in
                    // every order a naive store would deadlock on.
                    let (x, y) = if (t + i) % 2 == 0 {
                        ("k1", "c")
                    } else {
                        ("c", "k1")
                    };
                    let mut first = op(x, 300, 600, 1);
                    first.limit = if x == "c" { 100 } else { 300 };
                    let mut second = op(y, if y == "c" { 100 } else { 300 }, 600, 1);
                    second.joint = true;
                    first.burst = first.limit;
                    let got = s.apply_now(&[first, second], Charge::Each);
                    if got[0].allowed && got[1].allowed {
                        allowed += 1;
                    }
                }
                allowed
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 100);
}

#[tokio::test]
async fn a_reset_removes_a_live_counter_and_reports_an_expired_one_as_gone() {
    let (s, clock) = store();
    for _ in 0..2 {
        s.apply_one(&op("k", 2, 10, 1));
    }
    assert!(!s.apply_one(&op("k", 2, 10, 1)).allowed);
    assert!(s.reset("k").await.unwrap());
    assert!(!has(&s, "k"));
    assert_eq!(s.apply_one(&op("k", 2, 10, 1)).remaining, 1);
    // Past its window the counter already answers as fresh: nothing to reset.
    clock.advance(Duration::from_secs(11));
    assert!(!s.reset("k").await.unwrap());
    assert!(!s.reset("never").await.unwrap());
}
