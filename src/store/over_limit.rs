//! A local cache of counters known to be over their limit, in front of a
//! shared store (Redis): such a counter is answered here until the reset
//! time the store itself returned, without a call.
//!
//! Only where that is exact: divvy windows and fixed windows (a denied hit
//! takes nothing, so the counter stays full until its window ends), a
//! counter with no credit left, a hit that takes credits (`cost > 0`, not a
//! refund), in a group of its own, and only for a call whose groups are
//! charged on their own. An entry holds for the same algorithm, limit and
//! window only: a knob or reload that changes them bypasses and drops it.
//! A refund that gives back credits of a counter that was full is told to
//! the other replicas (through [`OverLimitCache::with_refunds`]'s channel,
//! see `crate::counters::resets`), whose caches then forget it.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::lru_table::LruTable;
use super::{Algorithm, Charge, CounterOp, CounterState, Store, StoreError, StoreFuture};
use crate::clock::Clock;
use crate::observe::metrics::Metrics;

/// Independent tables; a key's shard is picked by its hash's top bits.
const SHARDS: usize = 16;

/// Resident bytes of one cached counter at worst: its 64-byte slot and its
/// index entry (the memory budget reserves this much an entry).
pub const ENTRY_BYTES: u64 = 80;

/// A counter known to be full, and the limit it was full against.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Clock time (ms) when the store said the counter resets.
    until_ms: u64,
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
}

impl Entry {
    fn matches(&self, op: &CounterOp) -> bool {
        self.algorithm == op.algorithm
            && self.limit == op.limit
            && u128::from(self.window_ms) == op.window.as_millis()
    }
}

/// The cache around a store.
pub struct OverLimitCache {
    inner: Arc<dyn Store>,
    shards: Vec<Mutex<LruTable<Entry>>>,
    per_shard: usize,
    clock: Arc<dyn Clock>,
    hash_key: (u64, u64),
    /// Where the HITs answered here are counted.
    metrics: Arc<Metrics>,
    /// Keys of full counters a refund gave credits back to, for the other
    /// replicas' caches (dropped when the channel is full).
    refunds: Option<tokio::sync::mpsc::Sender<String>>,
}

impl OverLimitCache {
    /// `inner` with at most `entries` counters cached (least recently used
    /// dropped first), timed by `clock`; the HITs it answers are counted in
    /// `metrics` (`divvy_store_over_limit_cache_hits_total`).
    pub fn new(
        inner: Arc<dyn Store>,
        entries: usize,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> OverLimitCache {
        let per_shard = entries.div_ceil(SHARDS).max(1);
        OverLimitCache {
            inner,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruTable::with_cap(per_shard)))
                .collect(),
            per_shard,
            clock,
            hash_key: {
                let s = std::collections::hash_map::RandomState::new();
                (s.hash_one(0x5eed_u64), s.hash_one(0xd1f7_u64))
            },
            metrics,
            refunds: None,
        }
    }

    /// Sends the key of each counter that was full and that a refund gave
    /// credits back to into `refunds` (its receiver tells the other
    /// replicas, whose caches may still deny it).
    pub fn with_refunds(mut self, refunds: tokio::sync::mpsc::Sender<String>) -> OverLimitCache {
        self.refunds = Some(refunds);
        self
    }

    /// Counters cached now (expired ones included until they are looked up).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now().as_millis()).unwrap_or(u64::MAX)
    }

    fn id_of(&self, key: &str) -> u128 {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(self.hash_key.0, self.hash_key.1);
        h.write(key.as_bytes());
        h.finish128().as_u128()
    }

    fn shard(&self, id: u128) -> MutexGuard<'_, LruTable<Entry>> {
        lock(&self.shards[(id >> 64) as usize % SHARDS])
    }

    /// The cached denial of `op` (whose key hashes to `id`), if its counter
    /// is known full now.
    fn lookup(&self, id: u128, op: &CounterOp, now: u64) -> Option<CounterState> {
        let mut shard = self.shard(id);
        let entry = *shard.get(id)?;
        if !entry.matches(op) || now >= entry.until_ms {
            shard.remove(id);
            return None;
        }
        Some(CounterState {
            allowed: false,
            remaining: 0,
            reset_after: Duration::from_millis(entry.until_ms - now),
            overdrawn: 0,
        })
    }

    /// Remembers what the store answered for a cacheable op (whose key
    /// hashes to `id`): a full counter until its reset, else nothing.
    fn learn(&self, id: u128, op: &CounterOp, state: &CounterState, now: u64) {
        let mut shard = self.shard(id);
        if state.allowed || state.remaining > 0 || state.reset_after.is_zero() {
            shard.remove(id);
            return;
        }
        let entry = Entry {
            until_ms: now
                .saturating_add(u64::try_from(state.reset_after.as_millis()).unwrap_or(u64::MAX)),
            algorithm: op.algorithm,
            limit: op.limit,
            window_ms: u64::try_from(op.window.as_millis()).unwrap_or(u64::MAX),
        };
        shard.put(id, entry);
        while shard.len() > self.per_shard {
            shard.pop_lru();
        }
    }

    async fn apply_cached(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<CounterState>, StoreError> {
        let now = self.now_ms();
        // A refund makes a full counter not full: its key's ops in this call
        // go to the store (a settle's charge after its refund), and what was
        // cached of it is forgotten once the store has answered.
        let refunded: Vec<u128> = ops
            .iter()
            .filter(|op| op.refund)
            .map(|op| self.id_of(&op.key))
            .collect();
        // Each key hashed once, for the lookup and for what is learnt.
        let looked: Vec<Looked> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                if !cacheable(ops, i, charge) {
                    return Looked::Uncached;
                }
                let id = self.id_of(&op.key);
                if refunded.contains(&id) {
                    return Looked::Uncached;
                }
                self.lookup(id, op, now)
                    .map_or(Looked::Missed(id), Looked::Hit)
            })
            .collect();
        let hits = looked
            .iter()
            .filter(|l| matches!(l, Looked::Hit(_)))
            .count();
        if hits > 0 {
            self.metrics.store.over_limit_cache_hits.inc_by(hits as u64);
        }
        let states = if hits == 0 {
            self.inner.apply_by(ops, charge, deadline).await?
        } else if hits == ops.len() {
            return Ok(looked.iter().filter_map(Looked::hit).collect());
        } else {
            self.apply_rest(ops, charge, deadline, &looked).await?
        };
        // From the time before the call: the store's reset is counted from
        // when its script ran, later, so the entry never outlives the window.
        for ((op, state), l) in ops.iter().zip(&states).zip(&looked) {
            if let Looked::Missed(id) = *l {
                self.learn(id, op, state, now);
            }
        }
        for id in refunded {
            self.shard(id).remove(id);
        }
        self.tell_refunds(ops, &states);
        Ok(states)
    }

    /// Sends the keys of counters that were full before a refund of this
    /// call (what is left now is no more than what was given back, and
    /// less than a fresh counter holds: a refund to an unused counter is
    /// not news) and that another replica's cache may hold.
    fn tell_refunds(&self, ops: &[CounterOp], states: &[CounterState]) {
        let Some(tx) = &self.refunds else { return };
        for (op, state) in ops.iter().zip(states) {
            let full = op.limit.min(op.burst);
            let was_full =
                op.refund && op.cost > 0 && state.remaining <= op.cost && state.remaining < full;
            if was_full && op.algorithm.spec().over_limit_cache && !op.overdraft {
                let _ = tx.try_send(op.key.clone());
            }
        }
    }

    /// The ops not answered from the cache go to the store; the answers are
    /// merged back in order. Only single-op groups are ever cached, so the
    /// rest keeps its groups whole.
    async fn apply_rest(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
        looked: &[Looked],
    ) -> Result<Vec<CounterState>, StoreError> {
        let rest: Vec<CounterOp> = ops
            .iter()
            .zip(looked)
            .filter(|(_, l)| l.hit().is_none())
            .map(|(op, _)| op.clone())
            .collect();
        let answered = self.inner.apply_by(&rest, charge, deadline).await?;
        let mut answered = super::answered_all(answered, rest.len())?.into_iter();
        let mut out = Vec::with_capacity(ops.len());
        for l in looked {
            match l.hit() {
                Some(state) => out.push(state),
                None => out.extend(answered.next()),
            }
        }
        Ok(out)
    }
}

/// What the cache knew of one op of a call.
#[derive(Clone, Copy)]
enum Looked {
    /// Not cacheable: the store decides, nothing is learnt.
    Uncached,
    /// Cacheable, not known full: the store decides, its answer is learnt
    /// under this id (the key's hash).
    Missed(u128),
    /// Known full: answered here.
    Hit(CounterState),
}

impl Looked {
    fn hit(&self) -> Option<CounterState> {
        match self {
            Looked::Hit(state) => Some(*state),
            _ => None,
        }
    }
}

/// Whether op `i` may be answered from, and taught to, the cache. Never an
/// overdraft op: a cached denial would skip a charge that must be applied.
fn cacheable(ops: &[CounterOp], i: usize, charge: Charge) -> bool {
    let op = &ops[i];
    let alone = !op.joint && ops.get(i + 1).is_none_or(|next| !next.joint);
    op.algorithm.spec().over_limit_cache
        && !op.overdraft
        && op.cost > 0
        && !op.refund
        && alone
        && (charge == Charge::Each || (charge == Charge::AllOrNothing && ops.len() == 1))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for OverLimitCache {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(self.apply_cached(ops, charge, None))
    }

    fn apply_by<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
        deadline: Option<tokio::time::Instant>,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(self.apply_cached(ops, charge, deadline))
    }

    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        self.inner.peek(op)
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let existed = self.inner.reset(key).await?;
            // After the store's delete: a denial learnt meanwhile goes too.
            self.forget(key);
            Ok(existed)
        })
    }

    fn forget(&self, key: &str) -> bool {
        let id = self.id_of(key);
        self.shard(id).remove(id).is_some()
    }

    fn cached_denial(&self, key: &str) -> Option<bool> {
        let id = self.id_of(key);
        let now = self.now_ms();
        Some(self.shard(id).peek(id).is_some_and(|e| now < e.until_ms))
    }

    fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
        self.inner.probe()
    }

    fn ready(&self) -> bool {
        self.inner.ready()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;

    /// The cache over a memory store on one manual clock, and the store
    /// alone on its own copy of it, fed the same calls.
    struct Pair {
        clock: Arc<ManualClock>,
        cached: OverLimitCache,
        plain: MemoryStore,
        plain_clock: Arc<ManualClock>,
    }

    fn pair(entries: usize) -> Pair {
        let clock = Arc::new(ManualClock::default());
        let plain_clock = Arc::new(ManualClock::default());
        let inner = Arc::new(MemoryStore::with_clock(clock.clone()));
        Pair {
            cached: OverLimitCache::new(inner, entries, clock.clone(), Arc::new(Metrics::new())),
            plain: MemoryStore::with_clock(plain_clock.clone()),
            clock,
            plain_clock,
        }
    }

    impl Pair {
        async fn both(&self, ops: &[CounterOp]) -> Vec<CounterState> {
            let a = self.plain.apply(ops, Charge::Each).await.unwrap();
            let b = self.cached.apply(ops, Charge::Each).await.unwrap();
            assert_eq!(a, b, "{ops:?}");
            b
        }

        fn advance(&self, d: Duration) {
            self.clock.advance(d);
            self.plain_clock.advance(d);
        }
    }

    fn op(key: &str, limit: u64) -> CounterOp {
        CounterOp::new(key, Algorithm::Window, limit, Duration::from_secs(10), 1)
    }

    #[tokio::test]
    async fn a_full_window_is_cached_until_its_reset_and_a_new_limit_drops_it() {
        let p = pair(100);
        for _ in 0..2 {
            p.both(&[op("k", 2)]).await;
        }
        let denied = p.both(&[op("k", 2)]).await;
        assert!(!denied[0].allowed);
        assert_eq!(p.cached.len(), 1);
        p.advance(Duration::from_secs(4));
        let again = p.both(&[op("k", 2)]).await;
        assert_eq!(again[0].reset_after, Duration::from_secs(6));
        // A knob raising the limit: the entry no longer holds; the store
        // answers (a window keeps what it has left until it ends).
        let hits = || p.cached.metrics.store.over_limit_cache_hits.get();
        let before = hits();
        p.both(&[op("k", 5)]).await;
        assert_eq!(hits(), before);
        // A quota check (cost 0) and a refund are never answered by it.
        for _ in 0..4 {
            p.both(&[op("k", 5)]).await;
        }
        assert_eq!(p.cached.len(), 1);
        p.both(&[CounterOp {
            cost: 0,
            ..op("k", 5)
        }])
        .await;
        p.both(&[CounterOp {
            refund: true,
            ..op("k", 5)
        }])
        .await;
        // After the reset the store decides again.
        p.advance(Duration::from_secs(7));
        assert!(p.both(&[op("k", 5)]).await[0].allowed);
    }

    #[tokio::test]
    async fn joint_groups_go_to_the_store_and_the_table_stays_bounded() {
        let p = pair(16);
        let group = |key: &str| {
            let mut second = op(&format!("{key}/2"), 1);
            second.joint = true;
            [op(key, 1), second]
        };
        p.both(&group("g")).await;
        p.both(&group("g")).await;
        assert!(p.cached.is_empty(), "a group of two is never cached");
        for i in 0..100 {
            let key = format!("k{i}");
            p.both(&[op(&key, 1), op(&key, 1)]).await;
        }
        // At most one entry per shard past the bound's share of it.
        assert!(p.cached.len() <= 16, "{}", p.cached.len());
    }

    #[tokio::test]
    async fn a_refund_clears_a_cached_denial_and_its_call_goes_to_the_store() {
        let p = pair(100);
        let hits = |n| CounterOp {
            cost: n,
            ..op("k", 10)
        };
        let refund = |n| CounterOp {
            refund: true,
            ..hits(n)
        };
        assert!(p.both(&[hits(10)]).await[0].allowed);
        assert!(!p.both(&[hits(5)]).await[0].allowed);
        assert_eq!(p.cached.len(), 1);
        // A settle: 5 back, then 3 charged, in one call. The charge sees
        // the refund, not the cached denial.
        let settled = p.both(&[refund(5), hits(3)]).await;
        assert!(settled[1].allowed);
        assert!(p.cached.is_empty());
        // Full again, cached; a refund alone clears it for the next call.
        assert!(p.both(&[hits(2)]).await[0].allowed);
        assert!(!p.both(&[hits(5)]).await[0].allowed);
        assert_eq!(p.cached.len(), 1);
        p.both(&[refund(4)]).await;
        assert!(p.both(&[hits(4)]).await[0].allowed);
    }

    #[tokio::test]
    async fn a_reset_deletes_the_counter_and_a_forget_drops_only_the_cached_denial() {
        let p = pair(100);
        for _ in 0..3 {
            p.cached.apply(&[op("k", 2)], Charge::Each).await.unwrap();
        }
        assert_eq!(p.cached.cached_denial("k"), Some(true));
        assert_eq!(p.cached.cached_denial("other"), Some(false));
        // Another replica reset the store: forgetting sends the next hit there.
        p.cached.inner.reset("k").await.unwrap();
        assert!(p.cached.forget("k"));
        assert!(!p.cached.forget("k"));
        assert!(p.cached.apply(&[op("k", 2)], Charge::Each).await.unwrap()[0].allowed);
        // Full again, cached; a reset through the cache clears both.
        for _ in 0..2 {
            p.cached.apply(&[op("k", 2)], Charge::Each).await.unwrap();
        }
        assert_eq!(p.cached.cached_denial("k"), Some(true));
        assert!(p.cached.reset("k").await.unwrap());
        assert_eq!(p.cached.cached_denial("k"), Some(false));
        let fresh = p.cached.apply(&[op("k", 2)], Charge::Each).await.unwrap();
        assert_eq!((fresh[0].allowed, fresh[0].remaining), (true, 1));
        assert!(!p.cached.reset("never").await.unwrap());
    }

    #[tokio::test]
    async fn an_overdraft_is_never_answered_by_the_cache() {
        let p = pair(100);
        let over = |cost| CounterOp {
            overdraft: true,
            cost,
            ..op("k", 2)
        };
        assert!(p.both(&[over(5)]).await[0].allowed);
        // In debt: denied, yet each hit is charged (the debt grows), which
        // a cached denial would skip; the answers agree with the store's.
        for _ in 0..3 {
            assert!(!p.both(&[over(1)]).await[0].allowed);
        }
        assert!(p.cached.is_empty());
        let mut refund = over(5);
        refund.refund = true;
        // 3 + 3 in debt: 5 back leaves nothing, so a check is still denied.
        p.both(&[refund]).await;
        assert!(!p.both(&[over(0)]).await[0].allowed);
    }
}
