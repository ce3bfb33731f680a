//! Unit tests of the traffic recorder: the lines, the rotation bound, drops.

use super::*;
use crate::observe::metrics::Metrics;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("divvy-record-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn lines_are_stamped_and_flushed() {
    let dir = temp_dir("lines");
    let path = dir.join("t.log");
    let m = Metrics::new();
    let (rec, thread) = TrafficRecorder::spawn(&path, 1 << 20, 16, m.traffic.clone()).unwrap();
    rec.record(b"HIT a=b");
    rec.record(br#"{"domain":"d","descriptors":[]}"#);
    assert!(rec.flush(Duration::from_secs(5)));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let (stamp, rest) = lines[0].split_once(' ').unwrap();
    assert!(stamp.parse::<u64>().unwrap() > 1_600_000_000_000);
    assert_eq!(rest, "HIT a=b");
    assert!(lines[1].ends_with(r#"{"domain":"d","descriptors":[]}"#));
    assert_eq!(m.traffic.lines.with_label_values(&["written"]).get(), 2);
    drop(rec);
    thread.join().unwrap();
}

#[test]
fn the_file_is_rotated_at_its_bound() {
    let dir = temp_dir("rotate");
    let path = dir.join("t.log");
    let m = Metrics::new();
    let max = 1000;
    let (rec, thread) = TrafficRecorder::spawn(&path, max, 4096, m.traffic.clone()).unwrap();
    for i in 0..200 {
        rec.record(format!("HIT path=/p{i:03} ip=10.0.0.1").as_bytes());
    }
    drop(rec);
    thread.join().unwrap();
    let now = std::fs::metadata(&path).unwrap().len();
    let old = std::fs::metadata(dir.join("t.log.1")).unwrap().len();
    assert!(
        now <= max && old <= max,
        "{now} and {old} bytes, bound {max}"
    );
    assert!(m.traffic.rotations.get() >= 5);
    // The newest lines are in the file, the ones before in `.1`.
    let last = std::fs::read_to_string(&path).unwrap();
    assert!(last.trim_end().ends_with("HIT path=/p199 ip=10.0.0.1"));
    assert_eq!(m.traffic.lines.with_label_values(&["written"]).get(), 200);
}

#[test]
fn a_full_queue_drops_and_counts() {
    let dir = temp_dir("drop");
    let path = dir.join("t.log");
    let m = Metrics::new();
    // The writer is held up by a flush it cannot answer until we read it.
    let (rec, thread) = TrafficRecorder::spawn(&path, 1 << 20, 2, m.traffic.clone()).unwrap();
    let (ack, done) = sync_channel(0);
    rec.tx.send(Msg::Flush(ack)).unwrap();
    for _ in 0..10 {
        rec.record(b"HIT a=b");
    }
    let dropped = m.traffic.lines.with_label_values(&["dropped"]).get();
    assert!(dropped >= 8, "{dropped} dropped");
    done.recv().unwrap();
    drop(rec);
    thread.join().unwrap();
    let written = m.traffic.lines.with_label_values(&["written"]).get();
    assert_eq!(written + dropped, 10);
}
