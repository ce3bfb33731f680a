//! The Redis store: counters shared by every replica.
//!
//! Every check-and-consume is one Lua script ([`SCRIPT`], joined from
//! `lua/`: the mirror of [`super::algorithm`]) run with EVALSHA over all of a request's
//! counters: one round trip, atomic, on Redis `TIME` so skewed replicas
//! agree. On a single server (or Sentinel master) a batcher puts the
//! counters of every waiting request into one call (each request contiguous,
//! so still atomic), one call out at a time by default; in a Cluster it
//! makes one call per hash slot, in parallel, of the requests whose
//! counters share a slot. A Cluster request over several slots is charged
//! slot by slot and given back if any slot denies ([`RedisStore::apply`]):
//! never over the limits, but a concurrent request may see the credit taken
//! for that instant. A lost script cache
//! (`NOSCRIPT`) reloads it on every node and retries once. Client: [fred].

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use fred::prelude::*;
use fred::types::config::{ClusterDiscoveryPolicy, Server, TlsConnector};

use super::algorithm::window_ms;
use super::memory::Clock;
use super::redis_tls::RedisTls;
use super::redis_url::{HostPort, RedisTarget, Topology};
use super::{Algorithm, Charge, CounterOp, CounterState, Store, StoreError, StoreFuture};

/// The counter script (see [`super::algorithm::SCRIPT`]).
pub const SCRIPT: &str = super::algorithm::SCRIPT;

mod answer;
mod cluster;
mod connect;
mod script;
mod trace;

pub use answer::integers as answer_integers;
use cluster::*;
use connect::*;
use script::*;
pub use script::{push_run, MAX_REQUEST_COUNTERS, RUN};

/// Connection settings.
#[derive(Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Longest wait for one command (and for a connection attempt).
    pub timeout: Duration,
    /// A clock to send the script instead of letting it read Redis `TIME`:
    /// only for tests that run both stores on one simulated clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// Most batched script calls out at once on a single server or Sentinel
    /// master (at least 1; see [`DEFAULT_BATCHES_IN_FLIGHT`]).
    pub batches_in_flight: usize,
    /// The TLS client configuration, used when the target asks for TLS;
    /// `None`: the system's trust store, no client certificate (see
    /// [`super::redis_tls`]).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// How often one repeated connection error is logged again: the client
/// retries every 200 ms.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Batched script calls out at once by default: one. Requests that arrive
/// while a call is out wait for it and go together in the next, so calls
/// are larger and fewer: measured at less CPU per HIT on both sides and
/// lower paced latency than two out (docs/performance.md, "Batching Redis
/// calls"). Where Redis is far, a request that arrives while a call is out
/// waits up to one more round trip than with two out:
/// `--redis-batches-in-flight 2` trades Redis CPU for that.
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 1;

/// Most batched script calls out at once that `--redis-batches-in-flight`
/// accepts.
pub const MAX_BATCHES_IN_FLIGHT: usize = 64;

/// The key the health probe writes (one credit, expiring after a second).
pub const PROBE_KEY: &str = "divvy:__probe__";

/// Most counters sent in one batched script call.
pub const MAX_BATCH_KEYS: usize = 512;
/// Most distinct limit shapes looked up when a batch's script arguments are
/// built; a counter whose shape is not among the first ones adds its own
/// (the script reads it just the same), so a batch of many rules costs no
/// more than linear time.
const SHAPES_SEARCHED: usize = 16;

/// Counters in Redis.
pub struct RedisStore {
    core: Arc<Core>,
    /// Requests waiting to be batched (single server and Sentinel).
    batcher: mpsc::Sender<Pending>,
    /// A Cluster: requests whose counters share a hash slot are batched
    /// per slot; the others are charged slot by slot ([`cluster_call`]).
    cluster: bool,
}

/// The client and the script.
struct Core {
    client: Client,
    sha: String,
    clock: Option<Arc<dyn Clock>>,
}

/// One request's counters waiting for a batch.
struct Pending {
    ops: Vec<CounterOp>,
    charge: Charge,
    reply: oneshot::Sender<Result<Vec<CounterState>, StoreError>>,
    /// In a Cluster, the one hash slot of all its counters (a request over
    /// several slots is not batched).
    slot: u16,
    /// The decision span of a traced request (its store span's parent).
    trace: Option<opentelemetry::trace::SpanContext>,
}

/// The counters of one request as the script takes them.
type Part<'a> = (&'a [CounterOp], Charge);

fn server(h: &HostPort) -> Server {
    Server::new(h.host.clone(), h.port)
}

fn store_error(e: &Error) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::TimedOut(format!("redis: {e}")),
        ErrorKind::InvalidArgument | ErrorKind::InvalidCommand | ErrorKind::Parse => {
            StoreError::Refused(format!("redis: {e}"))
        }
        _ => StoreError::Unavailable(format!("redis: {e}")),
    }
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
        let config = fred_config(options)?;
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
        spawn_error_log(&client, t);
        // Connection and reconnection run in the background from here on.
        let _task = client.connect();
        let cluster = matches!(t.topology, Topology::Cluster { .. });
        let core = Arc::new(Core {
            client,
            sha: fred::util::sha1_hash(SCRIPT),
            clock: options.clock.clone(),
        });
        let batcher = {
            let (tx, rx) = mpsc::channel(4 * MAX_BATCH_KEYS);
            let calls = options.batches_in_flight.clamp(1, MAX_BATCHES_IN_FLIGHT);
            tokio::spawn(run_batcher(core.clone(), rx, calls));
            tx
        };
        let store = RedisStore {
            core,
            batcher,
            cluster,
        };
        let connected = matches!(
            tokio::time::timeout(startup_wait, store.core.client.wait_for_connect()).await,
            Ok(Ok(()))
        ) && store.probe().await.is_ok();
        Ok((store, connected))
    }
}

impl RedisStore {
    /// The Redis client (other shared state, such as knobs, uses it too).
    pub fn client(&self) -> Client {
        self.core.client.clone()
    }
}

/// Gathers waiting requests into script calls until the store is dropped,
/// with at most `calls` out at once (see [`DEFAULT_BATCHES_IN_FLIGHT`]). Each
/// call runs in a task of its own, so a panic there loses that batch only
/// (its requests see "the batch was dropped").
async fn run_batcher(core: Arc<Core>, mut rx: mpsc::Receiver<Pending>, calls: usize) {
    let permits = Arc::new(Semaphore::new(calls));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot first: requests arriving meanwhile join this batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        // Let the tasks already woken run first (connections whose requests
        // were read in the same poll), so that what arrived together goes
        // together.
        tokio::task::yield_now().await;
        // A request whose caller stopped waiting (its deadline passed while
        // a hung call was out, or it went away) is not sent: the failure
        // policy has answered it.
        let mut batch = Vec::new();
        let mut keys = 0;
        let mut next = Some(first);
        while let Some(p) = next.take() {
            if !p.reply.is_closed() {
                keys += p.ops.len();
                batch.push(p);
            }
            if keys < MAX_BATCH_KEYS {
                next = rx.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        let core = core.clone();
        tokio::spawn(async move {
            // One script call per hash slot, in parallel; a batch of one slot
            // (always, on a single server) is the one call, with no map of
            // slots and no join to build.
            let first_slot = batch.first().map_or(0, |p| p.slot);
            if batch.iter().all(|p| p.slot == first_slot) {
                eval_batch(&core, batch).await;
            } else {
                let mut slots: BTreeMap<u16, Vec<Pending>> = BTreeMap::new();
                for p in batch {
                    slots.entry(p.slot).or_default().push(p);
                }
                let calls = slots.into_values().map(|b| eval_batch(&core, b));
                futures_util::future::join_all(calls).await;
            }
            drop(permit);
        });
    }
}

/// One script call over the requests of `batch` (one hash slot); each gets
/// its answers.
async fn eval_batch(core: &Core, batch: Vec<Pending>) {
    let parts: Vec<Part<'_>> = batch.iter().map(|p| (p.ops.as_slice(), p.charge)).collect();
    // Boxed: the call future (fred's included) is large, and inline it made
    // the task large too, copied whole when spawned and when done.
    let traced = trace::start(&batch);
    let result = Box::pin(core.eval(&parts)).await;
    drop(parts);
    if let Some(start) = traced {
        trace::finish(&batch, start, result.is_ok());
    }
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
}

/// Runs `script` by its `sha`; when Redis has lost it (`NOSCRIPT`: a restart,
/// `SCRIPT FLUSH`), loads it again on every node and retries once.
/// `keys_args` builds the call's keys and arguments, a second time only for
/// that retry: cloning them for every call cost more.
pub(crate) async fn evalsha_or_load<R, K, V>(
    client: &Client,
    sha: &str,
    script: &str,
    what: &str,
    mut keys_args: impl FnMut() -> (K, V),
) -> Result<R, Error>
where
    R: FromValue,
    K: Into<fred::types::MultipleKeys> + Send,
    V: TryInto<fred::types::MultipleValues> + Send,
    V::Error: Into<Error> + Send,
{
    let (keys, args) = keys_args();
    match client.evalsha(sha, keys, args).await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            tracing::info!("redis lost the {what} script; loading it again");
            client.script_load_cluster::<(), _>(script).await?;
            let (keys, args) = keys_args();
            client.evalsha(sha, keys, args).await
        }
        other => other,
    }
}

impl Core {
    /// Runs the script once over the counters of several requests (all in
    /// one hash slot in a Cluster); answers in order.
    async fn eval(&self, parts: &[Part<'_>]) -> Result<Vec<CounterState>, StoreError> {
        self.eval_with(parts, false).await
    }

    /// [`Core::eval`]; with `undo`, every op gives back a charge this store
    /// just made, and a divvy window given back to full credits is removed
    /// (the charge had opened it).
    async fn eval_with(
        &self,
        parts: &[Part<'_>],
        undo: bool,
    ) -> Result<Vec<CounterState>, StoreError> {
        let count: usize = parts.iter().map(|(ops, _)| ops.len()).sum();
        let raw: fred::bytes::Bytes =
            evalsha_or_load(&self.client, &self.sha, SCRIPT, "counter", || {
                let (keys, args) = script_args(parts, count, undo, self.now());
                (key_bytes(&keys), decimal_args(&args))
            })
            .await
            .map_err(|e| store_error(&e))?;
        parse_answer(&answer::integers(&raw)?, count)
    }

    /// The time sent to the script: the injected clock's, or -1 (the
    /// script reads Redis `TIME`).
    fn now(&self) -> i64 {
        self.clock.as_ref().map_or(-1, |c| {
            i64::try_from(c.now().as_millis()).unwrap_or(i64::MAX)
        })
    }

    /// Cluster: one script call per hash slot, in parallel; then the charges
    /// of groups (or all-or-nothing requests) that another slot denied are
    /// given back.
    async fn apply_cluster(
        &self,
        ops: &[CounterOp],
        charge: Charge,
    ) -> Result<Vec<CounterState>, StoreError> {
        // Group ids from the joint flags.
        let mut group = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let g = if i > 0 && op.joint { group[i - 1] } else { i };
            group.push(g);
        }
        let slots = by_slot(ops);
        let (mut states, charged) = self.charge_slots(ops, &group, &slots, charge).await?;
        if slots.len() < 2 {
            return Ok(states);
        }
        // What the request as a whole decided.
        let mut group_ok = vec![true; ops.len()];
        for (i, s) in states.iter().enumerate() {
            group_ok[group[i]] &= s.allowed;
        }
        let blocked = charge == Charge::Denied
            || (charge == Charge::AllOrNothing
                && (0..ops.len()).any(|i| ops[i].decides && !group_ok[group[i]]));
        let undo: Vec<usize> = (0..ops.len())
            .filter(|&i| charged[i] && (blocked || !group_ok[group[i]]))
            .collect();
        if !undo.is_empty() {
            let given = self.give_back(ops, &undo).await?;
            for (&i, state) in undo.iter().zip(given) {
                // A denied overdraft given back stays denied, as answered.
                if states[i].allowed {
                    states[i] = CounterState {
                        allowed: true,
                        ..state
                    };
                }
                // Given back: nothing stays charged past what was left.
                states[i].overdrawn = 0;
            }
        }
        Ok(states)
    }

    /// One script call per slot of `slots`, in parallel (each slot's ops
    /// regrouped by `group`): every op's state, and whether it was charged.
    async fn charge_slots(
        &self,
        ops: &[CounterOp],
        group: &[usize],
        slots: &BTreeMap<u16, Vec<usize>>,
        charge: Charge,
    ) -> Result<(Vec<CounterState>, Vec<bool>), StoreError> {
        let sub: Vec<Vec<CounterOp>> = slots
            .values()
            .map(|idx| {
                idx.iter()
                    .enumerate()
                    .map(|(n, &i)| CounterOp {
                        joint: n > 0 && group[idx[n - 1]] == group[i],
                        ..ops[i].clone()
                    })
                    .collect()
            })
            .collect();
        let calls = sub
            .iter()
            .map(|part| async move { self.eval(&[(part.as_slice(), charge)]).await });
        let results = futures_util::future::join_all(calls).await;
        let mut states = vec![
            CounterState {
                allowed: false,
                remaining: 0,
                reset_after: Duration::ZERO,
                overdrawn: 0,
            };
            ops.len()
        ];
        let mut charged = vec![false; ops.len()];
        // Each group's number of ops (by the group's first op).
        let mut size = vec![0usize; ops.len()];
        for &g in group {
            size[g] += 1;
        }
        for ((idx, part), result) in slots.values().zip(&sub).zip(results) {
            let got = result?;
            let split: Vec<bool> = idx.iter().map(|&i| size[group[i]] > 1).collect();
            let local = charged_in_slot(part, &got, charge, &split);
            for ((&i, state), was) in idx.iter().zip(got).zip(local) {
                states[i] = state;
                charged[i] = was;
            }
        }
        Ok((states, charged))
    }

    /// Gives back the charges of `ops[undo]`, slot by slot: their states
    /// after the refund, in `undo`'s order.
    async fn give_back(
        &self,
        ops: &[CounterOp],
        undo: &[usize],
    ) -> Result<Vec<CounterState>, StoreError> {
        let refunds: Vec<CounterOp> = undo
            .iter()
            .map(|&i| CounterOp {
                refund: true,
                joint: false,
                decides: true,
                ..ops[i].clone()
            })
            .collect();
        tracing::debug!(
            counters = refunds.len(),
            "giving back charges another cluster slot denied"
        );
        let mut given = vec![
            CounterState {
                allowed: true,
                remaining: 0,
                reset_after: Duration::ZERO,
                overdrawn: 0,
            };
            refunds.len()
        ];
        for idx in by_slot(&refunds).values() {
            let part: Vec<CounterOp> = idx.iter().map(|&n| refunds[n].clone()).collect();
            let got = self
                .eval_with(&[(part.as_slice(), Charge::Each)], true)
                .await?;
            for (&n, state) in idx.iter().zip(got) {
                given[n] = state;
            }
        }
        Ok(given)
    }
}

impl Store for RedisStore {
    fn apply<'a>(
        &'a self,
        ops: &'a [CounterOp],
        charge: Charge,
    ) -> StoreFuture<'a, Result<Vec<CounterState>, StoreError>> {
        if ops.is_empty() {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        if let Err(e) = request_size_ok(ops.len()) {
            return Box::pin(std::future::ready(Err(e)));
        }
        // Two futures, boxed apart: the Cluster path holds the client's
        // command futures (several KB), and a batched request, which only
        // waits for its answer, must not carry (allocate, copy, zero) that
        // space on every call.
        match one_slot(ops, self.cluster) {
            Some(slot) => Box::pin(batched(&self.batcher, ops, charge, slot)),
            None => Box::pin(cluster_call(self.core.clone(), ops, charge)),
        }
    }

    fn peek<'a>(
        &'a self,
        op: &'a CounterOp,
    ) -> StoreFuture<'a, Result<Option<CounterState>, StoreError>> {
        Box::pin(async move {
            let exists: i64 = self
                .core
                .client
                .exists(op.key.as_str())
                .await
                .map_err(|e| store_error(&e))?;
            if exists == 0 {
                return Ok(None);
            }
            // A check (cost 0) through the script: the same arithmetic, no change.
            let check = CounterOp {
                cost: 0,
                refund: false,
                joint: false,
                ..op.clone()
            };
            let states = self
                .core
                .eval(&[(std::slice::from_ref(&check), Charge::Each)])
                .await?;
            Ok(states.into_iter().next())
        })
    }

    /// `DEL` of the one key that holds the counter (every algorithm keeps
    /// its state, and an overdraft its debt, in that key; in a Cluster the
    /// client sends it to the key's slot).
    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let deleted: i64 = self
                .core
                .client
                .del(key)
                .await
                .map_err(|e| store_error(&e))?;
            Ok(deleted > 0)
        })
    }

    /// Runs the counter script on a probe key (one credit, one second), so
    /// a Redis that answers PING but cannot write (a read-only replica after
    /// a failover, out of memory, still loading) counts as failing.
    fn probe(&self) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let op = CounterOp::new(PROBE_KEY, Algorithm::Window, 1, Duration::from_secs(1), 1);
            self.core
                .eval(&[(std::slice::from_ref(&op), Charge::Each)])
                .await
                .map(|_| ())
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests;
