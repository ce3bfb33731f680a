//! Sharing each limit among divvy replicas through the counters' Redis.
//!
//! Every replica is a holder of a lease on each limit counter its streams
//! report, renewed by the renewal script of global quotas
//! (`store/lua/global_renew.lua`, the arithmetic of [`crate::quota`]): it
//! sends the summed demand of its streams and is granted its share of the
//! rate, which the hub then divides among its own streams. Live grants
//! never sum above the rate; a replica that stops renewing gives its share
//! back when its lease lapses ([`LEASE_LIFE`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::assign::{FLOOR, HEADROOM};
use crate::coord::{Coordination, ShareAsk, ShareRenewal};
use crate::global::parse_grants;
use crate::observe::metrics::Metrics;

/// How often a replica renews its shares (sooner when a new limit appears).
pub const PERIOD: Duration = Duration::from_millis(500);
/// How long a share lives in Redis without renewal: three periods.
pub const LEASE_LIFE: Duration = Duration::from_millis(1500);
/// How long a renewal may take before the replica keeps its last shares.
const TIMEOUT: Duration = Duration::from_millis(250);

/// What this replica asks for one limit counter.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The counter's key (as the store keeps it).
    pub counter: String,
    /// The limit's whole rate, credits per second.
    pub rate: f64,
    /// The summed demand of this replica's streams, credits per second.
    pub demand: f64,
}

/// This replica's side of the sharing.
pub struct Replicas {
    coord: Coordination,
    holder: String,
    /// Counter → this replica's share of its rate.
    grants: Mutex<HashMap<String, f64>>,
    /// Counter → every live holder's share (`holder=grant ...`), for `GET /rlqs`.
    views: Mutex<HashMap<String, String>>,
    failing: AtomicBool,
    /// Where renewals are counted.
    metrics: Arc<Metrics>,
}

impl Replicas {
    /// Sharing through `coord` (the counters' Redis), as `holder` (this
    /// process, `host:pid`), its renewals counted in `metrics`.
    pub fn new(coord: Coordination, holder: String, metrics: Arc<Metrics>) -> Replicas {
        Replicas {
            coord,
            holder,
            grants: Mutex::new(HashMap::new()),
            views: Mutex::new(HashMap::new()),
            failing: AtomicBool::new(false),
            metrics,
        }
    }

    /// This replica's name among the holders.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// This replica's share of `counter`'s `rate`: its grant, or before the
    /// first one (or while Redis fails before any) the rate divided among
    /// the holders last seen.
    pub fn share(&self, counter: &str, rate: f64) -> f64 {
        if let Some(g) = lock(&self.grants).get(counter) {
            return g.min(rate);
        }
        let holders = lock(&self.views)
            .values()
            .map(|v| v.split(' ').count())
            .max()
            .unwrap_or(1);
        rate / holders.max(1) as f64
    }

    /// Whether `counter` has no grant yet: a renewal is due at once.
    pub fn lacks(&self, counter: &str) -> bool {
        !lock(&self.grants).contains_key(counter)
    }

    /// Every live holder's share of `counter` (`holder=grant ...`).
    pub fn view(&self, counter: &str) -> Option<String> {
        lock(&self.views).get(counter).cloned()
    }

    /// Renews the shares of every counter in `asks` in one script call.
    /// On failure the last grants stay in force (counters no stream
    /// reports any more are forgotten either way).
    pub async fn renew(&self, asks: &[Ask]) {
        let renewal = self.renewal(asks);
        let call = self.coord.renew_shares(&renewal);
        let answer = match tokio::time::timeout(TIMEOUT, call).await {
            Ok(Ok(raw)) => parse_grants(&raw, asks.len()).map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {TIMEOUT:?}")),
        };
        let mut grants = lock(&self.grants);
        let mut views = lock(&self.views);
        grants.retain(|k, _| asks.iter().any(|a| &a.counter == k));
        views.retain(|k, _| asks.iter().any(|a| &a.counter == k));
        let result = match answer {
            Ok(answers) => {
                for (ask, g) in asks.iter().zip(answers) {
                    grants.insert(ask.counter.clone(), g.rate);
                    views.insert(ask.counter.clone(), g.view);
                }
                if self.failing.swap(false, Ordering::AcqRel) {
                    tracing::info!("RLQS sharing through Redis works again");
                }
                "ok"
            }
            Err(why) => {
                if !self.failing.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        "RLQS sharing through Redis failed ({why}); keeping the last shares"
                    );
                }
                "failed"
            }
        };
        self.metrics
            .rlqs
            .replica_renewals
            .with_label_values(&[result])
            .inc();
    }

    /// What this replica asks for: its share of each limit counter.
    fn renewal(&self, asks: &[Ask]) -> ShareRenewal<'_> {
        ShareRenewal {
            purpose: "RLQS sharing",
            holder: &self.holder,
            life_ms: LEASE_LIFE.as_millis(),
            floor: FLOOR,
            headroom: HEADROOM,
            // A replica keeps its last shares when Redis fails; nothing is
            // held back for it once its grant lapses.
            fallback: crate::quota::Fallback {
                share: 0.0,
                hold_ms: 0,
            },
            asks: asks
                .iter()
                .map(|a| ShareAsk {
                    key: shared_key(&a.counter),
                    rate: a.rate,
                    demand: a.demand,
                    base: 0.0,
                    weight: 0.0,
                })
                .collect(),
        }
    }
}

/// The Redis hash of `counter`'s holders; one hash slot for all, as one
/// script call renews them together.
pub fn shared_key(counter: &str) -> String {
    format!("divvy:rlqs:{{r}}:{counter}")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
