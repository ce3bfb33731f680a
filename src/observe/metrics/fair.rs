//! Fair-share metrics: how many values share each limit and how the
//! shares are spread (labels are limit names only, never a value).

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{GaugeVec, IntCounterVec, IntGauge, Registry};

use super::build::{counter_vec, gauge, gauge_vec};

/// Fair shares among a limit's active values (`fairShare`).
#[derive(Clone)]
pub struct FairMetrics {
    /// `divvy_fair_share_actors{limit}`: active values sharing the limit (over its counters).
    pub actors: GaugeVec,
    /// `divvy_fair_share_rate{limit,stat}`: the smallest and largest share
    /// (credits per second) among the limit's active values.
    pub share: GaugeVec,
    /// `divvy_fair_share_overflow_total{limit}`: hits counted in the overflow
    /// share (the limit's `maxActors` reached) or held by the limit alone (too many counters tracked).
    pub overflow: IntCounterVec,
    /// `divvy_fair_share_exchanges_total{result}`: demand exchanges with the other replicas, ok or failed.
    pub exchanges: IntCounterVec,
    /// `divvy_fair_share_alive_timestamp_seconds`: last recompute of the shares.
    pub alive: IntGauge,
}

impl FairMetrics {
    pub(super) fn new(r: &Registry) -> FairMetrics {
        FairMetrics {
            actors: gauge_vec(
                r,
                "divvy_fair_share_actors",
                "Active values sharing a fairShare limit",
                &["limit"],
            ),
            share: gauge_vec(
                r,
                "divvy_fair_share_rate",
                "Smallest and largest share (credits per second) among a fairShare limit's active values",
                &["limit", "stat"],
            ),
            overflow: counter_vec(
                r,
                "divvy_fair_share_overflow_total",
                "Hits of a fairShare limit counted in its overflow share (maxActors reached) or by the limit alone",
                &["limit"],
            ),
            exchanges: counter_vec(
                r,
                "divvy_fair_share_exchanges_total",
                "Fair-share demand exchanges with the other replicas, by result",
                &["result"],
            ),
            alive: gauge(
                r,
                "divvy_fair_share_alive_timestamp_seconds",
                "Unix time of the last fair-share recompute",
            ),
        }
    }

    /// Sets the gauges from one recompute: per limit, (active values,
    /// smallest share, largest share); limits no longer active read 0.
    pub fn set(&self, by_limit: &HashMap<Arc<str>, (i64, f64, f64)>) {
        self.actors.reset();
        self.share.reset();
        for (limit, &(active, smallest, largest)) in by_limit {
            self.actors.with_label_values(&[limit]).set(active as f64);
            if active > 0 {
                self.share
                    .with_label_values(&[limit, "smallest"])
                    .set(smallest);
                self.share
                    .with_label_values(&[limit, "largest"])
                    .set(largest);
            }
        }
    }
}
