//! Global limits across regions: each region decides locally against a
//! lease (a share of the global rate and burst), renewed in the background.
//!
//! - The request path never waits on the global store: a `scope: global`
//!   limit is a token bucket in the region's own store at the leased rate
//!   and burst ([`Global::quota`]); demand is counted per counter.
//! - The renewer sends all demands in one script call per period (sooner
//!   when one moved by a fifth; `store/lua/global_renew.lua` mirrors
//!   [`crate::quota`]); live grants never sum above the global rate. A region's
//!   replicas share one lease through a regional Redis (one renews, holding
//!   a lease of the coordination handle; on the memory store each has its
//!   own).
//! - While the global store fails, a region decides on `fallback_share` of
//!   its last lease until `fallback` after that lease's expiry, then on the
//!   floor. The global store holds exactly that share back from the other
//!   regions for exactly that time ([`crate::quota::Record`]), so a region
//!   cut off from it (while the others are not) cannot lift the sum above
//!   the rate by more than its floor; a dead region's share goes to the
//!   others `fallback` after its lease.

mod lease;
#[cfg(test)]
mod partition_tests;
mod regional;
mod renew;

pub(crate) use renew::parse_grants;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde_json::{json, Value};

use crate::clock::now_ms;
use crate::config::LimitSpec;
use crate::coord::Coordination;
use crate::observe::metrics::Metrics;

/// The renewal script (kept with the coordination handle that runs it).
pub use crate::coord::RENEW_SCRIPT;
use lease::quota_at;
pub use lease::{lease_bucket, Lease, LeaseBucket, Phase};

/// How a region takes part in global limits.
#[derive(Debug, Clone)]
pub struct GlobalOptions {
    /// This region's name.
    pub region: String,
    /// How long a lease lasts before it is renewed.
    pub period: Duration,
    /// The share of the last lease kept while the global store fails.
    pub fallback_share: f64,
    /// How long after the last lease lapses that share is kept (then the floor).
    pub fallback: Duration,
    /// The smallest share of a region with demand (fraction of the rate).
    pub floor: f64,
    /// Room above measured demand (fraction of it).
    pub headroom: f64,
    /// This process among the region's replicas (`host:pid`).
    pub replica: String,
}

/// What a region sends for one global counter: the whole world's rate and
/// burst, and the limit's label (for metrics).
#[derive(Debug, Clone, PartialEq)]
struct GlobalSpec {
    /// Credits per second of the whole world.
    rate: f64,
    /// The whole world's burst.
    burst: u64,
    /// The limit's label, for metrics.
    label: String,
}

impl GlobalSpec {
    /// The burst of a lease of `grant` credits per second: the world's burst
    /// in proportion (at least 1).
    fn lease_burst(&self, grant: f64) -> u64 {
        if self.rate > 0.0 {
            ((self.burst as f64 * grant / self.rate).floor() as u64).max(1)
        } else {
            1
        }
    }

    /// The floor's share of the world, as a lease: what a counter stands on
    /// before its first grant.
    fn floor_lease(&self, floor: f64) -> Lease {
        Lease {
            rate: self.rate * floor,
            burst: ((self.burst as f64 * floor) as u64).max(1),
            expires_at_ms: 0,
            fallback: true,
        }
    }
}

/// Each counter's demand in credits per second, by counter key.
type Demands = HashMap<String, f64>;

/// Each counter's spec, by counter key.
type Specs = HashMap<String, GlobalSpec>;

/// What the region knows of a global counter.
#[derive(Debug, Clone)]
struct Counter {
    /// Credits per second of the whole world.
    rate: f64,
    /// The whole world's burst.
    burst: u64,
    /// The limit's label, for metrics.
    label: String,
    /// Credits asked for since the last step.
    demand: u64,
    /// Epoch ms demand was last seen.
    seen_ms: u64,
    /// The last steps' (credits asked, seconds): about half a period.
    recent: std::collections::VecDeque<(u64, f64)>,
}

/// The region's global limits.
pub struct Global {
    options: GlobalOptions,
    holder: String,
    store: Coordination,
    regional: Option<Coordination>,
    leases: ArcSwap<HashMap<String, Lease>>,
    last_good: Mutex<HashMap<String, Lease>>,
    counters: Mutex<HashMap<String, Counter>>,
    last_step: Mutex<Option<Instant>>,
    view: ArcSwap<HashMap<String, String>>,
    fallback: AtomicBool,
    renewer: AtomicBool,
    /// Whether a grant fell short of its target (others still hold share):
    /// renew sooner to pick it up when they give it back.
    short: AtomicBool,
    /// Each counter's demand as the last renewal reported it.
    reported: Mutex<HashMap<String, f64>>,
    wake: tokio::sync::Notify,
    /// The fair shares whose active users weigh the region's claim.
    fair: std::sync::OnceLock<Arc<crate::fair::FairShares>>,
    /// Where leases, demand, renewals and fallback are shown.
    metrics: Arc<Metrics>,
}

fn gauge_value(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

impl Global {
    /// Weighs the region's claim on each `fairShare` global counter by its
    /// active users in `fair` (set once; without, every claim weighs 1).
    pub fn weigh_by(&self, fair: Arc<crate::fair::FairShares>) {
        let _ = self.fair.set(fair);
    }

    /// How many claimants the region stands for on `counter`: its users
    /// asking now on a `fairShare` limit (at least 1), or 0 (it claims as
    /// one) for a counter without fair shares.
    fn weight(&self, counter: &str) -> f64 {
        match self.fair.get().and_then(|f| f.asking(counter)) {
            Some(users) => users.max(1) as f64,
            None => 0.0,
        }
    }

    /// Global limits through `store` (the global store); `regional` is the
    /// region's Redis when replicas share one (else each holds its own lease);
    /// `metrics`: the registry its leases and renewals are shown in.
    pub fn new(
        options: GlobalOptions,
        store: Coordination,
        regional: Option<Coordination>,
        metrics: Arc<Metrics>,
    ) -> Global {
        let replica = options.replica.clone();
        let holder = if regional.is_some() {
            options.region.clone()
        } else {
            format!("{}/{replica}", options.region)
        };
        Global {
            holder,
            store,
            regional,
            leases: ArcSwap::from_pointee(HashMap::new()),
            last_good: Mutex::new(HashMap::new()),
            counters: Mutex::new(HashMap::new()),
            last_step: Mutex::new(None),
            view: ArcSwap::from_pointee(HashMap::new()),
            fallback: AtomicBool::new(false),
            renewer: AtomicBool::new(false),
            short: AtomicBool::new(false),
            reported: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            fair: std::sync::OnceLock::new(),
            metrics,
            options,
        }
    }

    /// Who holds this region's leases in the global store.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether the region decides on conservative quotas (the global store fails).
    pub fn in_fallback(&self) -> bool {
        self.fallback.load(Ordering::Acquire)
    }

    /// The region's quota for the global counter `key` of `limit`, and
    /// counts `cost` credits of demand: `(credits per second, burst)`.
    pub fn quota(&self, key: &str, limit: &LimitSpec, cost: u64) -> (f64, u64) {
        let now = now_ms();
        let rate = limit.credit_limit as f64 / limit.reset_seconds.max(1) as f64;
        let new = {
            let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            match counters.get_mut(key) {
                Some(c) => {
                    c.demand = c.demand.saturating_add(cost.max(1));
                    c.seen_ms = now;
                    c.rate = rate;
                    c.burst = limit.burst;
                    false
                }
                None => {
                    counters.insert(
                        key.to_owned(),
                        Counter {
                            rate,
                            burst: limit.burst,
                            label: limit.label.clone().unwrap_or_default(),
                            demand: cost.max(1),
                            seen_ms: now,
                            recent: std::collections::VecDeque::new(),
                        },
                    );
                    true
                }
            }
        };
        if new {
            // A counter seen for the first time gets its lease at once.
            self.wake.notify_one();
        }
        let floor = (
            rate * self.options.floor,
            ((limit.burst as f64 * self.options.floor) as u64).max(1),
        );
        quota_at(self.leases.load().get(key), now, &self.fallback(), floor)
    }

    /// How this region falls back (the terms it gives the global store).
    fn fallback(&self) -> crate::quota::Fallback {
        crate::quota::Fallback {
            share: self.options.fallback_share,
            hold_ms: u64::try_from(self.options.fallback.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Renews (or reads) leases every quarter period until the runtime stops.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut last_renewal: Option<Instant> = None;
            let mut renewals = 0u32;
            loop {
                let Some(g) = me.upgrade() else { return };
                let tick = g.options.period / 4;
                // Every period; every quarter period for the first four
                // renewals, while a grant is short of its target (so share
                // given back by others is taken up quickly) and while the
                // global store fails (so leases return soon after it does).
                let quick = renewals < 4 || g.short.load(Ordering::Acquire) || g.in_fallback();
                let every = if quick { tick } else { g.options.period };
                let due = last_renewal.is_none_or(|t| t.elapsed() >= every);
                if g.step(due).await {
                    last_renewal = Some(Instant::now());
                    renewals = renewals.saturating_add(1);
                }
                g.metrics
                    .global
                    .alive
                    .set(i64::try_from(now_ms() / 1000).unwrap_or(0));
                let woken = g.wake.notified();
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = woken => {
                        // A new counter: renew now (at most every 50 ms).
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        last_renewal = None;
                    }
                }
            }
        })
    }

    /// One step: measure demand and share it with the region, renew if due
    /// and this replica renews, read the region's leases. True when a
    /// renewal was made.
    async fn step(&self, due: bool) -> bool {
        let now = now_ms();
        let (demands, specs) = self.take_demand(now);
        let mut renewed = false;
        match &self.regional {
            None => {
                if due || self.starving(&demands, &specs) || self.moved(&demands, &specs) {
                    renewed = self.renew(&demands, &specs).await;
                }
            }
            Some(regional) => {
                let _ = self.flush_regional(regional, &demands, &specs, now).await;
                let renewer = self.hold_renewer(regional).await;
                self.renewer.store(renewer, Ordering::Release);
                if renewer {
                    let (all, all_specs) = self.take_regional(regional, now).await;
                    if due || self.starving(&all, &all_specs) || self.moved(&all, &all_specs) {
                        renewed = self.renew(&all, &all_specs).await;
                    }
                } else {
                    self.read_regional(regional).await;
                }
            }
        }
        renewed
    }

    /// Whether a counter with demand holds less than the floor (its lease
    /// was cut to nothing while it was idle): renew now, not a period later.
    fn starving(&self, demands: &Demands, specs: &Specs) -> bool {
        let leases = self.leases.load();
        demands.iter().any(|(k, &d)| {
            d > 0.0
                && specs.get(k).is_some_and(|spec| {
                    leases
                        .get(k)
                        .is_some_and(|l| l.rate < spec.rate * self.options.floor)
                })
        })
    }

    /// What demand is measured over: half a lease period (see `take_demand`).
    fn demand_window_secs(&self) -> f64 {
        self.options.period.as_secs_f64() / 2.0
    }

    /// Whether some counter's demand moved since the last renewal reported
    /// it (`crate::quota::demand_moved`), or has demand and was never reported:
    /// renew now, at this quarter-period step, not a period later. Never
    /// while the global store fails: a failed renewal reports nothing, and
    /// the retries keep their own pace (a quarter period while it fails).
    fn moved(&self, demands: &Demands, specs: &Specs) -> bool {
        if self.in_fallback() {
            return false;
        }
        let window_secs = self.demand_window_secs();
        let reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        demands.iter().any(|(k, &d)| {
            // A counter with no spec is not renewed (nothing to send).
            let Some(spec) = specs.get(k) else {
                return false;
            };
            match reported.get(k) {
                Some(&r) => {
                    crate::quota::demand_moved(r, d, spec.rate * self.options.floor, window_secs)
                }
                None => d > 0.0,
            }
        })
    }

    /// Each counter's demand over about the last half period (credits per
    /// second, measured on this replica's own clock), and the counters'
    /// specs. Half a period, not a whole one: a shift of demand shows in
    /// the estimate (and so, through `moved`, in the grants) within about
    /// half a period, while two quarter-period steps still smooth it.
    fn take_demand(&self, now: u64) -> (Demands, Specs) {
        let elapsed = {
            let mut last = self.last_step.lock().unwrap_or_else(|e| e.into_inner());
            let secs = last.map_or(0.0, |t| t.elapsed().as_secs_f64());
            *last = Some(Instant::now());
            secs
        };
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        // Counters not asked for in 5 periods are forgotten (their lease lapses).
        let keep_ms = u64::try_from(self.options.period.as_millis() * 5).unwrap_or(u64::MAX);
        counters.retain(|_, c| now.saturating_sub(c.seen_ms) < keep_ms);
        let window = self.demand_window_secs();
        let mut demands = Demands::new();
        let mut specs = Specs::new();
        for (k, c) in counters.iter_mut() {
            let asked = std::mem::take(&mut c.demand);
            if elapsed > 0.0 {
                c.recent.push_back((asked, elapsed));
            }
            // Keep about half a period of steps.
            while c.recent.len() > 1 && c.recent.iter().skip(1).map(|r| r.1).sum::<f64>() >= window
            {
                c.recent.pop_front();
            }
            let secs: f64 = c.recent.iter().map(|r| r.1).sum();
            let count: u64 = c.recent.iter().map(|r| r.0).sum();
            let rate = if secs > 0.0 {
                count as f64 / secs
            } else {
                // The first step after a counter appears: what was asked, over the window.
                asked as f64 / window.max(0.05)
            };
            demands.insert(k.clone(), rate);
            let spec = GlobalSpec {
                rate: c.rate,
                burst: c.burst,
                label: c.label.clone(),
            };
            specs.insert(k.clone(), spec);
        }
        (demands, specs)
    }

    /// The lease period (the longest a region waits for a new share).
    pub fn period(&self) -> Duration {
        self.options.period
    }

    /// What `GET /global` shows.
    pub fn describe(&self) -> Value {
        let now = now_ms();
        let hold_ms = self.fallback().hold_ms;
        let leases = self.leases.load();
        let view = self.view.load();
        let mut list: Vec<Value> = leases
            .iter()
            .map(|(k, l)| {
                let phase = l.phase(now, hold_ms);
                json!({
                    "counter": k,
                    "rate": l.rate,
                    "burst": l.burst,
                    "expiresInSeconds": l.expires_at_ms.saturating_sub(now) as f64 / 1000.0,
                    "fallback": phase != Phase::Lease,
                    "phase": match phase {
                        Phase::Lease => "lease",
                        Phase::Fallback => "fallback",
                        Phase::Floor => "floor",
                    },
                    "view": view.get(k).map(|v| {
                        v.split(' ')
                            .filter_map(|p| p.split_once('='))
                            .map(|(r, g)| (r.to_owned(), json!(g.parse::<f64>().unwrap_or(0.0))))
                            .collect::<serde_json::Map<String, Value>>()
                    }),
                })
            })
            .collect();
        list.sort_by(|a, b| a["counter"].as_str().cmp(&b["counter"].as_str()));
        json!({
            "region": self.options.region,
            "holder": self.holder,
            "renewer": self.regional.is_none() || self.renewer.load(Ordering::Acquire),
            "leasePeriodSeconds": self.options.period.as_secs_f64(),
            "fallbackSeconds": self.options.fallback.as_secs_f64(),
            "fallback": self.in_fallback(),
            "leases": list,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::algorithm::{step, Params, State};
    use crate::store::Algorithm;

    fn params(b: LeaseBucket) -> Params {
        Params {
            limit: b.limit,
            window_ms: b.window_ms,
            burst: b.burst,
            cost: 1,
            refund: false,
        }
    }

    /// Hits every ms for `ms` ms from `now` under `b`: how many were allowed.
    fn drain(state: &mut Option<State>, now: u64, ms: u64, b: LeaseBucket) -> u64 {
        let mut allowed = 0;
        for t in now..now + ms {
            let v = step(Algorithm::TokenBucket, *state, t, &params(b));
            if let Some(next) = v.next {
                *state = Some(next);
            }
            allowed += u64::from(v.allowed);
        }
        allowed
    }

    #[test]
    fn a_lease_bucket_keeps_its_rate_and_burst_and_a_lease_change_gives_no_credits() {
        // A third of 200/s (burst 200), then half of it.
        let third = lease_bucket(200.0 / 3.0, 66, 200, 1);
        let half = lease_bucket(100.0, 100, 200, 1);
        // The same capacity, to the rounding of a division.
        let capacity = |b: LeaseBucket| b.burst * b.window_ms;
        assert!(capacity(half) - capacity(third) < third.burst);
        let mut state = None;
        // A new bucket is full: its burst, then its rate.
        let burst: u64 = (0..100).map(|_| drain(&mut state, 0, 1, third)).sum();
        assert_eq!(burst, 66);
        let a = drain(&mut state, 1, 10_000, third);
        assert!((a as f64 - 666.7).abs() <= 1.0, "{a}");
        // Emptied at a third, the bucket grows to half: at its rate, no burst.
        let b = drain(&mut state, 10_001, 10_000, half);
        assert!((b as f64 - 1000.0).abs() <= 1.0, "{b}");
        // And back to a third: no debt either.
        let c = drain(&mut state, 20_001, 1000, third);
        assert!((c as f64 - 66.7).abs() <= 1.0, "{c}");
        // The floor and no lease at all: a trickle, never nothing to count.
        let none = lease_bucket(0.0, 1, 200, 1);
        assert_eq!((none.limit, none.burst), (1, 1));
        assert!(lease_bucket(2.0, 2, 200, 1).limit > 1);
    }
}
