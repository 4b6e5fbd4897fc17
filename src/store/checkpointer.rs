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
    /// Opens the thread's connection to `path` and starts it.
    pub(super) fn spawn(path: &Path) -> anyhow::Result<Self> {
        use anyhow::Context;
        let connection = Connection::open(path)
            .with_context(|| format!("opening the checkpoint connection to {}", path.display()))?;
        super::journal_thread::apply_settings(&connection)?;
        let (nudge, nudges) = sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("toolgate-checkpoint".into())
            .spawn(move || run(connection, nudges))
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

fn run(connection: Connection, nudges: Receiver<()>) {
    loop {
        match nudges.recv_timeout(INTERVAL) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => checkpoint(&connection),
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn checkpoint(connection: &Connection) {
    let started = std::time::Instant::now();
    let result = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match result {
        Ok((log_frames, checkpointed)) => tracing::debug!(
            log_frames,
            checkpointed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "write-ahead log checkpointed"
        ),
        Err(error) => tracing::warn!(%error, "write-ahead log checkpoint failed"),
    }
}
