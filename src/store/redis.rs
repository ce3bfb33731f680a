//! The Redis store: counters shared by every replica.
//!
//! Every check-and-consume is one Lua script (`lua/divvy_window.lua`) run
//! with EVALSHA, over all the counters of a request at once, so a request is
//! one round trip. On a single server (or Sentinel master), concurrent
//! requests also share script calls: a batcher task gathers the counters of
//! every request waiting at that moment into one EVALSHA (each request's
//! counters contiguous and in order, so each request is still applied
//! atomically and its counters in its own order), with a few batches in
//! flight at once; batches in flight together may reach Redis in any order. One script call
//! then carries many requests, which is what lets one Redis serve far more
//! requests per second than it runs scripts. In a Cluster, the counters are grouped by hash slot (a
//! script may only touch one slot) and the groups go out in parallel; the
//! client pipelines them per node. A lost script cache (Redis restarted,
//! `SCRIPT FLUSH`) is detected by `NOSCRIPT` and the script reloaded on
//! every node before the call is retried once.
//!
//! The client is [fred]: it supports single servers, Cluster and Sentinel
//! (following failovers) natively, pipelines concurrent commands on one
//! connection, and reconnects on its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use fred::prelude::*;
use fred::types::config::{ClusterDiscoveryPolicy, Server, TlsConnector};

use super::redis_url::{HostPort, RedisTarget, Topology};
use super::{Algorithm, CounterOp, CounterState, Store, StoreError, StoreFuture};

/// The counter script.
pub const SCRIPT: &str = include_str!("lua/divvy_window.lua");

/// Connection settings.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Longest wait for one command (and for a connection attempt).
    pub timeout: Duration,
}

/// The key the health probe writes (one credit, expiring after a second).
pub const PROBE_KEY: &str = "divvy:__probe__";

/// Most counters sent in one batched script call.
pub const MAX_BATCH_KEYS: usize = 512;
/// Most batched script calls in flight at once.
pub const MAX_BATCHES_IN_FLIGHT: usize = 2;

/// Counters in Redis.
pub struct RedisStore {
    core: Arc<Core>,
    /// Requests waiting to be batched (single server and Sentinel).
    batcher: Option<mpsc::Sender<Pending>>,
}

/// The client and the script.
struct Core {
    client: Client,
    sha: String,
}

/// One request's counters waiting for a batch.
struct Pending {
    ops: Vec<CounterOp>,
    reply: oneshot::Sender<Result<Vec<CounterState>, StoreError>>,
}

fn server(h: &HostPort) -> Server {
    Server::new(h.host.clone(), h.port)
}

fn store_error(e: &Error) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

impl RedisStore {
    /// Builds the client, starts connecting (and reconnecting) in the
    /// background, and waits up to `startup_wait` for the first connection.
    /// Returns the store and whether Redis answered; the service starts
    /// either way, and a failure policy decides until Redis is reachable.
    pub async fn connect(
        options: &RedisOptions,
        startup_wait: Duration,
    ) -> Result<(RedisStore, bool), StoreError> {
        let t = &options.target;
        let server_config = match &t.topology {
            Topology::Single { server: s, .. } => ServerConfig::Centralized { server: server(s) },
            Topology::Cluster { seeds } => ServerConfig::Clustered {
                hosts: seeds.iter().map(server).collect(),
                policy: ClusterDiscoveryPolicy::default(),
            },
            Topology::Sentinel { sentinels, master } => ServerConfig::Sentinel {
                hosts: sentinels.iter().map(server).collect(),
                service_name: master.clone(),
            },
        };
        let tls = if t.tls {
            Some(
                TlsConnector::default_rustls()
                    .map_err(|e| store_error(&e))?
                    .into(),
            )
        } else {
            None
        };
        let config = Config {
            server: server_config,
            username: t.username.clone(),
            password: t.password.clone(),
            database: match &t.topology {
                Topology::Single { db, .. } => *db,
                _ => None,
            },
            // Keep trying when Redis is down at startup too.
            fail_fast: false,
            tls,
            ..Config::default()
        };
        let timeout = options.timeout;
        let client = Builder::from_config(config)
            .with_performance_config(|p| {
                p.default_command_timeout = timeout;
            })
            .with_connection_config(|c| {
                c.connection_timeout = timeout.max(Duration::from_millis(500));
                c.internal_command_timeout = timeout.max(Duration::from_millis(500));
                c.max_command_attempts = 1;
                c.unresponsive.max_timeout = Some(timeout.max(Duration::from_millis(500)) * 4);
                c.unresponsive.interval = Duration::from_millis(100);
            })
            .set_policy(ReconnectPolicy::new_constant(0, 200))
            .build()
            .map_err(|e| store_error(&e))?;
        // Connection and reconnection run in the background from here on.
        let _task = client.connect();
        let cluster = matches!(t.topology, Topology::Cluster { .. });
        let core = Arc::new(Core {
            client,
            sha: fred::util::sha1_hash(SCRIPT),
        });
        let batcher = (!cluster).then(|| {
            let (tx, rx) = mpsc::channel(4 * MAX_BATCH_KEYS);
            tokio::spawn(run_batcher(core.clone(), rx));
            tx
        });
        let store = RedisStore { core, batcher };
        let connected = matches!(
            tokio::time::timeout(startup_wait, store.core.client.wait_for_connect()).await,
            Ok(Ok(()))
        ) && store.probe().await.is_ok();
        Ok((store, connected))
    }
}

/// Gathers waiting requests into script calls until the store is dropped.
async fn run_batcher(core: Arc<Core>, mut rx: mpsc::Receiver<Pending>) {
    let permits = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot first: requests arriving meanwhile join this batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        let mut keys = batch[0].ops.len();
        while keys < MAX_BATCH_KEYS {
            match rx.try_recv() {
                Ok(p) => {
                    keys += p.ops.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let core = core.clone();
        tokio::spawn(async move {
            let all: Vec<&CounterOp> = batch.iter().flat_map(|p| p.ops.iter()).collect();
            let result = core.eval_group(&all).await;
            drop(all);
            match result {
                Ok(states) => {
                    let mut states = states.into_iter();
                    for p in batch {
                        let mine: Vec<CounterState> = states.by_ref().take(p.ops.len()).collect();
                        let _ = p.reply.send(Ok(mine));
                    }
                }
                Err(e) => {
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
            drop(permit);
        });
    }
}

impl Core {
    /// Runs the script on one group of ops (all in one hash slot).
    async fn eval_group(&self, ops: &[&CounterOp]) -> Result<Vec<CounterState>, StoreError> {
        let keys: Vec<&str> = ops.iter().map(|op| op.key.as_str()).collect();
        let mut args: Vec<i64> = Vec::with_capacity(ops.len() * 3);
        // A refund is sent as a negative cost.
        for op in ops {
            match op.algorithm {
                Algorithm::DivvyWindow => {}
            }
            args.push(i64::try_from(op.limit).unwrap_or(i64::MAX));
            args.push(i64::try_from(op.window.as_secs().max(1)).unwrap_or(i64::MAX));
            let cost = i64::try_from(op.cost).unwrap_or(i64::MAX);
            args.push(if op.refund { -cost } else { cost });
        }
        let first: Result<Vec<i64>, Error> = self
            .client
            .evalsha(self.sha.as_str(), keys.clone(), args.clone())
            .await;
        let raw = match first {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                tracing::info!("redis lost the counter script; loading it again");
                self.client
                    .script_load_cluster::<(), _>(SCRIPT)
                    .await
                    .map_err(|e| store_error(&e))?;
                self.client
                    .evalsha::<Vec<i64>, _, _, _>(self.sha.as_str(), keys, args)
                    .await
                    .map_err(|e| store_error(&e))?
            }
            other => other.map_err(|e| store_error(&e))?,
        };
        if raw.len() != ops.len() * 3 {
            return Err(StoreError::Unavailable(format!(
                "redis: the counter script returned {} values for {} counters",
                raw.len(),
                ops.len()
            )));
        }
        Ok(raw
            .chunks_exact(3)
            .map(|c| CounterState {
                allowed: c[0] == 1,
                remaining: u64::try_from(c[1]).unwrap_or(0),
                reset_after: Duration::from_millis(u64::try_from(c[2]).unwrap_or(0)),
            })
            .collect())
    }

    /// Cluster: one script call per hash slot.
    async fn apply_cluster(&self, ops: &[CounterOp]) -> Result<Vec<CounterState>, StoreError> {
        // One script call per hash slot; ops on one key share a slot, so
        // their order is kept. Groups run in parallel.
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            groups
                .entry(fred::util::redis_keyslot(op.key.as_bytes()))
                .or_default()
                .push(i);
        }
        let calls = groups.values().map(|idx| {
            let group: Vec<&CounterOp> = idx.iter().map(|&i| &ops[i]).collect();
            async move { self.eval_group(&group).await }
        });
        let results = futures_util::future::join_all(calls).await;
        let mut states = vec![
            CounterState {
                allowed: false,
                remaining: 0,
                reset_after: Duration::ZERO,
            };
            ops.len()
        ];
        for (idx, result) in groups.values().zip(results) {
            for (&i, state) in idx.iter().zip(result?) {
                states[i] = state;
            }
        }
        Ok(states)
    }
}

impl Store for RedisStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        Box::pin(async move {
            if ops.is_empty() {
                return Ok(Vec::new());
            }
            let Some(batcher) = &self.batcher else {
                return self.core.apply_cluster(ops).await;
            };
            let (reply, answer) = oneshot::channel();
            batcher
                .send(Pending {
                    ops: ops.to_vec(),
                    reply,
                })
                .await
                .map_err(|_| StoreError::Unavailable("redis: the batcher stopped".into()))?;
            // The batch's script call carries the command timeout, so an
            // answer always comes; no timer per request.
            answer.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "redis: the batch was dropped".into(),
                ))
            })
        })
    }

    fn peek<'a>(
        &'a self,
        key: &'a str,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        Box::pin(async move {
            let client = &self.core.client;
            let value: Option<i64> = client.get(key).await.map_err(|e| store_error(&e))?;
            let ttl: i64 = client.pttl(key).await.map_err(|e| store_error(&e))?;
            Ok(value.map(|left| CounterState {
                allowed: left > 0,
                remaining: u64::try_from(left).unwrap_or(0),
                reset_after: Duration::from_millis(u64::try_from(ttl).unwrap_or(0)),
            }))
        })
    }

    /// Runs the counter script on a probe key (one credit, one second), so
    /// a Redis that answers PING but cannot write (a read-only replica after
    /// a failover, out of memory, still loading) counts as failing.
    fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let op = CounterOp {
                key: PROBE_KEY.to_owned(),
                limit: 1,
                window: Duration::from_secs(1),
                cost: 1,
                refund: false,
                algorithm: Algorithm::DivvyWindow,
            };
            self.core.eval_group(&[&op]).await.map(|_| ())
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
