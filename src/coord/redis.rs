//! Coordination through Redis: the client the counter store (or the global
//! store) connected, so Cluster, Sentinel, TLS and the command timeout are
//! the store's. Besides `src/store`, the only module that speaks Redis.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;

use super::{CoordError, ShareRenewal, RENEW_SCRIPT};
use crate::store::redis::{evalsha_or_load, RedisStore};

/// Extends the lease if `ARGV[1]` holds it, takes it if nobody does;
/// returns 1 when `ARGV[1]` holds it afterwards.
const HOLD: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// Gives the lease up if `ARGV[1]` holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Removes each field `ARGV[2i-1]` still holding `ARGV[2i]`; returns how many.
const HDEL_IF: &str = r"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
";

fn unavailable(e: &Error) -> CoordError {
    CoordError::Unavailable(e.to_string())
}

/// Milliseconds of `d` for `PX` and `PEXPIRE` (at least 1: 0 is refused).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis().max(1)).unwrap_or(i64::MAX)
}

/// The Redis backend of [`super::Coordination`].
#[derive(Clone)]
pub(super) struct RedisCoordination {
    client: Client,
    /// The renewal script's SHA-1, computed once.
    renew_sha: String,
}

impl RedisCoordination {
    pub(super) fn new(store: &RedisStore) -> RedisCoordination {
        RedisCoordination {
            client: store.client(),
            renew_sha: fred::util::sha1_hash(RENEW_SCRIPT),
        }
    }

    pub(super) async fn get(&self, key: &str) -> Result<Option<String>, CoordError> {
        self.client.get(key).await.map_err(|e| unavailable(&e))
    }

    pub(super) async fn set_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, CoordError> {
        let expiry = ttl.map(|t| Expiration::PX(millis(t)));
        let set: Option<String> = self
            .client
            .set(key, value, expiry, Some(SetOptions::NX), false)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(set.is_some())
    }

    pub(super) async fn hold(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, CoordError> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let held: i64 = self
            .client
            .eval(HOLD, vec![key], vec![holder, ttl_ms.as_str()])
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(held == 1)
    }

    pub(super) async fn release(&self, key: &str, holder: &str) -> Result<bool, CoordError> {
        let released: i64 = self
            .client
            .eval(RELEASE, vec![key], vec![holder])
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(released == 1)
    }

    pub(super) async fn hash_get(
        &self,
        key: &str,
        field: &str,
    ) -> Result<Option<String>, CoordError> {
        self.client
            .hget(key, field)
            .await
            .map_err(|e| unavailable(&e))
    }

    pub(super) async fn hash_get_all(
        &self,
        key: &str,
    ) -> Result<HashMap<String, String>, CoordError> {
        self.client.hgetall(key).await.map_err(|e| unavailable(&e))
    }

    pub(super) async fn hash_set(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
        life: Option<Duration>,
    ) -> Result<(), CoordError> {
        self.client
            .hset::<(), _, _>(key, fields)
            .await
            .map_err(|e| unavailable(&e))?;
        if let Some(life) = life {
            // The fields are written; a hash that keeps its old life is
            // only kept longer.
            let _ = self.client.pexpire::<(), _>(key, millis(life), None).await;
        }
        Ok(())
    }

    pub(super) async fn hash_delete(
        &self,
        key: &str,
        fields: Vec<String>,
    ) -> Result<(), CoordError> {
        self.client
            .hdel::<(), _, _>(key, fields)
            .await
            .map_err(|e| unavailable(&e))
    }

    pub(super) async fn hash_delete_if(
        &self,
        key: &str,
        fields: Vec<(String, String)>,
    ) -> Result<(), CoordError> {
        let args: Vec<String> = fields.into_iter().flat_map(|(f, v)| [f, v]).collect();
        self.client
            .eval::<i64, _, _, _>(HDEL_IF, vec![key], args)
            .await
            .map(|_| ())
            .map_err(|e| unavailable(&e))
    }

    pub(super) async fn renew_shares(
        &self,
        renewal: &ShareRenewal<'_>,
    ) -> Result<Vec<String>, CoordError> {
        evalsha_or_load::<Vec<String>, _, _>(
            &self.client,
            &self.renew_sha,
            RENEW_SCRIPT,
            renewal.purpose,
            || script_call(renewal),
        )
        .await
        .map_err(|e| unavailable(&e))
    }
}

/// The renewal script's keys and arguments (see `store/lua/global_renew.lua`);
/// `-1` asks the script to use Redis's own clock.
fn script_call<'a>(renewal: &'a ShareRenewal<'_>) -> (Vec<&'a str>, Vec<String>) {
    let keys = renewal.asks.iter().map(|a| a.key.as_str()).collect();
    let mut args: Vec<String> = Vec::with_capacity(7 + 4 * renewal.asks.len());
    args.extend([
        renewal.holder.to_owned(),
        renewal.life_ms.to_string(),
        renewal.floor.to_string(),
        renewal.headroom.to_string(),
        "-1".to_owned(),
        renewal.fallback.share.to_string(),
        renewal.fallback.hold_ms.to_string(),
    ]);
    for a in &renewal.asks {
        args.push(a.rate.to_string());
        args.push(a.demand.to_string());
        args.push(a.base.to_string());
        args.push(a.weight.to_string());
    }
    (keys, args)
}

#[cfg(test)]
mod tests {
    use super::super::ShareAsk;
    use super::*;

    #[test]
    fn a_renewal_sends_the_holder_its_terms_and_four_numbers_per_counter() {
        let renewal = ShareRenewal {
            purpose: "test",
            holder: "eu",
            life_ms: 1500,
            floor: 0.01,
            headroom: 0.05,
            fallback: crate::quota::Fallback {
                share: 0.5,
                hold_ms: 2000,
            },
            asks: vec![
                ShareAsk {
                    key: "a".into(),
                    rate: 10.0,
                    demand: 2.5,
                    base: 4.0,
                    weight: 6.0,
                },
                ShareAsk {
                    key: "b".into(),
                    rate: 1.0,
                    demand: 0.0,
                    base: 0.0,
                    weight: 1.0,
                },
            ],
        };
        let (keys, args) = script_call(&renewal);
        assert_eq!(keys, vec!["a", "b"]);
        assert_eq!(
            args,
            vec![
                "eu", "1500", "0.01", "0.05", "-1", "0.5", "2000", "10", "2.5", "4", "6", "1", "0",
                "0", "1"
            ]
        );
    }
}
