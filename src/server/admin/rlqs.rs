//! `GET /rlqs`: the Rate Limit Quota Service's streams, their buckets, the
//! rule deciding each bucket and its current assignment.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::state::AdminState;
use crate::limiter::BucketLimit;
use crate::server::rlqs::assign::Assignment;
use crate::server::rlqs::hub::Bucket;
use crate::server::rlqs::replicas::Replicas;

/// Every stream of this replica with its buckets.
pub async fn list(State(s): State<AdminState>) -> Json<Value> {
    let hub = &s.rlqs;
    let now = hub.now();
    let settings = *hub.settings();
    let streams: Vec<Value> = {
        let state = hub.lock();
        state
            .streams
            .iter()
            .map(|(id, st)| {
                json!({
                    "id": id,
                    "peer": st.peer,
                    "domain": st.domain,
                    "openSeconds": now.saturating_sub(st.opened_at).as_secs(),
                    "buckets": st.buckets.iter().map(|(key, b)| bucket_json(key, b, now, hub.replicas())).collect::<Vec<_>>(),
                })
            })
            .collect()
    };
    Json(json!({
        "assignmentTtlSeconds": settings.assignment_ttl.as_secs(),
        "maxBucketsPerStream": settings.max_buckets_per_stream,
        "sharing": match hub.replicas() {
            Some(r) => json!({ "replicas": true, "holder": r.holder() }),
            None => json!({ "replicas": false }),
        },
        "streams": streams,
    }))
}

fn bucket_json(
    key: &[(String, String)],
    b: &Bucket,
    now: std::time::Duration,
    replicas: Option<&Arc<Replicas>>,
) -> Value {
    let id: serde_json::Map<String, Value> = key
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    let limits: Vec<String> = match &b.limit {
        Some(BucketLimit::Rates { rates, .. }) => {
            rates.iter().map(|r| r.describe.clone()).collect()
        }
        Some(BucketLimit::DenyAll { .. }) => vec!["always deny".to_owned()],
        Some(BucketLimit::AllowAll { .. }) => vec!["always allow".to_owned()],
        Some(BucketLimit::NoLimit) | None => Vec::new(),
    };
    // Each limit's holders and their shares (`holder=grant ...`).
    let replica_shares: Option<Vec<Option<String>>> = match (&b.limit, replicas) {
        (Some(BucketLimit::Rates { rates, .. }), Some(r)) => {
            Some(rates.iter().map(|l| r.view(&l.key)).collect())
        }
        _ => None,
    };
    json!({
        "bucket": id,
        "rule": b.limit.as_ref().map(|l| l.rule()).filter(|r| !r.is_empty()),
        "limits": limits,
        "demand": b.demand,
        "reportedSecondsAgo": now.saturating_sub(b.reported_at).as_secs(),
        "assignment": b.sent.map(|(a, _)| assignment_json(&a)),
        "replicaShares": replica_shares,
    })
}

fn assignment_json(a: &Assignment) -> Value {
    match *a {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_secs,
        } => json!({
            "kind": a.kind(),
            "maxTokens": max_tokens,
            "tokensPerFill": tokens_per_fill,
            "fillIntervalSeconds": fill_interval_secs,
            "perSecond": a.rate(),
        }),
        _ => json!({ "kind": a.kind() }),
    }
}
