//! Which replica governs a rule: a lease held through the coordination
//! handle.
//!
//! The key `divvy:governor:<label>` holds the holder's name with a time to
//! live of two control intervals. Each interval the holder extends it and
//! any other replica tries to take it, in one atomic step
//! ([`Coordination::hold`]) so that a holder never extends a lease another
//! replica has taken meanwhile. When the holder dies its lease lapses within
//! two intervals and another replica takes it at its next step: within
//! three intervals. Without Redis the handle is this process's own, and
//! this process always governs.

use std::time::Duration;

use crate::coord::{CoordError, Coordination};

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
    coord: Coordination,
    key: String,
    me: String,
}

impl Lease {
    /// The lease for `label`, held under the name `me` through `coord`.
    pub fn new(coord: Coordination, label: &str, me: &str) -> Lease {
        Lease {
            coord,
            key: format!("divvy:governor:{label}"),
            me: me.to_owned(),
        }
    }

    /// Takes or extends the lease for `ttl`. An error (Redis away) means
    /// this replica must not govern: it cannot know that no other does.
    pub async fn hold(&self, ttl: Duration) -> Result<Holding, CoordError> {
        if self.coord.hold(&self.key, &self.me, ttl).await? {
            return Ok(Holding::Mine);
        }
        let holder = self.coord.get(&self.key).await.ok().flatten();
        Ok(Holding::Theirs(holder))
    }

    /// Gives the lease up (when the governor stops), if this replica holds it.
    pub async fn release(&self) {
        let _ = self.coord.release(&self.key, &self.me).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_replica_governs_until_it_lets_go() {
        let coord = Coordination::in_process();
        let a = Lease::new(coord.clone(), "api", "a:1");
        let b = Lease::new(coord, "api", "b:2");
        let ttl = Duration::from_secs(60);
        assert_eq!(a.hold(ttl).await.unwrap(), Holding::Mine);
        assert_eq!(
            b.hold(ttl).await.unwrap(),
            Holding::Theirs(Some("a:1".into()))
        );
        a.release().await;
        assert_eq!(b.hold(ttl).await.unwrap(), Holding::Mine);
    }
}
