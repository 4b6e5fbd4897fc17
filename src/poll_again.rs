//! A future that is polled again at once when it wakes itself while being
//! polled, instead of going back through the scheduler.
//!
//! hyper's HTTP/1 connection wakes its own task once per request with a body:
//! the handler, polled inside the connection, asks for the body and so wakes
//! the connection that must read it. To tokio that is a task yielding: it goes
//! to the back of the run queue and an idle worker thread is woken to steal
//! it, so at one request at a time every request moved the connection to the
//! other core and back, a futex wake-up and two context switches each
//! (BENCHMARKS.md, issue 20, eighth pass). Wrapped in [`PollAgain`] the
//! connection is polled again on the spot, a bounded number of times and only
//! while the task has cooperative budget left; past that it yields as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Polls in a row before the future is left to the scheduler: a future that
/// keeps waking itself (hyper's loop over pipelined requests) still yields.
const MAX_POLLS_IN_A_ROW: usize = 4;

/// Not being polled; a wake-up goes to the task.
const IDLE: u8 = 0;
/// Being polled; a wake-up only marks that it must be polled again.
const POLLING: u8 = 1;
/// Woken while being polled.
const WOKEN: u8 = 2;

/// The waker the inner future sees.
struct SelfWake {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for SelfWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // One state word, so a wake-up can never fall between the poll's end
        // and the check for it.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            match state {
                IDLE => {
                    self.task.wake();
                    return;
                }
                WOKEN => return,
                _ => match self.state.compare_exchange_weak(
                    POLLING,
                    WOKEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(now) => state = now,
                },
            }
        }
    }
}

/// `inner`, polled again at once when it wakes itself during a poll.
pub struct PollAgain<F> {
    inner: Pin<Box<F>>,
    shared: Arc<SelfWake>,
    waker: Waker,
}

impl<F: Future> PollAgain<F> {
    pub fn new(inner: F) -> Self {
        let shared = Arc::new(SelfWake {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(shared.clone()),
            shared,
        }
    }
}

impl<F: Future> Future for PollAgain<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_POLLS_IN_A_ROW {
            this.shared.state.store(POLLING, Ordering::Release);
            let polled = this.inner.as_mut().poll(&mut inner_cx);
            let woken = this.shared.state.swap(IDLE, Ordering::AcqRel).eq(&WOKEN);
            if polled.is_ready() {
                return polled;
            }
            if !woken {
                return Poll::Pending;
            }
            // A resource out of cooperative budget wakes the task and answers
            // Pending until the task yields: polling again would spin.
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often the task's own waker is woken.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn task_waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    /// Wakes itself during its first `self_wakes` polls, then finishes.
    struct WakesItself {
        self_wakes: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.self_wakes {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_self_wake_is_answered_by_polling_again_not_by_the_task() {
        let (count, waker) = task_waker();
        let mut future = PollAgain::new(WakesItself {
            self_wakes: 1,
            polls: 0,
        });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(2));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields_to_the_scheduler() {
        let (count, waker) = task_waker();
        let mut future = PollAgain::new(WakesItself {
            self_wakes: usize::MAX,
            polls: 0,
        });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
        assert_eq!(future.inner.polls, MAX_POLLS_IN_A_ROW);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_wake_up_after_the_poll_reaches_the_task() {
        let (count, waker) = task_waker();
        let (tx, rx) = futures::channel::oneshot::channel::<u8>();
        let mut future = PollAgain::new(rx);
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert!(polled.is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        tx.send(7).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(Ok(7)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wake_ups_from_other_threads_are_never_lost() {
        // Each round a thread wakes the future while it may be mid-poll; a
        // lost wake-up would leave this test waiting forever.
        for _ in 0..2_000 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let sender = std::thread::spawn(move || tx.send(()).unwrap());
            PollAgain::new(rx).await.unwrap();
            sender.join().unwrap();
        }
    }
}
