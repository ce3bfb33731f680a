//! How the admin API shows knobs and limits.

use serde_json::{json, Value};

use crate::clock::now_ms;
use crate::config::LimitSpec;
use crate::knobs::Knob;

/// A knob as the admin API shows it.
pub(crate) fn knob_json(k: &Knob) -> Value {
    let now = now_ms();
    json!({
        "set": {
            "creditLimit": k.credit_limit,
            "resetSeconds": k.reset_seconds,
            "burst": k.burst,
        },
        "expiresInSeconds": k.expires_at_ms.map(|t| t.saturating_sub(now) as f64 / 1000.0),
        "setBy": k.set_by,
        "setAt": k.set_at_ms as f64 / 1000.0,
    })
}

/// A limit as `/config` and `/explain` show it.
pub(crate) fn limit_json(l: &LimitSpec) -> Value {
    json!({
        "label": l.label,
        "creditLimit": l.credit_limit,
        "resetSeconds": l.reset_seconds,
        "algorithm": l.algorithm.as_str(),
        "burst": l.burst,
        "actorField": l.actor_field,
        "fairShare": l.fair_share.as_ref().map(|f| json!({
            "by": f.by,
            "idleSeconds": f.idle.as_secs_f64(),
            "maxActors": f.max_actors,
        })),
        "describe": l.describe(),
    })
}
