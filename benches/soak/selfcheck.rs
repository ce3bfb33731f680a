//! The checks run first on made-up traces they must fail (an actor over
//! its limit, a 500 with no replica killed, an ERROR line with no fault, a
//! panic), so a soak that passes is not a soak whose checks cannot fail.

use crate::checks::{self, Findings};
use crate::faults::{Event, Kind, KNOB_DELETED, KNOB_SET};
use crate::grpc_load::{self, Answer, Call};
use crate::load::{Record, Status};

/// `n` requests of rule 0, actor 0, in epoch second 1000, all `status`.
fn second(n: usize, status: Status) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let sent = 1000.0 + i as f64 / (n as f64 + 1.0);
            let (envoy, rule, actor) = (i % 2, 0, 0);
            let status = status.clone();
            Record {
                rule,
                actor,
                envoy,
                sent,
                done: sent + 0.001,
                status,
            }
        })
        .collect()
}

/// `n` calls of actor 0 to `replica` in epoch second 1000, all `answer`.
fn calls(n: usize, replica: usize, answer: Answer) -> Vec<Call> {
    (0..n)
        .map(|i| {
            let sent = 1000.0 + i as f64 / (n as f64 + 1.0);
            Call {
                actor: 0,
                replica,
                sent,
                done: sent + 0.001,
                answer: answer.clone(),
            }
        })
        .collect()
}

/// Panics unless the gRPC load's check catches an actor over the xDS
/// domain's limit and an undecided call with no replica killed, and
/// excuses one to replica 0 while it was down.
fn grpc() {
    let none: Vec<Event> = Vec::new();
    let limit = crate::xds::LIMIT as usize;
    let mut clean = Findings::default();
    grpc_load::check(&calls(limit, 1, Answer::Ok), &none, &[], 0, &mut clean);
    assert!(
        clean.violations.is_empty(),
        "a clean gRPC trace fails: {:?}",
        clean.violations
    );
    let mut over = Findings::default();
    grpc_load::check(&calls(limit + 1, 1, Answer::Ok), &none, &[], 0, &mut over);
    assert!(
        !over.violations.is_empty(),
        "{} OKs of a limit of {limit} pass",
        limit + 1
    );
    let error = Answer::Error("Unavailable: connection refused".into());
    let mut failed = Findings::default();
    grpc_load::check(&calls(1, 1, error.clone()), &none, &[], 0, &mut failed);
    assert!(
        !failed.violations.is_empty(),
        "an undecided call with no replica killed passes"
    );
    let mut kill = Event::new("replica 0 killed", Kind::ReplicaKill, 999.5, 10.0);
    kill.recovered = Some(999.8);
    let mut excused = Findings::default();
    grpc_load::check(&calls(1, 0, error), &[kill], &[], 0, &mut excused);
    assert!(
        excused.violations.is_empty(),
        "a call to replica 0 while it was down is not excused: {:?}",
        excused.violations
    );
}

/// Whether `n` admissions of an actor of the global limit in epoch second
/// 1000 pass the check, with `events`.
fn global_passes(n: usize, events: &[Event]) -> bool {
    let rule = crate::rig::RULES
        .iter()
        .position(|r| r.0 == crate::global_limit::RULE)
        .expect("the global rule is in the load");
    let trace: Vec<Record> = second(n, Status::Allowed)
        .into_iter()
        .map(|r| Record { rule, ..r })
        .collect();
    let mut found = Findings::default();
    checks::admissions(&trace, events, &[], &mut found);
    found.violations.is_empty()
}

/// Panics unless the global limit's bound follows docs/global.md: burst +
/// rate with Redis up; inside a Redis stop, only the replicas' local
/// shares of the fallback share, then of the floor.
fn global() {
    let stop = |injected: f64, healed: f64| {
        let mut e = Event::new("redis SIGSTOP", Kind::RedisStop, injected, 1.0);
        e.healed = healed;
        e.recovered = Some(healed + 0.1);
        vec![e]
    };
    let limit = crate::rig::LIMIT as usize;
    assert!(global_passes(2 * limit, &[]), "burst + rate fails");
    assert!(
        !global_passes(2 * limit + 1, &[]),
        "burst + rate + 1 passes"
    );
    // 3.5 s into a stop: the last lease has lapsed, the fallback share
    // (a half) of it is in force; each replica's local half of that.
    let fallback = stop(996.5, 1002.0);
    assert!(global_passes(12, &fallback), "the fallback share fails");
    assert!(
        !global_passes(13, &fallback),
        "past the fallback share passes"
    );
    // 10 s into a stop: the floor, a credit of burst and of rate each.
    let floor = stop(990.0, 1010.0);
    assert!(global_passes(4, &floor), "the floor fails");
    assert!(!global_passes(5, &floor), "past the floor passes");
}

/// Panics unless every made-up fault is caught and a clean trace passes.
pub fn run() {
    grpc();
    global();
    let none: Vec<Event> = Vec::new();
    let mut clean = Findings::default();
    checks::admissions(&second(10, Status::Allowed), &none, &[], &mut clean);
    checks::statuses(&second(10, Status::Denied), &none, 0, &mut clean);
    assert!(
        clean.violations.is_empty(),
        "a clean trace fails: {:?}",
        clean.violations
    );
    let mut over = Findings::default();
    checks::admissions(&second(11, Status::Allowed), &none, &[], &mut over);
    assert!(
        !over.violations.is_empty(),
        "11 admissions of a limit of 10 pass"
    );
    let mut allowed = Findings::default();
    checks::admissions(
        &second(11, Status::Allowed),
        &none,
        &[(999.5, 1000.2)],
        &mut allowed,
    );
    assert!(
        allowed.violations.is_empty(),
        "the failure policy's allowance is not applied"
    );
    knobs();
    let mut failed = Findings::default();
    checks::statuses(&second(1, Status::Server(500)), &none, 0, &mut failed);
    assert!(
        !failed.violations.is_empty(),
        "a 500 with no replica killed passes"
    );
    let mut logged = Findings::default();
    let log = vec![
        (
            1000.0,
            0,
            "2026-01-01T00:00:00Z ERROR divvy: unexplained".to_owned(),
        ),
        (1000.0, 1, "thread 'main' panicked at src/x.rs".to_owned()),
    ];
    crate::health::logs(&log, &none, &mut logged);
    assert_eq!(logged.violations.len(), 2, "{:?}", logged.violations);
}

/// A knob event named `name` at `at`, seen at once.
fn knob_event(name: &'static str, at: f64) -> Event {
    let mut e = Event::new(name, Kind::Knob, at, 1.0);
    (e.healed, e.recovered) = (at, Some(at));
    e
}

/// The knob's lower limit holds between a set and its delete only: six
/// admissions inside fail, ten between a delete and the next set pass
/// (an hour's run once read that gap as the knob in force).
fn knobs() {
    let inside = [
        knob_event(KNOB_SET, 999.0),
        knob_event(KNOB_DELETED, 1002.0),
    ];
    let mut over = Findings::default();
    checks::admissions(&second(6, Status::Allowed), &inside, &[], &mut over);
    assert!(
        !over.violations.is_empty(),
        "6 admissions under a knob of 5 pass"
    );
    let gap = [
        knob_event(KNOB_SET, 990.0),
        knob_event(KNOB_DELETED, 995.0),
        knob_event(KNOB_SET, 1002.0),
        knob_event(KNOB_DELETED, 1004.0),
    ];
    let mut between = Findings::default();
    checks::admissions(&second(10, Status::Allowed), &gap, &[], &mut between);
    assert!(
        between.violations.is_empty(),
        "the gap between a knob's delete and the next set counts as the knob: {:?}",
        between.violations
    );
}
