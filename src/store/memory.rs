//! The embedded in-memory store: the default, no other process needed.
//!
//! Counters live in a sharded hash map of our own (a mutex per shard, many
//! more shards than cores). A request's counters are applied under their
//! shards' locks, taken in shard order (no deadlock), so every request is
//! atomic. Each counter holds its algorithm's state (see
//! [`super::algorithm`]) and an expiry; [`MemoryStore::sweep`] drops expired
//! ones, so memory follows the counters in use. Each shard keeps
//! least-recently-used order: under a cap ([`MemoryStore::with_max_counters`],
//! `--max-counters`) a new counter in a full shard evicts its least recently
//! used one (counted in `divvy_counters_evicted_total` and
//! `divvy_rejected_total{reason="eviction"}`).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::algorithm::{self, Params, State, States};
use super::lru_table::{LruTable, MAX_SLOTS};
use super::{Charge, CounterOp, CounterState, Store, StoreError, StoreFuture};
use crate::observe::metrics::Metrics;

pub use crate::clock::{Clock, SystemClock};

/// One stored counter.
#[derive(Debug, Clone, Copy)]
struct Entry {
    state: State,
    /// Epoch ms after which the counter answers like a fresh one.
    expires_at: u64,
}

/// A counter's identity in the memory store: a keyed 128-bit SipHash-1-3
/// of its key (random key per process). Holding 16 bytes instead of the
/// key's text keeps a counter small and its lookup free of string compares;
/// a collision between two of a process's counters has odds of about
/// n²/2¹²⁹, and no client can aim for one without the key.
type Id = u128;

/// One shard: counters in least-recently-used order.
struct Shard {
    map: LruTable<Entry>,
    /// Most counters held since the table last gave memory back.
    peak: usize,
}

impl Shard {
    fn new(cap: usize) -> Shard {
        Shard {
            map: LruTable::with_cap(cap),
            peak: 0,
        }
    }

    /// Gives the table's memory back when it holds under a quarter of its
    /// peak, so a flood's memory goes back once it is swept.
    fn shrink(&mut self) {
        if self.peak > 256 && self.map.len() < self.peak / 4 {
            self.map.shrink();
            self.peak = self.map.len();
        }
    }
}

/// The embedded store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// The key of the counters' [`Id`]s.
    id_key: (u64, u64),
    clock: Arc<dyn Clock>,
    /// Most counters a shard holds (`MAX_SLOTS`: no cap but the table's own).
    per_shard: usize,
    /// Counters evicted to stay under the cap.
    evicted: AtomicU64,
    /// Epoch ms of the last eviction log line.
    evict_logged: AtomicU64,
    /// Where evictions and the sweeper's count of counters are shown.
    metrics: Arc<Metrics>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock::default()))
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic elsewhere never stops the store: the map itself is always consistent.
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    /// A store on the system clock, without a cap, recording to a registry
    /// of its own (tests, benchmarks: nothing reaches `/metrics`).
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// A store on the given clock, without a cap, recording to a registry
    /// of its own (tests, benchmarks: nothing reaches `/metrics`).
    pub fn with_clock(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore::build(clock, None, Arc::new(Metrics::new()))
    }

    /// A store on `clock` holding at most `max` live counters (at least one
    /// per shard): a new counter in a full shard evicts its least recently
    /// used one. Evictions and the sweeper's count are shown in `metrics`.
    pub fn with_max_counters(
        clock: Arc<dyn Clock>,
        max: usize,
        metrics: Arc<Metrics>,
    ) -> MemoryStore {
        MemoryStore::build(clock, Some(max.max(1)), metrics)
    }

    /// A store on `clock`, holding at most `max` live counters when given
    /// (see [`with_max_counters`](Self::with_max_counters)), showing its
    /// evictions and the sweeper's count in `metrics`.
    pub fn build(clock: Arc<dyn Clock>, max: Option<usize>, metrics: Arc<Metrics>) -> MemoryStore {
        let mut shards =
            (std::thread::available_parallelism().map_or(4, |n| n.get()) * 32).next_power_of_two();
        if let Some(max) = max {
            // At least one counter a shard, and never more than `max` in all.
            while shards > 1 && shards > max {
                shards /= 2;
            }
        }
        let per_shard = max.map_or(MAX_SLOTS, |m| (m / shards).clamp(1, MAX_SLOTS));
        MemoryStore {
            shards: (0..shards)
                .map(|_| Mutex::new(Shard::new(per_shard)))
                .collect(),
            id_key: {
                let s = RandomState::new();
                (s.hash_one(0x5eed_u64), s.hash_one(0xd1f7_u64))
            },
            clock,
            per_shard,
            evicted: AtomicU64::new(0),
            evict_logged: AtomicU64::new(0),
            metrics,
        }
    }

    /// The most counters held at once (`None`: no cap).
    pub fn max_counters(&self) -> Option<usize> {
        (self.per_shard != MAX_SLOTS).then(|| self.per_shard * self.shards.len())
    }

    /// Counters evicted so far to stay under the cap.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn note_eviction(&self, now: u64) {
        let total = self.evicted.fetch_add(1, Ordering::Relaxed) + 1;
        let m = &self.metrics;
        m.store.counters_evicted.inc();
        m.rejected.with_label_values(&["eviction"]).inc();
        // At most one log line a minute.
        let last = self.evict_logged.load(Ordering::Relaxed);
        if now >= last + 60_000
            && self
                .evict_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                evicted_total = total,
                max_counters = self.max_counters().unwrap_or(0),
                "the memory store is full: least recently used counters are being evicted (raise --max-counters, or look for a flood of distinct actors)"
            );
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now().as_millis()).unwrap_or(u64::MAX)
    }

    /// A key's [`Id`].
    fn id_of(&self, key: &str) -> Id {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(self.id_key.0, self.id_key.1);
        h.write(key.as_bytes());
        h.finish128().as_u128()
    }

    fn shard_of(&self, id: Id) -> usize {
        // The top bits: the tables inside use the low ones.
        (id >> 64) as usize & (self.shards.len() - 1)
    }

    /// Number of counters held (live ones plus expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired counter; returns how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.now_ms();
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            dropped += shard.map.retain(|e| e.expires_at > now);
            // Give memory back after a flood of short-lived counters.
            shard.shrink();
        }
        // What the tables freed (when they grew or shrank) and the system
        // allocator kept.
        crate::store::lru_table::release_freed_arrays();
        dropped
    }

    /// Runs [`sweep`](Self::sweep) every `every` on the current tokio runtime.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { return };
                // Sweeping walks every shard: keep it off the async workers.
                let dropped = tokio::task::spawn_blocking(move || {
                    let n = store.sweep();
                    store
                        .metrics
                        .store
                        .counters
                        .set(i64::try_from(store.len()).unwrap_or(i64::MAX));
                    n
                })
                .await;
                if let Ok(n) = dropped {
                    if n > 0 {
                        tracing::debug!(dropped = n, "swept expired counters");
                    }
                }
            }
        })
    }

    /// Applies one op of its own (a convenience for tests and benchmarks).
    pub fn apply_one(&self, op: &CounterOp) -> CounterState {
        self.apply_now(std::slice::from_ref(op), Charge::Each)
            .pop()
            .unwrap_or(CounterState {
                allowed: false,
                remaining: 0,
                reset_after: Duration::ZERO,
                overdrawn: 0,
            })
    }

    /// Applies the ops of one request atomically (see [`algorithm::apply_request`]).
    pub fn apply_now(&self, ops: &[CounterOp], charge: Charge) -> Vec<CounterState> {
        self.apply_at(ops, charge, self.now_ms())
    }

    /// [`apply_now`](Self::apply_now) at `now` (epoch milliseconds on this
    /// store's clock).
    fn apply_at(&self, ops: &[CounterOp], charge: Charge, now: u64) -> Vec<CounterState> {
        if let [op] = ops {
            let id = [self.id_of(&op.key)];
            let mut guard = lock(&self.shards[self.shard_of(id[0])]);
            let mut states = Locked {
                ids: &id,
                store: self,
                per_shard: self.per_shard,
                ops,
                guards: std::slice::from_mut(&mut guard),
                slot: &[0],
                now,
            };
            return algorithm::apply_request(&mut states, now, ops, &[0], charge);
        }
        let ids: Vec<Id> = ops.iter().map(|op| self.id_of(&op.key)).collect();
        let shard_ids: Vec<usize> = ids.iter().map(|&id| self.shard_of(id)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        // Locks in ascending shard order: no two requests can deadlock.
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let slot: Vec<usize> = shard_ids
            .iter()
            .map(|id| order.binary_search(id).unwrap_or(0))
            .collect();
        // Every counter's lookup once before the algorithms run: independent
        // lookups overlap their cache misses.
        for (id, &g) in ids.iter().zip(&slot) {
            guards[g].map.warm(*id);
        }
        let same = same_ids(&ids);
        let mut states = Locked {
            ids: &ids,
            store: self,
            per_shard: self.per_shard,
            ops,
            guards: &mut guards,
            slot: &slot,
            now,
        };
        algorithm::apply_request(&mut states, now, ops, &same, charge)
    }
}

/// `same[i]`: the index of the first op whose counter has op `i`'s id. The
/// id is the store's identity of a key, and its low 64 bits are already a
/// keyed hash: finding repeats by id costs no hashing, where hashing the
/// keys again measured costly (docs/performance.md, "The line protocol
/// path").
fn same_ids(ids: &[Id]) -> Vec<usize> {
    if ids.len() <= 16 {
        return ids
            .iter()
            .enumerate()
            .map(|(i, id)| ids[..i].iter().position(|o| o == id).unwrap_or(i))
            .collect();
    }
    let low = |id: Id| id as u64;
    let mut first: hashbrown::HashTable<usize> = hashbrown::HashTable::with_capacity(ids.len());
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            *first
                .entry(low(id), |&j| ids[j] == id, |&j| low(ids[j]))
                .or_insert(i)
                .get()
        })
        .collect()
}

/// The counters of one request, their shards locked.
struct Locked<'a, 'g> {
    /// Per op: its counter's id.
    ids: &'a [Id],
    store: &'a MemoryStore,
    per_shard: usize,
    ops: &'a [CounterOp],
    guards: &'a mut [MutexGuard<'g, Shard>],
    /// Per op: the index of its shard's guard.
    slot: &'a [usize],
    now: u64,
}

impl States for Locked<'_, '_> {
    fn load(&mut self, i: usize) -> Option<State> {
        // A use: the counter becomes the shard's most recently used.
        self.guards[self.slot[i]]
            .map
            .get(self.ids[i])
            .map(|e| e.state)
    }

    fn save(&mut self, i: usize, state: State) {
        let op = &self.ops[i];
        let expires_at = algorithm::expires_at(&state, &Params::of(op));
        let shard = &mut self.guards[self.slot[i]];
        if expires_at <= self.now {
            shard.map.remove(self.ids[i]);
            return;
        }
        let entry = Entry { state, expires_at };
        if let Some(e) = shard.map.peek_mut(self.ids[i]) {
            *e = entry;
            return;
        }
        let mut evicted = 0;
        while shard.map.len() >= self.per_shard {
            match shard.map.pop_lru() {
                None => break,
                // An expired counter the sweep has not reached yet is no loss.
                Some((_, e)) if e.expires_at <= self.now => {}
                Some(_) => evicted += 1,
            }
        }
        if let Some((_, e)) = shard.map.put(self.ids[i], entry) {
            if e.expires_at > self.now {
                evicted += 1;
            }
        }
        shard.peak = shard.peak.max(shard.map.len());
        for _ in 0..evicted {
            self.store.note_eviction(self.now);
        }
    }
}

impl Store for MemoryStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.apply_now(ops, charge))))
    }

    fn apply_ready(
        &self,
        ops: &[CounterOp],
        charge: Charge,
        at: std::time::Instant,
    ) -> Option<Result<Vec<CounterState>, StoreError>> {
        Some(Ok(self.apply_at(ops, charge, self.clock.ms_at(at))))
    }

    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        let now = self.now_ms();
        let id = self.id_of(&op.key);
        let entry = lock(&self.shards[self.shard_of(id)]).map.peek(id).copied();
        let state = entry.filter(|e| e.expires_at > now).map(|e| {
            let (remaining, reset_ms) =
                algorithm::view(op.algorithm, Some(e.state), now, &Params::of(op));
            CounterState {
                allowed: remaining > 0,
                remaining,
                reset_after: Duration::from_millis(reset_ms),
                overdrawn: 0,
            }
        });
        Box::pin(std::future::ready(Ok(state)))
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        let now = self.now_ms();
        let id = self.id_of(key);
        let removed = lock(&self.shards[self.shard_of(id)]).map.remove(id);
        // An expired entry already answered as a fresh counter.
        let live = removed.is_some_and(|e| e.expires_at > now);
        Box::pin(std::future::ready(Ok(live)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
