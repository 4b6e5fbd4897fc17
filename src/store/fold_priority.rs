//! The journal thread's CPU priority.
//!
//! A fold (the journal log's records written into the indexed table) costs
//! about as much CPU per call as the call's own request path. On a machine
//! with few cores a fold running when the next call's threads wake up delayed
//! them: one-at-a-time remote calls had a p99 of about 3× their p50, against
//! 1.3-1.4× with the thread in `SCHED_IDLE` (BENCHMARKS.md, issue 20,
//! seventeenth pass). In `SCHED_IDLE` the thread runs only where no other
//! thread wants the core, and any thread that wakes there takes it at once.
//!
//! A thread in `SCHED_IDLE` may not run at all while every core is busy, so
//! whoever needs a fold now raises the thread back to the normal class first:
//! a journal read that finds records unfolded, a write that must commit to
//! the table, and an append that finds the backlog past [`RAISE_AT_BACKLOG`].
//! The thread lowers itself again only when it is about to wait with nothing
//! of that kind queued. (The checkpointer, itself background work, does not
//! raise it: while it waits for a fold, calls still append to the log.)
//!
//! Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20. Where
//! a probe finds neither, the thread is never lowered: folds then run at
//! normal priority, as they did before.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Records waiting to be folded past which an append raises the thread: a
/// backlog a starved thread would let grow is bounded here, long before the
/// log's memory bound (about 1,000 calls, a tenth of a second at full load).
pub(super) const RAISE_AT_BACKLOG: usize = 2048;

/// The journal thread's scheduling class, raised by any thread and lowered
/// only by the journal thread itself.
#[derive(Debug)]
pub(super) struct FoldPriority {
    /// The journal thread's kernel thread id; 0 until it registers.
    tid: AtomicI32,
    /// Odd while the thread is in the background class or being moved there,
    /// even while it is normal. Only the journal thread makes it odd and only
    /// a raise makes it even, each with a compare-and-swap, so a lowering
    /// sees any raise that came while it ran and undoes itself: the two
    /// calls to the kernel may land in either order.
    epoch: AtomicU64,
}

/// The two classes the journal thread runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// `SCHED_OTHER`: shares the cores fairly with every other thread.
    Normal,
    /// `SCHED_IDLE`: runs only on a core no other thread wants.
    Background,
}

impl FoldPriority {
    /// A priority for a thread that has not registered yet.
    pub(super) fn new() -> Self {
        Self {
            tid: AtomicI32::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    /// Makes the calling thread the one this priority moves.
    pub(super) fn register_current_thread(&self) {
        self.tid.store(current_tid(), Ordering::SeqCst);
    }

    /// Stops moving the registered thread, which is about to end: the
    /// kernel may give its id to another thread afterwards.
    pub(super) fn forget_thread(&self) {
        self.tid.store(0, Ordering::SeqCst);
    }

    /// The class the registered thread is in, if the kernel tells.
    #[cfg(test)]
    pub(super) fn thread_class(&self) -> Option<Class> {
        class_of(self.tid.load(Ordering::SeqCst))
    }

    /// Whether the thread is marked as in the background class.
    pub(super) fn in_background(&self) -> bool {
        !self.epoch.load(Ordering::SeqCst).is_multiple_of(2)
    }

    /// Whether the thread is in the normal class and may go to the
    /// background: the journal thread then waits with a timeout.
    pub(super) fn may_lower(&self) -> bool {
        raising_permitted() && !self.in_background()
    }

    /// Puts the thread back in the normal class if it is in the background.
    /// Called after the need is visible to the thread (a message queued, the
    /// backlog counted): a lowering that starts after that finds the need
    /// and does not lower.
    pub(super) fn raise(&self) {
        let epoch = self.epoch.load(Ordering::SeqCst);
        if epoch.is_multiple_of(2) {
            return;
        }
        // Losing the swap means another raise won it (and makes the call) or
        // the lowering found a need and stayed normal.
        if self
            .epoch
            .compare_exchange(epoch, epoch + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            set_class(self.tid.load(Ordering::SeqCst), Class::Normal);
            count_raise();
        }
    }

    /// Moves the calling (registered) thread to the background class unless
    /// `urgent` says something waits for it, or the process could not leave
    /// the background again.
    pub(super) fn lower_unless(&self, urgent: impl Fn() -> bool) {
        if !raising_permitted() {
            return;
        }
        let tid = self.tid.load(Ordering::SeqCst);
        let mut epoch = self.epoch.load(Ordering::SeqCst);
        if !epoch.is_multiple_of(2) {
            // Marked background. A raise whose call reached the kernel after
            // a lowering's left the thread normal: mark it so, then lower.
            if class_of(tid) != Some(Class::Normal) || !self.advance(epoch) {
                return;
            }
            epoch += 1;
        }
        if !self.advance(epoch) {
            return;
        }
        if urgent() {
            // A raise that got here first has marked it normal already.
            self.advance(epoch + 1);
            return;
        }
        set_class(tid, Class::Background);
        if self.epoch.load(Ordering::SeqCst) != epoch + 1 {
            // A raise came in between; its call may have come first.
            set_class(tid, Class::Normal);
        }
    }

    fn advance(&self, from: u64) -> bool {
        self.epoch
            .compare_exchange(from, from + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

fn count_raise() {
    let metrics = crate::metrics::metrics();
    if metrics.enabled() {
        metrics.journal_fold_raises.inc();
    }
}

/// Whether a thread of this process may leave `SCHED_IDLE` again: probed
/// once, on a thread of its own that lowers and raises itself.
pub(super) fn raising_permitted() -> bool {
    static PERMITTED: OnceLock<bool> = OnceLock::new();
    *PERMITTED.get_or_init(|| {
        let permitted = std::thread::Builder::new()
            .name("toolgate-probe".into())
            .spawn(|| {
                // Straight to the kernel: a refusal here is an answer, not a
                // failure to log.
                let tid = current_tid();
                imp::set_class(tid, Class::Background) && imp::set_class(tid, Class::Normal)
            })
            .ok()
            .and_then(|probe| probe.join().ok())
            .unwrap_or(false);
        if permitted {
            tracing::debug!("journal folds run in the background scheduling class (SCHED_IDLE)");
        } else {
            tracing::info!(
                "journal folds run at normal priority: leaving SCHED_IDLE again needs CAP_SYS_NICE or RLIMIT_NICE 20"
            );
        }
        permitted
    })
}

/// The class a thread of this process is in, if the kernel tells.
pub(super) fn class_of(tid: i32) -> Option<Class> {
    imp::class_of(tid)
}

fn current_tid() -> i32 {
    imp::current_tid()
}

/// Moves thread `tid` to `class`; whether the kernel did.
fn set_class(tid: i32, class: Class) -> bool {
    if tid == 0 {
        return false;
    }
    let done = imp::set_class(tid, class);
    if !done {
        tracing::warn!(tid, ?class, error = %std::io::Error::last_os_error(), "changing the journal thread's scheduling class failed");
    }
    done
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod imp {
    use super::Class;

    pub(super) fn current_tid() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }

    pub(super) fn set_class(tid: i32, class: Class) -> bool {
        let policy = match class {
            Class::Normal => libc::SCHED_OTHER,
            Class::Background => libc::SCHED_IDLE,
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` outlives the call; a tid of another process or of
        // an ended thread only makes the call fail.
        unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
    }

    pub(super) fn class_of(tid: i32) -> Option<Class> {
        // SAFETY: no pointers; a bad tid makes the call fail.
        match unsafe { libc::sched_getscheduler(tid) } {
            libc::SCHED_OTHER => Some(Class::Normal),
            libc::SCHED_IDLE => Some(Class::Background),
            _ => None,
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::Class;

    pub(super) fn current_tid() -> i32 {
        0
    }

    pub(super) fn set_class(_tid: i32, _class: Class) -> bool {
        false
    }

    pub(super) fn class_of(_tid: i32) -> Option<Class> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    /// A registered thread that lowers itself once per request and answers
    /// when done.
    struct Worker {
        tid: i32,
        go: mpsc::Sender<()>,
        done: mpsc::Receiver<()>,
        handle: std::thread::JoinHandle<()>,
    }

    impl Worker {
        fn start(priority: Arc<FoldPriority>, urgent: Arc<AtomicBool>) -> Self {
            let (tid_tx, tid_rx) = mpsc::channel();
            let (go, go_rx) = mpsc::channel::<()>();
            let (done_tx, done) = mpsc::channel();
            let handle = std::thread::spawn(move || {
                priority.register_current_thread();
                tid_tx.send(current_tid()).unwrap();
                while go_rx.recv().is_ok() {
                    priority.lower_unless(|| urgent.load(Ordering::SeqCst));
                    done_tx.send(()).unwrap();
                }
            });
            let tid = tid_rx.recv().unwrap();
            Self {
                tid,
                go,
                done,
                handle,
            }
        }

        fn lower(&self) {
            self.go.send(()).unwrap();
            self.done.recv().unwrap();
        }

        fn stop(self) {
            drop(self.go);
            self.handle.join().unwrap();
        }
    }

    /// A priority and its registered worker, lowering unless `urgent`; None
    /// (said loudly) where this process may not leave `SCHED_IDLE`.
    fn started(urgent: Arc<AtomicBool>) -> Option<(Arc<FoldPriority>, Worker)> {
        if !raising_permitted() {
            eprintln!(
                "NOT TESTED HERE: this process may not leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE < 20), so the journal thread stays normal"
            );
            return None;
        }
        let priority = Arc::new(FoldPriority::new());
        let worker = Worker::start(priority.clone(), urgent);
        Some((priority, worker))
    }

    #[test]
    fn the_thread_goes_to_the_background_and_any_thread_raises_it_back() {
        let urgent = Arc::new(AtomicBool::new(false));
        let Some((priority, worker)) = started(urgent.clone()) else {
            return;
        };
        assert_eq!(class_of(worker.tid), Some(Class::Normal));

        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        assert!(priority.in_background());
        priority.raise();
        assert_eq!(class_of(worker.tid), Some(Class::Normal));
        assert!(!priority.in_background());
        // A second raise finds it normal and changes nothing.
        priority.raise();
        assert_eq!(class_of(worker.tid), Some(Class::Normal));

        // Something waiting keeps it normal.
        urgent.store(true, Ordering::SeqCst);
        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Normal));
        assert!(!priority.in_background());

        urgent.store(false, Ordering::SeqCst);
        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        // Lowering again while in the background changes nothing.
        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        worker.stop();
    }

    #[test]
    fn a_forgotten_thread_is_never_moved() {
        let Some((priority, worker)) = started(Arc::default()) else {
            return;
        };
        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        priority.forget_thread();
        priority.raise();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        worker.stop();
    }

    #[test]
    fn a_thread_marked_background_but_normal_is_lowered_again() {
        let Some((priority, worker)) = started(Arc::default()) else {
            return;
        };
        worker.lower();
        // As if a raise's call to the kernel landed after the lowering's.
        assert!(set_class(worker.tid, Class::Normal));
        assert!(priority.in_background());
        worker.lower();
        assert_eq!(class_of(worker.tid), Some(Class::Background));
        assert!(priority.in_background());
        worker.stop();
    }

    #[test]
    fn raises_racing_lowerings_never_leave_a_thread_marked_normal_in_the_background() {
        let Some((priority, worker)) = started(Arc::default()) else {
            return;
        };
        for round in 0..500 {
            let raiser = {
                let priority = priority.clone();
                std::thread::spawn(move || priority.raise())
            };
            worker.lower();
            raiser.join().unwrap();
            // Marked normal must be normal: a raise is skipped only for a
            // thread marked background.
            if !priority.in_background() {
                assert_eq!(
                    class_of(worker.tid),
                    Some(Class::Normal),
                    "round {round}: marked normal, in the background"
                );
            }
        }
        priority.raise();
        assert_eq!(class_of(worker.tid), Some(Class::Normal));
        worker.stop();
    }
}
