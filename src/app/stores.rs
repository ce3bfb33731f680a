//! The counter store (memory, or Redis behind its failure policy), the
//! memory budget that sizes it, and the global store of global limits.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{AppError, Settings};
use crate::coord::Coordination;
use crate::global::{Global, GlobalOptions};
use crate::knobs::shared::SharedKnobs;
use crate::knobs::Knobs;
use crate::limiter::Limiter;
use crate::memory_budget::{cgroup_limit, plan, LimitSource, MemoryBudget, MemoryLimit, Reserved};
use crate::observe::metrics::Metrics;
use crate::rules::bounded::{fresh_secret_hex, secret_hex, set_secret_hex, SECRET_KEY};
use crate::store::failover::FailoverStore;
use crate::store::memory::SystemClock;
use crate::store::over_limit::OverLimitCache;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::redis_url::RedisTarget;
use crate::store::{MemoryStore, Store};

/// The counter store and what shares its Redis.
pub(super) struct StoreParts {
    pub store: Arc<dyn Store>,
    pub knobs: Knobs,
    /// Coordination through the counters' Redis (this process's own without
    /// it): the regional store of global limits, where governors elect their
    /// leader, where RLQS limits are shared and the actor-hash key agreed.
    pub coord: Coordination,
    /// Keys of full counters refunds gave credits back to (with the
    /// over-limit cache on Redis), for the other replicas' caches.
    pub refunds: Option<tokio::sync::mpsc::Receiver<String>>,
}

/// The memory budget: `memory_limit` (0: none), else the cgroup's limit;
/// logged, and exported in `metrics` as `divvy_memory_budget_bytes` and
/// `divvy_max_counters`.
pub(super) fn memory_budget(s: &Settings, rules: usize, metrics: &Metrics) -> MemoryBudget {
    let limit = match s.memory_limit {
        Some(0) => None,
        Some(bytes) => Some(MemoryLimit {
            bytes,
            source: LimitSource::Flag,
        }),
        None => cgroup_limit(),
    };
    let over_limit_cache = match s.redis {
        Some(_) => s.over_limit_cache as u64 * crate::store::over_limit::ENTRY_BYTES,
        None => 0,
    };
    let reserved = Reserved {
        offenders: crate::observe::offenders::MAX_BYTES,
        over_limit_cache,
        history: rules as u64 * crate::observe::history::RULE_BYTES,
    };
    let resident = crate::memory_budget::resident_bytes();
    let budget = plan(limit, resident, reserved, s.max_counters);
    let store = &metrics.store;
    store
        .memory_budget
        .set(budget.limit.as_ref().map_or(0, |l| l.bytes) as i64);
    store.max_counters.set(budget.max_counters as i64);
    match &budget.limit {
        Some(l) => info!(
            limit_bytes = l.bytes,
            source = ?l.source,
            headroom_bytes = budget.headroom,
            reserved_bytes = budget.reserved.total(),
            max_counters = budget.max_counters,
            limited_by_memory = budget.limited_by_memory,
            "memory budget"
        ),
        None => info!(
            max_counters = budget.max_counters,
            "no memory limit (no --memory-limit, no cgroup limit): --max-counters alone caps the counters"
        ),
    }
    budget
}

/// The memory store, or Redis behind its failure policy (with the knobs
/// shared through it); the stores record to `metrics` (the service's: what
/// its `/metrics` serves).
pub(super) async fn build_store(
    s: &Settings,
    max_counters: usize,
    metrics: &Arc<Metrics>,
) -> Result<StoreParts, AppError> {
    let Some(target) = s.redis.clone() else {
        let memory = Arc::new(MemoryStore::with_max_counters(
            Arc::new(SystemClock::default()),
            max_counters,
            metrics.clone(),
        ));
        memory.spawn_sweeper(s.sweep.max(Duration::from_secs(1)));
        info!("counters in the embedded memory store");
        return Ok(StoreParts {
            store: memory,
            knobs: Knobs::local(metrics.clone()),
            coord: Coordination::in_process(),
            refunds: None,
        });
    };
    info!(target = ?target, policy = ?s.on_store_failure, "counters in redis");
    let files = &s.redis_tls;
    if !target.tls && (files.ca.is_some() || files.cert.is_some() || files.key.is_some()) {
        warn!("Redis TLS files are given but the counters' Redis is not TLS (use rediss:// or --redis-tls); they are not used for it");
    }
    let options = redis_options(s, target, s.redis_timeout, s.redis_batches_in_flight)?;
    let (redis, connected) = RedisStore::connect(&options, Duration::from_secs(2)).await?;
    let coord = Coordination::redis(&redis);
    let mut primary: Arc<dyn Store> = Arc::new(redis);
    let mut refunds = None;
    if s.over_limit_cache > 0 {
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        refunds = Some(rx);
        let cache = OverLimitCache::new(
            primary,
            s.over_limit_cache,
            Arc::new(SystemClock::default()),
            metrics.clone(),
        );
        primary = Arc::new(cache.with_refunds(tx));
    }
    let failover = FailoverStore::new(primary, s.on_store_failure, s.local_share, metrics.clone())
        .with_breaker(options.timeout, s.breaker_failures)
        .with_max_counters(max_counters);
    let failover = Arc::new(if connected {
        failover
    } else {
        failover.start_failed()
    });
    failover.spawn_probe();
    Ok(StoreParts {
        store: failover,
        knobs: Knobs::shared(SharedKnobs::new(coord.clone()), metrics.clone()),
        coord,
        refunds,
    })
}

/// Options of a Redis client for `target`, with TLS from the settings' files
/// when the target uses TLS.
fn redis_options(
    s: &Settings,
    target: RedisTarget,
    timeout: Duration,
    batches_in_flight: usize,
) -> Result<RedisOptions, AppError> {
    let tls = match target.tls {
        true => Some(Arc::new(s.redis_tls.client_config()?)),
        false => None,
    };
    Ok(RedisOptions {
        tls,
        target,
        timeout: timeout.max(Duration::from_millis(1)),
        clock: None,
        batches_in_flight,
    })
}

/// With a global store, the limiter counts global limits against this
/// region's leases; the global store then holds the actor-hash key (else
/// the counters' Redis does, if shared). Returns where that key is agreed.
pub(super) async fn with_global(
    s: &Settings,
    limiter: Limiter,
    coord: &Coordination,
) -> Result<(Limiter, Option<Coordination>), AppError> {
    let regional = coord.is_shared().then(|| coord.clone());
    let Some(target) = s.global.clone() else {
        return Ok((limiter, regional));
    };
    let timeout = (s.global_lease / 4).max(Duration::from_millis(50));
    let options = redis_options(
        s,
        target,
        timeout,
        crate::store::redis::DEFAULT_BATCHES_IN_FLIGHT,
    )?;
    let (global_store, connected) = RedisStore::connect(&options, Duration::from_secs(2)).await?;
    if !connected {
        warn!("global store unreachable at startup; global limits start on conservative quotas");
    }
    let global_coord = Coordination::redis(&global_store);
    let global = Arc::new(Global::new(
        GlobalOptions {
            region: s.region.clone(),
            period: s.global_lease.max(Duration::from_millis(100)),
            fallback_share: s.global_fallback_share.clamp(0.0, 1.0),
            fallback: s.global_fallback,
            floor: s.global_floor.clamp(0.0, 1.0),
            headroom: 0.05,
            replica: s.replica.clone(),
        },
        global_coord.clone(),
        regional,
        limiter.telemetry().metrics.clone(),
    ));
    global.weigh_by(limiter.fair().clone());
    global.spawn();
    info!(region = %s.region, holder = %global.holder(), "global limits coordinated through the global store");
    // Every region hashes long actor values with one key.
    Ok((limiter.with_global(global), Some(global_coord)))
}

/// Agrees with the other replicas on the key that hashes long actor values
/// (see `crate::rules::bounded`), retrying every second while Redis does
/// not answer; meanwhile this replica uses a key of its own, so a long
/// value may count on a different counter than on other replicas.
///
/// Then, every 30 s, puts the key back if Redis lost it, so replicas
/// started later still agree with this one.
pub(super) async fn agree_on_key_secret(coord: Coordination) {
    let agreed = agree_on_secret(&coord).await;
    if !agreed {
        warn!(
            "could not read the shared key for long actor values from Redis; retrying every second"
        );
    }
    tokio::spawn(async move {
        if !agreed {
            while !agree_on_secret(&coord).await {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            info!("agreed on the shared key for long actor values through Redis");
        }
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            keep_secret(&coord).await;
        }
    });
}

/// Agrees on the hash key with every replica: offers a fresh one (written
/// only if none is stored) and uses whichever is stored. False when Redis
/// did not answer (this process keeps its own key meanwhile).
async fn agree_on_secret(coord: &Coordination) -> bool {
    let offer = fresh_secret_hex();
    if coord.set_if_absent(SECRET_KEY, &offer, None).await.is_err() {
        return false;
    }
    match coord.get(SECRET_KEY).await {
        Ok(Some(hex)) if set_secret_hex(&hex) => true,
        Ok(Some(_)) => {
            warn!("{SECRET_KEY} in Redis is not 32 hex digits; long actor values are hashed with this replica's own key (delete the key to let replicas agree again)");
            true
        }
        // Gone between the write and the read: try again.
        Ok(None) | Err(_) => false,
    }
}

/// Puts this process's key back if it is gone (a flush, an eviction), so
/// replicas started later agree with the running ones; a different stored
/// key is only reported (switching would move every long actor to a new
/// counter). False when Redis did not answer.
async fn keep_secret(coord: &Coordination) -> bool {
    let mine = secret_hex();
    match coord.set_if_absent(SECRET_KEY, &mine, None).await {
        Err(_) => false,
        Ok(true) => {
            warn!("{SECRET_KEY} had gone from Redis; this replica's key is stored again");
            true
        }
        Ok(false) => {
            if let Ok(Some(hex)) = coord.get(SECRET_KEY).await {
                if hex != mine {
                    warn!("{SECRET_KEY} in Redis differs from the key this replica hashes long actor values with (it changed while this replica ran); restart replicas to agree again");
                }
            }
            true
        }
    }
}
