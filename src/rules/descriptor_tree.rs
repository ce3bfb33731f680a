//! envoyproxy/ratelimit's descriptor matching, for the domains its files
//! define.
//!
//! A request descriptor's entries are walked level by level. At each level
//! the node named `key_value` is taken if there is one, else the first
//! wildcard node (in file order) whose `key_value` pattern matches, else
//! the key-only node; there is no backtracking. The limit is the one on the
//! node reached by the **last** entry: a request deeper than the tree, a
//! walk that stops early, or a node without a limit is "no limit" (a value
//! node with neither limit nor children whitelists that value).

use std::collections::HashMap;
use std::sync::Arc;

use super::bounded;
pub use crate::config::envoy_ratelimit::EnvoyNodeInfo;
use crate::config::envoy_ratelimit::{EnvoyConfig, EnvoyNode};

/// A compiled node.
#[derive(Debug)]
struct Node {
    /// The node as written.
    spec: EnvoyNodeInfo,
    /// Its stats key: `domain.key_value.key...` as written.
    full_key: String,
    /// Children by composite key (`key` or `key_value`).
    exact: HashMap<String, usize>,
    /// Wildcard children in file order, their composite split at `*`.
    wildcards: Vec<(usize, Vec<String>)>,
    children: Vec<Node>,
}

/// A domain's compiled tree.
#[derive(Debug)]
pub struct DomainTree {
    /// The file it came from.
    pub config: Arc<EnvoyConfig>,
    root: Node,
}

/// The limit a descriptor reached.
#[derive(Debug, Clone)]
pub struct TreeMatch {
    /// The node holding the limit.
    pub node: EnvoyNodeInfo,
    /// Stats key (bounded unless `detailed_metric` / `value_to_metric`).
    pub stats_key: String,
    /// The counter's identity: each entry as `key_value`, with the
    /// wildcard pattern instead of the value where `share_threshold` asks.
    pub counter_path: Vec<(String, String)>,
}

/// Whether `value` matches `parts` (a pattern split at `*`; each `*`
/// matches any run of characters, including none).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if value.len() < parts.iter().map(String::len).sum::<usize>()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// A level's children: by composite key, the wildcard ones, the nodes.
type Level = (HashMap<String, usize>, Vec<(usize, Vec<String>)>, Vec<Node>);

fn compile(nodes: &[EnvoyNode], parent_key: &str) -> Level {
    let mut exact = HashMap::new();
    let mut wildcards = Vec::new();
    let mut children = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let composite = n.info.composite();
        let full_key = format!("{parent_key}.{composite}");
        if composite.contains('*') {
            wildcards.push((i, composite.split('*').map(str::to_owned).collect()));
        }
        exact.insert(composite.clone(), i);
        let (e, w, c) = compile(&n.children, &full_key);
        children.push(Node {
            spec: n.info.clone(),
            full_key,
            exact: e,
            wildcards: w,
            children: c,
        });
    }
    (exact, wildcards, children)
}

impl DomainTree {
    /// Compiles a file's tree.
    pub fn new(config: Arc<EnvoyConfig>) -> DomainTree {
        let (exact, wildcards, children) = compile(&config.descriptors, &config.domain);
        let root = Node {
            spec: EnvoyNodeInfo {
                key: String::new(),
                value: String::new(),
                limit: None,
                shadow_mode: false,
                quota_mode: false,
                detailed_metric: false,
                value_to_metric: false,
                share_threshold: false,
                metadata: None,
            },
            full_key: config.domain.clone(),
            exact,
            wildcards,
            children,
        };
        DomainTree { config, root }
    }

    /// One line per limit, as envoyproxy/ratelimit's `/rlconfig` prints it:
    /// `rl.foo.bar: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false`.
    pub fn dump(&self) -> String {
        fn walk(n: &Node, out: &mut String) {
            if let Some(l) = &n.spec.limit {
                out.push_str(&format!(
                    "{}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}\n",
                    n.full_key,
                    l.unit.map_or("UNKNOWN", |u| u.as_str()),
                    l.requests_per_unit,
                    n.spec.shadow_mode,
                    n.spec.quota_mode
                ));
            }
            for c in &n.children {
                walk(c, out);
            }
        }
        let mut out = String::new();
        walk(&self.root, &mut out);
        out
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.config.domain
    }

    /// The limit for a descriptor's `entries`, if it reaches one.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<TreeMatch> {
        let domain = self.domain();
        let mut level = &self.root;
        let mut found: Option<&Node> = None;
        let mut detailed = String::from(domain);
        let mut to_metric = String::from(domain);
        let mut counter_path = Vec::with_capacity(entries.len());
        let last = entries.len().checked_sub(1)?;
        for (i, &(key, value)) in entries.iter().enumerate() {
            let with_value = format!("{key}_{value}");
            let mut wildcard: Option<&(usize, Vec<String>)> = None;
            let mut next = level.exact.get(&with_value).map(|&c| &level.children[c]);
            if next.is_none() {
                wildcard = level
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &with_value));
                next = wildcard.map(|(c, _)| &level.children[*c]);
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = level.exact.get(key).map(|&c| &level.children[c]);
            }
            // Request text in stats keys is bounded as in counter keys.
            detailed.push('.');
            bounded::push_value(&mut detailed, key);
            detailed.push('_');
            bounded::push_value(&mut detailed, value);
            to_metric.push('.');
            bounded::push_value(&mut to_metric, key);
            let mut counted_value = value.to_owned();
            if let Some(n) = next {
                let shown: Option<String> = match wildcard {
                    Some(_) if n.spec.share_threshold => {
                        // The node's own pattern: the request's key may be
                        // longer than the node's (a key-only wildcard).
                        let pattern = n.spec.value.clone();
                        counted_value = pattern.clone();
                        Some(pattern)
                    }
                    Some(_) if n.spec.value_to_metric => Some(value.to_owned()),
                    Some(_) => Some(n.spec.value.clone()),
                    None if by_value => Some(value.to_owned()),
                    None if n.spec.value_to_metric => Some(value.to_owned()),
                    None => None,
                };
                if let Some(v) = shown.filter(|v| !v.is_empty()) {
                    to_metric.push('_');
                    bounded::push_value(&mut to_metric, &v);
                }
            }
            counter_path.push((key.to_owned(), counted_value));
            let Some(n) = next else { break };
            if n.spec.limit.is_some() && i == last {
                found = Some(n);
            }
            if n.children.is_empty() {
                break;
            }
            level = n;
        }
        let node = found?;
        let stats_key = if node.spec.detailed_metric {
            detailed
        } else if to_metric != node.full_key {
            to_metric
        } else {
            node.full_key.clone()
        };
        Some(TreeMatch {
            node: node.spec.clone(),
            stats_key,
            counter_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::envoy_ratelimit::parse;

    fn tree(yaml: &str) -> DomainTree {
        DomainTree::new(Arc::new(parse("t.yaml", yaml).unwrap()))
    }

    fn rpu(t: &DomainTree, entries: &[(&str, &str)]) -> Option<u32> {
        t.find(entries)
            .and_then(|m| m.node.limit.map(|l| l.requests_per_unit))
    }

    #[test]
    fn wildcards_match_anywhere() {
        let p = |s: &str| s.split('*').map(str::to_owned).collect::<Vec<_>>();
        assert!(wildcard_match(&p("k_foo*"), "k_foobar"));
        assert!(wildcard_match(&p("k_foo*"), "k_foo"));
        assert!(wildcard_match(&p("k_bar*b"), "k_barab"));
        assert!(!wildcard_match(&p("k_bar*b"), "k_bara"));
        assert!(wildcard_match(&p("k_foo*bar*baz"), "k_foo1bar2baz"));
        assert!(!wildcard_match(&p("k_foo*bar*baz"), "k_foobaz"));
        assert!(!wildcard_match(&p("k_a*a"), "k_a"));
        assert!(wildcard_match(&p("k_x"), "k_x"));
    }

    #[test]
    fn the_walk_follows_envoyproxy_ratelimit() {
        let t = tree(
            "domain: d\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: k2\n        rate_limit: {unit: second, requests_per_unit: 2}\n      - key: k2\n        value: v2\n        rate_limit: {unit: second, requests_per_unit: 3}\n      - key: k2\n        value: 'w*'\n        rate_limit: {unit: second, requests_per_unit: 4}\n      - key: k2\n        value: white\n  - key: k3\n    value: v3\n",
        );
        assert_eq!(rpu(&t, &[("k1", "x")]), Some(1));
        assert_eq!(rpu(&t, &[("k1", "x"), ("k2", "v2")]), Some(3));
        assert_eq!(rpu(&t, &[("k1", "x"), ("k2", "wow")]), Some(4));
        assert_eq!(rpu(&t, &[("k1", "x"), ("k2", "other")]), Some(2));
        // Exact first: `white` is whitelisted although `w*` matches it.
        assert_eq!(rpu(&t, &[("k1", "x"), ("k2", "white")]), None);
        // Deeper than the tree, or a node without a limit.
        assert_eq!(rpu(&t, &[("k1", "x"), ("k2", "v2"), ("k3", "z")]), None);
        assert_eq!(rpu(&t, &[("k3", "v3")]), None);
        assert_eq!(rpu(&t, &[("nope", "x")]), None);
        let m = t.find(&[("k1", "x"), ("k2", "wow")]).unwrap();
        assert_eq!(m.stats_key, "d.k1.k2_w*");
    }

    #[test]
    fn a_request_key_longer_than_the_wildcard_nodes_is_harmless() {
        let t = tree(
            "domain: d\ndescriptors:\n  - key: k\n    value: '*'\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: 'a*'\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
        );
        // `k_longer_v` matches the pattern `k_*`.
        let m = t.find(&[("k_longer", "v")]).unwrap();
        assert_eq!(m.node.limit.unwrap().requests_per_unit, 1);
        assert_eq!(
            m.counter_path,
            vec![("k_longer".to_owned(), "*".to_owned())]
        );
        assert_eq!(rpu(&t, &[("abc", "v")]), Some(2));
    }
}
