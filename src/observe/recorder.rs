//! The dashboard's memory: every rule's decisions per second and the top
//! offenders, kept for 15 minutes and lost at a restart.
//!
//! One [`Recorder`] per service (its [`crate::observe::telemetry::Telemetry`]). A compiled divvy rule
//! holds its [`RuleStats`] (looked up by name when the rule is compiled, so
//! a reload that keeps a rule keeps its history); an envoyproxy/ratelimit
//! limit is looked up by its stats key. The limiter records the deciding
//! rule of every hit ([`Recorder::record`]): an atomic add for each, and
//! for a denied hit a short lock on the offenders' sketches.
//!
//! Bytes: see [`super::history`] (7.3 KB per rule that decides: 73 MB at
//! 10,000 rules) and [`super::offenders`] (8 MB at most).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use super::history::{RuleHistory, Second, SECONDS};
use super::offenders::{Offender, Offenders};
use crate::clock::Clock;

/// Most envoyproxy/ratelimit limits (stats keys) given a history; later
/// ones are not recorded (the same bound as their Prometheus counters).
pub const MAX_ENVOY_LIMITS: usize = super::metrics::MAX_STATS_KEYS;

/// What the dashboard keeps of one rule.
#[derive(Debug)]
pub struct RuleStats {
    /// The rule's name as answers and the dashboard show it.
    pub name: Arc<str>,
    /// Its decisions per second.
    pub history: RuleHistory,
    /// An envoyproxy/ratelimit limit as `<requests_per_unit> per <unit>`
    /// (divvy rules are described by their spec).
    pub describe: Option<String>,
    /// Hits a shadow rule would have denied (and allowed), since it came in force.
    pub shadow_denials: AtomicU64,
}

impl RuleStats {
    /// Counts a hit a shadow rule would have denied.
    pub fn shadow_denied(&self) {
        self.shadow_denials.fetch_add(1, Ordering::Relaxed);
    }

    /// Hits a shadow rule would have denied so far.
    pub fn shadow_denials(&self) -> u64 {
        self.shadow_denials.load(Ordering::Relaxed)
    }
}

/// Rule histories by name, and the offenders of every rule.
pub struct Recorder {
    clock: Arc<dyn Clock>,
    /// Divvy rules, held by their compiled rules: a rule that leaves the
    /// policy drops its history with it.
    rules: RwLock<HashMap<Arc<str>, Weak<RuleStats>>>,
    /// envoyproxy/ratelimit limits by stats key, kept (bounded).
    envoy: RwLock<HashMap<Arc<str>, Arc<RuleStats>>>,
    offenders: Mutex<Offenders>,
}

impl Recorder {
    /// An empty recorder reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Recorder {
        Recorder {
            clock,
            rules: RwLock::new(HashMap::new()),
            envoy: RwLock::new(HashMap::new()),
            offenders: Mutex::new(Offenders::default()),
        }
    }

    /// Now, in seconds since the epoch (read once per request).
    pub fn now(&self) -> u64 {
        self.clock.now_coarse().as_secs()
    }

    /// The second since the epoch at `instant`, a monotonic instant already
    /// read (a decision's own clock read serves its history too).
    pub fn second_at(&self, instant: std::time::Instant) -> u64 {
        self.clock.ms_at(instant) / 1000
    }

    /// The stats of the rule named `name`: the ones it had if a rule of
    /// that name is in force (a reload keeps its history), else new ones.
    pub fn rule(&self, name: &str) -> Arc<RuleStats> {
        let found = self
            .rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .and_then(Weak::upgrade);
        if let Some(s) = found {
            return s;
        }
        let mut map = self.rules.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(name).and_then(Weak::upgrade) {
            return s;
        }
        // Forget rules that left the policy before growing the map.
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let stats = Arc::new(RuleStats {
            name: Arc::from(name),
            history: RuleHistory::default(),
            describe: None,
            shadow_denials: AtomicU64::new(0),
        });
        map.insert(stats.name.clone(), Arc::downgrade(&stats));
        stats
    }

    /// The stats of an envoyproxy/ratelimit limit (`None` past [`MAX_ENVOY_LIMITS`]).
    pub fn envoy_limit(
        &self,
        stats_key: &str,
        describe: impl FnOnce() -> String,
    ) -> Option<Arc<RuleStats>> {
        if let Some(s) = self
            .envoy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(stats_key)
        {
            return Some(s.clone());
        }
        let mut map = self.envoy.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ENVOY_LIMITS && !map.contains_key(stats_key) {
            return None;
        }
        let stats = map.entry(Arc::from(stats_key)).or_insert_with(|| {
            Arc::new(RuleStats {
                name: Arc::from(stats_key),
                history: RuleHistory::default(),
                describe: Some(describe()),
                shadow_denials: AtomicU64::new(0),
            })
        });
        Some(stats.clone())
    }

    /// Counts a decision of `rule` at `now`; a denied one also counts
    /// `cost` against `actor` (bounded as counter keys keep it).
    pub fn record(&self, now: u64, rule: &RuleStats, allowed: bool, actor: &str, cost: u64) {
        rule.history.record(now, allowed);
        if !allowed {
            self.offenders
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(now, &rule.name, actor, cost.max(1));
        }
    }

    /// The top `n` offenders over the last `window_seconds`, of one rule or all.
    pub fn top(&self, window_seconds: u64, rule: Option<&str>, n: usize) -> Vec<Offender> {
        let now = self.now();
        self.offenders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .top(now, window_seconds, rule, n)
    }

    /// Every envoyproxy/ratelimit limit recorded so far.
    pub fn envoy_limits(&self) -> Vec<Arc<RuleStats>> {
        let map = self.envoy.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = map.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The sum of `rules`' last 15 minutes, second by second, oldest first,
    /// ending at `now`.
    pub fn total<'a>(
        &self,
        now: u64,
        rules: impl IntoIterator<Item = &'a RuleStats>,
    ) -> Vec<Second> {
        let mut out = vec![Second::default(); SECONDS];
        for r in rules {
            r.history.add_into(now, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    #[test]
    fn a_rule_keeps_its_history_while_a_rule_of_its_name_is_in_force() {
        let clock = Arc::new(ManualClock::default());
        clock.advance(Duration::from_secs(1_700_000_000));
        let r = Recorder::new(clock.clone());
        let a = r.rule("a");
        r.record(r.now(), &a, false, "mallory", 1);
        r.record(r.now(), &a, true, "alice", 1);
        // A reload compiles the rule again while the old one is in force.
        let again = r.rule("a");
        assert!(Arc::ptr_eq(&a, &again));
        drop((a, again));
        // Gone from the policy: a new rule of that name starts afresh.
        assert_eq!(r.rule("a").history.sum(r.now(), 900), Second::default());
        clock.advance(Duration::from_secs(1));
        let top = r.top(60, Some("a"), 20);
        assert_eq!((top[0].actor.as_str(), top[0].count), ("mallory", 1));
    }

    #[test]
    fn envoy_limits_are_kept_and_summed() {
        let clock = Arc::new(ManualClock::default());
        clock.advance(Duration::from_secs(1_700_000_000));
        let r = Recorder::new(clock);
        let now = r.now();
        for key in ["d.k_v", "d.k_w", "d.k_v"] {
            let s = r.envoy_limit(key, || "1 per second".into()).unwrap();
            r.record(now, &s, key.ends_with('v'), "x", 1);
        }
        let limits = r.envoy_limits();
        assert_eq!(limits.len(), 2);
        let total = r.total(now, limits.iter().map(|s| &**s));
        assert_eq!(
            total[SECONDS - 1],
            Second {
                allowed: 2,
                denied: 1
            }
        );
    }
}
