//! The actors with the most denied hits, per rule and overall, in fixed memory.
//!
//! Denied hits are counted per (rule, actor) in Space-Saving sketches
//! (Metwally, Agrawal, El Abbadi, 2005) of [`CAPACITY`] entries each, one
//! sketch per [`SLICE_SECONDS`]-second slice of time, [`SLICES`] of them in
//! a ring (15 minutes and the slice under way). A window (1, 5 or 15
//! minutes) merges the slice under way with the whole slices before it, so
//! it covers between w and w + 20 seconds.
//!
//! Bound: at most `SLICES × CAPACITY` = 46 × 1,024 = 47,104 entries, each
//! about 110 bytes and its actor, of at most 64 bytes (longer actors come
//! bounded: readable prefix and hash, as counter keys keep them): at most
//! about 8 MB however many distinct actors are denied (measured: 128 KB for
//! a full slice of 12-byte actors, so 6 MB for 46 of them).
//!
//! Error: within a slice of N denied hits, a reported count exceeds the
//! true one by at most N / 1,024 (the entry's `error`), and every (rule,
//! actor) with more than N / 1,024 hits is in the sketch. A window adds its
//! slices' counts, so over a window of N denied hits in all, counts are
//! within N / 1,024 of the truth and any actor above that share is listed.
//! The per-rule lists are the overall sketch filtered by rule: the bound
//! is relative to all denied hits, not the rule's own.

use std::collections::HashMap;
use std::sync::Arc;

/// Entries per sketch.
pub const CAPACITY: usize = 1024;
/// Seconds of time per sketch.
pub const SLICE_SECONDS: u64 = 20;
/// Sketches kept: 15 minutes of slices and the slice under way.
pub const SLICES: usize = 46;
/// The most the sketches hold together: every entry of every slice, about
/// 110 bytes with its heap place and index, and an actor of 64 bytes.
pub const MAX_BYTES: u64 = (SLICES * CAPACITY) as u64 * 176;

/// One counted (rule, actor).
#[derive(Debug, Clone)]
struct Entry {
    rule: Arc<str>,
    actor: Box<str>,
    hash: u64,
    count: u64,
    error: u64,
}

/// One Space-Saving sketch: entries in a min-heap by count, found by hash.
#[derive(Debug, Default)]
struct Sketch {
    /// The slice this sketch counts (`u64::MAX`: none yet).
    slice: u64,
    entries: Vec<Entry>,
    /// Entry indices as a min-heap by count.
    heap: Vec<u32>,
    /// Each entry's place in `heap`.
    place: Vec<u32>,
    by_hash: HashMap<u64, u32>,
}

impl Sketch {
    fn clear(&mut self, slice: u64) {
        self.slice = slice;
        self.entries.clear();
        self.heap.clear();
        self.place.clear();
        self.by_hash.clear();
    }

    fn count(&self, heap_index: usize) -> u64 {
        self.entries[self.heap[heap_index] as usize].count
    }

    /// Restores the heap below `i` after its count grew.
    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < self.heap.len() && self.count(l) < self.count(least) {
                least = l;
            }
            if r < self.heap.len() && self.count(r) < self.count(least) {
                least = r;
            }
            if least == i {
                return;
            }
            self.heap.swap(i, least);
            self.place[self.heap[i] as usize] = i as u32;
            self.place[self.heap[least] as usize] = least as u32;
            i = least;
        }
    }

    fn add(&mut self, rule: &Arc<str>, actor: &str, hash: u64, n: u64) {
        if let Some(&e) = self.by_hash.get(&hash) {
            let entry = &mut self.entries[e as usize];
            // A hit's cost is the client's (hits_addend): saturate.
            entry.count = entry.count.saturating_add(n);
            let at = self.place[e as usize] as usize;
            return self.sift_down(at);
        }
        if self.entries.len() < CAPACITY {
            let e = self.entries.len() as u32;
            self.entries.push(Entry {
                rule: rule.clone(),
                actor: actor.into(),
                hash,
                count: n,
                error: 0,
            });
            // A new entry's count is no less than... anything: push it and
            // sift up by hand (counts are small here).
            self.heap.push(e);
            self.place.push(e);
            self.by_hash.insert(hash, e);
            return self.sift_up(self.heap.len() - 1);
        }
        // Full: the least counted entry gives its place (and its count,
        // as the new one's possible error).
        let e = self.heap[0];
        let old = &mut self.entries[e as usize];
        self.by_hash.remove(&old.hash);
        let min = old.count;
        *old = Entry {
            rule: rule.clone(),
            actor: actor.into(),
            hash,
            count: min.saturating_add(n),
            error: min,
        };
        self.by_hash.insert(hash, e);
        self.sift_down(0);
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.count(parent) <= self.count(i) {
                return;
            }
            self.heap.swap(i, parent);
            self.place[self.heap[i] as usize] = i as u32;
            self.place[self.heap[parent] as usize] = parent as u32;
            i = parent;
        }
    }
}

/// One actor's denied hits in a window, as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Offender {
    /// The rule's name.
    pub rule: String,
    /// The actor, bounded as counter keys keep it.
    pub actor: String,
    /// Denied hits counted (an overestimate by at most `error`).
    pub count: u64,
    /// The most `count` may exceed the truth by.
    pub error: u64,
}

/// Denied hits per (rule, actor) over the last 15 minutes, in fixed memory.
pub struct Offenders {
    sketches: Vec<Sketch>,
    hasher: ahash::RandomState,
}

impl Default for Offenders {
    fn default() -> Self {
        Offenders {
            sketches: (0..SLICES)
                .map(|_| Sketch {
                    slice: u64::MAX,
                    ..Sketch::default()
                })
                .collect(),
            hasher: ahash::RandomState::new(),
        }
    }
}

impl Offenders {
    /// Counts `n` denied hits of `actor` under `rule` at `second` (epoch seconds).
    pub fn record(&mut self, second: u64, rule: &Arc<str>, actor: &str, n: u64) {
        let slice = second / SLICE_SECONDS;
        let hash = self.hasher.hash_one((&**rule, actor));
        let sketch = &mut self.sketches[(slice % SLICES as u64) as usize];
        if sketch.slice != slice {
            sketch.clear(slice);
        }
        sketch.add(rule, actor, hash, n);
    }

    /// The `top` actors with the most denied hits over the last
    /// `window_seconds` up to `now`, of `rule` only or of every rule, most first.
    pub fn top(
        &self,
        now: u64,
        window_seconds: u64,
        rule: Option<&str>,
        top: usize,
    ) -> Vec<Offender> {
        let last = now / SLICE_SECONDS;
        let first = last.saturating_sub(window_seconds.div_ceil(SLICE_SECONDS));
        let mut merged: HashMap<u64, Offender> = HashMap::new();
        let wanted = self
            .sketches
            .iter()
            .filter(|s| s.slice != u64::MAX && (first..=last).contains(&s.slice));
        for e in wanted.flat_map(|s| s.entries.iter()) {
            if rule.is_some_and(|r| r != &*e.rule) {
                continue;
            }
            let o = merged.entry(e.hash).or_insert_with(|| Offender {
                rule: e.rule.to_string(),
                actor: e.actor.to_string(),
                count: 0,
                error: 0,
            });
            o.count = o.count.saturating_add(e.count);
            o.error = o.error.saturating_add(e.error);
        }
        let mut list: Vec<Offender> = merged.into_values().collect();
        list.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.actor.cmp(&b.actor)));
        list.truncate(top);
        list
    }

    /// Entries held in all sketches (at most `SLICES × CAPACITY`).
    pub fn entries(&self) -> usize {
        self.sketches.iter().map(|s| s.entries.len()).sum()
    }

    /// An estimate of the bytes held: entries, heaps, indices and actors.
    pub fn heap_bytes(&self) -> usize {
        let per_entry = std::mem::size_of::<Entry>() + 4 + 4 + 2 * (8 + 4);
        self.sketches
            .iter()
            .map(|s| {
                s.entries.capacity() * per_entry
                    + s.by_hash.capacity() * 16
                    + s.entries.iter().map(|e| e.actor.len()).sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use std::time::Duration;

    #[test]
    fn the_heaviest_actor_comes_first_per_rule_and_overall() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_secs(1_700_000_000));
        let mut o = Offenders::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let now = clock.now().as_secs();
        for _ in 0..10 {
            o.record(now, &a, "alice", 1);
        }
        o.record(now, &a, "bob", 3);
        o.record(now, &b, "carol", 20);
        let all = o.top(now, 60, None, 20);
        assert_eq!(all[0].actor, "carol");
        assert_eq!((all[1].actor.as_str(), all[1].count), ("alice", 10));
        let of_a = o.top(now, 60, Some("a"), 1);
        assert_eq!(of_a.len(), 1);
        assert_eq!(
            (of_a[0].rule.as_str(), of_a[0].actor.as_str()),
            ("a", "alice")
        );
    }

    #[test]
    fn windows_take_whole_slices_and_forget_after_fifteen_minutes() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_secs(1_700_000_000));
        let mut o = Offenders::default();
        let r: Arc<str> = Arc::from("r");
        o.record(clock.now().as_secs(), &r, "old", 5);
        clock.advance(Duration::from_secs(3 * 60));
        let now = clock.now().as_secs();
        o.record(now, &r, "new", 1);
        let names = |w| -> Vec<String> {
            o.top(now, w, None, 20)
                .into_iter()
                .map(|x| x.actor)
                .collect()
        };
        assert_eq!(names(60), ["new"]);
        assert_eq!(names(300), ["old", "new"]);
        // A window reaches back w to w + 20 s: 15 min on, "new" is still in.
        clock.advance(Duration::from_secs(15 * 60));
        assert_eq!(o.top(clock.now().as_secs(), 900, None, 20).len(), 1);
        clock.advance(Duration::from_secs(SLICE_SECONDS));
        assert!(o.top(clock.now().as_secs(), 900, None, 20).is_empty());
    }

    /// A flood of 1,000,000 distinct actors over 10 s, with one heavy actor
    /// among them: the sketches stay within their bound and the heavy
    /// actor is first, its count within the stated error.
    #[test]
    fn a_flood_of_a_million_actors_stays_bounded_and_finds_the_heaviest() {
        let clock = ManualClock::default();
        clock.advance(Duration::from_secs(1_700_000_000));
        let mut o = Offenders::default();
        let r: Arc<str> = Arc::from("login");
        let mut actor = String::new();
        let started = std::time::Instant::now();
        for i in 0..1_000_000u64 {
            if i % 100_000 == 0 && i > 0 {
                clock.advance(Duration::from_secs(1));
            }
            actor.clear();
            std::fmt::Write::write_fmt(
                &mut actor,
                format_args!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            )
            .unwrap();
            o.record(clock.now().as_secs(), &r, &actor, 1);
            // The heavy actor: one hit in 100.
            if i % 100 == 0 {
                o.record(clock.now().as_secs(), &r, "heavy", 1);
            }
        }
        let top = o.top(clock.now().as_secs(), 60, Some("login"), 20);
        eprintln!(
            "1,000,000 actors in {:?}: {} entries, about {} bytes",
            started.elapsed(),
            o.entries(),
            o.heap_bytes()
        );
        assert_eq!(top[0].actor, "heavy");
        // 1,010,000 denied hits in the window: the error bound is N / CAPACITY.
        let bound = 1_010_000 / CAPACITY as u64 + 1;
        assert!(
            top[0].count >= 10_000 && top[0].count <= 10_000 + bound,
            "{:?}",
            top[0]
        );
        assert!(o.entries() <= SLICES * CAPACITY);
        assert!(o.heap_bytes() < 8_000_000, "{} bytes", o.heap_bytes());
    }
}
