//! Coordination: the one handle through which replicas share everything
//! that is not a counter (knobs, governor elections, a region's leases, RLQS
//! shares, the actor-hash key).
//!
//! [`Coordination`] offers only what those uses need: plain values written
//! once ([`Coordination::set_if_absent`]), leases held by name
//! ([`Coordination::hold`]), hashes of text fields that may expire whole,
//! and the fair-share renewal of [`crate::quota`] ([`Coordination::renew_shares`]).
//! Two backends stand behind it: [`redis`] (the counters' Redis client, or
//! the global store's: Cluster, Sentinel and TLS as the store built them)
//! and [`memory`] (this process alone, when there is no Redis). Another
//! backend is one more file and one more arm in each method below.

pub mod memory;
pub mod redis;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

/// The fair-share renewal script (`store/lua/global_renew.lua`), the Redis
/// form of [`crate::quota`]'s arithmetic.
pub const RENEW_SCRIPT: &str = include_str!("../store/lua/global_renew.lua");

/// Why a coordination call gave no answer.
#[derive(Debug, Clone, Error)]
pub enum CoordError {
    /// The backend did not answer or refused the call (its own message).
    #[error("{0}")]
    Unavailable(String),
    /// The backend cannot do this (the in-process one has no other holders
    /// to share with).
    #[error("{0} needs a shared coordination store (Redis)")]
    Unsupported(&'static str),
}

/// One holder's request for its shares of several counters' rates, renewed
/// in one call (the keys and arguments of `store/lua/global_renew.lua`).
#[derive(Debug, Clone)]
pub struct ShareRenewal<'a> {
    /// What the call is for, in logs (`renewal`, `RLQS sharing`).
    pub purpose: &'static str,
    /// Who asks (a region, or a replica).
    pub holder: &'a str,
    /// How long a grant lives without renewal, in milliseconds.
    pub life_ms: u128,
    /// The smallest share of a holder with demand (fraction of the rate).
    pub floor: f64,
    /// Room above measured demand (fraction of it).
    pub headroom: f64,
    /// How the holder decides once it cannot renew: the store holds that
    /// back from the others for as long (`crate::quota::Fallback`).
    pub fallback: crate::quota::Fallback,
    /// One entry per counter, in the order the answers come back.
    pub asks: Vec<ShareAsk>,
}

/// One counter of a [`ShareRenewal`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShareAsk {
    /// Where the counter's holders are kept.
    pub key: String,
    /// The counter's whole rate, credits per second.
    pub rate: f64,
    /// The holder's demand, credits per second.
    pub demand: f64,
    /// The holder's lease in force, credits per second (0: none): what it
    /// falls back from if the answer to this renewal never reaches it.
    pub base: f64,
    /// How many claimants the holder stands for (its users asking now on a
    /// `fairShare` limit; 0: it claims as one): see `quota::targets_weighted`.
    pub weight: f64,
}

#[derive(Clone)]
enum Backend {
    Redis(redis::RedisCoordination),
    Memory(Arc<memory::MemoryCoordination>),
}

/// The coordination handle; cheap to clone (every clone shares the backend).
#[derive(Clone)]
pub struct Coordination {
    backend: Backend,
}

impl Coordination {
    /// Coordination within this process only (no Redis).
    pub fn in_process() -> Coordination {
        Coordination {
            backend: Backend::Memory(Arc::new(memory::MemoryCoordination::default())),
        }
    }

    /// Coordination through the Redis of `store` (its client: Cluster,
    /// Sentinel and TLS as it connected).
    pub fn redis(store: &crate::store::redis::RedisStore) -> Coordination {
        Coordination {
            backend: Backend::Redis(redis::RedisCoordination::new(store)),
        }
    }

    /// Whether other processes see what goes through this handle.
    pub fn is_shared(&self) -> bool {
        match &self.backend {
            Backend::Redis(_) => true,
            Backend::Memory(_) => false,
        }
    }

    /// The text at `key`, if any.
    pub async fn get(&self, key: &str) -> Result<Option<String>, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.get(key).await,
            Backend::Memory(m) => Ok(m.get(key)),
        }
    }

    /// Writes `value` at `key` unless something is there (for `ttl`, or for
    /// good); true when it was written.
    pub async fn set_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.set_if_absent(key, value, ttl).await,
            Backend::Memory(m) => Ok(m.set_if_absent(key, value, ttl)),
        }
    }

    /// Takes the lease `key` for `holder` if nobody holds it, or extends it
    /// if `holder` does, for `ttl`; true when `holder` holds it afterwards.
    /// One atomic step: a holder never extends a lease another took meanwhile.
    pub async fn hold(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.hold(key, holder, ttl).await,
            Backend::Memory(m) => Ok(m.hold(key, holder, ttl)),
        }
    }

    /// Gives the lease `key` up if `holder` holds it; true when it did.
    pub async fn release(&self, key: &str, holder: &str) -> Result<bool, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.release(key, holder).await,
            Backend::Memory(m) => Ok(m.release(key, holder)),
        }
    }

    /// The field `field` of the hash `key`, if any.
    pub async fn hash_get(&self, key: &str, field: &str) -> Result<Option<String>, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.hash_get(key, field).await,
            Backend::Memory(m) => Ok(m.hash_get(key, field)),
        }
    }

    /// Every field of the hash `key` (none when it does not exist).
    pub async fn hash_get_all(&self, key: &str) -> Result<HashMap<String, String>, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.hash_get_all(key).await,
            Backend::Memory(m) => Ok(m.hash_get_all(key)),
        }
    }

    /// Writes `fields` into the hash `key` (nothing when there are none);
    /// with `life`, the whole hash then lives that long after this write
    /// (best effort: a failure to set the life is not reported).
    pub async fn hash_set(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
        life: Option<Duration>,
    ) -> Result<(), CoordError> {
        if fields.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Redis(r) => r.hash_set(key, fields, life).await,
            Backend::Memory(m) => {
                m.hash_set(key, fields, life);
                Ok(())
            }
        }
    }

    /// Removes `fields` from the hash `key`.
    pub async fn hash_delete(&self, key: &str, fields: Vec<String>) -> Result<(), CoordError> {
        if fields.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Redis(r) => r.hash_delete(key, fields).await,
            Backend::Memory(m) => {
                m.hash_delete(key, &fields);
                Ok(())
            }
        }
    }

    /// Removes each of `fields` from the hash `key` if it still holds the
    /// value given (atomically per call on Redis: a value written since it
    /// was read is kept).
    pub async fn hash_delete_if(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
    ) -> Result<(), CoordError> {
        if fields.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Redis(r) => r.hash_delete_if(key, fields).await,
            Backend::Memory(m) => {
                m.hash_delete_if(key, &fields);
                Ok(())
            }
        }
    }

    /// Renews `renewal.holder`'s shares of every counter asked for, in one
    /// call: four values per counter, in order (grant, target, every live
    /// holder's grant and every lapsed one's reserve as `holder=grant ...`, and `1` when another holder
    /// waits for share this one holds). `crate::global::parse_grants` reads them.
    pub async fn renew_shares(
        &self,
        renewal: &ShareRenewal<'_>,
    ) -> Result<Vec<String>, CoordError> {
        match &self.backend {
            Backend::Redis(r) => r.renew_shares(renewal).await,
            Backend::Memory(_) => Err(CoordError::Unsupported("sharing a rate among holders")),
        }
    }
}
