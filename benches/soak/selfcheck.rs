//! The checks run first on made-up traces they must fail (an actor over
//! its limit, a 500 with no replica killed, an ERROR line with no fault, a
//! panic), so a soak that passes is not a soak whose checks cannot fail.

use crate::checks::{self, Findings};
use crate::faults::{Event, Kind, KNOB_DELETED, KNOB_SET};
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

/// Panics unless every made-up fault is caught and a clean trace passes.
pub fn run() {
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
