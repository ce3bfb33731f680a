//! A TCP stream that fails once its peer has sent nothing for a while, so
//! a gRPC connection that goes silent is closed instead of held forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// `inner`, closed (reads fail with `TimedOut`) after `idle` without a byte
/// from the peer.
pub struct IdleStream {
    inner: TcpStream,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    /// When what it reads arrived (the kernel's receive timestamps).
    batch: super::recv_time::Batch,
}

impl IdleStream {
    /// Wraps `inner`.
    pub fn new(inner: TcpStream, idle: Duration) -> IdleStream {
        super::recv_time::enable(&inner);
        IdleStream {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            batch: super::recv_time::Batch::default(),
        }
    }
}

impl AsyncRead for IdleStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match super::recv_time::poll_read(&this.inner, cx, buf, &mut this.batch) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.idle;
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => waiting_until(
                self.deadline.as_mut(),
                cx,
                "the peer sent nothing for the idle timeout",
            ),
        }
    }
}

write_through!(impl[] for IdleStream, refuse: |_: &IdleStream| None);

/// A read that is waiting for the peer: failed with `TimedOut` (`why`)
/// once `deadline` has passed, else still waiting and woken at the
/// deadline too.
pub(crate) fn waiting_until(
    deadline: Pin<&mut Sleep>,
    cx: &mut Context<'_>,
    why: &'static str,
) -> Poll<io::Result<()>> {
    match deadline.poll(cx) {
        Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why))),
        Poll::Pending => Poll::Pending,
    }
}

/// `AsyncWrite` for a wrapper whose field `inner` is an `Unpin` I/O: every
/// call passed through to it, except that a write is first refused with
/// the error `refuse` (a closure over `&Self`) returns, if any.
macro_rules! write_through {
    (impl[$($generics:tt)*] for $ty:ty, refuse: $refuse:expr) => {
        impl<$($generics)*> tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let this = self.get_mut();
                if let Some(e) = ($refuse)(&*this) {
                    return std::task::Poll::Ready(Err(e));
                }
                std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                let this = self.get_mut();
                if let Some(e) = ($refuse)(&*this) {
                    return std::task::Poll::Ready(Err(e));
                }
                std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
            }
        }
    };
}
pub(crate) use write_through;

impl Connected for IdleStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}
