//! A request's key/value pairs, as the rules see them.

/// The key/value pairs of one request or Envoy descriptor, sorted by key.
/// A repeated key: the last value wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operation {
    pairs: Vec<(String, String)>,
}

impl Operation {
    /// Builds an operation from pairs in request order; for a repeated key the last one wins.
    pub fn from_pairs<I, K, V>(pairs: I) -> Operation
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut pairs: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        // A stable sort keeps request order among equal keys; keep the last of each run.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        // `dedup_by` keeps the first of a run: give it each later value.
        pairs.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        Operation { pairs }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .binary_search_by(|(k, _)| short_cmp(k.as_bytes(), key.as_bytes()))
            .ok()
            .map(|i| self.pairs[i].1.as_str())
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
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

    #[test]
    fn last_repeated_key_wins() {
        let op = Operation::from_pairs([("b", "1"), ("a", "x"), ("b", "2"), ("b", "3")]);
        assert_eq!(op.get("b"), Some("3"));
        assert_eq!(op.get("a"), Some("x"));
        assert_eq!(op.get("c"), None);
        assert_eq!(op.pairs().len(), 2);
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
