//! Work that must finish once started, whoever awaits it.
//!
//! A tool call runs inside the request that made it, so the common case costs
//! no task hand-off. If the request is dropped before the call is done (its
//! client hung up), the rest of the call moves to a task of its own, tracked
//! so that shutdown waits for it: the call runs to its end and is journalled.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;

/// A future that, when dropped unfinished, finishes in a tracked task.
pub(super) struct FinishOnDrop<F: Future<Output: Send> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    tracker: TaskTracker,
}

impl<F: Future<Output: Send> + Send + 'static> FinishOnDrop<F> {
    pub(super) fn new(work: F, tracker: TaskTracker) -> Self {
        Self {
            work: Some(Box::pin(work)),
            tracker,
        }
    }
}

impl<F: Future<Output: Send> + Send + 'static> Future for FinishOnDrop<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = self
            .work
            .as_mut()
            .expect("FinishOnDrop is not polled after it finished");
        let output = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(output)
    }
}

impl<F: Future<Output: Send> + Send + 'static> Drop for FinishOnDrop<F> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // The boxed future stays where it is pinned; only the box moves.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tracing::info!("the caller went away; the tool call finishes on its own");
                self.tracker.spawn_on(
                    async move {
                        let _ = work.await;
                    },
                    &handle,
                );
            }
            Err(_) => tracing::error!(
                "a tool call was abandoned outside the runtime; the journal marks it uncertain at the next start"
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
        assert_eq!(FinishOnDrop::new(async { 7 }, tracker.clone()).await, 7);
        assert!(tracker.is_empty());
    }
}
