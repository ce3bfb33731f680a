//! Resetting a counter on every replica.
//!
//! The replica asked deletes the counter in the store (which drops its own
//! over-limit cache entry), then writes the key into one Redis hash,
//! [`RESETS_KEY`] (`divvy:counters:resets`: field = counter key, value =
//! `<ms>:<replica>:<n>`). Every replica reads that hash every
//! [`POLL_EVERY`] and drops its cached denial of each key whose value it
//! has not seen, so within a second no replica answers from a stale denial.
//! A poll, unlike a pub/sub message, is never lost to a reconnect; entries
//! older than [`KEEP`] are deleted by whichever replica sees them.
//!
//! A HIT already on its way to Redis when the reset lands may bring back a
//! denial after the cache dropped it: each key is dropped again at every
//! poll for [`REPEAT_MS`] after it was first seen.
//!
//! A refund that gives credits back to a full counter is announced the same
//! way ([`announce_refunds`], value `<ms>:<replica>:r<n>`), kept only
//! [`REFUND_KEEP`]: nothing is reset, the other replicas' caches forget
//! their denial of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::now_ms;
use crate::coord::{CoordError, Coordination};
use crate::observe::metrics::Metrics;
use crate::store::{Store, StoreError};

/// The Redis hash of recent resets.
pub const RESETS_KEY: &str = "divvy:counters:resets";
/// How often each replica reads [`RESETS_KEY`].
pub const POLL_EVERY: Duration = Duration::from_millis(200);
/// How long a reset stays in [`RESETS_KEY`] (a replica cut off from Redis
/// longer than this decides by its failure policy meanwhile anyway).
pub const KEEP: Duration = Duration::from_secs(600);
/// How long after a reset is first seen its key is dropped again at each poll.
pub const REPEAT_MS: u64 = 1000;
/// How long a refund's announcement stays in [`RESETS_KEY`].
pub const REFUND_KEEP: Duration = Duration::from_secs(5);
/// Most refunds announced in one write.
const REFUND_BATCH: usize = 256;

/// Announces the keys `refunds` receives (full counters a refund gave
/// credits back to) in [`RESETS_KEY`], so every replica's over-limit cache
/// forgets them at its next poll; until the channel closes. At most
/// [`REFUND_BATCH`] per [`POLL_EVERY`], which bounds the hash every replica
/// reads (keys past that, or past the channel, are not announced). A
/// failed write is dropped: those caches deny until the window ends.
pub async fn announce_refunds(
    mut refunds: tokio::sync::mpsc::Receiver<String>,
    coord: Coordination,
    replica: String,
) {
    let mut n = 0u64;
    let mut keys = Vec::with_capacity(REFUND_BATCH);
    while refunds.recv_many(&mut keys, REFUND_BATCH).await > 0 {
        let now = now_ms();
        let fields = keys
            .drain(..)
            .map(|k| {
                n += 1;
                (k, format!("{now}:{replica}:r{n}"))
            })
            .collect();
        if let Err(e) = coord.hash_set(RESETS_KEY, fields, Some(KEEP)).await {
            tracing::debug!("a refund could not be announced to the other replicas: {e}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Why a reset did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResetError {
    /// The store did not delete the counter: nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The counter was deleted, but the other replicas were not told (their
    /// over-limit caches keep denying until the window ends): retry.
    #[error("the counter was reset in the store but the other replicas could not be told through Redis ({0}); retry the reset")]
    NotAnnounced(CoordError),
}

/// A reset seen in [`RESETS_KEY`].
struct Seen {
    stamp: String,
    first_ms: u64,
}

/// Resets counters and learns of other replicas' resets.
pub struct CounterResets {
    store: Arc<dyn Store>,
    /// The shared coordination store (`None`: this process alone).
    coord: Option<Coordination>,
    replica: String,
    sequence: AtomicU64,
    seen: Mutex<HashMap<String, Seen>>,
    metrics: Arc<Metrics>,
}

impl CounterResets {
    /// Resets in `store`, announced through `coord` when it is shared;
    /// `replica` names this process in the announcements.
    pub fn new(
        store: Arc<dyn Store>,
        coord: &Coordination,
        replica: &str,
        metrics: Arc<Metrics>,
    ) -> CounterResets {
        CounterResets {
            store,
            coord: coord.is_shared().then(|| coord.clone()),
            replica: replica.to_owned(),
            sequence: AtomicU64::new(0),
            seen: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Whether other replicas hear of this one's resets.
    pub fn is_shared(&self) -> bool {
        self.coord.is_some()
    }

    /// Deletes the counter at `key` and tells every replica; true when a
    /// counter was stored.
    pub async fn reset(&self, key: &str) -> Result<bool, ResetError> {
        let existed = self.store.reset(key).await?;
        if let Some(coord) = &self.coord {
            let n = self.sequence.fetch_add(1, Ordering::Relaxed);
            let stamp = format!("{}:{}:{n}", now_ms(), self.replica);
            coord
                .hash_set(RESETS_KEY, vec![(key.to_owned(), stamp)], Some(KEEP))
                .await
                .map_err(ResetError::NotAnnounced)?;
        }
        Ok(existed)
    }

    /// Reads the shared resets once and drops the cached denials of new
    /// ones; false when Redis did not answer.
    pub async fn poll(&self) -> bool {
        let Some(coord) = &self.coord else {
            return true;
        };
        let Ok(stored) = coord.hash_get_all(RESETS_KEY).await else {
            return false;
        };
        let now = now_ms();
        let (drop, stale) = self.note(stored, now);
        for key in &drop {
            if self.store.forget(key) {
                tracing::debug!(key = %key, "over-limit cache entry dropped after a reset");
            }
        }
        if !stale.is_empty() {
            // Only if unchanged: a reset written since the read is kept.
            let _ = coord.hash_delete_if(RESETS_KEY, stale).await;
        }
        true
    }

    /// Records what `stored` holds at `now`: the keys to drop from the cache
    /// (new resets and those seen within [`REPEAT_MS`]) and the entries
    /// older than [`KEEP`] (a refund's: [`REFUND_KEEP`]), with their stamps.
    fn note(
        &self,
        stored: HashMap<String, String>,
        now: u64,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let keep_ms = u64::try_from(KEEP.as_millis()).unwrap_or(u64::MAX);
        let refund_keep_ms = u64::try_from(REFUND_KEEP.as_millis()).unwrap_or(u64::MAX);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|key, _| stored.contains_key(key));
        let mut stale = Vec::new();
        for (key, stamp) in stored {
            // `<ms>:<replica>:<n>`; the replica's name may hold colons, so
            // the refund's `r<n>` is read from the end.
            let at = stamp.split(':').next().and_then(|t| t.parse::<u64>().ok());
            let refund = stamp.rsplit(':').next().is_some_and(|n| n.starts_with('r'));
            let keep = if refund { refund_keep_ms } else { keep_ms };
            if at.is_none_or(|at| now.saturating_sub(at) > keep) {
                stale.push((key.clone(), stamp.clone()));
            }
            match seen.get(&key) {
                Some(s) if s.stamp == stamp => {}
                _ => {
                    seen.insert(
                        key,
                        Seen {
                            stamp,
                            first_ms: now,
                        },
                    );
                }
            }
        }
        let drop = seen
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.first_ms) <= REPEAT_MS)
            .map(|(k, _)| k.clone())
            .collect();
        (drop, stale)
    }

    /// Polls every [`POLL_EVERY`] until the last handle is dropped (none
    /// without a shared store); each successful read sets
    /// `divvy_counter_resets_polled_timestamp_seconds`.
    pub fn spawn(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        self.coord.as_ref()?;
        let me = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                if me.poll().await {
                    me.metrics
                        .counters
                        .polled
                        .set(i64::try_from(now_ms() / 1000).unwrap_or(0));
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resets() -> CounterResets {
        let store: Arc<dyn Store> = Arc::new(crate::store::MemoryStore::new());
        CounterResets::new(
            store,
            &Coordination::in_process(),
            "a",
            Arc::new(Metrics::new()),
        )
    }

    fn stored(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_new_reset_is_dropped_for_a_second_and_an_old_one_is_deleted() {
        let r = resets();
        let now = 10_000_000;
        let fresh = format!("{now}:b:0");
        let (drop, stale) = r.note(
            stored(&[("k", &fresh), ("old", "1:b:0"), ("bad", "x")]),
            now,
        );
        let mut drop = drop;
        drop.sort();
        assert_eq!(drop, vec!["bad", "k", "old"]);
        let mut stale: Vec<String> = stale.into_iter().map(|(k, _)| k).collect();
        stale.sort();
        assert_eq!(stale, vec!["bad", "old"]);
        // Seen again within REPEAT_MS: dropped again; later: not.
        let (drop, _) = r.note(stored(&[("k", &fresh)]), now + REPEAT_MS);
        assert_eq!(drop, vec!["k"]);
        let (drop, _) = r.note(stored(&[("k", &fresh)]), now + REPEAT_MS + 1);
        assert!(drop.is_empty());
        // A second reset of the same key: a new stamp, dropped again.
        let again = format!("{}:a:1", now + 5000);
        let (drop, _) = r.note(stored(&[("k", &again)]), now + 5000);
        assert_eq!(drop, vec!["k"]);
        // Gone from the hash: forgotten here too.
        r.note(HashMap::new(), now + 6000);
        assert!(r.seen.lock().unwrap().is_empty());
    }

    #[test]
    fn a_refund_is_kept_five_seconds_whatever_the_replica_s_name() {
        let r = resets();
        let now = 10_000_000;
        let young = now - 4_000;
        let old = now - 6_000;
        // Replicas are named `host:pid`: the refund's `r<n>` is last.
        let (_, stale) = r.note(
            stored(&[
                ("fresh-refund", &format!("{young}:host-1:4242:r7")),
                ("old-refund", &format!("{old}:host-1:4242:r8")),
                ("old-reset", &format!("{old}:host-1:4242:9")),
            ]),
            now,
        );
        let stale: Vec<(String, String)> = stale;
        assert_eq!(stale.len(), 1, "{stale:?}");
        assert_eq!(stale[0].0, "old-refund");
        assert_eq!(stale[0].1, format!("{old}:host-1:4242:r8"));
    }

    #[tokio::test]
    async fn a_stale_entry_rewritten_since_it_was_read_is_kept() {
        let coord = Coordination::in_process();
        let fields = vec![("k".to_owned(), "1:a:0".to_owned())];
        coord.hash_set(RESETS_KEY, fields, None).await.unwrap();
        // Rewritten after the read that judged "1:a:0" stale.
        let newer = vec![("k".to_owned(), "2:b:0".to_owned())];
        coord.hash_set(RESETS_KEY, newer, None).await.unwrap();
        let stale = vec![("k".to_owned(), "1:a:0".to_owned())];
        coord.hash_delete_if(RESETS_KEY, stale).await.unwrap();
        assert_eq!(
            coord.hash_get(RESETS_KEY, "k").await.unwrap().as_deref(),
            Some("2:b:0")
        );
        let stale = vec![("k".to_owned(), "2:b:0".to_owned())];
        coord.hash_delete_if(RESETS_KEY, stale).await.unwrap();
        assert_eq!(coord.hash_get(RESETS_KEY, "k").await.unwrap(), None);
    }

    #[tokio::test]
    async fn without_a_shared_store_a_reset_is_local_and_nothing_polls() {
        let r = Arc::new(resets());
        assert!(!r.is_shared());
        assert!(r.spawn().is_none());
        assert!(!r.reset("k").await.unwrap());
        assert!(r.poll().await);
    }
}
