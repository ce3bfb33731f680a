//! Demands shared among replicas through the coordination store, so a
//! value whose requests land on several replicas gets one share, not one
//! per replica.
//!
//! Each counter has a hash `divvy:fair:<counter key>`; each replica writes
//! one field per value it sees, `<replica>\x1f<value>` = `<demand> <ms>`
//! (credits per second, and when it was measured), and reads the whole
//! hash back, summing the fresh fields by value. Fields older than
//! [`FRESH_MS`] are ignored (a replica that stopped), and removed once
//! older than [`STALE_MS`]; the hash itself lives [`HASH_LIFE`] past its
//! last write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::Entry;
use crate::coord::Coordination;
use crate::observe::metrics::FairMetrics;

/// A field measured longer ago than this is not counted.
pub const FRESH_MS: u64 = 1_500;
/// A field measured longer ago than this is removed by whoever reads it.
pub const STALE_MS: u64 = 5_000;
/// How long a counter's hash lives after its last write.
pub const HASH_LIFE: Duration = Duration::from_secs(10);
/// Separates the replica from the value in a field's name.
const SEP: char = '\x1f';

/// The exchange of one process.
pub struct Exchange {
    coord: Coordination,
    replica: String,
}

/// The hash of a counter.
pub fn hash_key(counter: &str) -> String {
    format!("divvy:fair:{counter}")
}

impl Exchange {
    /// Exchanges through `coord` as `replica` (unique among the replicas).
    pub fn new(coord: Coordination, replica: String) -> Exchange {
        Exchange { coord, replica }
    }

    /// Writes this replica's demands of every counter and reads back the
    /// deployment's; a counter whose exchange fails falls back to this
    /// replica's own demands until the next one works.
    pub async fn exchange(
        &self,
        entries: &[(String, Arc<Entry>)],
        now_ms: u64,
        metrics: &FairMetrics,
    ) {
        let calls = entries.iter().map(|(key, e)| self.one(key, e, now_ms));
        let results = join_all(calls).await;
        for ((_, e), result) in entries.iter().zip(results) {
            let deployment = match result {
                Ok(d) => {
                    metrics.exchanges.with_label_values(&["ok"]).inc();
                    Some(d)
                }
                Err(why) => {
                    metrics.exchanges.with_label_values(&["failed"]).inc();
                    tracing::debug!(%why, "fair-share demand exchange failed; using this replica's demands");
                    None
                }
            };
            if let Ok(mut t) = e.tracker.lock() {
                t.set_deployment(deployment);
            }
        }
    }

    async fn one(
        &self,
        key: &str,
        e: &Entry,
        now_ms: u64,
    ) -> Result<HashMap<String, f64>, crate::coord::CoordError> {
        let own = match e.tracker.lock() {
            Ok(mut t) => t.own_demands(now_ms),
            Err(_) => Vec::new(),
        };
        let fields = own
            .into_iter()
            .map(|(value, d)| {
                (
                    format!("{}{SEP}{value}", self.replica),
                    format!("{d:.3} {now_ms}"),
                )
            })
            .collect();
        let hash = hash_key(key);
        self.coord.hash_set(&hash, fields, Some(HASH_LIFE)).await?;
        let all = self.coord.hash_get_all(&hash).await?;
        let (demands, stale) = sum_fresh(&all, now_ms);
        if !stale.is_empty() {
            self.coord.hash_delete(&hash, stale).await?;
        }
        Ok(demands)
    }
}

/// The fresh fields' demands summed by value, and the stale fields' names.
pub fn sum_fresh(
    all: &HashMap<String, String>,
    now_ms: u64,
) -> (HashMap<String, f64>, Vec<String>) {
    let mut demands: HashMap<String, f64> = HashMap::new();
    let mut stale = Vec::new();
    for (field, text) in all {
        let parsed = text
            .split_once(' ')
            .and_then(|(d, at)| Some((d.parse::<f64>().ok()?, at.parse::<u64>().ok()?)));
        let (Some((_, value)), Some((demand, at))) = (field.split_once(SEP), parsed) else {
            stale.push(field.clone());
            continue;
        };
        let age = now_ms.saturating_sub(at);
        if age > STALE_MS {
            stale.push(field.clone());
        } else if age <= FRESH_MS && demand.is_finite() && demand >= 0.0 {
            *demands.entry(value.to_owned()).or_default() += demand;
        }
    }
    (demands, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_fields_are_summed_by_value_and_old_or_broken_ones_removed() {
        let all = HashMap::from([
            (format!("r1{SEP}a"), "60.000 10000".to_owned()),
            (format!("r2{SEP}c"), "10.000 9800".to_owned()),
            (format!("r1{SEP}c"), "10.000 10000".to_owned()),
            (format!("r3{SEP}a"), "99.000 8000".to_owned()),
            (format!("r4{SEP}a"), "99.000 4000".to_owned()),
            ("junk".to_owned(), "1 2".to_owned()),
            (format!("r5{SEP}b"), "nan-ish".to_owned()),
        ]);
        let (d, mut stale) = sum_fresh(&all, 10_000);
        assert_eq!(d.get("a"), Some(&60.0));
        assert_eq!(d.get("c"), Some(&20.0));
        assert_eq!(d.len(), 2);
        stale.sort();
        assert_eq!(
            stale,
            vec!["junk".to_owned(), format!("r4{SEP}a"), format!("r5{SEP}b")]
        );
    }
}
