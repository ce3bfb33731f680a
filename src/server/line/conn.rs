//! One line-protocol connection: framing, batching, answering in order.
//!
//! Bytes are split at `\n` (a `\r` before it is dropped; invalid UTF-8 is
//! replaced with U+FFFD). Every complete line already received, up to
//! `max_batch`, forms one batch: its HITs go to the limiter in one call (so
//! they are charged in request order, and a networked store answers them in
//! one round trip), and the answers are written back in request order. The
//! next batch is read only after the previous one is answered, so the work in
//! flight per connection is bounded and a client that sends faster than it
//! reads is held back by TCP. Connections never wait for each other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::parse::{parse_text, plain_text, LineError};
use crate::clock::CoarseInstant;
use crate::limiter::{Hit, Limiter, Request, Reset, Verdict};
use crate::observe::metrics::Metrics;
use crate::rules::OperationBuilder;

/// Limits of one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Longest accepted line, in bytes, without its newline.
    pub max_line: usize,
    /// Most requests decided together (and in flight) per connection.
    pub max_batch: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections open at once; one more gets an `ERR` line and is closed.
    pub max_connections: usize,
}

/// A slot in a batch: an answer known already, or a HIT to decide.
enum Slot {
    Ready(String),
    Hit,
}

/// Splits complete lines off the front of a buffer, discarding over-long ones.
/// Lines are borrowed from the buffer (a parsed line is copied into its
/// operation at once), and the consumed front is dropped only when no
/// complete line is left, so a read's worth of lines costs one move of the
/// unfinished tail at most.
struct Framer {
    buf: Vec<u8>,
    /// Where the bytes not yet framed start in `buf`.
    start: usize,
    /// Whether we are skipping the rest of an over-long line.
    discarding: bool,
    max_line: usize,
    /// Where a line refused for its length is counted.
    metrics: Arc<Metrics>,
}

/// One framed item.
enum Frame<'a> {
    /// A line without its newline (bytes, decoded where it is parsed).
    Line(&'a [u8]),
    TooLong,
}

/// Room made in a connection's buffer before each read, and its first size.
const READ_ROOM: usize = 8 * 1024;

impl Framer {
    fn new(max_line: usize, metrics: Arc<Metrics>) -> Framer {
        Framer {
            buf: Vec::with_capacity(READ_ROOM),
            start: 0,
            discarding: false,
            max_line,
            metrics,
        }
    }

    fn next(&mut self) -> Option<Frame<'_>> {
        loop {
            let pending = &self.buf[self.start..];
            match memchr::memchr(b'\n', pending) {
                Some(at) => {
                    let from = self.start;
                    self.start += at + 1;
                    if self.discarding {
                        // The tail of an over-long line, already answered.
                        self.discarding = false;
                        continue;
                    }
                    let mut end = from + at;
                    if end > from && self.buf[end - 1] == b'\r' {
                        end -= 1;
                    }
                    if end - from > self.max_line {
                        line_too_long(&self.metrics);
                        return Some(Frame::TooLong);
                    }
                    return Some(Frame::Line(&self.buf[from..end]));
                }
                None => {
                    // A trailing `\r` may be the start of this line's `\r\n`:
                    // it does not count towards the limit yet.
                    let pending = match pending.last() {
                        Some(b'\r') => pending.len() - 1,
                        _ => pending.len(),
                    };
                    if pending > self.max_line {
                        // Answer now and skip the rest of the line when it comes.
                        self.buf.clear();
                        self.start = 0;
                        if !self.discarding {
                            self.discarding = true;
                            line_too_long(&self.metrics);
                            return Some(Frame::TooLong);
                        }
                    }
                    return None;
                }
            }
        }
    }

    /// The buffer to read into: the framed front dropped (what is left is
    /// an unfinished line) and room for a read.
    fn read_room(&mut self) -> &mut Vec<u8> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() - self.buf.len() < READ_ROOM / 2 {
            self.buf.reserve(READ_ROOM);
        }
        &mut self.buf
    }
}

/// Counts a line refused for its length.
fn line_too_long(metrics: &Metrics) {
    metrics.rejected.with_label_values(&["line_too_long"]).inc();
}

/// Counts an open connection in the metrics for as long as it lives.
struct OpenConnection(Arc<Metrics>);

impl OpenConnection {
    fn new(metrics: Arc<Metrics>) -> OpenConnection {
        metrics.connections(1);
        OpenConnection(metrics)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections(-1);
    }
}

/// Serves one connection until the peer closes it, goes idle (sends nothing,
/// or reads none of its answers, for `idle_timeout`), fails, or `shutdown`
/// turns true. On shutdown the batch being decided is still answered; no
/// further line is read.
///
/// One timer per connection keeps the idle limit: it is set to fire
/// `idle_timeout` after the connection was last active (a read, a batch
/// decided, its answers written) and, when it fires early (there was
/// activity since), moved to that deadline. A busy connection does no timer
/// work per batch, and reads its activity times off the kernel's coarse
/// clock (a few milliseconds' resolution). Time spent deciding a batch is
/// not the client's: a write gets the whole `idle_timeout` from when the
/// answers are ready, and the next read from when they are written.
/// `shutdown` must be a receiver that has not marked a value seen (a clone
/// of one that never looks with `borrow_and_update` or `changed`).
pub async fn serve_connection<S>(
    mut stream: S,
    limiter: Arc<Limiter>,
    limits: ConnLimits,
    shutdown: tokio::sync::watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Counted in the registry the limiter records to.
    let _open = OpenConnection::new(limiter.telemetry().metrics.clone());
    serve_until_end(&mut stream, limiter, limits, shutdown.clone()).await;
    if stopping(&shutdown) {
        close_gently(&mut stream).await;
    }
}

/// How long a connection the server is stopping keeps reading (and
/// dropping) what its client still sends, waiting for it to close.
const LINGER: Duration = Duration::from_secs(1);

/// Ends a connection the server is stopping, whose answers are all written:
/// the write side is closed, then input is read and dropped until the
/// client closes too (or [`LINGER`]). Closing a socket with input unread
/// resets it, and the client could lose answers already sent.
async fn close_gently<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// [`serve_connection`]'s loop: returns when the connection is to end.
async fn serve_until_end<S>(
    mut stream: S,
    limiter: Arc<Limiter>,
    limits: ConnLimits,
    shutdown: tokio::sync::watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let metrics = limiter.telemetry().metrics.clone();
    let mut framer = Framer::new(limits.max_line, metrics.clone());
    let too_long = LineError::Malformed(format!(
        "Line too long: the limit is {} bytes.",
        limits.max_line
    ))
    .to_string();
    let idle = limits.idle_timeout;
    let mut last_active = CoarseInstant::now();
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    let mut stop_rx = shutdown.clone();
    let stopped = async move {
        // A dropped sender stops the connection too.
        let _ = stop_rx.wait_for(|&stop| stop).await;
    };
    tokio::pin!(stopped);
    let mut waiting = Waiting {
        stopped,
        timer,
        shutdown: &shutdown,
        polled_with: None,
    };
    let mut out = Vec::with_capacity(8 * 1024);
    let mut slots: Vec<Slot> = Vec::new();
    let mut hits: Vec<Hit> = Vec::new();
    let mut eof = false;
    loop {
        slots.clear();
        hits.clear();
        fill_batch(
            &mut framer,
            limits.max_batch,
            &too_long,
            &mut slots,
            &mut hits,
            &metrics,
        );
        if !slots.is_empty() {
            answer(&limiter, &slots, &hits, &mut out).await;
            last_active = CoarseInstant::now();
            // A client that stops reading its answers is idle too.
            if !write_answers(&mut stream, &out, &mut waiting, last_active, idle).await {
                return;
            }
            // Deciding and writing are not the client's idle time.
            last_active = CoarseInstant::now();
            out.clear();
            if stopping(&shutdown) {
                return;
            }
            continue;
        }
        if eof || stopping(&shutdown) {
            // A last line without a newline cannot be answered, so it is not executed.
            return;
        }
        // The read first; the signal and the timer only when they may have
        // fired (see `wait_input`). What was read as shutdown came is not
        // answered, as when the signal came first.
        match wait_input(&mut stream, &mut framer, &mut waiting).await {
            Woke::Read(Ok(0)) => eof = true,
            // (A dropped sender stops the connection too.)
            Woke::Read(Ok(_)) if stopping(&shutdown) => return,
            Woke::Read(Ok(_)) => last_active = CoarseInstant::now(),
            Woke::Read(Err(_)) | Woke::Stop => return,
            Woke::Timer => {
                if !still_active(waiting.timer.as_mut(), last_active, idle) {
                    return;
                }
                // The moved timer registers when next polled.
                waiting.polled_with = None;
            }
        }
    }
}

/// What a connection waits on besides its input: the shutdown signal, the
/// idle timer, and the waker they were last polled with.
struct Waiting<'a, F> {
    stopped: Pin<&'a mut F>,
    timer: Pin<&'a mut Sleep>,
    shutdown: &'a watch::Receiver<bool>,
    polled_with: Option<Waker>,
}

/// What ended a wait for input.
enum Woke {
    Read(std::io::Result<usize>),
    Stop,
    Timer,
}

/// Reads into `framer`, or waits for input, the shutdown signal or the
/// idle timer, the read polled first. Once polled, the signal's future and
/// the timer keep the task's waker, so a poll that finds nothing to read
/// polls them again only when they may have fired (the signal's version
/// moved, the timer elapsed) or the waker is another: polling both cost
/// about as much as the read itself, on every HIT of a connection with one
/// in flight.
async fn wait_input<S, F>(stream: &mut S, framer: &mut Framer, w: &mut Waiting<'_, F>) -> Woke
where
    S: AsyncRead + Unpin,
    F: Future<Output = ()>,
{
    std::future::poll_fn(|cx| {
        let read = std::pin::pin!(stream.read_buf(framer.read_room()));
        if let Poll::Ready(read) = read.poll(cx) {
            return Poll::Ready(Woke::Read(read));
        }
        let quiet = w
            .polled_with
            .as_ref()
            .is_some_and(|k| k.will_wake(cx.waker()))
            && matches!(w.shutdown.has_changed(), Ok(false))
            && !w.timer.is_elapsed();
        if quiet {
            return Poll::Pending;
        }
        w.polled_with = Some(cx.waker().clone());
        if w.stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Stop);
        }
        if w.timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Timer);
        }
        Poll::Pending
    })
    .await
}

/// Whether the connection is to stop: the signal turned true, or its sender
/// is gone. An atomic load while nothing changed, where reading the value
/// takes the channel's lock; so `shutdown` must not have marked `true` as
/// seen (the server hands out clones of a receiver that marks nothing).
fn stopping(shutdown: &tokio::sync::watch::Receiver<bool>) -> bool {
    match shutdown.has_changed() {
        Ok(false) => false,
        Ok(true) => *shutdown.borrow(),
        Err(_) => true,
    }
}

/// Takes up to `max_batch` framed lines off `framer`: a hit for each line
/// that parses, an answer ready for each that does not (its error
/// counted in `metrics`).
#[inline]
fn fill_batch(
    framer: &mut Framer,
    max_batch: usize,
    too_long: &str,
    slots: &mut Vec<Slot>,
    hits: &mut Vec<Hit>,
    metrics: &Metrics,
) {
    // Looked up once a batch: recording is off unless `--record`.
    let recorder = crate::observe::traffic::active();
    while slots.len() < max_batch {
        match framer.next() {
            Some(Frame::Line(line)) => match parse_line(line, hits) {
                Ok(()) => {
                    if let Some(r) = recorder {
                        r.record(line);
                    }
                    slots.push(Slot::Hit)
                }
                Err(e) => {
                    metrics.error(e.code());
                    slots.push(Slot::Ready(e.to_string()));
                }
            },
            Some(Frame::TooLong) => {
                metrics.error("unknown");
                slots.push(Slot::Ready(too_long.to_owned()));
            }
            None => break,
        }
    }
}

/// One line as a hit, pushed on `hits`. Pairs go straight into the
/// operation: no list in between.
#[inline]
fn parse_line(line: &[u8], hits: &mut Vec<Hit>) -> Result<(), LineError> {
    let mut operation = OperationBuilder::with_capacity(4);
    let decoded;
    let (text, plain) = match plain_text(line) {
        Some(text) => (text, true),
        None => {
            decoded = lossy_text(line);
            (&*decoded, false)
        }
    };
    parse_text(text, plain, |k, v| operation.push(k, v))?;
    hits.push(Hit::one(operation.finish()));
    Ok(())
}

/// Writes `out` while keeping the idle limit (a client that reads none of
/// its answers for `idle` is idle); false when the connection is done.
async fn write_answers<S: AsyncWrite + Unpin, F>(
    stream: &mut S,
    out: &[u8],
    waiting: &mut Waiting<'_, F>,
    last_active: CoarseInstant,
    idle: Duration,
) -> bool {
    let write = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    tokio::pin!(write);
    loop {
        tokio::select! {
            biased;
            written = &mut write => return written.is_ok(),
            () = &mut waiting.timer => {
                if !still_active(waiting.timer.as_mut(), last_active, idle) {
                    return false;
                }
                // The moved timer may not be polled here again.
                waiting.polled_with = None;
            }
        }
    }
}

/// A line that is not plain ASCII as text: borrowed when it is UTF-8, else
/// with U+FFFD for each invalid sequence (as `String::from_utf8_lossy`,
/// whose own check costs several times `str::from_utf8`'s).
fn lossy_text(line: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(line) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(line),
    }
}

/// The idle timer fired: whether the connection was active within `idle`
/// (then the timer is moved to `idle` after that activity).
fn still_active(
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
    last_active: CoarseInstant,
    idle: Duration,
) -> bool {
    let Some(left) = idle
        .checked_sub(last_active.elapsed())
        .filter(|d| !d.is_zero())
    else {
        return false;
    };
    timer.reset(Instant::now() + left);
    true
}

/// Decides the batch's HITs in one limiter call and writes every answer, in order, to `out`.
async fn answer(limiter: &Limiter, slots: &[Slot], hits: &[Hit], out: &mut Vec<u8>) {
    use std::io::Write as _;
    let decided = if hits.is_empty() {
        None
    } else {
        // The line protocol's rules are always divvy rules. Traced (a root
        // span per batch) only when a ratio sampler picks it.
        let ask = Request::line(hits);
        let trace = crate::observe::tracing_otlp::active().and_then(|t| t.line_batch(hits.len()));
        let verdict = match trace {
            None => limiter.decide(&ask).await,
            Some(mut t) => Box::pin(t.decide(limiter.decide(&ask))).await,
        };
        Some(verdict.map(Verdict::into_decisions))
    };
    let mut next_hit = 0;
    for slot in slots {
        // Writing to a Vec cannot fail.
        let _ = match slot {
            Slot::Ready(line) => writeln!(out, "{line}"),
            Slot::Hit => {
                let i = next_hit;
                next_hit += 1;
                match &decided {
                    Some(Ok(d)) => match d.as_ref().and_then(|d| d.items.get(i)) {
                        Some(item) => {
                            let o = &item.decider;
                            let reset: i64 = match o.reset {
                                Reset::Never => -1,
                                Reset::Unlimited => 0,
                                // Each algorithm rounds its own (see its `Spec`).
                                Reset::After(t) => {
                                    i64::try_from(o.algorithm.line_reset_seconds(t.as_millis()))
                                        .unwrap_or(i64::MAX)
                                }
                            };
                            out.extend_from_slice(if o.allowed {
                                b"OK true "
                            } else {
                                b"OK false "
                            });
                            let mut num = itoa::Buffer::new();
                            out.extend_from_slice(num.format(o.remaining).as_bytes());
                            out.push(b' ');
                            out.extend_from_slice(num.format(reset).as_bytes());
                            out.push(b'\n');
                            Ok(())
                        }
                        None => writeln!(out, "ERR unknown \"internal error: missing decision\""),
                    },
                    Some(Err(e)) => {
                        limiter.telemetry().metrics.error("unknown");
                        writeln!(out, "{}", LineError::Malformed(e.to_string()))
                    }
                    None => Ok(()),
                }
            }
        };
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
