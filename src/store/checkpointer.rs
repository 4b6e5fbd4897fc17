//! Write-ahead-log checkpoints on a thread of their own (SQLite files).
//!
//! SQLite checkpoints in whichever connection commits when the log passes its
//! threshold, and a checkpoint with `synchronous = NORMAL` syncs the log and
//! the database file: a few milliseconds inside a tool call's journal write,
//! the tail of every call-latency figure (BENCHMARKS.md, issue 20). Every
//! connection of the store turns automatic checkpoints off and this thread
//! runs passive checkpoints instead, which never block a writer: when the
//! journal writer has committed [`COMMITS_PER_CHECKPOINT`] times, and at least
//! every [`INTERVAL`] for the store's other writes.
//!
//! A passive checkpoint copies the frames the log held when it began, and
//! SQLite starts the log over from its beginning only when a writer finds every
//! frame copied. Under a steady stream of journal writes that never happened:
//! each checkpoint took tens of milliseconds (two fsyncs), the writer added
//! frames meanwhile, and the log grew without bound (144 MB after 3,300 calls,
//! never reused), with every commit's wal-index insert walking longer hash
//! chains (BENCHMARKS.md, issue 20, eighth pass). So after each pass the thread
//! runs further passes until few frames were written during the last one, then
//! holds the journal's writes back (the `hold_writes` given at spawn) while it
//! copies those; the next journal commit then starts the log over. Writers
//! wait that short catch-up, not a whole pass.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use rusqlite::Connection;

/// Journal commits between two checkpoints: a call's two commits add about 20
/// pages to the log, so about 40 MB of log at most.
pub(super) const COMMITS_PER_CHECKPOINT: u32 = 500;
/// Longest time between two checkpoints while the log is written.
const INTERVAL: Duration = Duration::from_secs(1);

/// Asks the checkpoint thread for a checkpoint; dropping every handle stops it.
#[derive(Debug)]
pub(super) struct Checkpointer {
    nudge: SyncSender<()>,
    commits: u32,
    thread: std::thread::JoinHandle<()>,
}

impl Checkpointer {
    /// Opens the thread's connection to `path` and starts it; `hold_writes`
    /// runs what it is given while no journal write can commit.
    pub(super) fn spawn(
        path: &Path,
        hold_writes: impl Fn(&dyn Fn()) + Send + 'static,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let connection = Connection::open(path)
            .with_context(|| format!("opening the checkpoint connection to {}", path.display()))?;
        super::journal_thread::apply_settings(&connection)?;
        let (nudge, nudges) = sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("toolgate-checkpoint".into())
            .spawn(move || run(connection, nudges, hold_writes))
            .context("starting the checkpoint thread")?;
        Ok(Self {
            nudge,
            commits: 0,
            thread,
        })
    }

    /// Stops the thread and waits until its connection is closed, so that the
    /// store's last connection, closing, checkpoints and removes the log.
    pub(super) fn stop(self) {
        drop(self.nudge);
        if self.thread.join().is_err() {
            tracing::error!("the checkpoint thread panicked");
        }
    }

    /// Counts one commit of the journal writer; every
    /// [`COMMITS_PER_CHECKPOINT`]th asks for a checkpoint (a request already
    /// pending is enough).
    pub(super) fn committed(&mut self) {
        self.commits += 1;
        if self.commits >= COMMITS_PER_CHECKPOINT {
            self.commits = 0;
            if let Err(TrySendError::Disconnected(())) = self.nudge.try_send(()) {
                tracing::warn!("the checkpoint thread has stopped");
            }
        }
    }
}

fn run(connection: Connection, nudges: Receiver<()>, hold_writes: impl Fn(&dyn Fn())) {
    loop {
        match nudges.recv_timeout(INTERVAL) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {
                checkpoint_and_restart(&connection, &hold_writes)
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Passes while writes go on, each copying what the one before saw written,
/// until the frames written during a pass are few; then the last pass with
/// journal writes held back. A pass's two fsyncs and its copying take
/// milliseconds per thousand frames, so the writers wait only for the few.
fn checkpoint_and_restart(connection: &Connection, hold_writes: &impl Fn(&dyn Fn())) {
    let Some(mut seen) = checkpoint(connection, "pass") else {
        return;
    };
    for _ in 0..MAX_PASSES_BEFORE_HOLDING {
        match checkpoint(connection, "pass") {
            Some(now) if now - seen > FEW_FRAMES => seen = now,
            Some(_) => break,
            None => return,
        }
    }
    hold_writes(&|| {
        checkpoint(connection, "catch-up");
    });
}

/// Frames written during a pass that the writers may wait for.
const FEW_FRAMES: i64 = 256;
/// Passes after the first one before writes are held back anyway.
const MAX_PASSES_BEFORE_HOLDING: usize = 3;

/// A passive checkpoint; the log's frame count when it copied every frame the
/// log held as it began (so a pass after it can leave nothing uncopied).
fn checkpoint(connection: &Connection, kind: &'static str) -> Option<i64> {
    let started = std::time::Instant::now();
    let result = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match result {
        Ok((log_frames, checkpointed)) => {
            tracing::debug!(
                kind,
                log_frames,
                checkpointed,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "write-ahead log checkpointed"
            );
            (log_frames > 0 && checkpointed == log_frames).then_some(log_frames)
        }
        Err(error) => {
            tracing::warn!(kind, %error, "write-ahead log checkpoint failed");
            None
        }
    }
}
