//! The counters each rule's overdraft limits charged past what was left,
//! most recent first and bounded, so the dashboard can show their debts.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::store::CounterOp;

/// Counters kept per rule.
pub const PER_RULE: usize = 20;
/// Rules kept (a policy of more rules than this forgets the oldest).
const RULES: usize = 1000;

/// Recently overdrawn counters by rule name.
#[derive(Default)]
pub struct Debtors {
    by_rule: Mutex<HashMap<String, VecDeque<CounterOp>>>,
}

impl Debtors {
    /// Notes that `op` (of rule `rule`) was charged past what was left.
    pub fn note(&self, rule: &str, op: &CounterOp) {
        let mut map = self.by_rule.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(rule) && map.len() >= RULES {
            // Bounded: a new rule takes the place of an arbitrary one.
            if let Some(k) = map.keys().next().cloned() {
                map.remove(&k);
            }
        }
        let list = map.entry(rule.to_owned()).or_default();
        list.retain(|o| o.key != op.key);
        list.push_front(CounterOp {
            cost: 0,
            refund: false,
            joint: false,
            ..op.clone()
        });
        list.truncate(PER_RULE);
    }

    /// The counters of `rule` last charged past what was left, most recent
    /// first (as checks: their cost is 0).
    pub fn of(&self, rule: &str) -> Vec<CounterOp> {
        let map = self.by_rule.lock().unwrap_or_else(|e| e.into_inner());
        map.get(rule)
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::Algorithm;
    use std::time::Duration;

    fn op(key: &str) -> CounterOp {
        CounterOp::new(key, Algorithm::Fixed, 10, Duration::from_secs(60), 5)
    }

    #[test]
    fn most_recent_first_without_repeats_and_bounded() {
        let d = Debtors::default();
        for i in 0..30 {
            d.note("r", &op(&format!("k{i}")));
        }
        d.note("r", &op("k25"));
        let keys: Vec<String> = d.of("r").into_iter().map(|o| o.key).collect();
        assert_eq!(keys.len(), PER_RULE);
        assert_eq!(keys[0], "k25");
        assert_eq!(keys[1], "k29");
        assert_eq!(keys.iter().filter(|k| *k == "k25").count(), 1);
        assert!(d.of("r").iter().all(|o| o.cost == 0));
        assert!(d.of("other").is_empty());
    }
}
