//! Governors (a PID controller per rule that reads a load from Prometheus
//! and sets the rule's `creditLimit` knob) against the real binary, a real
//! Prometheus (Debian's `prometheus` at /usr/bin/prometheus, started by each
//! test on a free loopback port with a private data dir) and, for the
//! replicas test, a real `redis-server`.
//!
//! The plant is simulated by the test with std threads:
//! - a worker sends `HIT path=/reindex` over one line-protocol connection
//!   as fast as it can (one in flight, 1 ms pause after a denial) and keeps
//!   the instants of the admitted hits of the last second;
//! - an exporter answers any HTTP GET with `plant_load <value>`, where the
//!   value is (hits admitted in the last 1000 ms × cost) ÷ capacity
//!   (capacity 50, cost 1 at start, both changeable by the test);
//! - Prometheus scrapes that exporter every second and the governor queries
//!   `max(plant_load)`. The rule is a token bucket of `creditLimit` per
//!   second, so the admitted rate is the knob and, at cost 1, the load is
//!   rate ÷ 50: setpoint 2 means ~100 hits/s (~25/s at cost 4).
//!
//! What is checked, and how ("in band" means the plant load, computed by
//! the test itself from the admitted hits, within ±20% of the setpoint,
//! 1.6..=2.4; the load is sampled every 500 ms):
//!
//! `settles_breaks_and_survives_prometheus_outage` (memory store, one
//! server; every 2s, kp 2, ki 5, min 5, max 500, setpoint 2, breaker above
//! 6, fallbackAfter 3; the rule starts at 10/s):
//! a) the load is *settled* once 4 samples in a row (2 s, one interval) are
//!    in band; this must happen within 60 s of the start. From then on the
//!    next 20 samples (10 s, five intervals) must all be within ±20%,
//!    allowing at most one sample out of band, and none outside ±40%.
//! b) the cost per hit is quadrupled (load jumps to ~8, above the breaker):
//!    `divvy_governor_breaker_open{rule="reindex"}` must read 1, and the
//!    knob creditLimit 0, within 2 intervals (4 s) of the change (measured
//!    by polling every 50 ms; printed). Then the load must be settled again
//!    (same 4-samples criterion) within 60 s, at ~25 admitted hits/s.
//! c) Prometheus is killed (SIGKILL) right after a governor step, so the
//!    next steps fall at ~2, ~4 and ~6 s. The knob must keep its value for
//!    the first 4.5 s (two steps without data hold the last output), must be
//!    `min` (5) at the latest 12 s after the kill (expected: ~6 s, the third
//!    step without data; printed), and `/governors` must show a `lastError`
//!    and `missing` >= 3. Prometheus is then started again on the same port
//!    and data dir, and the load must be settled again within 60 s.
//!
//! `two_replicas_one_governor_and_takeover` (two servers sharing a real
//! redis-server through `--redis-url`, every 1s, same plant; the worker
//! talks to the first server and moves to the other when its connection
//! breaks — counters are shared through Redis): within 10 s exactly one
//! replica reports `divvy_governor_leader{rule="reindex"}` 1 and the other
//! 0, `/governors` says `governing` and `idle`, and the idle one's
//! `leaseHolder` is the other's replica name (`host:pid`), which is also
//! the value of the Redis key `divvy:governor:reindex` (its PTTL at most
//! two intervals). After 4 more intervals the holder is killed (SIGKILL:
//! its lease is not released and must lapse), and the survivor must be
//! `governing` within 3 intervals (3 s, plus 300 ms for polling; printed),
//! and still be stepping 4 s later. From the election to the end, every
//! knob creditLimit seen on the survivor's `GET /knobs` (polled every
//! 200 ms, at least 30 polls) is within [min, max] = [5, 500] (the
//! breaker, far above the setpoint, must not open).
//!
//! `bad_governor_sections_are_refused_by_check`: `divvy check` refuses a
//! policy with bad governors (unknown rule, missing query, negative kp,
//! min > max, a bad `every`) with a non-zero exit and one message for each,
//! and prints `governor reindex: ...` for a valid one.

mod common;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::prometheus::{try_get, Prometheus};
use common::redis::Redis;
use common::Server;
use serde_json::Value;

/// The governed rule's label.
const RULE: &str = "reindex";
/// The load the governors hold.
const SETPOINT: f64 = 2.0;
/// ±20% of the setpoint.
const BAND: (f64, f64) = (SETPOINT * 0.8, SETPOINT * 1.2);
/// The governors' `min` and `max`.
const MIN: u64 = 5;
const MAX: u64 = 500;
/// The plant's capacity (load = admitted per second × cost ÷ capacity).
const CAPACITY: u64 = 50;
/// How often the load is sampled.
const SAMPLE: Duration = Duration::from_millis(500);
/// Samples in a row in band that count as settled (2 s).
const SETTLED_RUN: usize = 4;
/// How long the load may take to settle.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// The query the governors run.
const QUERY: &str = "max(plant_load)";

/// The policy: the rule `reindex` (10 per second, token bucket) governed by
/// the Prometheus at `prometheus`, stepping `every`.
fn policy(prometheus: &str, every: &str) -> String {
    format!(
        "\
overrides:
  - operation: {{path: /reindex}}
    creditLimit: 10
    resetSeconds: 1
    algorithm: token_bucket
    label: {RULE}
default: {{creditLimit: 0}}
governors:
  - rule: {RULE}
    query: '{QUERY}'
    prometheus: {prometheus}
    setpoint: {SETPOINT}
    every: {every}
    min: {MIN}
    max: {MAX}
    kp: 2
    ki: 5
    kd: 0
    breaker: {{above: 6}}
    fallbackAfter: 3
"
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// -------------------------------------------------------------------- plant

/// What the plant's threads share with the test.
struct PlantState {
    /// Instants of the hits admitted in (at least) the last second.
    admitted: Mutex<VecDeque<Instant>>,
    /// Cost of one hit.
    cost: AtomicU64,
    /// Capacity.
    capacity: AtomicU64,
    /// Every answer the worker got, and the admitted ones.
    answers: AtomicU64,
    allowed: AtomicU64,
    /// Set to stop the threads.
    stop: AtomicBool,
}

impl PlantState {
    /// Hits admitted in the last 1000 ms.
    fn rate(&self) -> usize {
        let now = Instant::now();
        let mut q = lock(&self.admitted);
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_millis(1000))
        {
            q.pop_front();
        }
        q.len()
    }

    /// The load: admitted per second × cost ÷ capacity.
    fn load(&self) -> f64 {
        self.rate() as f64 * self.cost.load(Ordering::SeqCst) as f64
            / self.capacity.load(Ordering::SeqCst) as f64
    }
}

/// The simulated plant: an exporter of `plant_load` and (once started) a
/// worker sending hits.
struct Plant {
    state: Arc<PlantState>,
    /// The exporter's port.
    port: u16,
    threads: Vec<JoinHandle<()>>,
}

impl Plant {
    /// Starts the exporter (capacity 50, cost 1).
    fn start() -> Plant {
        let state = Arc::new(PlantState {
            admitted: Mutex::new(VecDeque::new()),
            cost: AtomicU64::new(1),
            capacity: AtomicU64::new(CAPACITY),
            answers: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind exporter");
        let port = listener.local_addr().unwrap().port();
        let s = Arc::clone(&state);
        let exporter = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                // Read the request head; the body of a GET is empty.
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!(
                    "# HELP plant_load Admitted hits per second times cost over capacity.\n\
                     # TYPE plant_load gauge\nplant_load {}\n",
                    s.load()
                );
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Plant {
            state,
            port,
            threads: vec![exporter],
        }
    }

    /// Starts the worker on `targets[0]`; when its connection breaks it
    /// moves on to the next target (round robin).
    fn start_worker(&mut self, targets: Vec<SocketAddr>) {
        let s = Arc::clone(&self.state);
        self.threads.push(std::thread::spawn(move || {
            let mut next = 0;
            while !s.stop.load(Ordering::SeqCst) {
                let target = targets[next % targets.len()];
                next += 1;
                let Ok(conn) = TcpStream::connect(target) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = conn.set_nodelay(true);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut writer = conn.try_clone().expect("clone stream");
                let mut reader = BufReader::new(conn);
                let mut line = String::new();
                while !s.stop.load(Ordering::SeqCst) {
                    if writer.write_all(b"HIT path=/reindex\n").is_err() {
                        break;
                    }
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    s.answers.fetch_add(1, Ordering::Relaxed);
                    if line.starts_with("OK true") {
                        s.allowed.fetch_add(1, Ordering::Relaxed);
                        let now = Instant::now();
                        let mut q = lock(&s.admitted);
                        q.push_back(now);
                        while q
                            .front()
                            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(2))
                        {
                            q.pop_front();
                        }
                    } else {
                        assert!(line.starts_with("OK false"), "unexpected answer {line:?}");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        }));
    }

    fn load(&self) -> f64 {
        self.state.load()
    }

    fn rate(&self) -> usize {
        self.state.rate()
    }

    fn set_cost(&self, cost: u64) {
        self.state.cost.store(cost, Ordering::SeqCst);
    }
}

impl Drop for Plant {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the exporter's accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

// --------------------------------------------------------------- Prometheus

/// A Prometheus scraping the plant on `target_port` every second, once it
/// answers the governors' query with a number.
fn prometheus(target_port: u16) -> Prometheus {
    let mut p = Prometheus::start(
        common::stable_port(),
        &format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n\
             \x20 - job_name: plant\n\
             \x20   scrape_interval: 1s\n\
             \x20   scrape_timeout: 900ms\n\
             \x20   static_configs:\n\
             \x20     - targets: ['127.0.0.1:{target_port}']\n"
        ),
    );
    wait_for_sample(&mut p);
    p
}

/// Waits until `p` has a sample of the plant.
fn wait_for_sample(p: &mut Prometheus) {
    p.wait_until(&format!("/api/v1/query?query={QUERY}"), |body| {
        sample(body).is_some()
    });
}

/// The value of an instant query giving one sample, if it does.
fn query(p: &Prometheus, q: &str) -> Option<f64> {
    let (status, body) = try_get(p.addr(), &format!("/api/v1/query?query={q}"))?;
    (status == 200).then(|| sample(&body)).flatten()
}

/// The first sample's value in a query's JSON answer.
fn sample(body: &str) -> Option<f64> {
    let v: Value = serde_json::from_str(body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

// ------------------------------------------------------------ divvy's view

/// `GET path` on a divvy admin address, as JSON.
fn get_json(http: SocketAddr, path: &str) -> Value {
    let (status, body) = common::http_request(http, "GET", path, "", None);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// The `reindex` knob's creditLimit, if there is a knob (`GET /knobs`
/// lists `{"label", "set": {"creditLimit", ...}, "setBy", ...}`).
fn knob(http: SocketAddr) -> Option<u64> {
    let v = get_json(http, "/knobs");
    v["knobs"]
        .as_array()
        .expect("knobs")
        .iter()
        .find(|k| k["label"] == RULE)
        .and_then(|k| k["set"]["creditLimit"].as_u64())
}

/// The `reindex` governor's state from `GET /governors`, and the replica.
fn governor(http: SocketAddr) -> (Value, String) {
    let v = get_json(http, "/governors");
    let g = v["governors"]
        .as_array()
        .expect("governors")
        .iter()
        .find(|g| g["rule"] == RULE)
        .cloned()
        .unwrap_or(Value::Null);
    (g, v["replica"].as_str().unwrap_or_default().to_owned())
}

/// A governor metric of `reindex`.
fn gauge(http: SocketAddr, name: &str) -> Option<f64> {
    common::metric_samples_at(http)
        .get(&format!("{name}{{rule=\"{RULE}\"}}"))
        .copied()
}

fn in_band(load: f64) -> bool {
    (BAND.0..=BAND.1).contains(&load)
}

/// Samples the load every 500 ms (printing it every second with the knob
/// and the governor's last measurement) until [`SETTLED_RUN`] samples in a
/// row are in band; panics after [`SETTLE_BOUND`]. Returns how long it took
/// (to the first sample of the run) from `since`.
fn wait_settled(what: &str, plant: &Plant, http: SocketAddr, since: Instant) -> Duration {
    let mut run: Option<Instant> = None;
    let mut count = 0;
    let mut n = 0u64;
    loop {
        let load = plant.load();
        if in_band(load) {
            run.get_or_insert_with(Instant::now);
            count += 1;
        } else {
            run = None;
            count = 0;
        }
        if n.is_multiple_of(2) || count == SETTLED_RUN {
            let (g, _) = governor(http);
            println!(
                "  [{what}] t={:5.1}s load={load:.2} rate={}/s knob={:?} measured={} breaker={}",
                since.elapsed().as_secs_f64(),
                plant.rate(),
                knob(http),
                g["measurement"],
                g["breakerOpen"],
            );
        }
        n += 1;
        if count == SETTLED_RUN {
            let took = run.unwrap() - since;
            println!(
                "[{what}] settled in band {:.1}..{:.1} after {:.1} s at {} hits/s",
                BAND.0,
                BAND.1,
                took.as_secs_f64(),
                plant.rate()
            );
            return took;
        }
        assert!(
            since.elapsed() < SETTLE_BOUND,
            "[{what}] the load did not settle within ±20% of {SETPOINT} in {SETTLE_BOUND:?} \
             (last load {load:.2}, knob {:?}, governor {})",
            knob(http),
            governor(http).0
        );
        std::thread::sleep(SAMPLE);
    }
}

/// Waits until the governor's `steppedAtMs` changes (a step just happened).
fn wait_for_step(http: SocketAddr, every: Duration) {
    let first = governor(http).0["steppedAtMs"].clone();
    let deadline = Instant::now() + every * 3;
    while governor(http).0["steppedAtMs"] == first {
        assert!(Instant::now() < deadline, "the governor does not step");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// -------------------------------------------------------------------- tests

#[test]
fn settles_breaks_and_survives_prometheus_outage() {
    let every = Duration::from_secs(2);
    let mut plant = Plant::start();
    let mut prom = prometheus(plant.port);
    let server = Server::with_policy_args(&policy(&prom.url(), "2s"), "yaml", &[]);
    let http = server.http;
    plant.start_worker(vec![server.line]);
    let t0 = Instant::now();

    settles_at_the_setpoint(&plant, http, t0);
    breaks_at_quadruple_cost(&plant, http, every);
    survives_a_prometheus_outage(&plant, &mut prom, http, every, t0);
    drop(server);
}

/// a) From 10/s to the setpoint, and staying there; the governor holds the
/// lease and sets the rule's knob.
fn settles_at_the_setpoint(plant: &Plant, http: SocketAddr, t0: Instant) {
    let took = wait_settled("a: start", plant, http, t0);
    let mut samples = Vec::new();
    for _ in 0..20 {
        std::thread::sleep(SAMPLE);
        samples.push(plant.load());
    }
    let out = samples.iter().filter(|l| !in_band(**l)).count();
    let (lo, hi) = samples
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    println!(
        "[a] settled after {:.1} s; next 10 s: load {lo:.2}..{hi:.2}, {out} of 20 samples out of band, \
         {} hits/s, knob {:?}",
        took.as_secs_f64(),
        plant.rate(),
        knob(http)
    );
    assert!(
        out <= 1,
        "load left the band in {out} of 20 samples: {samples:.2?}"
    );
    assert!(
        lo >= SETPOINT * 0.6 && hi <= SETPOINT * 1.4,
        "load outside ±40%: {samples:.2?}"
    );
    let (g, replica) = governor(http);
    assert_eq!(g["role"], "governing", "{g}");
    assert_eq!(g["leaseHolder"].as_str(), Some(replica.as_str()), "{g}");
    assert_eq!(gauge(http, "divvy_governor_leader"), Some(1.0));
    assert_eq!(gauge(http, "divvy_governor_setpoint"), Some(SETPOINT));
    let out_gauge = gauge(http, "divvy_governor_output").expect("output gauge");
    assert!(
        (MIN as f64..=MAX as f64).contains(&out_gauge),
        "{out_gauge}"
    );
    let knobs = get_json(http, "/knobs");
    assert_eq!(knobs["shared"], false, "{knobs}");
    let k = knobs["knobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["label"] == RULE)
        .expect("a knob for reindex");
    assert_eq!(
        k["setBy"].as_str(),
        Some(format!("governor@{replica}").as_str()),
        "{k}"
    );
}

/// b) Quadruple cost: the breaker opens within 2 intervals, then the load
/// settles again at a quarter of the rate.
fn breaks_at_quadruple_cost(plant: &Plant, http: SocketAddr, every: Duration) {
    plant.set_cost(4);
    let changed = Instant::now();
    println!("[b] cost 4: load now {:.2}", plant.load());
    let mut opened = None;
    let mut zero = None;
    while opened.is_none() || zero.is_none() {
        let t = changed.elapsed();
        if opened.is_none() && gauge(http, "divvy_governor_breaker_open") == Some(1.0) {
            opened = Some(t);
        }
        if zero.is_none() && knob(http) == Some(0) {
            zero = Some(t);
        }
        assert!(
            t < every * 2,
            "within 2 intervals of the cost change: breaker_open metric at {opened:?}, \
             knob 0 at {zero:?}; governor {}",
            governor(http).0
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "[b] breaker open (metric) after {:.2} s, knob creditLimit 0 after {:.2} s",
        opened.unwrap().as_secs_f64(),
        zero.unwrap().as_secs_f64()
    );
    let took = wait_settled("b: cost 4", plant, http, changed);
    let rate = plant.rate();
    println!(
        "[b] settled again after {:.1} s at {rate} hits/s",
        took.as_secs_f64()
    );
    assert!(
        (15..=35).contains(&rate),
        "at cost 4 the rate should be near 25/s, is {rate}"
    );
    assert_eq!(gauge(http, "divvy_governor_breaker_open"), Some(0.0));
}

/// c) Prometheus goes away right after a step: the knob holds for two
/// steps, then falls to min; back with Prometheus.
fn survives_a_prometheus_outage(
    plant: &Plant,
    prom: &mut Prometheus,
    http: SocketAddr,
    every: Duration,
    t0: Instant,
) {
    wait_for_step(http, every);
    let before = knob(http).expect("a knob");
    prom.kill();
    let killed = Instant::now();
    assert_ne!(before, MIN, "the fallback check needs a knob above min");
    println!("[c] Prometheus killed; knob was {before}");
    let mut trace = Vec::new();
    let fell = loop {
        let t = killed.elapsed();
        let k = knob(http);
        trace.push((t.as_millis(), k));
        if t < Duration::from_millis(4500) {
            assert_eq!(
                k,
                Some(before),
                "the knob must hold for two intervals without data ({t:?} after the kill); \
                 trace {trace:?}; governor {}",
                governor(http).0
            );
        }
        if k == Some(MIN) {
            break t;
        }
        assert!(
            t < Duration::from_secs(12),
            "the knob did not fall to min ({MIN}) within 12 s of the kill: {trace:?}; governor {}",
            governor(http).0
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (g, _) = governor(http);
    println!(
        "[c] knob held {before} and fell to {MIN} after {:.2} s; governor: missing={} lastError={}",
        fell.as_secs_f64(),
        g["missing"],
        g["lastError"]
    );
    assert!(
        g["lastError"].as_str().is_some_and(|e| !e.is_empty()),
        "{g}"
    );
    assert!(g["missing"].as_u64().is_some_and(|m| m >= 3), "{g}");
    assert_eq!(g["output"].as_u64(), Some(MIN), "{g}");
    let errors: f64 = common::metric_samples_at(http)
        .iter()
        .filter(|(k, _)| {
            k.starts_with("divvy_governor_queries_total{")
                && k.contains("result=\"error\"")
                && k.contains(&format!("rule=\"{RULE}\""))
        })
        .map(|(_, v)| v)
        .sum();
    assert!(errors >= 3.0, "queries_total with result=error: {errors}");

    prom.launch();
    wait_for_sample(prom);
    let back = Instant::now();
    // Not asserted, shown: until its first scrape after the restart,
    // Prometheus answers with the last sample from before the kill (its
    // 5 min lookback), stamped with the evaluation time.
    println!(
        "[c] right after the restart Prometheus serves a plant_load sample {:?} s old",
        query(prom, "max(time()-timestamp(plant_load))")
    );
    println!(
        "[c] Prometheus back on the same port after {:.1} s",
        (back - killed).as_secs_f64()
    );
    let took = wait_settled("c: Prometheus back", plant, http, back);
    println!(
        "[c] settled again {:.1} s after Prometheus came back, {} hits/s; total {:.1} s",
        took.as_secs_f64(),
        plant.rate(),
        t0.elapsed().as_secs_f64()
    );
    let (g, _) = governor(http);
    assert!(g["lastError"].is_null(), "{g}");
}

#[test]
fn two_replicas_one_governor_and_takeover() {
    let every = Duration::from_secs(1);
    let redis = Redis::start();
    let mut plant = Plant::start();
    let prom = prometheus(plant.port);
    let text = policy(&prom.url(), "1s");
    let url = redis.url();
    let a = Server::with_policy_args(&text, "yaml", &["--redis-url", &url]);
    let b = Server::with_policy_args(&text, "yaml", &["--redis-url", &url]);
    plant.start_worker(vec![a.line, b.line]);
    let mut servers = [Some(a), Some(b)];
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.as_ref().unwrap().http).collect();
    let pids: Vec<u32> = servers.iter().map(|s| s.as_ref().unwrap().pid()).collect();

    // Exactly one governs.
    let t0 = Instant::now();
    let holder = single_governor(&addrs, t0);
    let survivor = 1 - holder;
    println!(
        "one governor after {:.1} s: replica #{holder} (pid {}) governs, #{survivor} (pid {}) idle",
        t0.elapsed().as_secs_f64(),
        pids[holder],
        pids[survivor]
    );
    let survivor_name = assert_one_lease(&redis, &addrs, &pids, holder, every);

    // The survivor's knob, every 200 ms, from now on.
    let watching = Arc::new(AtomicBool::new(true));
    let (seen, watcher) = watch_knob(addrs[survivor], Arc::clone(&watching));

    // Let the holder govern a few intervals, then kill it.
    std::thread::sleep(every * 4);
    let (gs, _) = governor(addrs[survivor]);
    assert_eq!(
        gs["role"], "idle",
        "still idle while the holder lives: {gs}"
    );
    assert_eq!(gauge(addrs[survivor], "divvy_governor_leader"), Some(0.0));
    drop(servers[holder].take());
    let killed = Instant::now();
    let took = wait_takeover(addrs[survivor], killed, every);
    println!(
        "holder killed; survivor governing after {:.2} s (bound {:.1} s)",
        took.as_secs_f64(),
        (every * 3).as_secs_f64()
    );
    let (g, _) = governor(addrs[survivor]);
    assert_eq!(
        g["leaseHolder"].as_str(),
        Some(survivor_name.as_str()),
        "{g}"
    );
    assert_eq!(gauge(addrs[survivor], "divvy_governor_leader"), Some(1.0));

    // The survivor keeps stepping for a few intervals.
    let stepped = g["steppedAtMs"].as_u64().expect("steppedAtMs");
    std::thread::sleep(every * 4);
    let (g, _) = governor(addrs[survivor]);
    assert!(
        g["steppedAtMs"].as_u64().unwrap() >= stepped + 2 * every.as_millis() as u64,
        "{g}"
    );
    assert_eq!(g["role"], "governing", "{g}");
    assert_eq!(
        redis.cli(&["GET", &format!("divvy:governor:{RULE}")]),
        survivor_name
    );
    watching.store(false, Ordering::SeqCst);
    watcher.join().unwrap();
    let seen = lock(&seen).clone();
    let values: Vec<u64> = seen.iter().map(|s| s.1).collect();
    println!(
        "survivor's knob over {} polls: {}..{} (rate now {}/s, load {:.2})",
        seen.len(),
        values.iter().min().unwrap_or(&0),
        values.iter().max().unwrap_or(&0),
        plant.rate(),
        plant.load()
    );
    assert!(seen.len() >= 30, "too few polls: {seen:?}");
    assert!(
        values.iter().all(|v| (MIN..=MAX).contains(v)),
        "a knob creditLimit outside [{MIN}, {MAX}]: {seen:?}"
    );
    assert_eq!(g["breakerOpen"], false, "{g}");
}

/// Waits up to 10 s (from `t0`) until exactly one of the replicas at
/// `addrs` governs and the other is idle, as their metrics and
/// `/governors` say; the one governing.
fn single_governor(addrs: &[SocketAddr], t0: Instant) -> usize {
    loop {
        let leader: Vec<Option<f64>> = addrs
            .iter()
            .map(|h| gauge(*h, "divvy_governor_leader"))
            .collect();
        let roles: Vec<Value> = addrs
            .iter()
            .map(|h| governor(*h).0["role"].clone())
            .collect();
        if let (Some(i), [Some(x), Some(y)]) = (
            roles.iter().position(|r| r == "governing"),
            leader.as_slice(),
        ) {
            if roles[1 - i] == "idle" && x + y == 1.0 && leader[i] == Some(1.0) {
                break i;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no single governor within 10 s: leader metrics {leader:?}, roles {roles:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Both replicas name replica `holder` (of `addrs`, pids `pids`) as the
/// lease holder, as Redis does, and the lease lives two intervals; the
/// other replica's name.
fn assert_one_lease(
    redis: &Redis,
    addrs: &[SocketAddr],
    pids: &[u32],
    holder: usize,
    every: Duration,
) -> String {
    let survivor = 1 - holder;
    let (gh, holder_name) = governor(addrs[holder]);
    let (gs, survivor_name) = governor(addrs[survivor]);
    assert_ne!(holder_name, survivor_name);
    assert!(
        holder_name.ends_with(&format!(":{}", pids[holder])),
        "{holder_name}"
    );
    assert_eq!(
        gh["leaseHolder"].as_str(),
        Some(holder_name.as_str()),
        "{gh}"
    );
    assert_eq!(gs["role"], "idle", "{gs}");
    assert_eq!(
        gs["leaseHolder"].as_str(),
        Some(holder_name.as_str()),
        "{gs}"
    );
    assert_eq!(
        redis.cli(&["GET", &format!("divvy:governor:{RULE}")]),
        holder_name
    );
    // The lease lives two intervals.
    let pttl: i64 = redis
        .cli(&["PTTL", &format!("divvy:governor:{RULE}")])
        .parse()
        .expect("PTTL");
    assert!(
        pttl > 0 && pttl <= 2 * every.as_millis() as i64,
        "lease PTTL {pttl} ms"
    );
    survivor_name
}

/// Knob polls: (ms since the start, creditLimit).
type KnobPolls = Arc<Mutex<Vec<(u128, u64)>>>;

/// The knob of the replica at `http`, every 200 ms while `watching`:
/// (ms since the start, creditLimit) and the polling thread.
fn watch_knob(http: SocketAddr, watching: Arc<AtomicBool>) -> (KnobPolls, JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::<(u128, u64)>::new()));
    let watcher = {
        let seen = Arc::clone(&seen);
        let start = Instant::now();
        std::thread::spawn(move || {
            while watching.load(Ordering::SeqCst) {
                if let Some(k) = knob(http) {
                    lock(&seen).push((start.elapsed().as_millis(), k));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    (seen, watcher)
}

/// Waits until the replica at `http` governs, at most 3 intervals after
/// the holder was `killed`; how long it took.
fn wait_takeover(http: SocketAddr, killed: Instant, every: Duration) -> Duration {
    loop {
        let (g, _) = governor(http);
        if g["role"] == "governing" {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < every * 3 + Duration::from_millis(300),
            "the survivor did not take over within 3 intervals: {g}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_governor_sections_are_refused_by_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = "\
overrides:
  - operation: {path: /reindex}
    creditLimit: 10
    resetSeconds: 1
    algorithm: token_bucket
    label: reindex
default: {creditLimit: 0}
";
    let bad = format!(
        "{rules}governors:
  - rule: nothere
    query: 'max(plant_load)'
    setpoint: 2
    max: 500
  - rule: reindex
    setpoint: 2
    min: 50
    max: 5
    kp: -1
    every: 2x
"
    );
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, bad).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg(&path)
        .output()
        .expect("run divvy check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success(), "bad governors accepted:\n{stderr}");
    common::assert_has(
        &stderr,
        &[
            "governor #1 (rule nothere): no rule or limit has the label `nothere`",
            "governor #2 (rule reindex): `query` is required",
            "governor #2 (rule reindex): `kp` must not be negative, found -1",
            "governor #2 (rule reindex): `min` (50) is greater than `max` (5)",
            "governor #2 (rule reindex): `every` must be a duration",
            "found `2x`",
        ],
    );

    let path = dir.path().join("good.yaml");
    std::fs::write(&path, policy("http://127.0.0.1:9090", "2s")).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg(&path)
        .output()
        .expect("run divvy check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "valid governor refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::assert_has(
        &stdout,
        &[
            "governor reindex: max(plant_load) -> setpoint 2 every 2s, creditLimit 5..500, \
             kp 2 ki 5 kd 0, breaker above 6, prometheus http://127.0.0.1:9090",
        ],
    );
}
