//! Renewing a region's leases against the global store: what is sent for
//! each counter (its [`GlobalSpec`] and demand), what the renewal script
//! answers for it (a [`Grant`]), and how that answer (or its failure)
//! becomes the region's leases, metrics and view.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{gauge_value, Demands, Global, GlobalSpec, Lease, Specs};
use crate::clock::now_ms;
use crate::coord::{CoordError, ShareAsk, ShareRenewal};
use crate::quota::Fallback;

/// Why a renewal gave no leases: the region falls back to conservative quotas.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenewError {
    /// The global store answered with an error.
    #[error("{0}")]
    Store(#[from] CoordError),
    /// The global store did not answer in time.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The script's reply is not four values per counter.
    #[error("renewal script returned {values} values")]
    Malformed {
        /// How many values came back.
        values: usize,
    },
}

/// What the renewal script answers for one counter (four values).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grant {
    /// The region's grant, in credits per second.
    pub rate: f64,
    /// What the region would get once the others have renewed.
    pub target: f64,
    /// Every live region's grant: `region=grant region=grant ...`.
    pub view: String,
    /// Whether another region waits for share this one holds.
    pub others_waiting: bool,
}

impl Grant {
    /// Short of its target, or holding share another region waits for:
    /// renew every quarter period until settled.
    fn short(&self) -> bool {
        self.rate < 0.9 * self.target || self.others_waiting
    }
}

/// The script's reply for `counters` counters, in the order they were sent.
/// A number that does not parse reads as 0 (the script sends only numbers).
pub(crate) fn parse_grants(raw: &[String], counters: usize) -> Result<Vec<Grant>, RenewError> {
    let malformed = || RenewError::Malformed { values: raw.len() };
    if raw.len() != counters * 4 {
        return Err(malformed());
    }
    raw.chunks_exact(4)
        .map(|group| match group {
            [rate, target, view, waiting] => Ok(Grant {
                rate: rate.parse().unwrap_or(0.0),
                target: target.parse().unwrap_or(0.0),
                view: view.clone(),
                others_waiting: waiting == "1",
            }),
            _ => Err(malformed()),
        })
        .collect()
}

/// What a region falls back on once a renewal fails, from its `last` good
/// lease: the fallback share of it until the fallback time after its expiry
/// (the global store holds that back for as long), then the floor.
pub(super) fn fallback_lease(last: &Lease, fallback: &Fallback) -> Lease {
    Lease {
        rate: last.rate * fallback.share,
        burst: ((last.burst as f64 * fallback.share) as u64).max(1),
        expires_at_ms: last.expires_at_ms.saturating_add(fallback.hold_ms),
        fallback: true,
    }
}

/// The lease a region would fall back from at `now` if a renewal's answer
/// were lost (credits per second; 0 once its fallback time is over): the
/// store keeps the fallback share of it, not only of the new grant, so a
/// grant lowered by an answer that never arrived does not lower it.
pub(super) fn fallback_base(last: Option<&Lease>, now: u64, hold_ms: u64) -> f64 {
    last.filter(|l| l.expires_at_ms.saturating_add(hold_ms) > now)
        .map_or(0.0, |l| l.rate)
}

/// The global store's key of the counter `key`.
fn global_key(key: &str) -> String {
    format!("divvy:global:{{g}}:{key}")
}

impl Global {
    /// How long a granted lease lives in the global store (ms): a period and a half.
    fn lease_life_ms(&self) -> u128 {
        self.options.period.as_millis() * 3 / 2
    }

    /// Renews every counter in `specs` with its demand; installs the leases
    /// (or the conservative quota when the global store fails). False when
    /// there were no counters (the quick first renewals wait for traffic).
    pub(super) async fn renew(&self, demands: &Demands, specs: &Specs) -> bool {
        if specs.is_empty() {
            return false;
        }
        let sent: Vec<(&String, &GlobalSpec)> = specs.iter().collect();
        let timeout = self.options.period / 4;
        let sent_at = now_ms();
        let renewal = self.renewal(&sent, demands, sent_at);
        let result = tokio::time::timeout(timeout, self.store.renew_shares(&renewal)).await;
        // The global store counts the life (and the fallback time after it)
        // from when the script ran, which is after it was sent: counted
        // from the send, the lease and its fallback end no later than what
        // the store holds back for them, whatever the clocks' offset.
        let expires = sent_at.saturating_add(u64::try_from(self.lease_life_ms()).unwrap_or(0));
        let answer = match result {
            Ok(Ok(raw)) => parse_grants(&raw, sent.len()),
            Ok(Err(e)) => Err(RenewError::from(e)),
            Err(_) => Err(RenewError::TimedOut(timeout)),
        };
        match answer {
            Ok(grants) => self.take_grants(&sent, &grants, demands, expires).await,
            Err(why) => self.fall_back(&sent, &why).await,
        }
        true
    }

    /// What the region asks the global store for at `now`: its share of
    /// each counter, with the lease it would fall back from if the answer
    /// were lost.
    fn renewal(
        &self,
        sent: &[(&String, &GlobalSpec)],
        demands: &Demands,
        now: u64,
    ) -> ShareRenewal<'_> {
        let fallback = self.fallback();
        let last = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
        ShareRenewal {
            purpose: "renewal",
            holder: &self.holder,
            life_ms: self.lease_life_ms(),
            floor: self.options.floor,
            headroom: self.options.headroom,
            fallback,
            asks: sent
                .iter()
                .map(|(k, spec)| ShareAsk {
                    key: global_key(k),
                    rate: spec.rate,
                    demand: demands.get(*k).copied().unwrap_or(0.0),
                    base: fallback_base(last.get(*k), now, fallback.hold_ms),
                    weight: self.weight(k),
                })
                .collect(),
        }
    }

    /// Installs the granted leases and leaves fallback, if the region was in it.
    async fn take_grants(
        &self,
        sent: &[(&String, &GlobalSpec)],
        grants: &[Grant],
        demands: &Demands,
        expires_at_ms: u64,
    ) {
        let mut leases = HashMap::with_capacity(sent.len());
        let mut views = HashMap::with_capacity(sent.len());
        let mut short = false;
        for (&(k, spec), grant) in sent.iter().zip(grants) {
            short |= grant.short();
            let lease = Lease {
                rate: grant.rate,
                burst: spec.lease_burst(grant.rate),
                expires_at_ms,
                fallback: false,
            };
            leases.insert(k.clone(), lease);
            views.insert(k.clone(), grant.view.clone());
            let demand = demands.get(k).copied().unwrap_or(0.0);
            let m = &self.metrics;
            m.global
                .lease
                .with_label_values(&[&spec.label])
                .set(gauge_value(grant.rate));
            m.global
                .demand
                .with_label_values(&[&spec.label])
                .set(gauge_value(demand));
        }
        self.short.store(short, Ordering::Release);
        *self.reported.lock().unwrap_or_else(|e| e.into_inner()) = sent
            .iter()
            .map(|&(k, _)| (k.clone(), demands.get(k).copied().unwrap_or(0.0)))
            .collect();
        if self.fallback.swap(false, Ordering::AcqRel) {
            tracing::info!("global store answers again; leases in force");
        }
        self.metrics.global.fallback.set(0);
        self.metrics
            .global
            .renewals
            .with_label_values(&["ok"])
            .inc();
        *self.last_good.lock().unwrap_or_else(|e| e.into_inner()) = leases.clone();
        self.view.store(Arc::new(views.clone()));
        if let Some(regional) = &self.regional {
            // The other replicas of the region show the world's view too.
            self.write_regional_view(regional, views).await;
        }
        self.install(leases).await;
    }

    /// The global store failed: decides on `fallback_share` of each
    /// counter's last lease until the fallback time after that lease's
    /// expiry, then on the floor (at once, before the first lease), until a
    /// renewal succeeds.
    async fn fall_back(&self, sent: &[(&String, &GlobalSpec)], why: &RenewError) {
        self.metrics
            .global
            .renewals
            .with_label_values(&["failed"])
            .inc();
        if !self.fallback.swap(true, Ordering::AcqRel) {
            tracing::warn!("global store failed ({why}); deciding on conservative quotas");
        }
        self.metrics.global.fallback.set(1);
        let fallback = self.fallback();
        let last = self
            .last_good
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let leases = sent
            .iter()
            .map(|&(k, spec)| {
                let lease = match last.get(k) {
                    Some(l) => fallback_lease(l, &fallback),
                    None => spec.floor_lease(self.options.floor),
                };
                (k.clone(), lease)
            })
            .collect();
        self.install(leases).await;
    }

    /// Puts `leases` in force on this replica (and for the region's other
    /// replicas, in the regional store), over the leases of other counters.
    async fn install(&self, leases: HashMap<String, Lease>) {
        if let Some(regional) = &self.regional {
            self.write_regional_leases(regional, &leases).await;
        }
        let mut merged = (**self.leases.load()).clone();
        merged.extend(leases);
        self.leases.store(Arc::new(merged));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn a_reply_of_four_values_per_counter_is_its_grants_in_order() {
        let raw = reply(&["2.5", "3", "eu=2.5 us=7.5", "0", "1", "1", "eu=1", "1"]);
        let grants = parse_grants(&raw, 2).unwrap();
        assert_eq!(
            grants,
            vec![
                Grant {
                    rate: 2.5,
                    target: 3.0,
                    view: "eu=2.5 us=7.5".to_owned(),
                    others_waiting: false,
                },
                Grant {
                    rate: 1.0,
                    target: 1.0,
                    view: "eu=1".to_owned(),
                    others_waiting: true,
                },
            ]
        );
        assert!(grants[0].short() && grants[1].short());
    }

    #[test]
    fn a_reply_of_the_wrong_length_is_malformed() {
        let raw = reply(&["2.5", "3", "eu=2.5", "0", "1"]);
        let err = parse_grants(&raw, 1).unwrap_err();
        assert!(matches!(err, RenewError::Malformed { values: 5 }));
        assert_eq!(err.to_string(), "renewal script returned 5 values");
        assert!(parse_grants(&raw, 2).is_err());
        assert_eq!(parse_grants(&[], 0).unwrap(), vec![]);
    }

    #[test]
    fn a_grant_within_a_tenth_of_its_target_is_not_short() {
        let grant = |rate, target| Grant {
            rate,
            target,
            view: String::new(),
            others_waiting: false,
        };
        assert!(!grant(9.0, 10.0).short());
        assert!(grant(8.9, 10.0).short());
    }
}
