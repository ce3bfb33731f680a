//! `serve --record FILE`: every request written to a file as `divvy replay`
//! reads it, `<unix-ms> <request>` a line (a line-protocol HIT as received,
//! an Envoy request as its `POST /json` body). Off the request path: a
//! request hands its line to a bounded queue and a writer thread writes it;
//! when the queue is full the line is dropped and counted, never waited
//! for. The file is bounded: past `max_bytes` it is moved to `FILE.1` (the
//! previous `.1` is lost) and a new one begun, so at most twice `max_bytes`
//! is on disk.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::metrics::TrafficMetrics;

/// Lines the queue holds before it drops.
pub const QUEUE_LINES: usize = 65_536;
/// Bytes the queue holds before it drops (large requests fill it sooner
/// than [`QUEUE_LINES`] would).
pub const QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// The default of `--record-max-bytes`: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// How often an idle writer flushes the file and says it is alive.
const IDLE_FLUSH: Duration = Duration::from_secs(1);

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be opened for appending.
    #[error("--record {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("--record: cannot start the writer thread: {0}")]
    Thread(std::io::Error),
    /// Recording was already started in this process.
    #[error("--record: a recorder is already running in this process")]
    Twice,
}

enum Msg {
    /// A request received at `at_ms`, as its line.
    Line { at_ms: u64, text: Box<[u8]> },
    /// Write out what is queued, then answer.
    Flush(SyncSender<()>),
}

/// The request path's handle on the writer.
pub struct TrafficRecorder {
    tx: SyncSender<Msg>,
    metrics: TrafficMetrics,
    /// Bytes of the lines queued and not yet written.
    queued: Arc<AtomicUsize>,
}

static ACTIVE: OnceLock<TrafficRecorder> = OnceLock::new();

/// The process's recorder, when `--record` started one.
pub fn active() -> Option<&'static TrafficRecorder> {
    ACTIVE.get()
}

/// Starts recording to `path` for the whole process (what `--record` does).
pub fn start(path: &Path, max_bytes: u64, metrics: TrafficMetrics) -> Result<(), RecordError> {
    let (recorder, _writer) = TrafficRecorder::spawn(path, max_bytes, QUEUE_LINES, metrics)?;
    ACTIVE.set(recorder).map_err(|_| RecordError::Twice)
}

impl TrafficRecorder {
    /// A recorder writing to `path` through a queue of `queue` lines, and
    /// its writer thread (which ends once the recorder is dropped).
    pub fn spawn(
        path: &Path,
        max_bytes: u64,
        queue: usize,
        metrics: TrafficMetrics,
    ) -> Result<(TrafficRecorder, std::thread::JoinHandle<()>), RecordError> {
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer::open(path, max_bytes.max(1), metrics.clone(), queued.clone())?;
        let (tx, rx) = sync_channel(queue);
        let thread = std::thread::Builder::new()
            .name("divvy-record".into())
            .spawn(move || writer.run(rx))
            .map_err(RecordError::Thread)?;
        Ok((
            TrafficRecorder {
                tx,
                metrics,
                queued,
            },
            thread,
        ))
    }

    /// Records one request line (without its newline), stamped now.
    pub fn record(&self, line: &[u8]) {
        let before = self.queued.fetch_add(line.len(), Ordering::Relaxed);
        let msg = Msg::Line {
            at_ms: crate::clock::now_ms(),
            text: line.into(),
        };
        let sent = before + line.len() <= QUEUE_BYTES && self.tx.try_send(msg).is_ok();
        if !sent {
            self.queued.fetch_sub(line.len(), Ordering::Relaxed);
            self.metrics.lines.with_label_values(&["dropped"]).inc();
        }
    }

    /// Waits (up to `timeout`) until every line queued so far is written
    /// to the file: shutdown calls it so a stopped server's file is whole.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = sync_channel(1);
        send_within(&self.tx, Msg::Flush(ack), timeout) && done.recv_timeout(timeout).is_ok()
    }
}

/// `SyncSender::send` with a deadline (the standard one has none): a full
/// queue is tried again until `timeout`.
fn send_within(tx: &SyncSender<Msg>, mut msg: Msg, timeout: Duration) -> bool {
    let until = std::time::Instant::now() + timeout;
    loop {
        match tx.try_send(msg) {
            Ok(()) => return true,
            Err(TrySendError::Full(m)) if std::time::Instant::now() < until => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return false,
        }
    }
}

/// The writer thread's file, rotated at `max_bytes`.
struct Writer {
    path: PathBuf,
    max_bytes: u64,
    file: BufWriter<File>,
    /// Bytes in the current file.
    written: u64,
    metrics: TrafficMetrics,
    /// The recorder's count of bytes queued, taken down as lines are written.
    queued: Arc<AtomicUsize>,
}

impl Writer {
    fn open(
        path: &Path,
        max_bytes: u64,
        metrics: TrafficMetrics,
        queued: Arc<AtomicUsize>,
    ) -> Result<Writer, RecordError> {
        let file = append(path).map_err(|source| RecordError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let written = file.metadata().map_or(0, |m| m.len());
        Ok(Writer {
            path: path.to_owned(),
            max_bytes,
            file: BufWriter::new(file),
            written,
            metrics,
            queued,
        })
    }

    fn run(mut self, rx: Receiver<Msg>) {
        loop {
            self.metrics.alive.set(unix_seconds());
            match rx.recv_timeout(IDLE_FLUSH) {
                Ok(Msg::Line { at_ms, text }) => {
                    self.write(at_ms, &text);
                    self.queued.fetch_sub(text.len(), Ordering::Relaxed);
                }
                Ok(Msg::Flush(ack)) => {
                    let _ = self.file.flush();
                    let _ = ack.send(());
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.file.flush();
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = self.file.flush();
    }

    /// Writes one line, first moving a file that would grow past `max_bytes` aside.
    fn write(&mut self, at_ms: u64, text: &[u8]) {
        let stamp = at_ms.to_string();
        let len = (stamp.len() + 1 + text.len() + 1) as u64;
        if self.written > 0 && self.written + len > self.max_bytes {
            if let Err(e) = self.rotate() {
                // The file stays within its bound: the line is not written.
                tracing::warn!(error = %e, path = %self.path.display(), "--record: rotation failed");
                self.metrics.lines.with_label_values(&["failed"]).inc();
                return;
            }
        }
        let wrote = (|| {
            self.file.write_all(stamp.as_bytes())?;
            self.file.write_all(b" ")?;
            self.file.write_all(text)?;
            self.file.write_all(b"\n")
        })();
        let result = match wrote {
            Ok(()) => {
                self.written += len;
                "written"
            }
            Err(_) => "failed",
        };
        self.metrics.lines.with_label_values(&[result]).inc();
    }

    /// `FILE` → `FILE.1`, and a new, empty `FILE`.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = BufWriter::new(append(&self.path)?);
        self.written = 0;
        self.metrics.rotations.inc();
        Ok(())
    }
}

fn append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn unix_seconds() -> i64 {
    i64::try_from(crate::clock::now_ms() / 1000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
