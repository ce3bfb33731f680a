//! One lease for all the replicas of a region, through the regional Redis:
//! every replica writes its demand and its counters' specs there, one
//! replica (holding a lease, [`Coordination::hold`]) renews for the region and writes the
//! leases and the world's view back, and the others read them.
//!
//! Keys are `divvy:global:<what>:<region>`; values are text: a demand is
//! `rate ms`, a spec `rate burst label`, a lease `rate burst expires fallback`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::time::Duration;

use super::{gauge_value, Demands, Global, GlobalSpec, Lease, Specs};
use crate::clock::now_ms;
use crate::coord::{CoordError, Coordination};

/// A spec as the regional store holds it.
fn encode_spec(spec: &GlobalSpec) -> String {
    format!("{} {} {}", spec.rate, spec.burst, spec.label)
}

/// A spec written by [`encode_spec`], if it reads as one.
fn decode_spec(value: &str) -> Option<GlobalSpec> {
    let mut parts = value.splitn(3, ' ');
    let rate = parts.next()?.parse().ok()?;
    let burst = parts.next()?.parse().ok()?;
    let label = parts.next().unwrap_or("").to_owned();
    Some(GlobalSpec { rate, burst, label })
}

/// A lease as the regional store holds it.
fn encode_lease(l: &Lease) -> String {
    format!(
        "{} {} {} {}",
        l.rate,
        l.burst,
        l.expires_at_ms,
        u8::from(l.fallback)
    )
}

/// A lease written by [`encode_lease`], if it reads as one.
fn decode_lease(value: &str) -> Option<Lease> {
    let p: Vec<&str> = value.split(' ').collect();
    let [rate, burst, exp, fb] = p.as_slice() else {
        return None;
    };
    Some(Lease {
        rate: rate.parse().ok()?,
        burst: burst.parse().ok()?,
        expires_at_ms: exp.parse().ok()?,
        fallback: *fb == "1",
    })
}

impl Global {
    fn regional_key(&self, what: &str) -> String {
        format!("divvy:global:{what}:{}", self.options.region)
    }

    fn replica(&self) -> String {
        self.options.replica.clone()
    }

    /// How long the region's hashes outlive their last write: ten periods.
    fn regional_life(&self) -> Duration {
        self.options.period * 10
    }

    /// Writes this replica's demand rates (field `counter<TAB>replica`,
    /// value `rate ms`) and the counters' specs to the regional store.
    pub(super) async fn flush_regional(
        &self,
        regional: &Coordination,
        demands: &Demands,
        specs: &Specs,
        now: u64,
    ) -> Result<(), CoordError> {
        let demand_key = self.regional_key("demand");
        let spec_key = self.regional_key("specs");
        let me = self.replica();
        let mut rates: Vec<(String, String)> = Vec::with_capacity(demands.len());
        let mut spec_fields: Vec<(String, String)> = Vec::with_capacity(specs.len());
        for (k, d) in demands {
            rates.push((format!("{k}\t{me}"), format!("{d} {now}")));
            if let Some(spec) = specs.get(k) {
                spec_fields.push((k.clone(), encode_spec(spec)));
            }
        }
        let life = Some(self.regional_life());
        if !rates.is_empty() {
            regional.hash_set(&demand_key, rates, life).await?;
            regional.hash_set(&spec_key, spec_fields, life).await?;
        }
        Ok(())
    }

    /// Takes or keeps the region's renewer lock; true when this replica holds it.
    /// Redis not answering: not the renewer.
    pub(super) async fn hold_renewer(&self, regional: &Coordination) -> bool {
        let key = self.regional_key("renewer");
        let ttl = self.options.period * 3 / 2;
        regional
            .hold(&key, &self.replica(), ttl)
            .await
            .unwrap_or(false)
    }

    /// The region's demand: the sum of every replica's fresh rate per counter.
    pub(super) async fn take_regional(
        &self,
        regional: &Coordination,
        now: u64,
    ) -> (Demands, Specs) {
        let demand_key = self.regional_key("demand");
        let spec_key = self.regional_key("specs");
        let raw = regional.hash_get_all(&demand_key).await.unwrap_or_default();
        let fresh_ms = u64::try_from(self.options.period.as_millis() * 2).unwrap_or(u64::MAX);
        let mut demands = Demands::new();
        let mut stale = Vec::new();
        for (field, value) in raw {
            let Some((counter, _replica)) = field.split_once('\t') else {
                stale.push(field);
                continue;
            };
            let mut parts = value.split(' ');
            let rate: f64 = parts.next().and_then(|r| r.parse().ok()).unwrap_or(0.0);
            let at: u64 = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
            if now.saturating_sub(at) > fresh_ms {
                stale.push(field.clone());
                continue;
            }
            *demands.entry(counter.to_owned()).or_default() += rate;
        }
        if !stale.is_empty() {
            let _ = regional.hash_delete(&demand_key, stale).await;
        }
        let raw = regional.hash_get_all(&spec_key).await.unwrap_or_default();
        let specs = raw
            .into_iter()
            .filter_map(|(k, v)| Some((k, decode_spec(&v)?)))
            .collect();
        (demands, specs)
    }

    /// Writes the world's view of the counters just renewed, for the
    /// region's other replicas.
    pub(super) async fn write_regional_view(
        &self,
        regional: &Coordination,
        views: HashMap<String, String>,
    ) {
        let key = self.regional_key("view");
        let fields: Vec<(String, String)> = views.into_iter().collect();
        let life = Some(self.regional_life());
        let _ = regional.hash_set(&key, fields, life).await;
    }

    /// Writes the leases just decided, for the region's other replicas.
    pub(super) async fn write_regional_leases(
        &self,
        regional: &Coordination,
        leases: &HashMap<String, Lease>,
    ) {
        let key = self.regional_key("leases");
        let fields: Vec<(String, String)> = leases
            .iter()
            .map(|(k, l)| (k.clone(), encode_lease(l)))
            .collect();
        let life = Some(self.regional_life());
        let _ = regional.hash_set(&key, fields, life).await;
    }

    /// A replica that does not renew: puts the region's leases and view in force.
    pub(super) async fn read_regional(&self, regional: &Coordination) {
        let key = self.regional_key("leases");
        let Ok(raw) = regional.hash_get_all(&key).await else {
            return;
        };
        let leases: HashMap<String, Lease> = raw
            .into_iter()
            .filter_map(|(k, v)| Some((k, decode_lease(&v)?)))
            .collect();
        let now = now_ms();
        let fallback = leases
            .values()
            .any(|l| l.fallback || l.expires_at_ms <= now);
        {
            // Should this replica take over renewing, it falls back from
            // (and tells the global store of) the leases the region uses.
            let mut last = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
            last.extend(
                leases
                    .iter()
                    .filter(|(_, l)| !l.fallback)
                    .map(|(k, l)| (k.clone(), *l)),
            );
        }
        self.fallback.store(fallback, Ordering::Release);
        self.metrics.global.fallback.set(i64::from(fallback));
        {
            let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            for (k, l) in &leases {
                if let Some(c) = counters.get(k) {
                    self.metrics
                        .global
                        .lease
                        .with_label_values(&[&c.label])
                        .set(gauge_value(l.rate));
                }
            }
        }
        self.leases.store(Arc::new(leases));
        if let Ok(view) = regional.hash_get_all(&self.regional_key("view")).await {
            self.view.store(Arc::new(view));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::GlobalOptions;

    fn replica(name: &str, regional: &Coordination) -> Global {
        let options = GlobalOptions {
            region: "eu".to_owned(),
            period: Duration::from_secs(60),
            fallback_share: 0.5,
            fallback: Duration::from_secs(60),
            floor: 0.01,
            headroom: 0.05,
            replica: name.to_owned(),
        };
        let metrics = Arc::new(crate::observe::metrics::Metrics::new());
        Global::new(
            options,
            Coordination::in_process(),
            Some(regional.clone()),
            metrics,
        )
    }

    #[tokio::test]
    async fn one_replica_of_a_region_renews_and_the_others_read_its_leases() {
        let regional = Coordination::in_process();
        let (a, b) = (replica("a:1", &regional), replica("b:2", &regional));
        assert!(a.hold_renewer(&regional).await);
        assert!(!b.hold_renewer(&regional).await);
        assert!(a.hold_renewer(&regional).await);
        let lease = Lease {
            rate: 2.0,
            burst: 4,
            expires_at_ms: u64::MAX,
            fallback: false,
        };
        let leases = HashMap::from([("c".to_owned(), lease)]);
        a.write_regional_leases(&regional, &leases).await;
        b.read_regional(&regional).await;
        assert_eq!(b.leases.load().get("c"), Some(&lease));
    }

    #[test]
    fn a_spec_reads_back_as_written_and_its_label_may_hold_spaces() {
        let spec = GlobalSpec {
            rate: 2.5,
            burst: 40,
            label: "api calls".to_owned(),
        };
        assert_eq!(encode_spec(&spec), "2.5 40 api calls");
        assert_eq!(decode_spec(&encode_spec(&spec)), Some(spec));
        assert_eq!(
            decode_spec("1 2"),
            Some(GlobalSpec {
                rate: 1.0,
                burst: 2,
                label: String::new(),
            })
        );
        assert_eq!(decode_spec("x 2 l"), None);
        assert_eq!(decode_spec("1"), None);
    }

    #[test]
    fn a_lease_reads_back_as_written() {
        let lease = Lease {
            rate: 0.75,
            burst: 3,
            expires_at_ms: u64::MAX,
            fallback: true,
        };
        assert_eq!(encode_lease(&lease), format!("0.75 3 {} 1", u64::MAX));
        assert_eq!(decode_lease(&encode_lease(&lease)), Some(lease));
        assert_eq!(decode_lease("1 2 3"), None);
        assert_eq!(decode_lease("1 2 3 0 4"), None);
        assert_eq!(decode_lease("1 x 3 0"), None);
    }
}
