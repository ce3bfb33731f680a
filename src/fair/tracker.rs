//! One shared counter's active values: what each asks, what each is
//! admitted, and each one's share of the counter's rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::meter::Meter;
use crate::config::FairShareSpec;

/// Room above a value's measured demand (a tenth), so a value asking a
/// steady rate is not held just under it by measurement noise.
pub const HEADROOM: f64 = 0.1;

/// One value of the fair-share key.
#[derive(Debug, Clone)]
pub struct Actor {
    asked: Meter,
    admitted: Meter,
    /// Its share in credits per second (`None` until the first recompute
    /// after it arrived; 0 when it asked nothing in the second before).
    share: Option<f64>,
    seen_ms: u64,
}

impl Actor {
    /// The share its next hit is held to: its own, or `split` (an equal
    /// split) when it has none yet or asked nothing when shares were set.
    fn effective_share(&self, split: f64) -> f64 {
        self.share.filter(|&s| s > 0.0).unwrap_or(split)
    }

    fn new(now_ms: u64) -> Actor {
        Actor {
            asked: Meter::new(now_ms),
            admitted: Meter::new(now_ms),
            share: None,
            seen_ms: now_ms,
        }
    }
}

/// What [`Tracker::ask`] answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// The value's share as a fraction of the counter's rate (0 to 1).
    pub fraction: f64,
    /// Whether the value is counted in the overflow share (the tracker was full).
    pub overflow: bool,
}

/// One row of [`Tracker::view`].
#[derive(Debug, Clone, PartialEq)]
pub struct ActorView {
    /// The value (bounded as counter keys bound it), or `~overflow`.
    pub value: String,
    /// Credits per second asked over the last second.
    pub demand: f64,
    /// Its share, credits per second.
    pub share: f64,
    /// Credits per second admitted over the last second.
    pub admitted: f64,
}

/// The values sharing one counter.
#[derive(Debug)]
pub struct Tracker {
    idle_ms: u64,
    max_actors: usize,
    /// Values tracked by every tracker of the process, held under a bound.
    tracked: Arc<Budget>,
    /// The counter's rate (credits per second) as last planned.
    rate: f64,
    actors: HashMap<Box<str>, Actor, ahash::RandomState>,
    overflow: Option<Actor>,
    /// Demands over the whole deployment, by value, from the last exchange
    /// (`None`: this process's own are used).
    deployment: Option<HashMap<String, f64>>,
    pub(super) touched_ms: u64,
    computed_ms: u64,
}

/// Shares older than this are recomputed by the next ask (the recompute
/// task, every quarter second, normally comes first).
pub const STALE_SHARES_MS: u64 = 500;

/// The values every tracker of a process may hold together.
#[derive(Debug)]
pub struct Budget {
    most: usize,
    held: AtomicUsize,
}

impl Budget {
    /// A budget of `most` values.
    pub fn new(most: usize) -> Budget {
        Budget {
            most,
            held: AtomicUsize::new(0),
        }
    }

    /// Takes one value's place; false when none is left.
    fn take(&self) -> bool {
        let taken = self.held.fetch_add(1, Ordering::Relaxed) < self.most;
        if !taken {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        taken
    }

    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }

    /// Values held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// The name the overflow share goes by.
pub const OVERFLOW: &str = "~overflow";

impl Tracker {
    /// An empty tracker.
    pub fn new(idle_ms: u64, max_actors: usize, tracked: Arc<Budget>, now_ms: u64) -> Tracker {
        Tracker {
            idle_ms,
            max_actors: max_actors.max(1),
            tracked,
            rate: 0.0,
            actors: HashMap::default(),
            overflow: None,
            deployment: None,
            touched_ms: now_ms,
            computed_ms: now_ms,
        }
    }

    /// Takes `spec`'s idle time and bound (a reload's apply from the
    /// counter's next hit).
    pub fn follow(&mut self, spec: &FairShareSpec) {
        self.idle_ms = u64::try_from(spec.idle.as_millis()).unwrap_or(u64::MAX);
        self.max_actors = spec.max_actors.max(1);
    }

    /// Counts `cost` asked by `value` at `now_ms` under a counter of `rate`
    /// credits per second, and answers the value's share of it.
    pub fn ask(&mut self, value: &str, cost: u64, rate: f64, now_ms: u64) -> Ask {
        self.rate = rate;
        self.touched_ms = now_ms;
        if now_ms.saturating_sub(self.computed_ms) >= STALE_SHARES_MS {
            self.recompute(now_ms);
        }
        if self.actors.len() < self.max_actors
            && !self.actors.contains_key(value)
            && self.tracked.take()
        {
            self.actors.insert(value.into(), Actor::new(now_ms));
        }
        let (actor, overflow) = match self.actors.get_mut(value) {
            Some(a) => (a, false),
            None => (
                self.overflow.get_or_insert_with(|| Actor::new(now_ms)),
                true,
            ),
        };
        actor.asked.add(now_ms, cost);
        actor.seen_ms = now_ms;
        let own = actor.share;
        // No share yet, or none because it asked nothing when the shares
        // were set: a newcomer, with an equal split until the next recompute.
        let split = rate / self.active().max(1) as f64;
        let share = own.filter(|&s| s > 0.0).unwrap_or(split);
        let fraction = if rate > 0.0 {
            (share / rate).clamp(0.0, 1.0)
        } else {
            0.0
        };
        Ask { fraction, overflow }
    }

    /// Counts `cost` admitted for `value` (or the overflow share).
    pub fn admitted(&mut self, value: &str, overflow: bool, cost: u64, now_ms: u64) {
        let actor = match overflow {
            true => self.overflow.as_mut(),
            false => self.actors.get_mut(value),
        };
        if let Some(a) = actor {
            a.admitted.add(now_ms, cost);
        }
    }

    /// Drops values idle longer than the idle time, then sets every
    /// value's share: max-min fair by demand ([`crate::quota::max_min`]),
    /// over the deployment's demands when an exchange gave them.
    pub fn recompute(&mut self, now_ms: u64) {
        self.computed_ms = now_ms;
        let idle = self.idle_ms;
        let before = self.actors.len();
        self.actors
            .retain(|_, a| now_ms.saturating_sub(a.seen_ms) <= idle);
        self.tracked.give_back(before - self.actors.len());
        if self
            .overflow
            .as_ref()
            .is_some_and(|a| now_ms.saturating_sub(a.seen_ms) > idle)
        {
            self.overflow = None;
        }
        let demands = self.demands(now_ms);
        let shares = crate::quota::max_min(self.rate, HEADROOM, &demands);
        // The local values come first, in the order `demands` walked them.
        let all = self.actors.values_mut().chain(self.overflow.as_mut());
        for (a, share) in all.zip(shares) {
            a.share = Some(share);
        }
    }

    /// Every value's demand: this process's values first (in map order,
    /// the overflow share last), then values only other replicas see. A
    /// value's demand is the deployment's when an exchange gave it (never
    /// less than this process alone measures).
    fn demands(&mut self, now_ms: u64) -> Vec<f64> {
        let deployment = self.deployment.as_ref();
        let mut out = Vec::with_capacity(self.actors.len() + 1);
        let overflow = self.overflow.as_mut().map(|a| (OVERFLOW, a));
        let local = self
            .actors
            .iter_mut()
            .map(|(v, a)| (&**v, a))
            .chain(overflow);
        for (value, a) in local {
            let own = a.asked.rate(now_ms);
            out.push(
                deployment
                    .and_then(|d| d.get(value))
                    .map_or(own, |&d| d.max(own)),
            );
        }
        if let Some(d) = deployment {
            let has_overflow = self.overflow.is_some();
            let elsewhere = d.iter().filter(|(v, _)| {
                !(self.actors.contains_key(v.as_str()) || has_overflow && *v == OVERFLOW)
            });
            out.extend(elsewhere.map(|(_, &demand)| demand));
        }
        out
    }

    /// This process's demand by value, for the values that asked in the
    /// last two seconds (what it tells the other replicas: a value that
    /// stopped is told as 0 a few times, then no more).
    pub fn own_demands(&mut self, now_ms: u64) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = self
            .actors
            .iter_mut()
            .filter(|(_, a)| now_ms.saturating_sub(a.seen_ms) <= 2_000)
            .map(|(v, a)| (v.to_string(), a.asked.rate(now_ms)))
            .collect();
        if let Some(a) = self.overflow.as_mut() {
            out.push((OVERFLOW.to_owned(), a.asked.rate(now_ms)));
        }
        out
    }

    /// Sets the deployment's demands (from every replica), for the next
    /// recompute: at most `maxActors` of them, the largest.
    pub fn set_deployment(&mut self, demands: Option<HashMap<String, f64>>) {
        self.deployment = demands.map(|d| {
            if d.len() <= self.max_actors {
                return d;
            }
            let mut all: Vec<(String, f64)> = d.into_iter().collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1));
            all.truncate(self.max_actors);
            all.into_iter().collect()
        });
    }

    /// Values active now (the overflow share counts as one).
    pub fn active(&self) -> usize {
        self.actors.len() + usize::from(self.overflow.is_some())
    }

    /// Values asking now (in the last second) over the deployment: this
    /// process's, or as many as the last exchange saw asking, if more.
    pub fn asking(&mut self, now_ms: u64) -> usize {
        let elsewhere = self
            .deployment
            .as_ref()
            .map_or(0, |d| d.values().filter(|&&x| x > 0.0).count());
        let mut here = 0;
        for a in self.actors.values_mut() {
            here += usize::from(a.asked.rate(now_ms) > 0.0);
        }
        here.max(elsewhere)
    }

    /// The counter's rate as last planned (credits per second).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether nothing asked for longer than the idle time.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.touched_ms) > self.idle_ms
    }

    /// The smallest and largest share among the active values (credits per second).
    pub fn spread(&self) -> Option<(f64, f64)> {
        let rate = self.rate / self.active().max(1) as f64;
        let shares = self.actors.values().chain(self.overflow.as_ref());
        shares
            .map(|a| a.effective_share(rate))
            .fold(None, |acc, s| match acc {
                None => Some((s, s)),
                Some((lo, hi)) => Some((f64::min(lo, s), f64::max(hi, s))),
            })
    }

    /// Every active value: demand, share and admitted rate, by value.
    pub fn view(&mut self, now_ms: u64) -> Vec<ActorView> {
        let rate = self.rate;
        let active = self.active().max(1) as f64;
        let row = |value: String, a: &mut Actor| ActorView {
            value,
            demand: a.asked.rate(now_ms),
            share: a.effective_share(rate / active),
            admitted: a.admitted.rate(now_ms),
        };
        let mut rows: Vec<ActorView> = self
            .actors
            .iter_mut()
            .map(|(v, a)| row(v.to_string(), a))
            .collect();
        if let Some(a) = self.overflow.as_mut() {
            rows.push(row(OVERFLOW.to_owned(), a));
        }
        rows.sort_by(|a, b| a.value.cmp(&b.value));
        rows
    }

    /// The share of `value` in credits per second and its demand, if it is active.
    pub fn share_of(&mut self, value: &str, now_ms: u64) -> Option<(f64, f64)> {
        let rate = self.rate;
        let active = self.active().max(1) as f64;
        let a = self.actors.get_mut(value)?;
        Some((a.effective_share(rate / active), a.asked.rate(now_ms)))
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.tracked.give_back(self.actors.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(max_actors: usize) -> Tracker {
        Tracker::new(5_000, max_actors, Arc::new(Budget::new(1_000)), 0)
    }

    /// Paces each value at its rate (credits per second) for `ms`, starting
    /// at `from`, recomputing every 250 ms; what each was asked and its
    /// fraction at the end.
    fn run(t: &mut Tracker, rates: &[(&str, u64)], from: u64, ms: u64) -> Vec<f64> {
        let mut out = vec![0.0; rates.len()];
        for now in from..from + ms {
            for (i, (v, r)) in rates.iter().enumerate() {
                if *r > 0 && (now * r) / 1000 != ((now + 1) * r) / 1000 {
                    out[i] = t.ask(v, 1, 100.0, now).fraction * 100.0;
                }
            }
            if now % 250 == 0 {
                t.recompute(now);
            }
        }
        out
    }

    #[test]
    fn shares_follow_demand_max_min() {
        let mut t = tracker(100);
        let s = run(
            &mut t,
            &[("a", 30), ("b", 40), ("c", 60), ("d", 80)],
            0,
            3_000,
        );
        assert!(s.iter().all(|x| (x - 25.0).abs() < 1.0), "{s:?}");
        let s = run(
            &mut t,
            &[("a", 200), ("b", 10), ("c", 10), ("d", 10)],
            3_000,
            3_000,
        );
        assert!(s[1..].iter().all(|x| *x >= 10.0 && *x < 12.5), "{s:?}");
        assert!((s[0] - 67.0).abs() < 3.0, "{s:?}");
    }

    #[test]
    fn a_stopped_value_gives_its_share_back_within_two_seconds_and_leaves_after_idle() {
        let mut t = tracker(100);
        run(
            &mut t,
            &[("a", 30), ("b", 40), ("c", 80), ("d", 60)],
            0,
            3_000,
        );
        let s = run(&mut t, &[("a", 30), ("b", 40), ("c", 80)], 3_000, 2_000);
        assert!(
            s[0] >= 30.0 && (s[1] - 33.5).abs() < 1.5 && (s[2] - 33.5).abs() < 1.5,
            "{s:?}"
        );
        assert_eq!(t.active(), 4);
        run(&mut t, &[("a", 30)], 5_000, 4_000);
        assert_eq!(t.active(), 3, "d idle for 6 s");
    }

    #[test]
    fn a_newcomer_gets_an_equal_split_then_what_it_asks() {
        let mut t = tracker(100);
        run(&mut t, &[("a", 100), ("b", 100), ("c", 100)], 0, 2_000);
        let first = t.ask("d", 1, 100.0, 2_000).fraction;
        assert!((first - 0.25).abs() < 1e-9, "{first}");
        assert_eq!(tracker(10).ask("alone", 1, 100.0, 0).fraction, 1.0);
        let s = run(
            &mut t,
            &[("a", 100), ("b", 100), ("c", 100), ("d", 20)],
            2_000,
            1_500,
        );
        assert!(s[3] >= 20.0, "{s:?}");
    }

    #[test]
    fn beyond_max_actors_newcomers_share_one_overflow_share() {
        let mut t = tracker(2);
        assert!(!t.ask("a", 1, 100.0, 0).overflow);
        assert!(!t.ask("b", 1, 100.0, 0).overflow);
        assert!(t.ask("c", 1, 100.0, 0).overflow);
        assert!(t.ask("d", 1, 100.0, 0).overflow);
        assert_eq!(t.active(), 3);
        t.recompute(100);
        let view = t.view(100);
        assert_eq!(
            view.iter().map(|r| r.value.as_str()).collect::<Vec<_>>(),
            ["a", "b", OVERFLOW]
        );
        assert!(view.iter().map(|r| r.share).sum::<f64>() <= 100.0 + 1e-9);
    }

    #[test]
    fn the_process_budget_bounds_every_tracker_together() {
        let budget = Arc::new(Budget::new(3));
        let mut a = Tracker::new(1_000, 10, budget.clone(), 0);
        let mut b = Tracker::new(1_000, 10, budget.clone(), 0);
        for v in ["1", "2"] {
            assert!(!a.ask(v, 1, 100.0, 0).overflow);
        }
        assert!(!b.ask("x", 1, 100.0, 0).overflow);
        assert!(b.ask("y", 1, 100.0, 0).overflow, "the budget is spent");
        assert_eq!(budget.held(), 3);
        a.recompute(2_000);
        assert_eq!(budget.held(), 1, "a's idle values gave their places back");
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn the_deployments_demand_decides_when_it_is_known() {
        let mut t = tracker(100);
        run(&mut t, &[("a", 60), ("c", 10)], 0, 2_000);
        // Another replica sees b at 60 and c at 10 as well.
        let d = HashMap::from([("a".into(), 60.0), ("b".into(), 60.0), ("c".into(), 20.0)]);
        t.set_deployment(Some(d));
        t.recompute(2_000);
        let (a, _) = t.share_of("a", 2_000).unwrap_or_default();
        let (c, _) = t.share_of("c", 2_000).unwrap_or_default();
        // Limit 100: c wants 22, a and b split 78 (b is not here, but counted).
        assert!(
            (c - 22.0).abs() < 1e-9 && (a - 39.0).abs() < 1e-9,
            "{a} {c}"
        );
    }
}
