//! The divvy line protocol on a real socket against the real binary.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use common::{desc, parse_ok, request, Server};

/// Each rule answers with a distinct creditLimit, so an answer shows which
/// rule the parsed request matched.
const GRAMMAR_POLICY: &str = r#"
overrides:
  - operation: {q: "b c"}
    creditLimit: 0
  - operation: {"": x}
    creditLimit: 1
    resetSeconds: 0
  - operation: {e: ""}
    creditLimit: 2
    resetSeconds: 0
  - operation: {r: "2"}
    creditLimit: 3
    resetSeconds: 0
  - operation: {u: "x\"y"}
    creditLimit: 4
    resetSeconds: 0
  - operation: {w: v}
    creditLimit: 5
    resetSeconds: 0
  - operation: {"k k": "v=v"}
    creditLimit: 6
    resetSeconds: 0
  - operation: {case: Value}
    creditLimit: 8
    resetSeconds: 0
  - operation: {bad: "\uFFFD"}
    creditLimit: 9
    resetSeconds: 0
default:
  creditLimit: 7
  resetSeconds: 0
"#;

/// Every case of the grammar section of the protocol contract: request bytes → answer line.
const GRAMMAR: &[(&[u8], &str)] = &[
    (b"HIT", "OK true 7 0"),
    (b"hit q=\"b c\"", "OK false 0 -1"),
    (b"Hit =x", "OK true 1 0"),
    (b"HIT e=", "OK true 2 0"),
    (b"HIT e=\"\"", "OK true 2 0"),
    (b"HIT e= w=v", "OK true 2 0"),
    (b"HIT r=1 r=2", "OK true 3 0"),
    (b"HIT r=2 r=1", "OK true 7 0"),
    (b"HIT u=x\"y", "OK true 4 0"),
    (b"\"HIT\" w=v", "OK true 5 0"),
    (b"\"hit\"w=v", "OK true 5 0"),
    (b"HIT w=\"v\"", "OK true 5 0"),
    (b"HIT \t w=v \t", "OK true 5 0"),
    ("HIT\u{A0}w=v".as_bytes(), "OK true 5 0"),
    ("HIT w=v\u{3000}a=b\u{2028}".as_bytes(), "OK true 5 0"),
    (
        "HIT a=b\u{FEFF}\u{1680}\u{2000}\u{200A}\u{202F}\u{205F}\u{2029}\u{0B}\u{0C}w=v".as_bytes(),
        "OK true 5 0",
    ),
    (b"HIT w=v\r", "OK true 5 0"),
    (b"HIT \"k k\"=\"v=v\"", "OK true 6 0"),
    (b"HIT case=Value", "OK true 8 0"),
    (b"HIT case=value", "OK true 7 0"),
    (b"HIT CASE=Value", "OK true 7 0"),
    (b"HIT bad=\xff", "OK true 9 0"),
    (b"", "ERR unknown-command \"Unrecognized command: \""),
    (
        b" HIT w=v",
        "ERR unknown-command \"Unrecognized command: \"",
    ),
    (b"\tHIT", "ERR unknown-command \"Unrecognized command: \""),
    (
        b"get w=v",
        "ERR unknown-command \"Unrecognized command: GET\"",
    ),
    (
        b"hits",
        "ERR unknown-command \"Unrecognized command: HITS\"",
    ),
    (
        b"\"hit w\"=v",
        "ERR unknown-command \"Unrecognized command: HIT W\"",
    ),
    (
        b"\xffhit",
        "ERR unknown-command \"Unrecognized command: \u{FFFD}HIT\"",
    ),
    (b"\"HIT", "ERR unknown \"Unexpected end of quoted string.\""),
    (
        b"HIT w=\"v",
        "ERR unknown \"Unexpected end of quoted string.\"",
    ),
    (
        b"HIT \"w=v",
        "ERR unknown \"Unexpected end of quoted string.\"",
    ),
    (b"HIT w", "ERR unknown \"Unexpected end of input string.\""),
    (
        b"HIT w=v x",
        "ERR unknown \"Unexpected end of input string.\"",
    ),
    (b"HIT w v", "ERR unknown \"Expected '=', found ' '\""),
    (b"HIT \"w\"v=x", "ERR unknown \"Expected '=', found 'v'\""),
    (
        b"HIT a=b=c",
        "ERR unknown \"Expected whitespace, found '='\"",
    ),
    (
        b"HIT a=\"b\"c",
        "ERR unknown \"Expected whitespace, found 'c'\"",
    ),
    (
        "HIT a=\"b\"\u{1F600}".as_bytes(),
        "ERR unknown \"Expected whitespace, found '\u{FFFD}'\"",
    ),
];

#[test]
fn grammar_table_on_a_real_socket() {
    let server = Server::with_policy(GRAMMAR_POLICY, "yaml");
    // All cases pipelined on one connection: an ERR never closes it.
    let mut input = Vec::new();
    for (req, _) in GRAMMAR {
        input.extend_from_slice(req);
        input.push(b'\n');
    }
    let answers = server.line_exchange(&input);
    let got: Vec<&str> = answers.split_terminator('\n').collect();
    assert_eq!(got.len(), GRAMMAR.len(), "{answers}");
    for ((req, want), got) in GRAMMAR.iter().zip(&got) {
        assert_eq!(*got, *want, "request {:?}", String::from_utf8_lossy(req));
    }
    // And each case alone on its own connection.
    for (req, want) in GRAMMAR {
        let mut line = req.to_vec();
        line.push(b'\n');
        assert_eq!(server.line_exchange(&line), format!("{want}\n"));
    }
}

const COUNTING_POLICY: &str = r#"
overrides:
  - operation: {k: n}
    creditLimit: 1000
    resetSeconds: 1h
  - operation: {k: both}
    creditLimit: 4
    resetSeconds: 1h
  - operation: {k: actor, ip: "*"}
    creditLimit: 2
    resetSeconds: 1h
    actorField: ip
  - operation: {k: canary}
    matchPolicy: canary
    creditLimit: 1
    resetSeconds: 1h
  - operation: {k: short}
    creditLimit: 1
    resetSeconds: 1
default:
  creditLimit: 7
  resetSeconds: 0
"#;

#[test]
fn a_thousand_pipelined_requests_are_answered_in_order() {
    let server = Server::with_policy(COUNTING_POLICY, "yaml");
    let input = "HIT k=n\n".repeat(1000) + "HIT k=n\n";
    let answers = server.line_exchange(input.as_bytes());
    let lines: Vec<&str> = answers.lines().collect();
    assert_eq!(lines.len(), 1001);
    for (i, line) in lines.iter().take(1000).enumerate() {
        let (allowed, left, reset) = parse_ok(line);
        assert!(allowed, "{i}: {line}");
        assert_eq!(left, 999 - i as u64, "answer {i} out of order: {line}");
        assert!((3598..=3600).contains(&reset), "{line}");
    }
    assert!(lines[1000].starts_with("OK false 0 "));
}

#[test]
fn hit_semantics_match_the_grpc_path_and_share_counters() {
    let server = Server::with_policy(COUNTING_POLICY, "yaml");
    let line = |s: &str| server.line_exchange(format!("{s}\n").as_bytes());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut client = rt.block_on(server.client());
    let mut grpc = |pairs: &[(&str, &str)]| {
        let r = rt
            .block_on(client.should_rate_limit(request("any", vec![desc(pairs)])))
            .unwrap()
            .into_inner();
        (r.statuses[0].code == 1, r.statuses[0].limit_remaining)
    };
    // One counter, charged alternately through both protocols.
    assert_eq!(parse_ok(line("HIT k=both").trim()).1, 3);
    assert_eq!(grpc(&[("k", "both")]), (true, 2));
    assert_eq!(parse_ok(line("HIT k=both").trim()).1, 1);
    assert_eq!(grpc(&[("k", "both")]), (true, 0));
    assert_eq!(line("HIT k=both"), "OK false 0 3600\n");
    assert_eq!(grpc(&[("k", "both")]), (false, 0));
    // Actors.
    assert_eq!(line("HIT k=actor ip=1.1.1.1"), "OK true 1 3600\n");
    assert_eq!(line("HIT k=actor ip=1.1.1.1"), "OK true 0 3600\n");
    assert_eq!(line("HIT k=actor ip=1.1.1.1"), "OK false 0 3600\n");
    assert_eq!(line("HIT k=actor ip=2.2.2.2"), "OK true 1 3600\n");
    // Canary: charged, never decides (the default, always-allow, answers).
    assert_eq!(line("HIT k=canary"), "OK true 7 0\n");
    assert_eq!(line("HIT k=canary"), "OK true 7 0\n");
    // The window reopens after resetSeconds.
    assert_eq!(line("HIT k=short"), "OK true 0 1\n");
    // Seconds to reset here depend on how long the machine took: 1 or 0.
    assert!(line("HIT k=short").starts_with("OK false 0 "));
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(line("HIT k=short"), "OK true 0 1\n");
}

#[test]
fn a_last_line_without_newline_is_not_executed() {
    let server = Server::with_policy(COUNTING_POLICY, "yaml");
    assert_eq!(
        server.line_exchange(b"HIT k=both\nHIT k=both"),
        "OK true 3 3600\n"
    );
    assert_eq!(server.line_exchange(b"HIT k=both\n"), "OK true 2 3600\n");
}

#[test]
fn over_long_lines_get_an_error_and_the_stream_resynchronises() {
    let server = Server::with_policy_args(GRAMMAR_POLICY, "yaml", &["--line-max-bytes", "64"]);
    let long = format!("HIT w={}\n", "x".repeat(100));
    let huge = format!("HIT w={}\n", "y".repeat(1 << 20));
    let input = format!("HIT w=v\n{long}HIT w=v\n{huge}HIT\n");
    let answers = server.line_exchange(input.as_bytes());
    let too_long = "ERR unknown \"Line too long: the limit is 64 bytes.\"";
    assert_eq!(
        answers,
        format!("OK true 5 0\n{too_long}\nOK true 5 0\n{too_long}\nOK true 7 0\n")
    );
}

#[test]
fn a_stalled_connection_does_not_delay_another() {
    let server = Server::with_policy(COUNTING_POLICY, "yaml");
    // A: sends a partial line and stalls.
    let mut a = TcpStream::connect(server.line).unwrap();
    a.write_all(b"HIT k=").unwrap();
    // C: pipelines far more than it reads, so the server's writes to it block.
    let mut c = TcpStream::connect(server.line).unwrap();
    let flood = "HIT k=n\n".repeat(200_000);
    let writer = std::thread::spawn(move || {
        let _ = c.write_all(flood.as_bytes());
        c
    });
    // B: answered while A and C are stuck.
    let b = TcpStream::connect(server.line).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = BufReader::new(b.try_clone().unwrap());
    for expected in ["OK true 7 0", "OK true 7 0"] {
        (&b).write_all(b"HIT\n").unwrap();
        let mut got = String::new();
        reader
            .read_line(&mut got)
            .expect("B answered despite A and C");
        assert_eq!(got.trim_end(), expected);
    }
    // A completes its line and is answered in turn.
    a.write_all(b"both\n").unwrap();
    a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = String::new();
    BufReader::new(&a).read_line(&mut got).unwrap();
    assert_eq!(got, "OK true 3 3600\n");
    drop(a);
    // C goes away abruptly mid-pipeline; the server keeps serving.
    drop(b);
    drop(reader);
    std::thread::sleep(Duration::from_millis(100));
    let c = writer.join().unwrap();
    let _ = c.shutdown(Shutdown::Both);
    drop(c);
    assert_eq!(server.line_exchange(b"HIT\n"), "OK true 7 0\n");
}

#[test]
fn idle_connections_are_closed() {
    let server = Server::with_policy_args(GRAMMAR_POLICY, "yaml", &["--line-idle-seconds", "1"]);
    let mut s = TcpStream::connect(server.line).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        s.read(&mut buf)
            .expect("closed by the server, not timed out"),
        0
    );
    // A busy connection is not idle.
    let mut s = TcpStream::connect(server.line).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for _ in 0..4 {
        s.write_all(b"HIT\n").unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "OK true 7 0\n");
        std::thread::sleep(Duration::from_millis(400));
    }
    // Its timer fired while it was busy and was moved: it still closes once idle.
    let mut rest = Vec::new();
    assert_eq!(
        reader
            .read_to_end(&mut rest)
            .expect("closed by the server, not timed out"),
        0
    );
}

#[test]
fn thousands_of_connections_and_abrupt_disconnects() {
    let server = Server::with_policy(COUNTING_POLICY, "yaml");
    let mut conns = Vec::new();
    for _ in 0..2000 {
        let mut s = TcpStream::connect(server.line).expect("connect");
        s.write_all(b"HIT\n").unwrap();
        conns.push(s);
    }
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"OK true 7 0\n");
    }
    // Half of them vanish mid-pipeline, with unread answers and unsent lines.
    for (i, mut s) in conns.into_iter().enumerate() {
        if i % 2 == 0 {
            let _ = s.write_all(&b"HIT k=n\n".repeat(50));
            let _ = s.write_all(b"HIT k=");
        }
        drop(s);
    }
    assert_eq!(server.line_exchange(b"HIT\n"), "OK true 7 0\n");
}

#[test]
fn a_client_that_never_reads_its_answers_is_closed() {
    let server = Server::with_policy_args(GRAMMAR_POLICY, "yaml", &["--line-idle-seconds", "1"]);
    let mut s = TcpStream::connect(server.line).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let chunk = "HIT w=v\n".repeat(64 * 1024);
    // Keep writing and never read: the server's answers back up, it gives up
    // after the idle timeout and closes, and our writes start failing.
    let mut failed = false;
    for _ in 0..200 {
        if s.write_all(chunk.as_bytes()).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "the server kept a connection that never reads");
    assert_eq!(server.line_exchange(b"HIT\n"), "OK true 7 0\n");
}

#[test]
fn a_crlf_line_at_the_limit_is_accepted_however_tcp_splits_it() {
    let server = Server::with_policy_args(GRAMMAR_POLICY, "yaml", &["--line-max-bytes", "8"]);
    let mut s = TcpStream::connect(server.line).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"HIT w=v \r").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(b"\nHIT w=vv \r\n").unwrap();
    let mut reader = BufReader::new(s);
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert_eq!(first, "OK true 5 0\n");
    let mut second = String::new();
    reader.read_line(&mut second).unwrap();
    assert_eq!(
        second,
        "ERR unknown \"Line too long: the limit is 8 bytes.\"\n"
    );
}

#[test]
fn sigterm_answers_what_was_accepted_and_exits_zero() {
    let mut server = Server::with_policy(COUNTING_POLICY, "yaml");
    let addr = server.line;
    let clients: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut w = s.try_clone().unwrap();
                let writer = std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if w.write_all(b"HIT k=n\nHIT\n").is_err() {
                            break;
                        }
                    }
                });
                // Every answer that arrives is whole; then the server closes cleanly.
                let mut answers = 0;
                let mut reader = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) => break,
                        Ok(_) => {
                            assert!(line.ends_with('\n'), "partial answer {line:?}");
                            assert!(line.starts_with("OK "), "{line:?}");
                            answers += 1;
                        }
                        Err(e) => panic!("connection broke instead of closing: {e}"),
                    }
                }
                let _ = writer.join();
                answers
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let status = server.terminate();
    assert!(status.success(), "exit status {status:?}");
    let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(answered > 0);
}
