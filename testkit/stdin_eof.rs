//! Stdin that reports its end. When a stdio client closes our stdin, rmcp
//! still waits up to 5 s for handlers in flight; a `hang` would hold the
//! process that long after its client is gone, so sleeping tools watch this.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Wraps a reader; cancels `closed` once a read returns end of file.
pub struct WatchEof<R> {
    inner: R,
    closed: CancellationToken,
}

impl<R> WatchEof<R> {
    pub fn new(inner: R, closed: CancellationToken) -> Self {
        Self { inner, closed }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for WatchEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let had_room = buf.remaining() > 0;
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        // A successful read that adds nothing to a buffer with room is EOF.
        if matches!(poll, Poll::Ready(Ok(()))) && had_room && buf.filled().len() == before {
            self.closed.cancel();
        }
        poll
    }
}
