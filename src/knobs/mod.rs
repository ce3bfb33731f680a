//! Knobs: live overrides of a rule's (or a `limits` entry's) numbers.
//!
//! A knob is named by a label and may set `creditLimit`, `resetSeconds` and
//! `burst`, optionally for a limited time. The limiter reads the knobs in
//! force on every request (one atomic pointer load); counters keep the key
//! of the rule as written, so consumption carries over when a knob changes
//! the numbers. With the Redis store, knobs live in one Redis hash shared by
//! every replica ([`shared`]); with the memory store they are this
//! process's own.

pub mod body;
pub mod shared;

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::clock::now_ms;

use crate::config::LimitSpec;
use crate::observe::metrics::Metrics;
pub use body::KnobBody;

/// The numbers a knob sets, and who set it when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Knob {
    /// Credits per window (0 denies every hit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credit_limit: Option<u64>,
    /// Window (refill period) in seconds, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_seconds: Option<u64>,
    /// Token bucket capacity, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// Epoch ms at which the knob removes itself, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The replica that set it (`host:pid`).
    pub set_by: String,
    /// Epoch ms at which it was set.
    pub set_at_ms: u64,
}

impl Knob {
    /// A knob setting only the credit limit, with no expiry (tests: 0 is
    /// the stop knob).
    #[cfg(test)]
    pub(crate) fn credit_limit(credit_limit: u64) -> Knob {
        Knob {
            credit_limit: Some(credit_limit),
            reset_seconds: None,
            burst: None,
            expires_at_ms: None,
            set_by: "test".into(),
            set_at_ms: 0,
        }
    }

    /// Whether the knob is still in force at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|t| t > now_ms)
    }

    /// `creditLimit=20 resetSeconds=60` (the fields it sets).
    pub fn fields(&self) -> String {
        let mut out = Vec::new();
        if let Some(n) = self.credit_limit {
            out.push(format!("creditLimit={n}"));
        }
        if let Some(n) = self.reset_seconds {
            out.push(format!("resetSeconds={n}"));
        }
        if let Some(n) = self.burst {
            out.push(format!("burst={n}"));
        }
        out.join(" ")
    }

    /// `limit` as this knob makes it. A token bucket's burst that equals
    /// its creditLimit (the default) follows a new creditLimit.
    pub fn apply(&self, limit: &LimitSpec) -> LimitSpec {
        let credit_limit = self.credit_limit.unwrap_or(limit.credit_limit);
        let burst = match self.burst {
            Some(b) => b,
            None if limit.burst == limit.credit_limit => credit_limit,
            None => limit.burst,
        };
        LimitSpec {
            credit_limit,
            reset_seconds: self.reset_seconds.unwrap_or(limit.reset_seconds),
            burst: if limit.algorithm.spec().has_burst {
                burst
            } else {
                credit_limit
            },
            ..limit.clone()
        }
    }
}

/// Why a knob change was refused or failed. Nothing changed.
#[derive(Debug, Error)]
pub enum KnobError {
    /// The body is not a valid knob.
    #[error("{0}")]
    Invalid(String),
    /// No rule or limit has the label.
    #[error("no rule or limit has the label `{0}`")]
    UnknownLabel(String),
    /// There is no knob with the label.
    #[error("no knob is set for `{0}`")]
    NoKnob(String),
    /// The shared store (Redis) could not take the change.
    #[error("knobs are shared through Redis, which did not answer ({0}); nothing changed")]
    Unavailable(String),
}

/// The knobs in force, shared by every request.
pub struct Knobs {
    /// Shared knobs (`Arc`): the request path takes one without copying it.
    current: ArcSwap<HashMap<String, Arc<Knob>>>,
    shared: Option<shared::SharedKnobs>,
    /// Where the knob count, changes and refreshes are recorded.
    metrics: Arc<Metrics>,
    replica: String,
    /// Serialises changes made through this replica.
    writing: tokio::sync::Mutex<()>,
}

impl Knobs {
    /// Knobs kept in this process only (the memory store), recording to
    /// `metrics`.
    pub fn local(metrics: Arc<Metrics>) -> Knobs {
        Knobs::new(None, metrics)
    }

    /// Knobs kept in Redis and shared by every replica, recording to
    /// `metrics`.
    pub fn shared(shared: shared::SharedKnobs, metrics: Arc<Metrics>) -> Knobs {
        Knobs::new(Some(shared), metrics)
    }

    fn new(shared: Option<shared::SharedKnobs>, metrics: Arc<Metrics>) -> Knobs {
        Knobs {
            current: ArcSwap::from_pointee(HashMap::new()),
            shared,
            metrics,
            replica: format!("localhost:{}", std::process::id()),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// These knobs as set by `replica` (`host:pid`, its name in `setBy`).
    pub fn with_replica(mut self, replica: impl Into<String>) -> Knobs {
        self.replica = replica.into();
        self
    }

    /// This replica's name in `setBy`.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Whether knobs are shared through Redis.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The knob in force for `label`, if any (the request path).
    pub fn get(&self, label: &str) -> Option<Arc<Knob>> {
        let map = self.current.load();
        if map.is_empty() {
            return None;
        }
        map.get(label).filter(|k| k.live(now_ms())).cloned()
    }

    /// Whether any knob is set (so requests can skip the lookups).
    pub fn any(&self) -> bool {
        !self.current.load().is_empty()
    }

    /// Every knob in force, sorted by label.
    pub fn list(&self) -> Vec<(String, Knob)> {
        let now = now_ms();
        let mut out: Vec<(String, Knob)> = self
            .current
            .load()
            .iter()
            .filter(|(_, k)| k.live(now))
            .map(|(l, k)| (l.clone(), Knob::clone(k)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Sets `label`'s knob; returns the one it replaced.
    pub async fn set(&self, label: &str, knob: Knob) -> Result<Option<Knob>, KnobError> {
        let _guard = self.writing.lock().await;
        if let Some(shared) = &self.shared {
            shared.put(label, &knob).await?;
        }
        let old = self.get(label).map(|k| Knob::clone(&k));
        let mut map = (**self.current.load()).clone();
        map.insert(label.to_owned(), Arc::new(knob));
        self.install(map);
        Ok(old)
    }

    /// Removes `label`'s knob; returns it.
    pub async fn delete(&self, label: &str) -> Result<Knob, KnobError> {
        let _guard = self.writing.lock().await;
        let old = self
            .get(label)
            .map(|k| Knob::clone(&k))
            .ok_or_else(|| KnobError::NoKnob(label.to_owned()))?;
        if let Some(shared) = &self.shared {
            shared.delete(label).await?;
        }
        let mut map = (**self.current.load()).clone();
        map.remove(label);
        self.install(map);
        Ok(old)
    }

    fn install(&self, map: HashMap<String, Arc<Knob>>) {
        self.metrics
            .knobs
            .set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        self.current.store(Arc::new(map));
    }

    /// Drops expired knobs (and, when shared, reads every replica's
    /// changes): one step of the background task. False when the shared
    /// store could not be read (the last knobs seen stay in force).
    pub async fn refresh(&self) -> bool {
        // Held across the read: a change made through this replica meanwhile
        // must not be overwritten by an older snapshot.
        let _guard = self.writing.lock().await;
        let now = now_ms();
        let mut read = true;
        let fresh = match &self.shared {
            Some(shared) => match shared.read_all().await {
                Ok(map) => Some(map),
                Err(e) => {
                    // Redis down: the last knobs seen stay in force.
                    tracing::debug!("knobs not refreshed: {e}");
                    read = false;
                    None
                }
            },
            None => None,
        };
        let old = self.current.load_full();
        let mut map: HashMap<String, Arc<Knob>> = match fresh {
            Some(read) => read.into_iter().map(|(l, k)| (l, Arc::new(k))).collect(),
            None => (*old).clone(),
        };
        let expired: Vec<String> = map
            .iter()
            .filter(|(_, k)| !k.live(now))
            .map(|(l, _)| l.clone())
            .collect();
        for label in &expired {
            if let Some(k) = map.remove(label) {
                if old.contains_key(label) {
                    tracing::info!(label = %label, knob = %k.fields(), "knob expired");
                    self.metrics
                        .knob_changes
                        .with_label_values(&["expire"])
                        .inc();
                }
            }
            if let Some(shared) = &self.shared {
                shared.delete_if_expired(label, now).await;
            }
        }
        for (label, k) in &map {
            if old.get(label) != Some(k) && self.shared.is_some() {
                tracing::info!(label = %label, knob = %k.fields(), set_by = %k.set_by, "knob applied from another replica or at start");
            }
        }
        for label in old.keys() {
            if !map.contains_key(label) && !expired.contains(label) {
                tracing::info!(label = %label, "knob removed by another replica");
            }
        }
        if *old != map {
            self.install(map);
        }
        read
    }

    /// Refreshes every `every` until the process ends.
    pub fn spawn_refresh(
        self: &Arc<Self>,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.refresh().await;
                me.metrics
                    .knobs_refreshed
                    .set(i64::try_from(now_ms() / 1000).unwrap_or(0));
            }
        })
    }
}
