//! Fair shares: a limit divided among the values of one request key that
//! are using it now, max-min fair by demand (`fairShare: user`).
//!
//! Each counter of a `fairShare` limit (one per actor of the limit, one
//! per region's lease of a global limit) has a [`tracker::Tracker`]: the
//! values that asked in the last `idle`, each one's demand (credits per
//! second asked, allowed or not) and share. The planner asks it for the
//! value's share and adds a second counter op, the value's own bucket at
//! that share, beside the limit's own: the hit is allowed only when both
//! allow it. Shares are recomputed every quarter second by [`FairShares::run`];
//! with a shared coordination store (Redis) each replica first exchanges
//! its values' demands ([`exchange`]), so every replica computes the same
//! shares over the whole deployment.

pub mod exchange;
pub mod meter;
pub mod tracker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::FairShareSpec;
use crate::coord::Coordination;
use crate::observe::metrics::FairMetrics;
use crate::store::CounterOp;
use tracker::{ActorView, Ask, Budget, Tracker, OVERFLOW};

/// How often shares are recomputed (and demands exchanged).
pub const RECOMPUTE_EVERY: Duration = Duration::from_millis(250);
/// Most counters whose values are tracked in one process; beyond, a new
/// counter's hits are held by the limit alone (counted as overflow).
pub const MAX_COUNTERS: usize = 10_000;
/// Most values tracked in one process over every counter; beyond, a new
/// value is counted in its counter's overflow share.
pub const MAX_VALUES: usize = 100_000;

/// One tracked counter: its values, and the names metrics and `/fair` use.
pub struct Entry {
    tracker: Mutex<Tracker>,
    /// The limit's name in metrics (its label, else the rule's).
    pub limit: Arc<str>,
    /// The rule's name (its label, else the rule as written).
    pub rule: Arc<str>,
}

impl Entry {
    /// Counts `cost` admitted for a value `ask` was made for.
    pub fn admitted(&self, value: &str, overflow: bool, cost: u64, now_ms: u64) {
        if let Ok(mut t) = self.tracker.lock() {
            t.admitted(value, overflow, cost, now_ms);
        }
    }
}

/// A value's share asked for on the decision path.
pub struct Share {
    /// The tracked counter (to count what the store admits).
    pub entry: Arc<Entry>,
    /// The value as kept (bounded as counter keys bound it).
    pub value: String,
    /// The tracker's answer.
    pub ask: Ask,
}

/// What `/fair` lists for one counter.
#[derive(Debug, Clone)]
pub struct CounterView {
    /// The shared counter's key.
    pub key: String,
    /// The limit's name.
    pub limit: String,
    /// The counter's rate, credits per second.
    pub rate: f64,
    /// Its active values.
    pub actors: Vec<ActorView>,
}

/// Every fair-share counter of this process.
pub struct FairShares {
    entries: RwLock<HashMap<String, Arc<Entry>, ahash::RandomState>>,
    clock: Arc<dyn Clock>,
    metrics: FairMetrics,
    exchange: Option<exchange::Exchange>,
    tracked: Arc<Budget>,
}

impl FairShares {
    /// Fair shares timed by `clock`, recorded in `metrics`; with a shared
    /// `coord`, demands are exchanged with the other replicas as `replica`.
    pub fn new(
        clock: Arc<dyn Clock>,
        metrics: FairMetrics,
        coord: Option<(Coordination, String)>,
    ) -> FairShares {
        let exchange = coord
            .filter(|(c, _)| c.is_shared())
            .map(|(coord, replica)| exchange::Exchange::new(coord, replica));
        FairShares {
            entries: RwLock::new(HashMap::default()),
            clock,
            metrics,
            exchange,
            tracked: Arc::new(Budget::new(MAX_VALUES)),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_coarse().as_millis()).unwrap_or(u64::MAX)
    }

    /// Counts a hit of `cost` by `value` on the counter `key` of a limit
    /// of `rate` credits per second shared by `spec`, and answers the
    /// value's share (`None` when the process tracks [`MAX_COUNTERS`]
    /// counters already: the limit alone holds the hit).
    pub fn ask(
        &self,
        key: &str,
        names: (&str, &str),
        spec: &FairShareSpec,
        value: &str,
        cost: u64,
        rate: f64,
    ) -> Option<Share> {
        let entry = self.entry(key, names, spec)?;
        let value = kept_value(value);
        let ask = {
            let mut t = entry.tracker.lock().ok()?;
            t.follow(spec);
            t.ask(&value, cost, rate, self.now_ms())
        };
        if ask.overflow {
            self.metrics
                .overflow
                .with_label_values(&[&entry.limit])
                .inc();
        }
        let value = value.into_owned();
        Some(Share { entry, value, ask })
    }

    fn entry(
        &self,
        key: &str,
        (limit, rule): (&str, &str),
        spec: &FairShareSpec,
    ) -> Option<Arc<Entry>> {
        {
            let all = self.entries.read().ok()?;
            if let Some(e) = all.get(key) {
                return Some(e.clone());
            }
            // Full: refused without the write lock (a flood of new
            // counters must not queue every decision behind it).
            if all.len() >= MAX_COUNTERS {
                self.metrics.overflow.with_label_values(&[limit]).inc();
                return None;
            }
        }
        let mut all = self.entries.write().ok()?;
        if all.len() >= MAX_COUNTERS && !all.contains_key(key) {
            self.metrics.overflow.with_label_values(&[limit]).inc();
            return None;
        }
        let idle = u64::try_from(spec.idle.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        let e = all.entry(key.to_owned()).or_insert_with(|| {
            Arc::new(Entry {
                tracker: Mutex::new(Tracker::new(
                    idle,
                    spec.max_actors,
                    self.tracked.clone(),
                    now,
                )),
                limit: limit.into(),
                rule: rule.into(),
            })
        });
        Some(e.clone())
    }

    /// The time now, as the trackers count it (ms since the epoch).
    pub fn now(&self) -> u64 {
        self.now_ms()
    }

    /// The counters `keep` keeps, taken out of the map (so no decision
    /// waits on the map while they are worked on).
    fn counters(&self, keep: impl Fn(&Entry) -> bool) -> Vec<(String, Arc<Entry>)> {
        match self.entries.read() {
            Ok(all) => all
                .iter()
                .filter(|(_, e)| keep(e))
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Recomputes every counter's shares, drops idle values and counters,
    /// and sets the gauges.
    pub fn recompute(&self) {
        let now = self.now_ms();
        let entries = self.counters(|_| true);
        let mut by_limit: HashMap<Arc<str>, (i64, f64, f64)> = HashMap::new();
        let mut idle = Vec::new();
        for (key, e) in &entries {
            let Ok(mut t) = e.tracker.lock() else {
                continue;
            };
            t.recompute(now);
            if t.is_idle(now) {
                idle.push(key.clone());
                continue;
            }
            let slot = by_limit
                .entry(e.limit.clone())
                .or_insert((0, f64::MAX, 0.0));
            slot.0 += t.active() as i64;
            if let Some((lo, hi)) = t.spread() {
                slot.1 = slot.1.min(lo);
                slot.2 = slot.2.max(hi);
            }
        }
        if !idle.is_empty() {
            if let Ok(mut all) = self.entries.write() {
                for key in &idle {
                    // Asked again since it was found idle: it stays.
                    let still = all
                        .get(key)
                        .and_then(|e| e.tracker.lock().ok().map(|t| t.is_idle(now)));
                    if still == Some(true) {
                        all.remove(key);
                    }
                }
            }
        }
        self.metrics.set(&by_limit);
    }

    /// Every counter of the rule named `rule`, with its active values.
    pub fn view(&self, rule: &str) -> Vec<CounterView> {
        let now = self.now_ms();
        let mine = self.counters(|e| &*e.rule == rule || &*e.limit == rule);
        let mut out: Vec<CounterView> = mine
            .into_iter()
            .filter_map(|(key, e)| {
                let mut t = e.tracker.lock().ok()?;
                Some(CounterView {
                    key,
                    limit: e.limit.to_string(),
                    rate: t.rate(),
                    actors: t.view(now),
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// How many values ask on the counter `key` now, over the deployment
    /// (`None`: no `fairShare` limit counts on it here).
    pub fn asking(&self, key: &str) -> Option<usize> {
        let now = self.now_ms();
        let all = self.entries.read().ok()?;
        let mut t = all.get(key)?.tracker.lock().ok()?;
        Some(t.asking(now))
    }

    /// The share and demand (credits per second) of `value` on `key`, if active.
    pub fn share_of(&self, key: &str, value: &str) -> Option<(f64, f64)> {
        let now = self.now_ms();
        let value = kept_value(value);
        let all = self.entries.read().ok()?;
        let mut t = all.get(key)?.tracker.lock().ok()?;
        t.share_of(&value, now)
    }

    /// Recomputes every [`RECOMPUTE_EVERY`] (exchanging demands first when
    /// the coordination store is shared), until the last holder drops it.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(RECOMPUTE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.step().await;
            }
        })
    }

    /// One step of the task: exchange, recompute.
    async fn step(&self) {
        if let Some(x) = &self.exchange {
            let entries = self.counters(|_| true);
            x.exchange(&entries, self.now_ms(), &self.metrics).await;
        }
        self.recompute();
        let now = i64::try_from(crate::clock::now_ms() / 1000).unwrap_or(0);
        self.metrics.alive.set(now);
    }
}

/// A value as trackers and counter keys keep it: bounded as counter keys
/// bound actor values (a long one as a keyed hash).
fn kept_value(value: &str) -> std::borrow::Cow<'_, str> {
    if crate::rules::bounded::is_long(value) {
        let mut kept = String::new();
        crate::rules::bounded::push_value(&mut kept, value);
        std::borrow::Cow::Owned(kept)
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

/// The op of a value's own bucket at `fraction` of the shared counter's
/// `whole` op (appended to its key as `:fair:<value>`), joint with it.
/// `scaled`: the whole op already counts in thousandths (a global lease).
pub fn share_op(whole: &CounterOp, share: &Share, scaled: bool) -> CounterOp {
    let f = share.ask.fraction;
    let mut key = String::with_capacity(whole.key.len() + 6 + share.value.len());
    key.push_str(&whole.key);
    key.push_str(":fair:");
    key.push_str(if share.ask.overflow {
        OVERFLOW
    } else {
        &share.value
    });
    let mut op = CounterOp {
        key,
        joint: true,
        ..whole.clone()
    };
    // A hit larger than the share's part of the burst still fits once the
    // value has saved up for it (never more than the limit's own).
    let big = whole.cost.min(whole.burst);
    if whole.algorithm.spec().has_burst {
        let k = fine_scale(whole, scaled);
        op.window = whole.window.saturating_mul(k as u32);
        op.limit = ((whole.limit as f64 * k as f64 * f).floor() as u64).max(1);
        op.burst = ((whole.burst as f64 * f).round() as u64).max(1).max(big);
    } else {
        op.limit = ((whole.limit as f64 * f).round() as u64).max(1).max(big);
        op.burst = op.limit;
    }
    op
}

/// How much finer a token bucket's share counts than the limit's own: in
/// thousandths where the stores still count it exactly, less where the
/// limit's capacity is large; not at all when already fine (a global lease)
/// or when an overdraft needs the room above the capacity for its debt.
fn fine_scale(whole: &CounterOp, scaled: bool) -> u64 {
    if scaled || whole.overdraft {
        return 1;
    }
    let window_ms = crate::store::algorithm::window_ms(whole.window);
    let capacity = whole.burst.max(1).saturating_mul(window_ms);
    (crate::store::algorithm::MAX_CREDIT_MS / capacity.max(1)).clamp(1, 1000)
}

/// A share's credits per the limit's own window, as answers report it;
/// `scaled`: `whole` is a global lease's op, whose window is not the
/// limit's (`reset_seconds`), so its rate tells.
pub fn share_credits(whole: &CounterOp, fraction: f64, scaled: bool, reset_seconds: u64) -> u64 {
    let per_window = if scaled {
        rate_of(whole) * reset_seconds.max(1) as f64 * fraction
    } else {
        whole.limit as f64 * fraction
    };
    (per_window.round() as u64).max(1)
}

/// The rate of a counter op, credits per second.
pub fn rate_of(op: &CounterOp) -> f64 {
    op.limit as f64 / op.window.as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::observe::telemetry::Telemetry;

    fn spec() -> FairShareSpec {
        FairShareSpec {
            by: "user".into(),
            idle: Duration::from_secs(5),
            max_actors: 10,
        }
    }

    fn share(fraction: f64) -> Share {
        let clock = Arc::new(ManualClock::default());
        let telemetry = Telemetry::detached(clock.clone());
        let fair = FairShares::new(clock, telemetry.metrics.fair.clone(), None);
        let mut s = fair
            .ask("k", ("l", "r"), &spec(), "u", 1, 10.0)
            .unwrap_or_else(|| panic!("no share"));
        s.ask.fraction = fraction;
        s
    }

    #[test]
    fn a_share_s_numbers_follow_the_limit_and_stay_exact() {
        use crate::store::algorithm::{window_ms, MAX_CREDIT_MS};
        use crate::store::Algorithm;
        let bucket = |limit, secs, burst| CounterOp {
            burst,
            ..CounterOp::new(
                "k",
                Algorithm::TokenBucket,
                limit,
                Duration::from_secs(secs),
                1,
            )
        };
        // 100/s, a tenth: 10/s counted in thousandths, burst 10.
        let op = share_op(&bucket(100, 1, 100), &share(0.1), false);
        assert_eq!(
            (op.limit, window_ms(op.window), op.burst),
            (10_000, 1_000_000, 10)
        );
        assert!(op.joint && op.key == "k:fair:u");
        // A day's million: coarser units, still within what the stores count exactly.
        let op = share_op(&bucket(1_000_000, 86_400, 1_000_000), &share(0.5), false);
        assert!(
            op.burst.saturating_mul(window_ms(op.window)) <= MAX_CREDIT_MS,
            "{op:?}"
        );
        assert!((rate_of(&op) - 1_000_000.0 / 86_400.0 / 2.0).abs() < 0.01);
        // An overdraft's share keeps whole credits, so its debt has room.
        let mut whole = bucket(100_000, 86_400, 100_000);
        whole.overdraft = true;
        assert_eq!(
            window_ms(share_op(&whole, &share(0.5), false).window),
            86_400_000
        );
        // A hit larger than the share's burst fits once saved up for.
        let mut whole = bucket(1_000, 60, 1_000);
        whole.cost = 150;
        assert_eq!(share_op(&whole, &share(0.1), false).burst, 150);
        let window = CounterOp::new("k", Algorithm::Fixed, 1_000, Duration::from_secs(60), 150);
        assert_eq!(share_op(&window, &share(0.1), false).limit, 150);
    }

    #[test]
    fn counters_are_bounded_and_idle_ones_dropped() {
        let clock = Arc::new(ManualClock::default());
        let telemetry = Telemetry::detached(clock.clone());
        let fair = FairShares::new(clock.clone(), telemetry.metrics.fair.clone(), None);
        for i in 0..MAX_COUNTERS {
            let key = format!("k{i}");
            assert!(fair.ask(&key, ("l", "r"), &spec(), "u", 1, 10.0).is_some());
        }
        assert!(fair
            .ask("one more", ("l", "r"), &spec(), "u", 1, 10.0)
            .is_none());
        let overflow = telemetry
            .metrics
            .fair
            .overflow
            .with_label_values(&["l"])
            .get();
        assert_eq!(overflow, 1);
        // A counter asked again stays; the others go once idle.
        clock.advance(Duration::from_secs(4));
        assert!(fair.ask("k7", ("l", "r"), &spec(), "u", 1, 10.0).is_some());
        clock.advance(Duration::from_secs(2));
        fair.recompute();
        let left = fair.entries.read().map(|e| e.len()).unwrap_or(0);
        assert_eq!(left, 1);
        assert!(fair
            .ask("one more", ("l", "r"), &spec(), "u", 1, 10.0)
            .is_some());
        assert_eq!(fair.view("r").len(), 2);
        // Active, but it asked nothing in the last second: its next hit
        // gets an equal split (here the whole rate).
        assert_eq!(fair.share_of("k7", "u"), Some((10.0, 0.0)));
    }
}
