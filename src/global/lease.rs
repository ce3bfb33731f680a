//! A region's lease of a global counter: which quota is in force (the
//! lease, its fallback share, the floor) and the token-bucket numbers a
//! lease is counted with.

/// A region's share of one global counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lease {
    /// Credits per second.
    pub rate: f64,
    /// Burst in credits.
    pub burst: u64,
    /// Epoch ms after which it no longer holds.
    pub expires_at_ms: u64,
    /// Whether it is a conservative quota standing in for a lease.
    pub fallback: bool,
}

/// Which quota a region decides a counter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its lease.
    Lease,
    /// The fallback share of its last lease (the global store fails).
    Fallback,
    /// The floor: before the first lease, or cut off from the global store
    /// for longer than the fallback time.
    Floor,
}

impl Lease {
    /// Which quota is in force at `now_ms` when the fallback lasts
    /// `hold_ms` past a lease's expiry. A fallback lease (installed when a
    /// renewal failed) already holds the reduced share until its expiry.
    pub fn phase(&self, now_ms: u64, hold_ms: u64) -> Phase {
        if self.expires_at_ms > now_ms {
            if self.fallback {
                Phase::Fallback
            } else {
                Phase::Lease
            }
        } else if !self.fallback && self.expires_at_ms.saturating_add(hold_ms) > now_ms {
            Phase::Fallback
        } else {
            Phase::Floor
        }
    }
}

/// The quota `(credits per second, burst)` in force at `now_ms` under
/// `lease` (the last one installed, if any): the lease, its fallback share,
/// or `floor` (the floor's quota of the counter). Never less than the
/// floor: a grant below it (others hold the rest until they give it back)
/// is counted as the floor too, so a lease's bucket never drains slower
/// than the floor's (see [`lease_bucket`]) and one that grows out of a
/// trickle gives no credits at once.
pub(super) fn quota_at(
    lease: Option<&Lease>,
    now_ms: u64,
    fallback: &crate::quota::Fallback,
    floor: (f64, u64),
) -> (f64, u64) {
    let Some(l) = lease else {
        return floor;
    };
    let quota = match l.phase(now_ms, fallback.hold_ms) {
        Phase::Lease => (l.rate, l.burst.max(1)),
        Phase::Fallback if l.fallback => (l.rate, l.burst.max(1)),
        Phase::Fallback => (
            l.rate * fallback.share,
            ((l.burst as f64 * fallback.share) as u64).max(1),
        ),
        Phase::Floor => floor,
    };
    if quota.0 < floor.0 {
        floor
    } else {
        quota
    }
}

/// How a region's bucket of a global limit counts a lease: the numbers of
/// its token-bucket op ([`lease_bucket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseBucket {
    /// Capacity units refilled per ms (the op's limit per window).
    pub limit: u64,
    /// The op's window in ms: the capacity units one credit takes.
    pub window_ms: u64,
    /// The lease's burst in credits.
    pub burst: u64,
}

/// The token-bucket numbers of a lease of `rate` credits per second and
/// `burst` credits, of a limit whose whole burst is `whole_burst` per
/// `reset_seconds`. The bucket's capacity in units (burst × window) is the
/// same whatever the lease, so what a bucket has used carries over a lease
/// change as the same fraction of the new burst: a lease that grows gives
/// no credits at once (a full-capacity jump would: a third of the world's
/// burst when a region's share of three grows by half), and one that
/// shrinks leaves no debt. Thousandths of a unit keep small rates exact.
/// This holds while the lease has at least one credit of burst (a rate of
/// at least the whole rate over the whole burst): below, the burst stays 1
/// and the refill slows, and a later, faster refill applies to the time
/// since the bucket was last written (at most a burst at once).
pub fn lease_bucket(rate: f64, burst: u64, whole_burst: u64, reset_seconds: u64) -> LeaseBucket {
    let burst = burst.max(1);
    let capacity = whole_burst
        .max(burst)
        .saturating_mul(reset_seconds.max(1))
        .saturating_mul(1_000_000)
        .min(crate::store::algorithm::MAX_CREDIT_MS);
    let window_ms = (capacity / burst).max(1);
    let limit = (rate.max(0.0) * window_ms as f64 / 1000.0).floor() as u64;
    LeaseBucket {
        limit: limit.max(1),
        window_ms,
        burst,
    }
}
