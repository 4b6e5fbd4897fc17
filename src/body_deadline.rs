//! A request body that must arrive whole by a deadline.
//!
//! A client that sends a request head and then trickles or stalls its body
//! would otherwise hold its connection, one of the capped slots, for as long
//! as the handler waits: the header read and idle timeouts do not run while a
//! request is in flight. The timer is only started when a read of the body
//! finds nothing there, so a body that came with its head costs none.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

/// The error a [`DeadlineBody`] yields once its deadline has passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive whole within {limit_ms} ms of its head")]
pub struct BodyTimedOut {
    pub limit_ms: u128,
}

/// Whether `error`, or an error it was caused by, is [`BodyTimedOut`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTimedOut>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// An incoming body that fails with [`BodyTimedOut`] when it is not done by
/// its deadline.
pub struct DeadlineBody {
    inner: Incoming,
    deadline: Instant,
    limit_ms: u128,
    /// Started at the first read that had to wait.
    timer: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    /// `inner`, which must arrive whole within `limit` from now.
    pub fn new(inner: Incoming, limit: std::time::Duration) -> Self {
        Self {
            inner,
            deadline: Instant::now() + limit,
            limit_ms: limit.as_millis(),
            timer: None,
        }
    }
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut {
                limit_ms: self.limit_ms,
            })))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_found_through_the_errors_it_caused() {
        let timed_out = axum::Error::new(BodyTimedOut { limit_ms: 5 });
        assert!(is_body_timeout(&timed_out));
        let other = axum::Error::new(std::io::Error::other("reset"));
        assert!(!is_body_timeout(&other));
    }
}
