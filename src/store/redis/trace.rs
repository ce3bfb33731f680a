//! The store's spans: each traced request in a batched script call gets a
//! span of that call (the command, the batch's size, its hash slot), a
//! child of the request's decision span. A batch without a traced request
//! costs one check.

use std::time::SystemTime;

use opentelemetry::KeyValue;

use super::Pending;
use crate::observe::tracing_otlp;

/// When the call starts, if a request of `batch` is traced.
pub(super) fn start(batch: &[Pending]) -> Option<SystemTime> {
    tracing_otlp::active()?;
    batch
        .iter()
        .any(|p| p.trace.is_some())
        .then(SystemTime::now)
}

/// Records the call that began at `start` for each traced request of
/// `batch` (the slot is 0 on a single server).
pub(super) fn finish(batch: &[Pending], start: SystemTime, ok: bool) {
    let end = SystemTime::now();
    let keys: usize = batch.iter().map(|p| p.ops.len()).sum();
    for p in batch {
        let Some(parent) = &p.trace else { continue };
        let attributes = vec![
            KeyValue::new("db.system", "redis"),
            KeyValue::new("db.operation", "EVALSHA"),
            KeyValue::new("divvy.batch.requests", batch.len() as i64),
            KeyValue::new("divvy.batch.keys", keys as i64),
            KeyValue::new("divvy.request.keys", p.ops.len() as i64),
            KeyValue::new("divvy.store.ok", ok),
            KeyValue::new("db.redis.slot", i64::from(p.slot)),
        ];
        tracing_otlp::store_span(parent, "EVALSHA", start, end, attributes);
    }
}
