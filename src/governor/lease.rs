//! Which replica governs a rule: a lease in Redis.
//!
//! The key `divvy:governor:<label>` holds the holder's name with a time to
//! live of two control intervals. Each interval the holder extends it and
//! any other replica tries to take it (`SET NX PX`), in one script so that
//! a holder never extends a lease another replica has taken meanwhile. When
//! the holder dies its lease lapses within two intervals and another
//! replica takes it at its next step: within three intervals. Without Redis
//! (the memory store) there is one process, and it always governs.

use std::time::Duration;

use fred::prelude::*;

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

/// Whether this replica may govern, and who does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// This replica holds the lease (or needs none).
    Mine,
    /// Another replica holds it (its name, if it could be read).
    Theirs(Option<String>),
}

/// One governor's lease.
#[derive(Clone)]
pub struct Lease {
    client: Option<Client>,
    key: String,
    me: String,
}

impl Lease {
    /// The lease for `label`, held under the name `me`; `client`: `None`
    /// when there is one process (it always governs).
    pub fn new(client: Option<Client>, label: &str, me: &str) -> Lease {
        Lease {
            client,
            key: format!("divvy:governor:{label}"),
            me: me.to_owned(),
        }
    }

    /// Takes or extends the lease for `ttl`. An error (Redis away) means
    /// this replica must not govern: it cannot know that no other does.
    pub async fn hold(&self, ttl: Duration) -> Result<Holding, String> {
        let Some(client) = &self.client else {
            return Ok(Holding::Mine);
        };
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let held: i64 = client
            .eval(
                HOLD,
                vec![self.key.as_str()],
                vec![self.me.as_str(), &ttl_ms],
            )
            .await
            .map_err(|e| e.to_string())?;
        if held == 1 {
            return Ok(Holding::Mine);
        }
        let holder: Option<String> = client.get(self.key.as_str()).await.ok().flatten();
        Ok(Holding::Theirs(holder))
    }

    /// Gives the lease up (when the governor stops), if this replica holds it.
    pub async fn release(&self) {
        if let Some(client) = &self.client {
            let _: Result<i64, _> = client
                .eval(RELEASE, vec![self.key.as_str()], vec![self.me.as_str()])
                .await;
        }
    }
}
