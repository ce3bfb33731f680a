//! `SOAK_DUMP=DIR`: the run's raw trace as text files, to look into a
//! failure: every request, every fault and every replica log line.

use std::fmt::Write;

use crate::faults::Event;
use crate::load::Record;
use crate::rig::LogLine;

/// Writes `requests.txt`, `faults.txt` and `log.txt` into `dir` (times in
/// Unix seconds).
pub fn write(
    dir: &str,
    records: &[Record],
    events: &[Event],
    log: &[LogLine],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut text = String::from("# rule actor envoy sent done status\n");
    for r in records {
        let _ = writeln!(
            text,
            "{} {} {} {:.4} {:.4} {:?}",
            r.rule, r.actor, r.envoy, r.sent, r.done, r.status
        );
    }
    std::fs::write(format!("{dir}/requests.txt"), text)?;
    let mut text = String::new();
    for e in events {
        let _ = writeln!(text, "{e:?}");
    }
    std::fs::write(format!("{dir}/faults.txt"), text)?;
    let mut text = String::new();
    for (at, replica, line) in log {
        let _ = writeln!(text, "{at:.4} {replica} {line}");
    }
    std::fs::write(format!("{dir}/log.txt"), text)
}
