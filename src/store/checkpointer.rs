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
    let mut commits = Commits::default();
    loop {
        let nudged = match nudges.recv_timeout(INTERVAL) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // Looked at before the passes: a commit during them shows next time.
        let committed = commits.since_last_look(&connection);
        if (nudged || committed) && !checkpoint_and_restart(&connection, &hold_writes) {
            // Frames may be left (a reader held them, or the pass failed):
            // the next interval tries again even if nothing is committed.
            commits.forget();
        }
    }
}

/// Whether any connection committed since the thread last looked, by
/// `PRAGMA data_version` (which a checkpoint does not change): an idle
/// server's thread then checkpoints nothing, instead of three passes and
/// the journal's lock every second.
#[derive(Debug, Default)]
struct Commits {
    last_version: Option<i64>,
}

impl Commits {
    /// True at the first look, after [`Commits::forget`], when the version
    /// cannot be read, and whenever another connection committed since the
    /// last look.
    fn since_last_look(&mut self, connection: &Connection) -> bool {
        let version = connection
            .query_row("PRAGMA data_version", [], |row| row.get::<_, i64>(0))
            .ok();
        let committed = version.is_none() || version != self.last_version;
        self.last_version = version;
        committed
    }

    fn forget(&mut self) {
        self.last_version = None;
    }
}

/// Passes while writes go on, each copying what the one before saw written,
/// until the frames written during a pass are few; then the last pass with
/// journal writes held back. A pass's two fsyncs and its copying take
/// milliseconds per thousand frames, so the writers wait only for the few.
/// True when the log was left with every frame copied (or empty).
fn checkpoint_and_restart(connection: &Connection, hold_writes: &impl Fn(&dyn Fn())) -> bool {
    let mut seen = match checkpoint(connection, "pass") {
        Pass::Copied(frames) => frames,
        Pass::Empty => return true,
        Pass::Partial => return false,
    };
    for _ in 0..MAX_PASSES_BEFORE_HOLDING {
        match checkpoint(connection, "pass") {
            Pass::Copied(now) if now - seen > FEW_FRAMES => seen = now,
            Pass::Copied(_) => break,
            Pass::Empty => return true,
            Pass::Partial => return false,
        }
    }
    let copied = std::cell::Cell::new(false);
    hold_writes(&|| {
        copied.set(checkpoint(connection, "catch-up") != Pass::Partial);
    });
    copied.get()
}

/// Frames written during a pass that the writers may wait for.
const FEW_FRAMES: i64 = 256;
/// Passes after the first one before writes are held back anyway.
const MAX_PASSES_BEFORE_HOLDING: usize = 3;

/// What a passive checkpoint left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Every frame copied; the log held this many when the pass began (so a
    /// pass after it can leave nothing uncopied).
    Copied(i64),
    /// The log held no frames.
    Empty,
    /// Frames left uncopied (a reader still uses them), or the pass failed.
    Partial,
}

/// A passive checkpoint.
fn checkpoint(connection: &Connection, kind: &'static str) -> Pass {
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
            match log_frames {
                // Not a WAL database (-1), or a log that holds nothing.
                ..=0 => Pass::Empty,
                _ if checkpointed == log_frames => Pass::Copied(log_frames),
                _ => Pass::Partial,
            }
        }
        Err(error) => {
            tracing::warn!(kind, %error, "write-ahead log checkpoint failed");
            Pass::Partial
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two connections to a new WAL database: the checkpoint thread's, and
    /// a writer's with one table.
    fn database() -> (tempfile::TempDir, Connection, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let writer = Connection::open(&path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        super::super::journal_thread::apply_settings(&writer).unwrap();
        writer.execute("CREATE TABLE rows (n INTEGER)", []).unwrap();
        let checkpoints = Connection::open(&path).unwrap();
        super::super::journal_thread::apply_settings(&checkpoints).unwrap();
        (dir, checkpoints, writer)
    }

    fn insert(writer: &Connection) {
        writer.execute("INSERT INTO rows VALUES (1)", []).unwrap();
    }

    #[test]
    fn only_a_commit_of_another_connection_counts_as_a_change() {
        let (_dir, checkpoints, writer) = database();
        let mut commits = Commits::default();
        assert!(commits.since_last_look(&checkpoints), "the first look");
        assert!(!commits.since_last_look(&checkpoints), "nothing committed");
        insert(&writer);
        assert!(commits.since_last_look(&checkpoints), "a commit");
        assert!(
            checkpoint_and_restart(&checkpoints, &|catch_up: &dyn Fn()| catch_up()),
            "every frame copied"
        );
        assert!(
            !commits.since_last_look(&checkpoints),
            "a checkpoint is no commit"
        );
        commits.forget();
        assert!(commits.since_last_look(&checkpoints), "after forgetting");
    }

    #[test]
    fn a_log_copied_whole_needs_nothing_more_and_one_a_reader_holds_does() {
        let (_dir, checkpoints, writer) = database();
        insert(&writer);
        let holds = std::cell::Cell::new(0);
        let hold = |catch_up: &dyn Fn()| {
            holds.set(holds.get() + 1);
            catch_up();
        };
        assert!(checkpoint_and_restart(&checkpoints, &hold));
        assert_eq!(holds.get(), 1, "the catch-up ran with writes held");

        // A reader's snapshot from before a commit keeps that commit's frames
        // in the log: the checkpoint cannot copy them yet.
        let path = writer.path().unwrap().to_owned();
        let reader = Connection::open(path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM rows", [], |row| row.get(0))
            .unwrap();
        insert(&writer);
        assert!(!checkpoint_and_restart(&checkpoints, &hold), "frames left");
        reader.execute_batch("COMMIT").unwrap();
        assert!(checkpoint_and_restart(&checkpoints, &hold));
    }
}
