//! A request's key/value pairs, as the rules see them.

use std::cell::Cell;

use crate::pattern::short_eq;

/// The key/value pairs of one request or Envoy descriptor, sorted by key.
/// A repeated key: the last value wins.
///
/// Every key and value sits in one string, found by their offsets: two
/// allocations per request rather than one per key and value (allocation
/// was the line path's largest cost; docs/performance.md, "The line
/// protocol path").
#[derive(Clone, Default)]
pub struct Operation {
    /// The keys and values, each key followed by its value, in request order.
    text: String,
    /// The pairs, sorted by key (one per key).
    spans: Vec<Span>,
}

/// Where one pair is in [`Operation::text`]: the key is
/// `start..key_end`, the value `key_end..end`. Offsets are `u32`: requests
/// are far smaller than 4 GiB (lines, HTTP bodies and gRPC messages are
/// capped, by default far below it).
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    key_end: u32,
    end: u32,
}

/// An offset into an operation's text. Past 4 GiB (a cap raised that far)
/// it saturates: pairs beyond read as cut short or empty, never a panic.
fn offset(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Operation {
    /// Builds an operation from pairs in request order; for a repeated key the last one wins.
    pub fn from_pairs<I, K, V>(pairs: I) -> Operation
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let pairs = pairs.into_iter();
        // A request known to have no pairs allocates nothing.
        let mut builder = if pairs.size_hint().1 == Some(0) {
            OperationBuilder::default()
        } else {
            OperationBuilder::with_capacity(pairs.size_hint().0)
        };
        for (k, v) in pairs {
            builder.push(k.as_ref(), v.as_ref());
        }
        builder.finish()
    }

    #[inline]
    fn key(&self, s: &Span) -> &str {
        slice(&self.text, s.start, s.key_end)
    }

    #[inline]
    fn value(&self, s: &Span) -> &str {
        slice(&self.text, s.key_end, s.end)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        let key = key.as_bytes();
        // Most requests have a few pairs: an equality scan, where a pair of
        // another length costs one comparison, beats a binary search's
        // ordered comparisons; many pairs: the binary search.
        let found = if self.spans.len() <= 8 {
            self.spans
                .iter()
                .find(|s| short_eq(key_bytes(&self.text, s), key))
        } else {
            self.spans
                .binary_search_by(|s| short_cmp(key_bytes(&self.text, s), key))
                .ok()
                .and_then(|i| self.spans.get(i))
        };
        found.map(|s| self.value(s))
    }

    /// Gives the operation's buffers to the thread's next
    /// [`OperationBuilder::with_capacity`], so a request that is done with
    /// its operation lets the next one build without allocating (buffers
    /// grown past a usual request's are dropped instead).
    pub fn recycle(self) {
        if self.text.capacity() <= SPARE_TEXT && self.spans.capacity() <= SPARE_PAIRS {
            SPARE.set(Some((self.text, self.spans)));
        }
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.spans.iter().map(|s| (self.key(s), self.value(s)))
    }

    /// How many pairs (one per key).
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

thread_local! {
    /// The buffers of an operation given back with [`Operation::recycle`].
    static SPARE: Cell<Option<(String, Vec<Span>)>> = const { Cell::new(None) };
}

/// The most text bytes and pairs of buffers kept for reuse.
const SPARE_TEXT: usize = 256;
const SPARE_PAIRS: usize = 16;

/// An [`Operation`] built pair by pair, in request order (as a parser
/// finds them, with no list of pairs in between).
#[derive(Default)]
pub struct OperationBuilder {
    text: String,
    spans: Vec<Span>,
}

impl OperationBuilder {
    /// A builder with room for `pairs` pairs and, as most requests need,
    /// 64 bytes of text: two allocations in all.
    pub fn with_capacity(pairs: usize) -> OperationBuilder {
        if let Some((mut text, mut spans)) = SPARE.take() {
            text.clear();
            spans.clear();
            spans.reserve(pairs);
            return OperationBuilder { text, spans };
        }
        OperationBuilder {
            text: String::with_capacity(64),
            spans: Vec::with_capacity(pairs),
        }
    }

    /// Adds the next pair.
    #[inline]
    pub fn push(&mut self, key: &str, value: &str) {
        let start = offset(self.text.len());
        self.text.push_str(key);
        let key_end = offset(self.text.len());
        self.text.push_str(value);
        self.spans.push(Span {
            start,
            key_end,
            end: offset(self.text.len()),
        });
    }

    /// The operation: the pairs sorted by key, the last of a repeated key kept.
    pub fn finish(self) -> Operation {
        let OperationBuilder { text, mut spans } = self;
        let key = |s: &Span| key_bytes(&text, s);
        // A stable sort keeps request order among equal keys. Most requests
        // have a few pairs: for up to 16, an insertion sort with its
        // comparisons inlined (measured cheaper than the library's for a
        // few); beyond, the library's (no quadratic time for a request of
        // many pairs).
        if spans.len() <= 16 {
            for i in 1..spans.len() {
                let next = spans[i];
                let mut j = i;
                while j > 0 && short_cmp(key(&spans[j - 1]), key(&next)).is_gt() {
                    spans[j] = spans[j - 1];
                    j -= 1;
                }
                spans[j] = next;
            }
        } else {
            spans.sort_by(|a, b| short_cmp(key(a), key(b)));
        }
        // Keep the last of each run of equal keys.
        if spans.windows(2).any(|w| short_eq(key(&w[0]), key(&w[1]))) {
            // `dedup_by` keeps the first of a run: give it each later pair.
            spans.dedup_by(|later, kept| {
                let same = short_eq(key(later), key(kept));
                if same {
                    *kept = *later;
                }
                same
            });
        }
        Operation { text, spans }
    }
}

/// `text[from..to]`, or "" where that is not a slice of it (only for an
/// offset saturated at 4 GiB).
#[inline]
fn slice(text: &str, from: u32, to: u32) -> &str {
    text.get(from as usize..to as usize).unwrap_or("")
}

/// [`slice`]'s bytes, without its check for character boundaries (keys are
/// compared as bytes, which orders them as `str` does).
#[inline]
fn bytes(text: &str, from: u32, to: u32) -> &[u8] {
    text.as_bytes()
        .get(from as usize..to as usize)
        .unwrap_or(&[])
}

/// The bytes of span `s`'s key in `text`.
#[inline]
fn key_bytes<'t>(text: &'t str, s: &Span) -> &'t [u8] {
    bytes(text, s.start, s.key_end)
}

impl PartialEq for Operation {
    fn eq(&self, other: &Operation) -> bool {
        self.pairs().eq(other.pairs())
    }
}

impl Eq for Operation {}

impl std::fmt::Debug for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.pairs()).finish()
    }
}

/// `a.cmp(b)` compared in place: keys are short, and a call to the C
/// library's `memcmp` costs more than the loop.
#[inline]
fn short_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use super::Operation;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn an_operation_built_on_recycled_buffers_holds_only_its_own_pairs() {
        let first =
            Operation::from_pairs([("path", "/a/long/path/x"), ("ip", "10.0.0.1"), ("z", "9")]);
        let text = first.text.as_ptr();
        first.recycle();
        let second = Operation::from_pairs([("method", "GET")]);
        // The buffer was reused, and nothing of the first operation shows.
        assert_eq!(second.text.as_ptr(), text);
        assert_eq!(second.pairs().collect::<Vec<_>>(), [("method", "GET")]);
        assert_eq!((second.get("path"), second.get("ip")), (None, None));
        // Buffers grown past a usual request's are not kept.
        let big = Operation::from_pairs([("k", "v".repeat(1000))]);
        big.recycle();
        let third = Operation::from_pairs([("a", "b")]);
        assert!(third.text.capacity() < 1000);
    }

    proptest! {
        /// An operation holds what a map holds after inserting the pairs in
        /// request order (the last value of a repeated key wins), sorted by
        /// key: any Unicode, empty keys and values included, up to 16 pairs
        /// (the insertion sort) and beyond (the library's).
        #[test]
        fn pairs_are_a_map_of_the_last_values(
            pairs in proptest::collection::vec(("[a-c\\u{e9}\\u{1F600}]{0,3}", "\\PC{0,4}"), 0..24),
        ) {
            let op = Operation::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let mut map = BTreeMap::new();
            for (k, v) in &pairs {
                map.insert(k.as_str(), v.as_str());
            }
            prop_assert!(op.pairs().eq(map.iter().map(|(k, v)| (*k, *v))));
            for (k, v) in &map {
                prop_assert_eq!(op.get(k), Some(*v));
            }
            prop_assert_eq!(op.get("zz-absent"), None);
            prop_assert_eq!(op.is_empty(), map.is_empty());
        }
    }

    #[test]
    fn last_repeated_key_wins() {
        let op = Operation::from_pairs([("b", "1"), ("a", "x"), ("b", "2"), ("b", "3")]);
        assert_eq!(op.get("b"), Some("3"));
        assert_eq!(op.get("a"), Some("x"));
        assert_eq!(op.get("c"), None);
        assert_eq!(op.pairs().len(), 2);
        assert_eq!(op, Operation::from_pairs([("a", "x"), ("b", "3")]));
    }

    #[test]
    fn keys_sharing_a_prefix_are_found() {
        let op = Operation::from_pairs([("ab", "2"), ("a", "1"), ("abc", "3"), ("b", "4")]);
        for (k, v) in [("a", "1"), ("ab", "2"), ("abc", "3"), ("b", "4")] {
            assert_eq!(op.get(k), Some(v));
        }
        assert_eq!(op.get("abd"), None);
        assert_eq!(op.get(""), None);
    }
}
