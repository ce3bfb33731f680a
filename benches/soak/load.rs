//! The steady load: several actors on each rule, each asking through both
//! Envoys on its own paced schedule, every answer kept with the Unix times
//! it was sent and received.

use std::sync::{Arc, Mutex};

use crate::common::pacer::{self, Load, Outcome};
use crate::now;
use crate::rig::RULES;

/// Actors per rule.
pub const ACTORS: usize = 3;

/// Requests per second of one actor through one Envoy (both Envoys: twice
/// this, well above each rule's limit, so every window is contested).
pub const RATE: f64 = 8.0;

/// What became of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// 200.
    Allowed,
    /// 429.
    Denied,
    /// A 5xx from Envoy.
    Server(u16),
    /// Anything else: another status, a connection error.
    Other(String),
}

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Record {
    /// Index in [`RULES`].
    pub rule: usize,
    /// The actor, `0..ACTORS`.
    pub actor: usize,
    /// Which Envoy it went through.
    pub envoy: usize,
    /// When it was sent (Unix seconds).
    pub sent: f64,
    /// When its answer came back (Unix seconds).
    pub done: f64,
    /// The answer.
    pub status: Status,
}

/// The load's users, named `rule.actor.envoy`, their schedules spread
/// evenly over each 1/[`RATE`] s (steady, not a burst of every user at
/// once).
fn loads(seconds: f64) -> Vec<(usize, usize, usize, Load)> {
    let users = RULES.len() * ACTORS * 2;
    let mut loads = Vec::new();
    for rule in 0..RULES.len() {
        for actor in 0..ACTORS {
            for envoy in 0..2 {
                let user = format!("{rule}.{actor}.{envoy}");
                let from = loads.len() as f64 / (users as f64 * RATE);
                loads.push((rule, actor, envoy, Load::new(&user, RATE, from, seconds)));
            }
        }
    }
    loads
}

/// Runs the load through Envoys `ports` for `seconds` on threads of its
/// own; the records accumulate in the returned vector as they come.
pub fn start(
    ports: [u16; 2],
    seconds: f64,
) -> (Arc<Mutex<Vec<Record>>>, std::thread::JoinHandle<u64>) {
    let records = Arc::new(Mutex::new(Vec::new()));
    let shared = records.clone();
    let handle = std::thread::spawn(move || {
        let plan = loads(seconds);
        let just_loads: Vec<Load> = plan.iter().map(|(.., l)| l.clone()).collect();
        let connect = |i: usize, _: &Load| -> pacer::Sender {
            let (rule, actor, envoy, _) = plan[i];
            let actor_name = format!("actor{actor}");
            let headers = [("x-rule", RULES[rule].0), ("x-actor", actor_name.as_str())];
            let mut send = pacer::http_sender(ports[envoy], "/", &headers);
            let records = shared.clone();
            Box::new(move || {
                let sent = now();
                let outcome = send();
                let status = match &outcome {
                    Outcome::Allowed => Status::Allowed,
                    Outcome::Denied => Status::Denied,
                    Outcome::Failed(why) => classify(why),
                };
                let done = now();
                let record = Record {
                    rule,
                    actor,
                    envoy,
                    sent,
                    done,
                    status,
                };
                records.lock().unwrap().push(record);
                outcome
            })
        };
        let traces = pacer::run(&just_loads, &connect);
        traces.iter().map(|t| t.skipped).sum()
    });
    (records, handle)
}

/// A failed request's status: an Envoy 5xx, or something else.
fn classify(why: &str) -> Status {
    match why.strip_prefix("HTTP ").and_then(|c| c.parse().ok()) {
        Some(code) if (500..600).contains(&code) => Status::Server(code),
        _ => Status::Other(why.to_owned()),
    }
}
