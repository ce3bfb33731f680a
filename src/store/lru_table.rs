//! A compact least-recently-used table of counters, one per memory-store
//! shard.
//!
//! Counters sit in one dense `Vec` of 64-byte slots (id, value, 32-bit
//! recency links), found through a `hashbrown::HashTable` of 32-bit slot
//! numbers that uses the ids' low 64 bits (already a keyed hash) as they
//! are; removal moves the last slot into the hole, so [`LruTable::shrink`]
//! can give memory back. Both arrays come from glibc's allocator, not
//! mimalloc, so arrays a table leaves behind go back to the system whichever
//! thread frees them (`divvy serve` has glibc map large blocks on their own;
//! the sweep calls [`release_freed_arrays`] for the rest). Why, with figures:
//! docs/performance.md, "Memory per counter" and "The allocator".

use std::alloc::System;

use allocator_api2::vec::Vec as SysVec;
use hashbrown::HashTable;

/// Gives the system back the pages of freed table arrays that glibc's
/// allocator still holds (`malloc_trim(0)`: every whole free page in every
/// arena, not only at the top of the heap). Only the counter tables
/// allocate much from glibc, so this walks few free blocks. Does nothing
/// where the C library is not glibc.
pub fn release_freed_arrays() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes an integer and only returns free memory of
    // glibc's allocator to the system; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// "No slot" in the recency links.
const NIL: u32 = u32::MAX;

/// Most slots a table holds: slot numbers are 32-bit, `NIL` excluded.
pub const MAX_SLOTS: usize = (u32::MAX - 1) as usize;

/// One counter and its place in the recency list.
#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    id: u128,
    value: V,
    /// The next more recently used slot.
    prev: u32,
    /// The next less recently used slot.
    next: u32,
}

/// Counters by 128-bit id, in least-recently-used order.
#[derive(Debug)]
pub struct LruTable<V> {
    slots: SysVec<Slot<V>, System>,
    index: HashTable<u32, System>,
    /// The most recently used slot.
    head: u32,
    /// The least recently used slot.
    tail: u32,
    /// Most slots the owner lets this table hold: the slot array never grows
    /// past it, so a capped table's memory is its cap's, not the next power
    /// of two's.
    cap: usize,
}

impl<V> Default for LruTable<V> {
    fn default() -> Self {
        LruTable {
            slots: SysVec::new_in(System),
            index: HashTable::new_in(System),
            head: NIL,
            tail: NIL,
            cap: MAX_SLOTS,
        }
    }
}

fn hash(id: u128) -> u64 {
    id as u64
}

/// Slot numbers are below [`MAX_SLOTS`], so they fit in 32 bits.
fn slot_no(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(NIL)
}

impl<V> LruTable<V> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose owner keeps it to at most `cap` slots (it
    /// evicts before inserting past it); the slot array is never allocated
    /// beyond `cap`.
    pub fn with_cap(cap: usize) -> Self {
        LruTable {
            cap: cap.clamp(1, MAX_SLOTS),
            ..Self::default()
        }
    }

    /// Counters held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn find(&self, id: u128) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash(id), |&s| slots[s as usize].id == id)
            .map(|&s| s as usize)
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.slots[i].prev, self.slots[i].next);
        match prev {
            NIL => self.head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        let head = self.head;
        self.slots[i].prev = NIL;
        self.slots[i].next = head;
        match head {
            NIL => self.tail = slot_no(i),
            h => self.slots[h as usize].prev = slot_no(i),
        }
        self.head = slot_no(i);
    }

    fn touch(&mut self, i: usize) {
        if self.head != slot_no(i) {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// The value of `id`, which becomes the most recently used.
    pub fn get(&mut self, id: u128) -> Option<&mut V> {
        let i = self.find(id)?;
        self.touch(i);
        Some(&mut self.slots[i].value)
    }

    /// The value of `id`, its recency unchanged.
    pub fn peek(&self, id: u128) -> Option<&V> {
        self.find(id).map(|i| &self.slots[i].value)
    }

    /// The value of `id` to change, its recency unchanged.
    pub fn peek_mut(&mut self, id: u128) -> Option<&mut V> {
        let i = self.find(id)?;
        Some(&mut self.slots[i].value)
    }

    /// Reads what [`get`](Self::get) of `id` will read (its index entry,
    /// its slot and its recency neighbours) without changing anything, so
    /// that the reads of several ids overlap in the processor's memory
    /// accesses rather than wait for each other one by one.
    pub fn warm(&self, id: u128) {
        if let Some(i) = self.find(id) {
            let s = &self.slots[i];
            for n in [s.prev, s.next] {
                if let Some(slot) = self.slots.get(n as usize) {
                    std::hint::black_box(slot.prev);
                }
            }
        }
    }

    /// Whether `id` is held.
    pub fn contains(&self, id: u128) -> bool {
        self.find(id).is_some()
    }

    /// Sets the value of `id`, which becomes the most recently used. When
    /// the table already holds [`MAX_SLOTS`] counters, the least recently
    /// used one makes room and is returned.
    pub fn put(&mut self, id: u128, value: V) -> Option<(u128, V)> {
        if let Some(i) = self.find(id) {
            self.slots[i].value = value;
            self.touch(i);
            return None;
        }
        let evicted = if self.slots.len() >= MAX_SLOTS {
            self.pop_lru()
        } else {
            None
        };
        let i = self.slots.len();
        self.grow_within_cap();
        self.slots.push(Slot {
            id,
            value,
            prev: NIL,
            next: NIL,
        });
        self.push_front(i);
        let slots = &self.slots;
        self.index
            .insert_unique(hash(id), slot_no(i), |&s| hash(slots[s as usize].id));
        evicted
    }

    /// Before a push into a full array: doubles it as `Vec` would, but never
    /// past the cap (a table at its cap then holds exactly the cap).
    fn grow_within_cap(&mut self) {
        let (len, capacity) = (self.slots.len(), self.slots.capacity());
        if len < capacity {
            return;
        }
        let want = (capacity * 2).max(4).min(self.cap).max(len + 1);
        self.slots.reserve_exact(want - len);
    }

    /// Removes slot `i`; the last slot moves into its place.
    fn remove_at(&mut self, i: usize) -> (u128, V) {
        self.unlink(i);
        let id = self.slots[i].id;
        let slots = &self.slots;
        if let Ok(entry) = self
            .index
            .find_entry(hash(id), |&s| slots[s as usize].id == id)
        {
            entry.remove();
        }
        let last = self.slots.len() - 1;
        let removed = self.slots.swap_remove(i);
        if i != last {
            // The slot that moved from the end: its neighbours and its index
            // entry follow.
            let (prev, next, moved) = (self.slots[i].prev, self.slots[i].next, self.slots[i].id);
            match prev {
                NIL => self.head = slot_no(i),
                p => self.slots[p as usize].next = slot_no(i),
            }
            match next {
                NIL => self.tail = slot_no(i),
                n => self.slots[n as usize].prev = slot_no(i),
            }
            let old = slot_no(last);
            if let Some(s) = self.index.find_mut(hash(moved), |&s| s == old) {
                *s = slot_no(i);
            }
        }
        (removed.id, removed.value)
    }

    /// Removes `id`; returns its value.
    pub fn remove(&mut self, id: u128) -> Option<V> {
        let i = self.find(id)?;
        Some(self.remove_at(i).1)
    }

    /// Removes the least recently used counter.
    pub fn pop_lru(&mut self) -> Option<(u128, V)> {
        match self.tail {
            NIL => None,
            t => Some(self.remove_at(t as usize)),
        }
    }

    /// Keeps only the counters for which `keep` is true; returns how many
    /// were removed. The order of those kept is unchanged.
    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut removed = 0;
        // From the end: a removal moves the last slot, already visited, into
        // the hole.
        for i in (0..self.slots.len()).rev() {
            if !keep(&self.slots[i].value) {
                self.remove_at(i);
                removed += 1;
            }
        }
        removed
    }

    /// Gives back the memory of slots and index buckets no longer used.
    pub fn shrink(&mut self) {
        self.slots.shrink_to_fit();
        let slots = &self.slots;
        self.index.shrink_to_fit(|&s| hash(slots[s as usize].id));
    }

    /// The ids from most to least recently used (for tests and debugging).
    pub fn ids_by_recency(&self) -> Vec<u128> {
        let mut out = Vec::with_capacity(self.slots.len());
        let mut at = self.head;
        while at != NIL && out.len() < self.slots.len() {
            out.push(self.slots[at as usize].id);
            at = self.slots[at as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A capped table's slot array stops at the cap instead of the next
    /// power of two (what the memory budget counts on).
    #[test]
    fn a_capped_table_allocates_no_more_than_its_cap() {
        let mut t: LruTable<u64> = LruTable::with_cap(1000);
        for id in 0..1000u128 {
            t.put(id, 0);
        }
        assert_eq!(t.slots.capacity(), 1000);
        let mut free: LruTable<u64> = LruTable::new();
        for id in 0..1000u128 {
            free.put(id, 0);
        }
        assert!(free.slots.capacity() >= 1000);
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let mut t = LruTable::new();
        for id in 1..=4u128 {
            assert!(t.put(id, id * 10).is_none());
        }
        assert_eq!(t.ids_by_recency(), vec![4, 3, 2, 1]);
        assert_eq!(t.get(1).copied(), Some(10));
        assert_eq!(t.peek(2).copied(), Some(20));
        // Warming reads only: no recency changes, a missing id, the head,
        // the tail (their missing neighbours) and an empty table are no error.
        for id in [3, 99, 1, 2] {
            t.warm(id);
        }
        LruTable::<u64>::new().warm(1);
        assert_eq!(t.ids_by_recency(), vec![1, 4, 3, 2]);
        assert_eq!(t.pop_lru(), Some((2, 20)));
        assert_eq!(t.remove(4), Some(40));
        assert_eq!(t.remove(4), None);
        assert_eq!(t.ids_by_recency(), vec![1, 3]);
        t.put(3, 33);
        assert_eq!(t.ids_by_recency(), vec![3, 1]);
        assert_eq!(t.peek(3).copied(), Some(33));
        assert_eq!(t.len(), 2);
        assert_eq!(t.retain(|v| *v != 33), 1);
        assert_eq!(t.ids_by_recency(), vec![1]);
        assert_eq!(t.pop_lru(), Some((1, 10)));
        assert!(t.is_empty() && t.pop_lru().is_none());
    }

    /// Random operations against a plain list kept in recency order.
    #[test]
    fn random_operations_agree_with_a_plain_model() {
        let mut t: LruTable<u64> = LruTable::new();
        let mut model: Vec<(u128, u64)> = Vec::new(); // most recent first
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        for step in 0..20_000u64 {
            // Ids share low bits now and then, so index probing is exercised.
            let id = u128::from(next() % 300) | (u128::from(next() % 2) << 64);
            match next() % 6 {
                0 | 1 => {
                    t.put(id, step);
                    model.retain(|e| e.0 != id);
                    model.insert(0, (id, step));
                }
                2 => {
                    let got = t.get(id).copied();
                    let pos = model.iter().position(|e| e.0 == id);
                    assert_eq!(got, pos.map(|p| model[p].1));
                    if let Some(p) = pos {
                        let e = model.remove(p);
                        model.insert(0, e);
                    }
                }
                3 => {
                    let pos = model.iter().position(|e| e.0 == id);
                    assert_eq!(t.remove(id), pos.map(|p| model.remove(p).1));
                }
                4 => assert_eq!(t.pop_lru(), model.pop()),
                _ => {
                    let cut = next() % 20_000;
                    let before = model.len();
                    model.retain(|e| e.1 >= cut);
                    assert_eq!(t.retain(|v| *v >= cut), before - model.len());
                    if next() % 4 == 0 {
                        t.shrink();
                    }
                }
            }
            assert_eq!(t.len(), model.len());
            assert_eq!(
                t.ids_by_recency(),
                model.iter().map(|e| e.0).collect::<Vec<_>>(),
                "step {step}"
            );
        }
    }

    #[test]
    fn a_slot_is_64_bytes() {
        // What a counter of the memory store costs, besides its index bucket.
        assert_eq!(std::mem::size_of::<Slot<[u64; 5]>>(), 64);
    }
}
