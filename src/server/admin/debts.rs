//! Debts of `overdraft: true` limits for the dashboard's rule page and
//! `GET /explain`: what a counter owes, read with a check (nothing charged).

use serde_json::{json, Value};

use super::state::AdminState;
use crate::rules::Rule;
use crate::store::algorithm::debt_probe;
use crate::store::{CounterOp, Store};

/// The debt of `op`'s counter (credits charged past its limit, not yet
/// paid back), or the store's error.
pub(super) async fn debt_of(store: &dyn Store, op: &CounterOp) -> Value {
    let (probe, added) = debt_probe(op);
    match store.peek(&probe).await {
        Ok(None) => json!(0),
        Ok(Some(st)) => json!(added.saturating_sub(st.remaining)),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// A rule's overdraft figures: credits charged past what was left since
/// the process started, and the counters last overdrawn with their debts
/// now and the seconds until each is full again (debt paid back).
pub(super) async fn rule_json(s: &AdminState, rule: &Rule) -> Value {
    let label = rule.spec.label.as_deref().unwrap_or("");
    let charged = s
        .limiter
        .telemetry()
        .metrics
        .policy
        .overdraft_charged
        .with_label_values(&[label])
        .get();
    let store = s.limiter.store();
    let mut counters = Vec::new();
    for op in s.limiter.debtors().of(rule.name()) {
        let full = match store.peek(&op).await {
            Ok(Some(st)) => json!(st.reset_after.as_secs_f64()),
            Ok(None) => json!(0),
            Err(e) => json!({"error": e.to_string()}),
        };
        counters.push(json!({
            "counterKey": op.key,
            "debt": debt_of(store.as_ref(), &op).await,
            "fullInSeconds": full,
        }));
    }
    json!({"chargedPastLeft": charged, "counters": counters})
}
