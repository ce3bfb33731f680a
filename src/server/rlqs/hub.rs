//! Every RLQS stream of this process, its buckets and their assignments.
//!
//! Reports update a bucket's demand; [`Hub::tick`] asks the limiter
//! which limit decides each bucket, divides each limit's rate among the
//! buckets (of every stream) that share its counter, and returns the
//! assignments that changed, to be pushed. With [`Replicas`] (the Redis
//! store) each rate is first shared among the replicas by their streams'
//! demand; with the memory store this process divides each whole rate
//! among its own streams.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;

use super::assign::{abandon, allocate, Assignment, Claim};
use super::replicas::{Ask, Replicas};
use super::{RlqsError, RlqsSettings, MAX_BUCKET_ID_BYTES, MAX_BUCKET_ID_ENTRIES};
use crate::clock::Clock;
use crate::limiter::{BucketLimit, Limiter};
use crate::observe::metrics::Metrics;

/// A bucket id: its pairs sorted by key (Envoy's order does not matter).
pub type BucketKey = Vec<(String, String)>;

/// What is sent to a stream.
pub type Outbound = Result<RateLimitQuotaResponse, tonic::Status>;

/// One bucket of one stream.
#[derive(Debug)]
pub struct Bucket {
    /// Measured demand, credits per second (`None` before a report measures it).
    pub demand: Option<f64>,
    /// When it was last reported (clock time).
    pub reported_at: Duration,
    /// The limit that decides it, as of the last recompute.
    pub limit: Option<BucketLimit>,
    /// Live share per limit counter it is counted against.
    pub held: HashMap<String, f64>,
    /// The assignment last sent and when (`None`: to be sent).
    pub sent: Option<(Assignment, Duration)>,
    /// Allowed and denied of the last report, not yet counted in metrics.
    pending: (u64, u64),
}

/// One stream.
#[derive(Debug)]
pub struct Stream {
    /// The peer's address.
    pub peer: String,
    /// The domain of its first report (`None` before it).
    pub domain: Option<String>,
    /// When it opened (clock time).
    pub opened_at: Duration,
    /// Its buckets.
    pub buckets: BTreeMap<BucketKey, Bucket>,
    tx: mpsc::Sender<Outbound>,
}

/// Every stream, by id.
#[derive(Debug, Default)]
pub struct Streams {
    next: u64,
    /// The streams.
    pub streams: BTreeMap<u64, Stream>,
}

/// The streams, the limiter they are decided by, and the settings.
pub struct Hub {
    limiter: Arc<Limiter>,
    settings: RlqsSettings,
    clock: Arc<dyn Clock>,
    state: Mutex<Streams>,
    /// A report came since the last recompute.
    dirty: AtomicBool,
    /// The other replicas, when limits are shared with them.
    replicas: Option<Arc<Replicas>>,
}

/// A bucket's claim on one limit counter: where it is and what it wants.
struct Claimant {
    stream: u64,
    bucket: BucketKey,
    claim: Claim,
}

/// One limit counter's rate and the buckets counted against it.
struct Group {
    rate: f64,
    claimants: Vec<Claimant>,
}

impl Hub {
    /// A hub deciding with `limiter`, timed by `clock`.
    pub fn new(limiter: Arc<Limiter>, settings: RlqsSettings, clock: Arc<dyn Clock>) -> Hub {
        Hub {
            limiter,
            settings,
            clock,
            state: Mutex::new(Streams::default()),
            dirty: AtomicBool::new(false),
            replicas: None,
        }
    }

    /// The registry RLQS records to (the limiter's).
    pub fn metrics(&self) -> &Metrics {
        &self.limiter.telemetry().metrics
    }

    /// The same hub, sharing each limit with the other replicas.
    pub fn with_replicas(mut self, replicas: Arc<Replicas>) -> Hub {
        self.replicas = Some(replicas);
        self
    }

    /// The replicas limits are shared with, if any.
    pub fn replicas(&self) -> Option<&Arc<Replicas>> {
        self.replicas.as_ref()
    }

    /// What this replica asks of each limit counter its streams report:
    /// the summed demand of its buckets (a bucket not measured yet may
    /// want the whole rate).
    pub fn asks(&self) -> Vec<Ask> {
        let s = self.lock();
        let mut asks: Vec<Ask> = groups(&s)
            .into_iter()
            .map(|(counter, g)| Ask {
                demand: g
                    .claimants
                    .iter()
                    .map(|c| c.claim.demand.unwrap_or(g.rate))
                    .sum(),
                rate: g.rate,
                counter,
            })
            .collect();
        asks.sort_by(|a, b| a.counter.cmp(&b.counter));
        asks
    }

    /// The settings.
    pub fn settings(&self) -> &RlqsSettings {
        &self.settings
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The streams, locked (for `GET /rlqs`).
    pub fn lock(&self) -> MutexGuard<'_, Streams> {
        // A panic while locked leaves plain data behind: keep serving it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Now, by the hub's clock.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Registers a stream from `peer` whose answers go to `tx`; its id.
    pub fn open(&self, peer: String, tx: mpsc::Sender<Outbound>) -> u64 {
        let now = self.now();
        let mut s = self.lock();
        s.next += 1;
        let id = s.next;
        s.streams.insert(
            id,
            Stream {
                peer,
                domain: None,
                opened_at: now,
                buckets: BTreeMap::new(),
                tx,
            },
        );
        gauges(&s, self.metrics());
        id
    }

    /// Forgets stream `id`; its shares go back at the next recompute.
    pub fn close(&self, id: u64) {
        let mut s = self.lock();
        s.streams.remove(&id);
        gauges(&s, self.metrics());
    }

    /// Ends every stream (shutdown): their senders are dropped.
    pub fn close_all(&self) {
        let mut s = self.lock();
        for stream in s.streams.values() {
            let _ = stream
                .tx
                .try_send(Err(tonic::Status::unavailable("divvy is shutting down")));
        }
        s.streams.clear();
        gauges(&s, self.metrics());
    }

    /// Takes one reports message of stream `id`: counts it, answers the
    /// reported buckets that hold an assignment with it (renewing its
    /// TTL), and leaves new buckets and new demand to the next recompute,
    /// which the allocation task runs within a tenth of a second
    /// ([`Hub::take_dirty`]): a burst of reports costs one recompute.
    pub fn report(&self, id: u64, reports: RateLimitQuotaUsageReports) -> Result<(), RlqsError> {
        let now = self.now();
        let mut s = self.lock();
        let reported = take_reports(
            &mut s,
            id,
            reports,
            now,
            self.settings.max_buckets_per_stream,
            self.metrics(),
        )?;
        let mut renew = Vec::new();
        if let Some(stream) = s.streams.get_mut(&id) {
            let domain = stream.domain.clone().unwrap_or_default();
            for key in &reported {
                let Some(b) = stream.buckets.get_mut(key) else {
                    continue;
                };
                if b.limit.is_none() {
                    b.limit = Some(self.limiter.bucket_limit(&domain, &entries(key)));
                }
                count_reported(b, self.metrics());
                if let Some((a, _)) = b.sent {
                    if !renew.iter().any(|(k, _)| k == key) {
                        renew.push((key.clone(), Some(a)));
                    }
                    b.sent = Some((a, now));
                }
            }
        }
        self.dirty.store(true, Ordering::Release);
        let mut changes = Changes::new();
        if !renew.is_empty() {
            changes.insert(id, renew);
        }
        self.send(&mut s, changes);
        Ok(())
    }

    /// Whether a report came since the last call: a recompute is due.
    pub fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// Recomputes every assignment and pushes those that changed (and
    /// renewals of those half-way to expiry). Nothing here waits: the
    /// lock is held for the limiter's lookups and queued sends only.
    pub fn tick(&self) {
        let now = self.now();
        let mut s = self.lock();
        let changes = self.recompute_locked(&mut s, now);
        self.send(&mut s, changes);
    }

    /// Per stream, the buckets whose assignment is to be sent (`None`:
    /// abandoned). Buckets not reported for twice the TTL, and buckets no
    /// rule decides any more, are abandoned and forgotten.
    fn recompute_locked(&self, s: &mut Streams, now: Duration) -> Changes {
        let mut changes = Changes::new();
        let idle = self.settings.assignment_ttl.saturating_mul(2);
        for (&id, stream) in s.streams.iter_mut() {
            let Some(domain) = stream.domain.clone() else {
                continue;
            };
            stream.buckets.retain(|key, b| {
                let limit = self.limiter.bucket_limit(&domain, &entries(key));
                let gone = now.saturating_sub(b.reported_at) > idle
                    || (limit == BucketLimit::NoLimit
                        && b.limit.as_ref().is_some_and(|l| *l != BucketLimit::NoLimit));
                if gone {
                    changes.entry(id).or_default().push((key.clone(), None));
                    return false;
                }
                b.limit = Some(limit);
                true
            });
        }
        for (counter, group) in groups(s) {
            let rate = self
                .replicas
                .as_ref()
                .map_or(group.rate, |r| r.share(&counter, group.rate));
            let claims: Vec<Claim> = group.claimants.iter().map(|c| c.claim).collect();
            let shares = allocate(rate, &claims);
            for (c, share) in group.claimants.iter().zip(shares) {
                if let Some(b) = bucket_mut(s, c.stream, &c.bucket) {
                    b.held.insert(counter.clone(), share);
                }
            }
        }
        let half_ttl = self.settings.assignment_ttl / 2;
        for (&id, stream) in s.streams.iter_mut() {
            for (key, b) in stream.buckets.iter_mut() {
                let a = assignment(b);
                let due = match b.sent {
                    Some((old, at)) => old != a || now.saturating_sub(at) >= half_ttl,
                    None => true,
                };
                if due {
                    b.sent = Some((a, now));
                    changes.entry(id).or_default().push((key.clone(), Some(a)));
                }
            }
        }
        gauges(s, self.metrics());
        changes
    }

    /// Sends each stream its actions; a stream that cannot take them now
    /// gets them again at the next recompute.
    fn send(&self, s: &mut Streams, changes: Changes) {
        let ttl = self.settings.assignment_ttl.as_secs().max(1);
        for (id, actions) in changes {
            let Some(stream) = s.streams.get_mut(&id) else {
                continue;
            };
            let bucket_action: Vec<BucketAction> = actions
                .iter()
                .map(|(key, a)| match a {
                    Some(a) => a.action(key, ttl),
                    None => abandon(key),
                })
                .collect();
            if bucket_action.is_empty() {
                continue;
            }
            let response = RateLimitQuotaResponse { bucket_action };
            if stream.tx.try_send(Ok(response)).is_ok() {
                for (_, a) in &actions {
                    let kind = a.map_or("abandon", |a| a.kind());
                    self.metrics()
                        .rlqs
                        .assignments
                        .with_label_values(&[kind])
                        .inc();
                }
            } else {
                for (key, _) in &actions {
                    if let Some(b) = stream.buckets.get_mut(key) {
                        b.sent = None;
                    }
                }
            }
        }
    }
}

/// Per stream, (bucket, assignment or abandon) to send.
type Changes = BTreeMap<u64, Vec<(BucketKey, Option<Assignment>)>>;

/// A bucket id's pairs as a descriptor's entries.
fn entries(key: &BucketKey) -> Vec<(&str, &str)> {
    key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn bucket_mut<'a>(s: &'a mut Streams, stream: u64, key: &BucketKey) -> Option<&'a mut Bucket> {
    s.streams.get_mut(&stream)?.buckets.get_mut(key)
}

/// Every limit counter with the buckets counted against it.
fn groups(s: &Streams) -> HashMap<String, Group> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    for (&id, stream) in &s.streams {
        for (key, b) in &stream.buckets {
            let Some(BucketLimit::Rates { rates, .. }) = &b.limit else {
                continue;
            };
            for r in rates {
                let g = groups.entry(r.key.clone()).or_insert_with(|| Group {
                    rate: r.rate,
                    claimants: Vec::new(),
                });
                g.claimants.push(Claimant {
                    stream: id,
                    bucket: key.clone(),
                    claim: Claim {
                        demand: b.demand,
                        held: b.held.get(&r.key).copied().unwrap_or(0.0),
                    },
                });
            }
        }
    }
    groups
}

/// What bucket `b` is told: the tightest of its shares, each limit's burst
/// divided as its rate is.
fn assignment(b: &Bucket) -> Assignment {
    match &b.limit {
        None | Some(BucketLimit::NoLimit) | Some(BucketLimit::AllowAll { .. }) => {
            Assignment::AllowAll
        }
        Some(BucketLimit::DenyAll { .. }) => Assignment::DenyAll,
        Some(BucketLimit::Rates { rates, .. }) => {
            let mut rate = f64::INFINITY;
            let mut burst = f64::INFINITY;
            for r in rates {
                let share = b.held.get(&r.key).copied().unwrap_or(0.0);
                rate = rate.min(share);
                burst = burst.min(r.burst as f64 * share / r.rate.max(f64::MIN_POSITIVE));
            }
            Assignment::token_bucket(rate, burst)
        }
    }
}

/// Applies one reports message to stream `id`: the domain (first message),
/// each bucket's demand. Returns the keys of the buckets reported.
fn take_reports(
    s: &mut Streams,
    id: u64,
    reports: RateLimitQuotaUsageReports,
    now: Duration,
    max_buckets: usize,
    m: &Metrics,
) -> Result<Vec<BucketKey>, RlqsError> {
    let stream = s.streams.get_mut(&id).ok_or(RlqsError::Closed)?;
    if stream.domain.is_none() {
        if reports.domain.is_empty() {
            return Err(RlqsError::NoDomain);
        }
        stream.domain = Some(reports.domain);
    }
    let mut reported = Vec::with_capacity(reports.bucket_quota_usages.len());
    for usage in reports.bucket_quota_usages {
        let key = bucket_key(usage.bucket_id.map(|b| b.bucket).unwrap_or_default(), m)?;
        let elapsed = usage
            .time_elapsed
            .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
            .unwrap_or(0.0);
        let count = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        let fresh = !stream.buckets.contains_key(&key);
        if fresh && stream.buckets.len() >= max_buckets {
            m.rejected
                .with_label_values(&["rlqs_too_many_buckets"])
                .inc();
            continue;
        }
        let b = stream.buckets.entry(key.clone()).or_insert_with(|| Bucket {
            demand: None,
            reported_at: now,
            limit: None,
            held: HashMap::new(),
            sent: None,
            pending: (0, 0),
        });
        // Envoy states the time in whole seconds (truncated); the time since
        // this bucket's last report here is exact. A first report covers no
        // time (Envoy sends it at the first request).
        let here = now.saturating_sub(b.reported_at).as_secs_f64();
        let elapsed = if !fresh && here >= 0.5 { here } else { elapsed };
        if elapsed >= 0.5 {
            b.demand = Some(count as f64 / elapsed);
        }
        b.reported_at = now;
        b.pending.0 = b.pending.0.saturating_add(usage.num_requests_allowed);
        b.pending.1 = b.pending.1.saturating_add(usage.num_requests_denied);
        reported.push(key);
    }
    Ok(reported)
}

/// A bucket id's pairs, sorted, within the bounds.
fn bucket_key(pairs: HashMap<String, String>, m: &Metrics) -> Result<BucketKey, RlqsError> {
    if pairs.is_empty() {
        return Err(RlqsError::EmptyBucketId);
    }
    let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if pairs.len() > MAX_BUCKET_ID_ENTRIES || bytes > MAX_BUCKET_ID_BYTES {
        m.rejected
            .with_label_values(&["rlqs_bucket_id_too_large"])
            .inc();
        return Err(RlqsError::BucketIdTooLarge {
            entries: pairs.len(),
            bytes,
        });
    }
    let mut key: BucketKey = pairs.into_iter().collect();
    key.sort_unstable();
    Ok(key)
}

/// Counts what Envoy reported for `b` under its deciding rule.
fn count_reported(b: &mut Bucket, m: &Metrics) {
    let (allowed, denied) = std::mem::take(&mut b.pending);
    let rule = b.limit.as_ref().map_or("", |l| l.rule());
    let rule = if rule.is_empty() { "none" } else { rule };
    let m = &m.rlqs.reported;
    m.with_label_values(&[rule, "allowed"]).inc_by(allowed);
    m.with_label_values(&[rule, "denied"]).inc_by(denied);
}

fn gauges(s: &Streams, m: &Metrics) {
    let m = &m.rlqs;
    m.streams.set(s.streams.len() as i64);
    m.buckets
        .set(s.streams.values().map(|st| st.buckets.len()).sum::<usize>() as i64);
}
