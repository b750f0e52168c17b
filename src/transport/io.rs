//! The byte stream of a connection, with a deadline for its first bytes: a client
//! that connects and sends nothing (or less than the HTTP/2 preface) is closed when
//! the handshake timeout passes, instead of holding a file descriptor for ever. The
//! same wrapper, the one every connection's bytes pass through, also tells hyper and
//! h2 not to write vectored, so that small answers are copied and written together
//! (see `is_write_vectored`).

use prometheus::IntCounter;
use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

/// The length of the HTTP/2 client connection preface (`PRI * HTTP/2.0…`).
pub(super) const HTTP2_PREFACE_LEN: usize = 24;

/// A stream whose first `needed` bytes must arrive before a deadline, and whose
/// writes are never vectored.
pub(super) struct FirstBytes<IO> {
    inner: IO,
    needed: usize,
    /// `None` once the first bytes arrived (or the deadline fired).
    deadline: Option<Pin<Box<Sleep>>>,
    timeouts: IntCounter,
}

impl<IO> FirstBytes<IO> {
    pub(super) fn new(inner: IO, needed: usize, within: Duration, timeouts: IntCounter) -> Self {
        Self {
            inner,
            needed,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            timeouts,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstBytes<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() {
                    let read = buf.filled().len() - before;
                    this.needed = this.needed.saturating_sub(read);
                    // Enough bytes, or end of stream (hyper closes the connection).
                    if this.needed == 0 || read == 0 {
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                // Polled only while waiting, so the timer wakes this task when it fires.
                if let Some(deadline) = &mut this.deadline
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    this.deadline = None;
                    this.timeouts.inc();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent no request within the handshake timeout",
                    )));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FirstBytes<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    /// No, whatever the stream below can do, so that answers are batched. h2 copies a
    /// DATA frame into its write buffer only below a threshold (256 bytes for a
    /// stream that writes vectored, 1,024 for one that does not); a larger frame is
    /// chained after the buffer, and no other frame is buffered until it has been
    /// written. Most answers are between the two (a Login's tokens, a Check's
    /// identity headers and claims): chained, each took a write of its own, and the
    /// kernel's cost per write dominated (Check: 2.1 writes per decision against
    /// 1.0 for ValidateToken). Copied, they go out together with their trailers.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn writes_are_never_vectored_so_small_answers_are_batched() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (connected, _accepted) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let timeouts = IntCounter::new("t", "t").unwrap();
        let io = FirstBytes::new(connected.unwrap(), 4, Duration::from_secs(5), timeouts);
        // A TCP stream writes vectored; wrapped, it says it does not.
        assert!(io.inner.is_write_vectored());
        assert!(!io.is_write_vectored());
    }

    #[tokio::test(start_paused = true)]
    async fn silence_past_the_deadline_is_an_error() {
        let (client, server) = tokio::io::duplex(64);
        let timeouts = IntCounter::new("t", "t").unwrap();
        let mut io = FirstBytes::new(server, 4, Duration::from_secs(5), timeouts.clone());
        let mut buf = [0u8; 8];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(timeouts.get(), 1);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn enough_bytes_in_time_lift_the_deadline() {
        let (mut client, server) = tokio::io::duplex(64);
        let timeouts = IntCounter::new("t", "t").unwrap();
        let mut io = FirstBytes::new(server, 4, Duration::from_secs(5), timeouts.clone());
        client.write_all(b"abcd").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 4);
        // Long after the deadline, a quiet connection is no longer timed out here.
        tokio::time::sleep(Duration::from_secs(60)).await;
        client.write_all(b"e").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        assert_eq!(timeouts.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_must_still_finish_in_time() {
        let (mut client, server) = tokio::io::duplex(64);
        let timeouts = IntCounter::new("t", "t").unwrap();
        let mut io = FirstBytes::new(server, 4, Duration::from_secs(5), timeouts.clone());
        let mut buf = [0u8; 8];
        for _ in 0..3 {
            client.write_all(b"x").await.unwrap();
            assert_eq!(io.read(&mut buf).await.unwrap(), 1);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
