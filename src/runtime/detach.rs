//! Work that must finish once started, whoever awaits it.
//!
//! A tool call, or a request that changes something, runs inside the request
//! that made it, so the common case costs no task hand-off. If the request is
//! dropped before the work is done (its client hung up, or its time ran out),
//! the rest of the work moves to a task of its own, tracked so that shutdown
//! waits for it: the work runs to its end, and a call is journalled.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// A future that, when dropped unfinished, finishes in a tracked task.
pub struct FinishOnDrop<F: Future<Output: Send> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    /// What the work is, for the log line of a hand-off.
    what: &'static str,
    tracker: TaskTracker,
}

impl<F: Future<Output: Send> + Send + 'static> FinishOnDrop<F> {
    pub(crate) fn new(work: F, what: &'static str, tracker: TaskTracker) -> Self {
        Self {
            work: Some(Box::pin(work)),
            what,
            tracker,
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for FinishOnDrop<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Out of its slot while polled: work that panics is dropped with the
        // unwind, and is not handed to a task to be polled again.
        let mut work = self
            .work
            .take()
            .expect("FinishOnDrop is not polled after it finished");
        match work.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(output),
            Poll::Pending => {
                self.work = Some(work);
                Poll::Pending
            }
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // The boxed future stays where it is pinned; only the box moves. The
        // span current here is the dropped request's (an instrumented future
        // enters its span while its inner future is dropped): the rest of the
        // work keeps logging in it.
        let span = tracing::Span::current();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tracing::info!(
                    work = self.what,
                    "the caller went away; the work finishes on its own"
                );
                self.tracker.spawn_on(
                    async move {
                        let _ = work.await;
                    }
                    .instrument(span),
                    &handle,
                );
            }
            Err(_) => tracing::error!(
                work = self.what,
                "work was abandoned outside the runtime; a tool call's row is marked uncertain at the next start"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn dropped_work_still_finishes_and_is_tracked() {
        let tracker = TaskTracker::new();
        let finished = Arc::new(AtomicBool::new(false));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let done = finished.clone();
        let work = FinishOnDrop::new(
            async move {
                let _ = released.await;
                done.store(true, Ordering::SeqCst);
            },
            "test work",
            tracker.clone(),
        );
        // Polled once, then abandoned like a request whose client hung up.
        let mut work = Box::pin(work);
        assert!(futures::poll!(work.as_mut()).is_pending());
        drop(work);
        assert_eq!(tracker.len(), 1);
        release.send(()).unwrap();
        tracker.close();
        tracker.wait().await;
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn finished_work_leaves_nothing_behind() {
        let tracker = TaskTracker::new();
        assert_eq!(
            FinishOnDrop::new(async { 7 }, "test work", tracker.clone()).await,
            7
        );
        assert!(tracker.is_empty());
    }

    #[tokio::test]
    async fn work_that_panics_is_not_handed_on() {
        let tracker = TaskTracker::new();
        let mut work = Box::pin(FinishOnDrop::new(
            async { panic!("the work fails") },
            "test work",
            tracker.clone(),
        ));
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let waker = futures::task::noop_waker();
            work.as_mut().poll(&mut Context::from_waker(&waker))
        }));
        assert!(polled.is_err(), "the work did not panic");
        drop(work);
        assert!(tracker.is_empty(), "a panicked future was handed to a task");
    }
}
