//! A governor on a rule of its own, reading Prometheus, and the fault of
//! Prometheus going away and coming back.

use crate::common::prometheus::Prometheus;
use crate::faults::{wait_until, Event, Kind};
use crate::now;
use crate::rig::{self, Rig};

/// Prometheus with no scrape targets: the governor's query is a constant.
const CONFIG: &str = "global: {scrape_interval: 15s}\n";

/// The policy's governed rule and its governor: `vector(1)` below its
/// setpoint of 2, so the knob climbs to `max` while Prometheus answers and
/// falls to `min` after 4 intervals without it (docs/knobs.md,
/// "Governors"). No request of the load matches the rule.
pub fn policy_part(prometheus: &str) -> (String, String) {
    let rule = "  - operation: {rule: governed, actor: \"*\"}\n    algorithm: token_bucket\n    creditLimit: 10\n    resetSeconds: 1\n    label: governed\n";
    let governor = format!(
        "governors:\n  - rule: governed\n    query: 'vector(1)'\n    prometheus: {prometheus}\n    setpoint: 2\n    min: 1\n    max: 50\n    every: 500ms\n    fallbackAfter: 4\n"
    );
    (rule.to_owned(), governor)
}

/// Starts Prometheus on a fixed free port.
pub fn start() -> Prometheus {
    Prometheus::start(crate::common::stable_port(), CONFIG)
}

/// The governor's queries with `result` so far, over both replicas (the
/// one holding the lease queries).
fn queries(rig: &Rig, result: &str) -> f64 {
    let label = format!("result=\"{result}\"");
    rig.replicas
        .iter()
        .filter_map(|r| rig::get(r.http(), "/metrics"))
        .flat_map(|(_, body)| {
            crate::common::parse_metrics(&body)
                .into_iter()
                .filter(|(k, _)| {
                    k.starts_with("divvy_governor_queries_total") && k.contains(&label)
                })
                .map(|(_, v)| v)
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Prometheus killed for `hold`, then started again: its queries must
/// fail meanwhile, and succeed again within 2 s of it answering (four
/// intervals of 500 ms).
pub fn prometheus_down(rig: &mut Rig, hold: std::time::Duration) -> Event {
    let mut event = Event::new("prometheus killed, restarted", Kind::Prometheus, now(), 2.0);
    let failed = queries(rig, "error");
    rig.prometheus.kill();
    std::thread::sleep(hold);
    let failing = queries(rig, "error") - failed;
    event.note = format!("{failing} governor queries failed while it was down");
    if failing < 1.0 {
        event.problem = Some("no governor query failed while Prometheus was down".into());
    }
    rig.prometheus.launch();
    event.healed = now();
    let ok = queries(rig, "ok");
    event.recovered = wait_until(30.0, || queries(rig, "ok") > ok);
    event
}
