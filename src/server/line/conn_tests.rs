//! Unit tests of `server/line/conn.rs`.

use super::*;
use crate::config::{parse_str, Format};
use crate::rules::RuleSet;
use crate::store::MemoryStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: &str = "default: {creditLimit: 5, resetSeconds: 60, actorField: ip}\n";

fn limits() -> ConnLimits {
    ConnLimits {
        max_line: 1024,
        max_batch: 16,
        idle_timeout: Duration::from_secs(60),
        max_connections: 1,
    }
}

fn limiter() -> Arc<Limiter> {
    let rules = RuleSet::new(parse_str(POLICY, Format::Yaml, "t.yaml").expect("policy"));
    Arc::new(Limiter::new(rules, Arc::new(MemoryStore::new())))
}

/// What a connection answers after its first line's answer, when a
/// second line and `stop` (given the shutdown signal's sender; what it
/// returns is kept alive to the end) come together while it waits in
/// its read: on this one thread it runs again only when this awaits,
/// with both already there.
async fn answered_after(
    stop: impl FnOnce(tokio::sync::watch::Sender<bool>) -> Option<tokio::sync::watch::Sender<bool>>,
) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(4096);
    let (sender, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(serve_connection(server, limiter(), limits(), stop_rx));
    client.write_all(b"HIT ip=1\n").await.expect("write");
    let mut answer = [0u8; 64];
    let n = client.read(&mut answer).await.expect("read");
    assert_eq!(&answer[..n], b"OK true 4 60\n");
    client.write_all(b"HIT ip=1\n").await.expect("write");
    let _kept = stop(sender);
    task.await.expect("the connection ends");
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.expect("read");
    rest
}

/// A line that comes with shutdown is not answered: the read is polled
/// before the shutdown signal, and what it brings is dropped.
#[tokio::test(flavor = "current_thread")]
async fn a_line_that_comes_with_shutdown_is_not_answered() {
    let rest = answered_after(|sender| {
        sender.send_replace(true);
        Some(sender)
    })
    .await;
    assert_eq!(rest, b"", "nothing answered after shutdown");
}

/// The same when the shutdown signal's sender is dropped without a
/// word: a dropped sender stops the connection too.
#[tokio::test(flavor = "current_thread")]
async fn a_line_that_comes_as_the_signal_is_dropped_is_not_answered() {
    let rest = answered_after(|sender| {
        drop(sender);
        None
    })
    .await;
    assert_eq!(rest, b"", "nothing answered once the sender is gone");
}

/// Lines split across reads, with `\r\n` endings, a line of non-ASCII
/// text, a malformed one and one with quotes are each answered once, in
/// order, and nothing more. (A `\r` left at a line's end would read as
/// whitespace to both parsers: the ending matters only to the length
/// limit.)
#[tokio::test(flavor = "current_thread")]
async fn lines_split_across_reads_are_answered_once_in_order() {
    let (mut client, server) = tokio::io::duplex(4096);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(serve_connection(server, limiter(), limits(), stop_rx));
    for part in [
        &b"HIT ip=a\r\nHIT i"[..],
        b"p=b\nHIT ip=\xc3\xa9\n",
        b"HIT a\r\nHIT ip=\"a\"\n",
    ] {
        client.write_all(part).await.expect("write");
        tokio::task::yield_now().await;
    }
    // The end of input: the connection answers what it has and closes.
    client.shutdown().await.expect("shutdown");
    task.await.expect("the connection ends");
    let mut answers = Vec::new();
    client.read_to_end(&mut answers).await.expect("read");
    assert_eq!(
        String::from_utf8_lossy(&answers),
        "OK true 4 60\nOK true 4 60\nOK true 4 60\n\
         ERR unknown \"Unexpected end of input string.\"\nOK true 3 60\n"
    );
}
