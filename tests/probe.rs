//! `divvy probe` against a real `divvy serve` on loopback: what the chart's
//! `helm test` pod runs against the Service (the image has no curl).

mod common;

use std::net::TcpListener;
use std::process::{Command, Output};

use common::certs::Certs;
use common::{binary, Server};

/// Runs `divvy probe` with `args`.
fn probe(args: &[&str]) -> Output {
    Command::new(binary())
        .arg("probe")
        .args(args)
        .output()
        .expect("run divvy probe")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

const POLICY: &str = "default: {creditLimit: 1, resetSeconds: 0}\n";

/// /readyz of a serving process: exit 0 and its body; a path the admin API
/// does not have: non-zero, naming the status; a closed port: non-zero.
#[test]
fn probe_reports_readyz_and_fails_on_errors_and_closed_ports() {
    let server = Server::with_policy(POLICY, "yaml");
    let url = format!("http://{}/readyz", server.http);
    let out = probe(&["--timeout", "5s", &url]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!out.stdout.is_empty(), "the body is printed");

    let out = probe(&[&format!("http://{}/no-such-page", server.http)]);
    assert!(!out.status.success(), "a 404 must fail: {}", text(&out));
    assert!(text(&out).contains("404"), "{}", text(&out));

    // A port nobody listens on (bound, then released).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = probe(&[
        "--timeout",
        "2s",
        &format!("http://127.0.0.1:{port}/readyz"),
    ]);
    assert!(!out.status.success(), "a closed port must fail");
    assert!(
        text(&out).contains(&format!("127.0.0.1:{port}")),
        "{}",
        text(&out)
    );

    let out = probe(&["not-a-url"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("http://"), "{}", text(&out));
}

/// An admin API served over HTTPS: verified with the CA given; refused with
/// a CA that did not sign the server's certificate.
#[test]
fn probe_speaks_https_with_the_given_ca() {
    let certs = Certs::generate();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let server = Server::with_policy_args(
        POLICY,
        "yaml",
        &[
            "--http-tls-cert",
            &s(&certs.server.cert),
            "--http-tls-key",
            &s(&certs.server.key),
        ],
    );
    let url = format!("https://{}/readyz", server.http);
    let out = probe(&["--ca", &s(&certs.ca), &url]);
    assert!(out.status.success(), "{}", text(&out));

    let out = probe(&["--ca", &s(&certs.other_ca), &url]);
    assert!(!out.status.success(), "an unknown issuer must fail");
    assert!(
        text(&out).to_lowercase().contains("certificate"),
        "{}",
        text(&out)
    );

    // Plain HTTP to the TLS port gets no HTTP answer.
    let out = probe(&["--timeout", "2s", &format!("http://{}/readyz", server.http)]);
    assert!(!out.status.success(), "{}", text(&out));
}
