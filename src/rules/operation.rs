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
        let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = v,
                _ => out.push((k, v)),
            }
        }
        Operation { pairs: out }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
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
}
