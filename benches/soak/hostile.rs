//! The hostile burst: a pipelined line-protocol flood on replica 1 of
//! long, distinct actor values (each a new counter in Redis, hashed in its
//! key), beside the steady load.

use proptest::prelude::Rng;
use proptest::test_runner::TestRng;

use crate::common::flood::line_flood;
use crate::faults::{Event, Kind};
use crate::now;
use crate::rig::Rig;

/// Requests in one burst, and the connections that carry them.
const REQUESTS: usize = 10_000;
const CONNECTIONS: usize = 8;

/// Floods replica 1; every answer must be a decision (`OK ...`).
pub fn burst(rig: &mut Rig, rng: &mut TestRng) -> Event {
    let salt = rng.next_u64();
    let line = rig.replicas[1].line();
    let mut event = Event::new("hostile line flood", Kind::Hostile, now(), 0.0);
    let flood = std::panic::catch_unwind(|| {
        line_flood(line, REQUESTS, CONNECTIONS, &|i| {
            let long = format!("{salt:x}-{i}-").repeat(1 + i % 12);
            format!("HIT rule=hostile actor={long}")
        })
    });
    event.healed = now();
    event.recovered = Some(event.healed);
    match flood {
        Ok(answers) => {
            let bad = answers.iter().filter(|a| !a.starts_with("OK ")).count();
            let allowed = answers.iter().filter(|a| a.starts_with("OK true")).count();
            event.note = format!(
                "{REQUESTS} HITs on {CONNECTIONS} connections in {:.1} s, {allowed} allowed",
                event.healed - event.injected
            );
            if bad > 0 {
                event.problem = Some(format!("{bad} answers were not decisions"));
            }
        }
        Err(_) => event.problem = Some("the flood broke off (see the panic above)".into()),
    }
    event
}
