//! Hot reload against the real binary: every way a file gets replaced,
//! invalid files, bursts, reloads under load, and counters that survive.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{desc, request, Server};

/// A policy whose `HIT k=marker` answers `OK true <mark> 0`.
fn policy(mark: u64, counted_limit: u64) -> String {
    format!(
        "overrides:\n  - operation: {{k: counted}}\n    creditLimit: {counted_limit}\n    resetSeconds: 1h\n  \
         - operation: {{k: other}}\n    creditLimit: 10\n    resetSeconds: 1h\n  \
         - operation: {{k: marker}}\n    creditLimit: {mark}\n    resetSeconds: 0\n\
         default: {{creditLimit: 1, resetSeconds: 0}}\n"
    )
}

struct Setup {
    server: Server,
    dir: tempfile::TempDir,
    path: PathBuf,
}

fn setup(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy(1, 10)).unwrap();
    let server = Server::start(&path, extra);
    Setup { server, dir, path }
}

fn mark(server: &Server) -> u64 {
    let answer = server.line_exchange(b"HIT k=marker\n");
    answer.split(' ').nth(2).unwrap().parse().unwrap()
}

fn wait_for_mark(server: &Server, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while mark(server) != want {
        assert!(
            Instant::now() < deadline,
            "policy with mark {want} not in force within 15 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_in_place(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn rename_over(path: &Path, text: &str) {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn every_replacement_style_takes_effect() {
    let s = setup(&[]);
    assert_eq!(mark(&s.server), 1);
    write_in_place(&s.path, &policy(2, 10));
    wait_for_mark(&s.server, 2);
    rename_over(&s.path, &policy(3, 10));
    wait_for_mark(&s.server, 3);
    std::fs::remove_file(&s.path).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // While the file is gone the old rules keep serving.
    assert_eq!(mark(&s.server), 3);
    std::fs::write(&s.path, policy(4, 10)).unwrap();
    wait_for_mark(&s.server, 4);
    drop(s.dir);
}

#[test]
fn kubernetes_configmap_symlink_swap_takes_effect() {
    // The layout the kubelet writes: policy.yaml -> ..data/policy.yaml,
    // ..data -> ..<timestamp>/, and an update swaps ..data atomically.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let v1 = root.join("..2026_11_21_v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("policy.yaml"), policy(11, 10)).unwrap();
    std::os::unix::fs::symlink("..2026_11_21_v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policy.yaml", root.join("policy.yaml")).unwrap();
    let server = Server::start(&root.join("policy.yaml"), &[]);
    assert_eq!(mark(&server), 11);
    let v2 = root.join("..2026_11_21_v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("policy.yaml"), policy(12, 10)).unwrap();
    std::os::unix::fs::symlink("..2026_11_21_v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(&v1).unwrap();
    wait_for_mark(&server, 12);
}

#[test]
fn an_invalid_file_changes_nothing_and_is_reported() {
    let s = setup(&[]);
    let rx = &s.server.log;
    // A counter in progress.
    assert_eq!(
        s.server.line_exchange(b"HIT k=counted\n"),
        "OK true 9 3600\n"
    );
    rename_over(
        &s.path,
        "overrides:\n  - operation: {k: x}\n    creditLimt: 3\n",
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut reported = None;
    while reported.is_none() {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the failed reload is logged");
        if line.contains("policy reload failed") {
            reported = Some(line);
        }
    }
    let reported = reported.unwrap();
    // Reported once: reading the file does not trigger another reload.
    let again = Instant::now() + Duration::from_millis(1500);
    while let Ok(line) = rx.recv_timeout(again.saturating_duration_since(Instant::now())) {
        assert!(
            !line.contains("policy reload failed"),
            "reloaded again: {line}"
        );
    }
    let (_, metrics) = s.server.http("GET", "/metrics", "");
    assert!(
        metrics.contains("divvy_reloads_total{result=\"failure\"} 1"),
        "{metrics}"
    );
    assert!(reported.contains("policy.yaml"), "{reported}");
    assert!(
        reported.contains("unknown field `creditLimt`"),
        "{reported}"
    );
    assert!(reported.contains("line 3"), "{reported}");
    // The old rules still serve, counters intact.
    assert_eq!(mark(&s.server), 1);
    let counted = s.server.line_exchange(b"HIT k=counted\n");
    assert!(counted.starts_with("OK true 8 "), "{counted}");
    // Then a valid file takes effect.
    rename_over(&s.path, &policy(5, 10));
    wait_for_mark(&s.server, 5);
}

#[test]
fn the_last_of_a_hundred_writes_in_a_second_wins() {
    let s = setup(&[]);
    for i in 1..=100u64 {
        if i % 2 == 0 {
            write_in_place(&s.path, &policy(100 + i, 10));
        } else {
            rename_over(&s.path, &policy(100 + i, 10));
        }
        std::thread::sleep(Duration::from_millis(8));
    }
    wait_for_mark(&s.server, 200);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(mark(&s.server), 200);
}

#[test]
fn counters_of_unchanged_rules_survive_a_reload() {
    let s = setup(&[]);
    for left in [9, 8, 7] {
        assert_eq!(
            s.server.line_exchange(b"HIT k=other\n"),
            format!("OK true {left} 3600\n")
        );
    }
    assert_eq!(
        s.server.line_exchange(b"HIT k=counted\n"),
        "OK true 9 3600\n"
    );
    // Change the marker and the `counted` rule's limit; `other` is unchanged.
    rename_over(&s.path, &policy(2, 20));
    wait_for_mark(&s.server, 2);
    let other = s.server.line_exchange(b"HIT k=other\n");
    assert!(other.starts_with("OK true 6 "), "{other}");
    // The changed rule starts a fresh counter.
    assert_eq!(
        s.server.line_exchange(b"HIT k=counted\n"),
        "OK true 19 3600\n"
    );
}

#[test]
fn sighup_forces_a_reload() {
    let mut s = setup(&["--no-watch"]);
    rename_over(&s.path, &policy(7, 10));
    let pid = s.server.pid();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_for_mark(&s.server, 7);
    assert!(s.server.terminate().success());
}

#[test]
fn reloads_under_load_fail_no_request() {
    let s = setup(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (stop, failures, done, addr) =
            (stop.clone(), failures.clone(), done.clone(), s.server.line);
        workers.push(std::thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut w = stream;
            while !stop.load(Ordering::SeqCst) {
                w.write_all(b"HIT k=marker\nHIT k=counted who=x\n").unwrap();
                for _ in 0..2 {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if !line.starts_with("OK ") {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    let grpc_addr = s.server.grpc;
    for _ in 0..2 {
        let (stop, failures, done) = (stop.clone(), failures.clone(), done.clone());
        workers.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{grpc_addr}")).await.unwrap();
                while !stop.load(Ordering::SeqCst) {
                    let r = client
                        .should_rate_limit(request("any", vec![desc(&[("k", "marker")]), desc(&[("k", "other")])]))
                        .await;
                    match r {
                        Ok(r) if r.get_ref().statuses.len() == 2 => {}
                        _ => {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }));
    }
    for i in 1..=20u64 {
        rename_over(&s.path, &policy(1000 + i, 10 + i));
        wait_for_mark(&s.server, 1000 + i);
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    assert!(done.load(Ordering::SeqCst) > 100);
}
