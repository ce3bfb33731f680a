//! The faults, drawn on a seeded schedule: each kind once in a random
//! order, then kinds at random, one at a time, each held for a random
//! time and then healed, its recovery timed by polling the replicas.

use std::time::Duration;

use proptest::prelude::Rng;
use proptest::test_runner::TestRng;

use crate::common::fault_proxy::Fault as ProxyFault;
use crate::now;
use crate::rig::{self, Rig};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Redis paused (SIGSTOP), then continued.
    RedisStop,
    /// Redis killed, then started again empty on its port.
    RedisKill,
    /// Every Redis reply held 60 ms by the proxy (past Envoy's deadline).
    RedisSlow,
    /// Replica 0 killed (SIGKILL), then started again on its ports.
    ReplicaKill,
    /// A policy file that does not load, then a good one.
    Reload,
    /// A knob halving the fixed rule's limit, set then removed.
    Knob,
    /// A line-protocol flood of long, distinct actor values.
    Hostile,
    /// ZooKeeper (the aux rules' source) killed, then started again.
    ZooKeeper,
    /// The gRPC port's certificate: a broken pair, then a good one.
    Tls,
    /// Prometheus (the governor's source) killed, then started again.
    Prometheus,
    /// The xDS control plane stopped, then serving a new version.
    Xds,
}

/// Every kind, in the order they are listed in the report.
pub const ALL: [Kind; 11] = [
    Kind::RedisStop,
    Kind::RedisKill,
    Kind::RedisSlow,
    Kind::ReplicaKill,
    Kind::Reload,
    Kind::Knob,
    Kind::Hostile,
    Kind::ZooKeeper,
    Kind::Tls,
    Kind::Prometheus,
    Kind::Xds,
];

/// One fault as it happened (times in Unix seconds).
#[derive(Debug, Clone)]
pub struct Event {
    /// What was done (a kind may make several events: a reload's bad and
    /// good files, a knob's set and delete).
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// When it began.
    pub injected: f64,
    /// When it was lifted (for a one-shot action, when it was done).
    pub healed: f64,
    /// When recovery was seen, if it was within the poll's limit.
    pub recovered: Option<f64>,
    /// The longest recovery (healed → recovered) allowed, seconds.
    pub bound: f64,
    /// What was observed on the way.
    pub note: String,
    /// What went wrong, if anything did.
    pub problem: Option<String>,
}

impl Event {
    /// An event begun at `injected`, its recovery bound `bound` seconds.
    pub fn new(name: &'static str, kind: Kind, injected: f64, bound: f64) -> Event {
        Event {
            name,
            kind,
            injected,
            healed: injected,
            recovered: None,
            bound,
            note: String::new(),
            problem: None,
        }
    }

    /// Seconds from healed to recovered.
    pub fn recovery(&self) -> Option<f64> {
        self.recovered.map(|r| r - self.healed)
    }

    /// When its effects are over: recovered (or, failing that, healed plus
    /// its bound) and a second for the window it ends in.
    pub fn over(&self) -> f64 {
        self.recovered.unwrap_or(self.healed + self.bound) + 1.0
    }
}

/// A float in `[lo, hi)` from `rng`.
pub fn between(rng: &mut TestRng, lo: f64, hi: f64) -> f64 {
    lo + (rng.next_u64() % 1_000_000) as f64 / 1_000_000.0 * (hi - lo)
}

/// The longest a fault is held, seconds; the gap before each is drawn
/// from [`GAP`].
const HOLD: (f64, f64) = (2.0, 4.0);
const GAP: (f64, f64) = (1.5, 3.0);

/// Injects faults until `until` (Unix seconds), leaving time for the
/// last one's recovery: every kind once in a seeded order first.
pub fn run(rig: &mut Rig, rng: &mut TestRng, until: f64) -> Vec<Event> {
    let mut order = ALL.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut events = Vec::new();
    loop {
        let kind = order
            .pop()
            .unwrap_or_else(|| ALL[(rng.next_u64() % ALL.len() as u64) as usize]);
        let gap = between(rng, GAP.0, GAP.1);
        let hold = between(rng, HOLD.0, HOLD.1);
        if now() + gap + hold + 12.0 > until {
            return events;
        }
        std::thread::sleep(Duration::from_secs_f64(gap));
        println!(
            "soak: {:>6.1} s  {kind:?} for {hold:.1} s",
            now() - crate::START.get().copied().unwrap_or(0.0)
        );
        events.extend(inject(rig, rng, kind, hold));
    }
}

/// One fault of `kind`, held `hold` seconds.
fn inject(rig: &mut Rig, rng: &mut TestRng, kind: Kind, hold: f64) -> Vec<Event> {
    let hold = Duration::from_secs_f64(hold);
    match kind {
        Kind::RedisStop | Kind::RedisKill | Kind::RedisSlow => vec![redis_fault(rig, kind, hold)],
        Kind::ReplicaKill => vec![replica_kill(rig, hold)],
        Kind::Reload => reload(rig),
        Kind::Knob => knob(rig, hold),
        Kind::Hostile => vec![crate::hostile::burst(rig, rng)],
        Kind::ZooKeeper => vec![zookeeper(rig, hold)],
        Kind::Tls => crate::tls::rotation(rig),
        Kind::Prometheus => vec![crate::governor::prometheus_down(rig, hold)],
        Kind::Xds => vec![crate::xds::plane_down(rig, hold)],
    }
}

/// Redis paused, killed or slowed for `hold`; recovered when both
/// replicas' breakers are closed again (a probe every 250 ms closes one
/// once Redis answers in time: README, "When Redis fails").
fn redis_fault(rig: &mut Rig, kind: Kind, hold: Duration) -> Event {
    let (name, bound) = match kind {
        Kind::RedisStop => ("redis SIGSTOP, SIGCONT", 1.0),
        Kind::RedisKill => ("redis killed, restarted empty", 2.0),
        _ => ("redis replies slowed 60 ms", 1.0),
    };
    let mut event = Event::new(name, kind, now(), bound);
    match kind {
        Kind::RedisStop => rig.redis.pause(),
        Kind::RedisKill => rig.redis.kill(),
        _ => rig
            .proxy
            .set(ProxyFault::SlowReplies(Duration::from_millis(60))),
    }
    std::thread::sleep(hold);
    let open: Vec<bool> = rig
        .replicas
        .iter()
        .map(|r| breaker(r.http()) != Some(0.0))
        .collect();
    event.note = format!("breaker open at the end: {open:?}");
    match kind {
        Kind::RedisStop => rig.redis.resume(),
        Kind::RedisKill => rig.redis.restart(),
        _ => rig.proxy.set(ProxyFault::None),
    }
    event.healed = now();
    let https: Vec<_> = rig.replicas.iter().map(rig::Replica::http).collect();
    event.recovered = wait_until(30.0, || https.iter().all(|h| breaker(*h) == Some(0.0)));
    event
}

/// A replica's breaker state (0 closed), if it answers.
fn breaker(http: std::net::SocketAddr) -> Option<f64> {
    rig::metric(http, "divvy_store_breaker_state")
}

/// Replica 0 killed for `hold`, then started again; recovered when it is
/// ready and its breaker closed (the soak's own bound: a debug build
/// starts in well under 10 s).
fn replica_kill(rig: &mut Rig, hold: Duration) -> Event {
    let mut event = Event::new(
        "replica 0 killed, restarted",
        Kind::ReplicaKill,
        now(),
        10.0,
    );
    rig.kill_replica(0);
    std::thread::sleep(hold);
    event.healed = now();
    rig.start_replica(0);
    let http = rig.replicas[0].http();
    event.recovered = wait_until(30.0, || {
        rig::get(http, "/readyz").is_some_and(|(s, _)| s == 200) && breaker(http) == Some(0.0)
    });
    event
}

/// The sum of `divvy_reloads_total` samples with `result`, per replica.
fn reloads(rig: &Rig, result: &str) -> Vec<f64> {
    let label = format!("result=\"{result}\"");
    rig.replicas
        .iter()
        .map(|r| {
            let body = rig::get(r.http(), "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            crate::common::parse_metrics(&body)
                .iter()
                .filter(|(k, _)| k.starts_with("divvy_reloads_total") && k.contains(&label))
                .map(|(_, v)| v)
                .sum()
        })
        .collect()
}

/// A policy file that does not parse, then a good one (a new version
/// comment, the same rules); each must be seen by both replicas' watchers
/// within 2 s: the bad one refused, the good one loaded.
fn reload(rig: &mut Rig) -> Vec<Event> {
    let mut events = Vec::new();
    for (name, text, result) in [
        (
            "bad policy file refused",
            "overrides: [\n  - {creditLimit: oops\n".to_owned(),
            "failure",
        ),
        (
            "good policy file loaded",
            rig::policy(next_version(), &rig.prometheus.url()),
            "success",
        ),
    ] {
        let before = reloads(rig, result);
        let mut event = Event::new(name, Kind::Reload, now(), 2.0);
        rig.write_policy(&text);
        event.healed = now();
        event.recovered = wait_until(30.0, || {
            reloads(rig, result).iter().zip(&before).all(|(a, b)| a > b)
        });
        events.push(event);
    }
    events
}

/// A fresh policy version for each good reload.
fn next_version() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static VERSION: AtomicU32 = AtomicU32::new(1);
    VERSION.fetch_add(1, Ordering::Relaxed) + 1
}

/// The fixed rule's knob limit while the knob is in force.
pub const KNOB_LIMIT: u64 = 5;
/// The name of the event that sets the knob.
pub const KNOB_SET: &str = "knob set (fixed: creditLimit 5)";
/// The name of the event that deletes it.
pub const KNOB_DELETED: &str = "knob deleted";

/// A knob lowering the fixed rule to [`KNOB_LIMIT`], set on replica 0 and
/// removed `hold` later; each change must reach replica 1 within a second
/// (README, "Knobs": read from Redis every 250 ms).
fn knob(rig: &mut Rig, hold: Duration) -> Vec<Event> {
    let (a, b) = (rig.replicas[0].http(), rig.replicas[1].http());
    let seen = || rig::get(b, "/knobs").is_some_and(|(_, body)| body.contains("\"fixed\""));
    let mut set = Event::new(KNOB_SET, Kind::Knob, now(), 1.0);
    let body = format!("{{\"creditLimit\": {KNOB_LIMIT}, \"ttlSeconds\": 120}}");
    let answer = rig::request(a, "PUT", "/knobs/fixed", &body);
    set.healed = now();
    if answer.as_ref().map(|(s, _)| *s) != Some(200) {
        set.problem = Some(format!("PUT /knobs/fixed answered {answer:?}"));
    }
    set.recovered = wait_until(10.0, seen);
    std::thread::sleep(hold);
    let mut delete = Event::new(KNOB_DELETED, Kind::Knob, now(), 1.0);
    let answer = rig::request(a, "DELETE", "/knobs/fixed", "");
    delete.healed = now();
    if answer.as_ref().map(|(s, _)| *s) != Some(200) {
        delete.problem = Some(format!("DELETE /knobs/fixed answered {answer:?}"));
    }
    delete.recovered = wait_until(10.0, || !seen());
    vec![set, delete]
}

/// ZooKeeper killed for `hold`, then started again: the aux rule stays in
/// force on both replicas meanwhile; recovered when both see ZooKeeper
/// answer again (`divvy_aux_rules_source_up`), within the reconnection
/// backoff's longest wait, 10 s (docs/knobs.md, "Aux rules").
fn zookeeper(rig: &mut Rig, hold: Duration) -> Event {
    let mut event = Event::new("zookeeper killed, restarted", Kind::ZooKeeper, now(), 10.0);
    rig.zk.kill();
    std::thread::sleep(hold);
    let aux: Vec<Option<f64>> = rig
        .replicas
        .iter()
        .map(|r| rig::metric(r.http(), "divvy_aux_rules"))
        .collect();
    event.note = format!("aux rules in force while it was down: {aux:?}");
    if aux.iter().any(|n| *n != Some(1.0)) {
        event.problem = Some(format!(
            "the aux rule was not kept while ZooKeeper was down: {aux:?}"
        ));
    }
    rig.zk.launch();
    event.healed = now();
    let https: Vec<_> = rig.replicas.iter().map(rig::Replica::http).collect();
    event.recovered = wait_until(30.0, || {
        https
            .iter()
            .all(|h| rig::metric(*h, "divvy_aux_rules_source_up") == Some(1.0))
    });
    event
}

/// Polls `done` every 20 ms for up to `limit` seconds: when it held.
pub fn wait_until(limit: f64, done: impl FnMut() -> bool) -> Option<f64> {
    wait_every(limit, 0.02, done)
}

/// Polls `done` every `every` seconds for up to `limit` seconds: when it
/// held.
pub fn wait_every(limit: f64, every: f64, mut done: impl FnMut() -> bool) -> Option<f64> {
    let give_up = now() + limit;
    while now() < give_up {
        if done() {
            return Some(now());
        }
        std::thread::sleep(Duration::from_secs_f64(every));
    }
    None
}
