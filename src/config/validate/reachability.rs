//! Unreachable rules: a rule that an earlier `stop` rule masks.

use std::collections::{HashMap, HashSet};

use crate::config::model::{MatchPolicy, RuleSpec};
use crate::pattern::Pattern;

/// Reports every rule that an earlier stop rule masks.
///
/// An earlier rule A can mask B only if each of A's exact values appears in
/// B as the same exact value, so stop rules are indexed by one of their exact
/// pairs and B is only compared with the rules indexed under its own exact
/// pairs plus those with no exact pair: large policies stay fast to check.
pub(super) fn check_reachability(rules: &[RuleSpec], problems: &mut Vec<String>) {
    let compiled: Vec<Vec<(&str, Pattern)>> = rules
        .iter()
        .map(|r| {
            r.operation
                .iter()
                .map(|(k, v)| (k.as_str(), Pattern::new(v)))
                .collect()
        })
        .collect();
    let domains: Vec<Option<Pattern>> = rules
        .iter()
        .map(|r| r.domain.as_deref().map(Pattern::new))
        .collect();
    let mut by_pair: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    let mut unindexed: Vec<usize> = Vec::new();
    for (b, rule) in rules.iter().enumerate() {
        // Candidates: earlier stop rules whose index pair B also has exactly.
        let mut candidates: Vec<usize> = unindexed.clone();
        let mut seen = HashSet::new();
        for (k, p) in &compiled[b] {
            if let Pattern::Exact(v) = p {
                if seen.insert((*k, v.as_str())) {
                    if let Some(list) = by_pair.get(&(*k, v.as_str())) {
                        candidates.extend(list);
                    }
                }
            }
        }
        candidates.sort_unstable();
        if let Some(&a) = candidates
            .iter()
            .find(|&&a| masks_compiled(&compiled[a], &domains[a], &compiled[b], &domains[b]))
        {
            problems.push(format!(
                "{rule} is unreachable: the earlier stop {} matches every request it could match",
                rules[a]
            ));
        }
        // A shadow rule decides as a stop rule does (it only never denies).
        if rule.match_policy != MatchPolicy::Canary {
            let first_exact = compiled[b].iter().find_map(|(k, p)| match p {
                Pattern::Exact(v) => Some((*k, v.as_str())),
                _ => None,
            });
            match first_exact {
                Some(pair) => by_pair.entry(pair).or_default().push(b),
                None => unindexed.push(b),
            }
        }
    }
}

/// Whether rule `a`, if it is a stop rule placed before `b`, matches every
/// request `b` could match (so `b` would be unreachable). Sound: never `true`
/// when some request matches `b` but not `a`.
pub fn masks(a: &RuleSpec, b: &RuleSpec) -> bool {
    fn compile(r: &RuleSpec) -> Vec<(&str, Pattern)> {
        r.operation
            .iter()
            .map(|(k, v)| (k.as_str(), Pattern::new(v)))
            .collect()
    }
    let domain = |r: &RuleSpec| r.domain.as_deref().map(Pattern::new);
    masks_compiled(&compile(a), &domain(a), &compile(b), &domain(b))
}

fn masks_compiled(
    a: &[(&str, Pattern)],
    a_domain: &Option<Pattern>,
    b: &[(&str, Pattern)],
    b_domain: &Option<Pattern>,
) -> bool {
    let domain_ok = match (a_domain, b_domain) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(pa), Some(pb)) => pa.covers(pb),
    };
    domain_ok
        && a.iter().all(|(ka, pa)| {
            b.iter()
                .find(|(kb, _)| kb == ka)
                .is_some_and(|(_, pb)| pa.covers(pb))
        })
}
