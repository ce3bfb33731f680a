//! When the bytes of a gRPC connection's reads reached its socket, from the
//! kernel's receive timestamps (`SO_TIMESTAMPNS`), so that the time a call
//! waited in the socket counts toward its deadline (docs/reliability.md,
//! "Overload").
//!
//! h2 reads everything the socket holds at each turn of a connection's task
//! before hyper accepts any of the streams read, so a call cannot be matched
//! to its read. A batch is what the connection reads between two moments it
//! found the socket empty. It arrived at its first read's timestamp. For
//! TCP, the kernel reports the newest segment a read took. The calls of
//! the first read arrived by then, and later reads' calls arrived after it.
//! The batch's instant is shown to [`super::arrival`] through a thread-local
//! value: hyper accepts streams in the connection's task right after the
//! reads, on the same thread.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The socket option and control message of nanosecond receive timestamps
/// (Linux's `SO_TIMESTAMPNS_OLD`, a `timespec`, on x86-64 and arm64).
const SO_TIMESTAMPNS: libc::c_int = 35;

/// A batch's instant is taken by streams accepted within this of its last
/// read; older, it belongs to a read of another connection or time.
const FRESH: Duration = Duration::from_millis(20);

/// A receive timestamp older than this is not believed (a clock step).
const MOST_BELIEVED: Duration = Duration::from_secs(1);

thread_local! {
    /// The current batch on this thread: when it arrived, when last read.
    static BATCH: Cell<Option<(Instant, Instant)>> = const { Cell::new(None) };
}

/// Asks the kernel to timestamp what `stream` receives. A socket that
/// refuses keeps working; its calls count from when they are read.
pub fn enable(stream: &TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: the fd is open for the call (`stream` is borrowed); the
    // option value is a c_int that outlives the call.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_TIMESTAMPNS,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// One connection's batch: when it arrived, and whether the socket was
/// found empty since (the next read starts a new batch).
#[derive(Debug, Default)]
pub struct Batch {
    arrived: Option<Instant>,
    drained: bool,
}

impl Batch {
    /// A read at `now` took bytes the kernel received `age` ago (`None`:
    /// no timestamp); the batch's instant is shown to this thread.
    pub fn read(&mut self, age: Option<Duration>, now: Instant) {
        if self.drained || self.arrived.is_none() {
            let age = age.filter(|a| *a <= MOST_BELIEVED).unwrap_or_default();
            self.arrived = Some(now.checked_sub(age).unwrap_or(now));
            self.drained = false;
        }
        if let Some(arrived) = self.arrived {
            BATCH.with(|b| b.set(Some((arrived, now))));
        }
    }

    /// The socket was found empty.
    pub fn drained(&mut self) {
        self.drained = true;
    }
}

/// When the batch this thread read last arrived, if it was read within
/// [`FRESH`] of `now`.
pub fn batch_arrival(now: Instant) -> Option<Instant> {
    let (arrived, read) = BATCH.with(Cell::get)?;
    (now.saturating_duration_since(read) <= FRESH).then_some(arrived)
}

/// `AsyncRead::poll_read` on `stream`, noting in `batch` when what it read
/// arrived.
pub fn poll_read(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    batch: &mut Batch,
) -> Poll<io::Result<()>> {
    loop {
        match stream.poll_read_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {
                batch.drained();
                return Poll::Pending;
            }
        }
        let unfilled = buf.initialize_unfilled();
        match stream.try_io(Interest::READABLE, || receive(stream.as_raw_fd(), unfilled)) {
            Ok((n, stamp)) => {
                buf.advance(n);
                if n > 0 {
                    batch.read(stamp.map(age), Instant::now());
                }
                return Poll::Ready(Ok(()));
            }
            // Readiness was stale; `try_io` cleared it: wait again.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// How long ago, by the system clock, the kernel's timestamp `at` was.
fn age(at: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(at)
}

/// One `recvmsg` into `buf`: the bytes read, and the receive timestamp
/// (since the epoch) if the kernel sent one.
fn receive(fd: libc::c_int, buf: &mut [u8]) -> io::Result<(usize, Option<Duration>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one timespec control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at `iov` (over `buf`) and `control`, both alive
    // and writable for the call's length.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: the CMSG_* walk stays within msg_controllen of `control`,
    // which the kernel filled; the timespec is read unaligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == SO_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
                let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
                stamp = Some(Duration::new(secs, nanos.min(999_999_999)));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((usize::try_from(n).unwrap_or(0), stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_batch_arrives_at_its_first_reads_timestamp_until_the_socket_is_drained() {
        // Injected instants: the arithmetic is relative to `t0`.
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut batch = Batch::default();
        batch.read(Some(12 * MS), t0);
        assert_eq!(batch_arrival(t0), Some(t0 - 12 * MS));
        // A later read of the same batch keeps its instant.
        batch.read(Some(MS), t0 + 3 * MS);
        assert_eq!(batch_arrival(t0 + 4 * MS), Some(t0 - 12 * MS));
        // Drained: the next read starts a new batch.
        batch.drained();
        batch.read(Some(2 * MS), t0 + 10 * MS);
        assert_eq!(batch_arrival(t0 + 10 * MS), Some(t0 + 8 * MS));
        // Stale: another connection's or long ago.
        assert_eq!(batch_arrival(t0 + 10 * MS + FRESH + MS), None);
    }

    #[test]
    fn no_timestamp_or_one_not_believed_counts_from_the_read() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut batch = Batch::default();
        batch.read(None, t0);
        assert_eq!(batch_arrival(t0), Some(t0));
        batch.drained();
        batch.read(Some(MOST_BELIEVED + MS), t0 + MS);
        assert_eq!(batch_arrival(t0 + MS), Some(t0 + MS));
    }

    #[tokio::test]
    async fn a_loopback_read_carries_the_kernels_timestamp() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        enable(&server);
        let mut batch = Batch::default();
        // The kernel turns receive timestamps on for the whole host a
        // moment after the first socket asks: a few tries.
        let mut waits = Vec::new();
        for _ in 0..5 {
            client.write_all(b"hello").await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            let mut bytes = [0u8; 16];
            let mut buf = ReadBuf::new(&mut bytes);
            std::future::poll_fn(|cx| poll_read(&server, cx, &mut buf, &mut batch))
                .await
                .unwrap();
            assert_eq!(buf.filled(), b"hello");
            batch.drained();
            let now = Instant::now();
            waits.push(now - batch_arrival(now).unwrap());
        }
        // Received about 30 ms before it was read.
        assert!(
            waits.iter().any(|w| *w >= Duration::from_millis(25)),
            "{waits:?}"
        );
    }
}
