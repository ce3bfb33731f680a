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

use super::{Knob, KnobError};
use crate::coord::{CoordError, Coordination};

/// The Redis hash holding every knob.
pub const KNOBS_KEY: &str = "divvy:knobs";

/// The knobs' shared copy, through the coordination handle.
#[derive(Clone)]
pub struct SharedKnobs {
    coord: Coordination,
}

fn unavailable(e: &CoordError) -> KnobError {
    KnobError::Unavailable(e.to_string())
}

impl SharedKnobs {
    /// Knobs through `coord` (the Redis store's).
    pub fn new(coord: Coordination) -> SharedKnobs {
        SharedKnobs { coord }
    }

    /// Writes `label`'s knob.
    pub async fn put(&self, label: &str, knob: &Knob) -> Result<(), KnobError> {
        let json = serde_json::to_string(knob)
            .map_err(|e| KnobError::Invalid(format!("cannot encode the knob: {e}")))?;
        self.coord
            .hash_set(KNOBS_KEY, vec![(label.to_owned(), json)], None)
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Removes `label`'s knob.
    pub async fn delete(&self, label: &str) -> Result<(), KnobError> {
        self.coord
            .hash_delete(KNOBS_KEY, vec![label.to_owned()])
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Removes `label`'s knob if the stored one has expired by `now_ms`.
    pub async fn delete_if_expired(&self, label: &str, now_ms: u64) {
        let stored = self.coord.hash_get(KNOBS_KEY, label).await;
        if let Ok(Some(json)) = stored {
            if serde_json::from_str::<Knob>(&json).is_ok_and(|k| !k.live(now_ms)) {
                let _ = self
                    .coord
                    .hash_delete(KNOBS_KEY, vec![label.to_owned()])
                    .await;
            }
        }
    }

    /// Every knob stored (unreadable entries are skipped with a warning).
    pub async fn read_all(&self) -> Result<HashMap<String, Knob>, KnobError> {
        let raw: HashMap<String, String> = self
            .coord
            .hash_get_all(KNOBS_KEY)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::Coordination;

    fn knob(credit_limit: u64, expires_at_ms: Option<u64>) -> Knob {
        Knob {
            expires_at_ms,
            ..Knob::credit_limit(credit_limit)
        }
    }

    #[tokio::test]
    async fn a_knob_written_through_one_handle_is_read_through_another() {
        let coord = Coordination::in_process();
        let (a, b) = (SharedKnobs::new(coord.clone()), SharedKnobs::new(coord));
        a.put("api", &knob(20, None)).await.unwrap();
        a.put("old", &knob(5, Some(10))).await.unwrap();
        let seen = b.read_all().await.unwrap();
        assert_eq!(seen.get("api"), Some(&knob(20, None)));
        b.delete_if_expired("old", 11).await;
        b.delete_if_expired("api", 11).await;
        let seen = a.read_all().await.unwrap();
        assert_eq!(seen.keys().collect::<Vec<_>>(), vec!["api"]);
        a.delete("api").await.unwrap();
        assert!(b.read_all().await.unwrap().is_empty());
    }
}
