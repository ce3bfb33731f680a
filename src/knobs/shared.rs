//! Knobs in Redis, shared by every replica.
//!
//! Layout: one hash, [`KNOBS_KEY`] (`divvy:knobs`); a field per label, its
//! value the knob as JSON (`{"creditLimit":20,"expiresAtMs":...,
//! "setBy":"host:pid","setAtMs":...}`). A change is written there first and
//! then applied locally; every replica reads the whole hash every 250 ms
//! (and at start), so a change reaches every replica within a second, also
//! one that was down when it was made. A knob past its expiry is ignored by
//! everyone and deleted by whichever replica sees it first. When Redis does
//! not answer, reading fails and the last knobs seen stay in force; changes
//! are refused (nothing would reach the other replicas).

use std::collections::HashMap;

use fred::prelude::*;

use super::{Knob, KnobError};

/// The Redis hash holding every knob.
pub const KNOBS_KEY: &str = "divvy:knobs";

/// The knobs' Redis client.
#[derive(Clone)]
pub struct SharedKnobs {
    client: Client,
}

fn unavailable(e: &Error) -> KnobError {
    KnobError::Unavailable(e.to_string())
}

impl SharedKnobs {
    /// Knobs through `client` (the Redis store's).
    pub fn new(client: Client) -> SharedKnobs {
        SharedKnobs { client }
    }

    /// Writes `label`'s knob.
    pub async fn put(&self, label: &str, knob: &Knob) -> Result<(), KnobError> {
        let json = serde_json::to_string(knob)
            .map_err(|e| KnobError::Invalid(format!("cannot encode the knob: {e}")))?;
        self.client
            .hset::<(), _, _>(KNOBS_KEY, (label, json))
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Removes `label`'s knob.
    pub async fn delete(&self, label: &str) -> Result<(), KnobError> {
        self.client
            .hdel::<(), _, _>(KNOBS_KEY, label)
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Removes `label`'s knob if the stored one has expired by `now_ms`.
    pub async fn delete_if_expired(&self, label: &str, now_ms: u64) {
        let stored: Result<Option<String>, Error> = self.client.hget(KNOBS_KEY, label).await;
        if let Ok(Some(json)) = stored {
            if serde_json::from_str::<Knob>(&json).is_ok_and(|k| !k.live(now_ms)) {
                let _ = self.client.hdel::<(), _, _>(KNOBS_KEY, label).await;
            }
        }
    }

    /// Every knob stored (unreadable entries are skipped with a warning).
    pub async fn read_all(&self) -> Result<HashMap<String, Knob>, KnobError> {
        let raw: HashMap<String, String> = self
            .client
            .hgetall(KNOBS_KEY)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(raw
            .into_iter()
            .filter_map(|(label, json)| match serde_json::from_str::<Knob>(&json) {
                Ok(k) => Some((label, k)),
                Err(e) => {
                    tracing::warn!(label = %label, "ignoring an unreadable knob in {KNOBS_KEY}: {e}");
                    None
                }
            })
            .collect())
    }
}
