//! The SQLite journal writer: one thread that owns its own connection to the
//! database file and commits each gathered batch synchronously, with prepared
//! statements kept between batches.
//!
//! Through sqlx every statement is a round trip from the writer task to the
//! connection's worker thread (a futex wake-up and a context switch each way,
//! about 90 µs on a loaded 2-core machine, where SQLite's own work is a few
//! µs): a batch of N writes cost N + 2 of them, and the writer, not SQLite,
//! bounded the journal's throughput (BENCHMARKS.md, issue 20). Here a batch
//! costs one wake-up of this thread and one of each caller.
//!
//! What the journal promises is unchanged: a caller is answered only after its
//! write is committed (WAL, `synchronous = NORMAL`, as the pool), and a batch
//! that fails is retried one write at a time so each caller gets its own answer.
//!
//! A caller whose write is the only one in flight (so nothing is queued and
//! the thread has no batch) commits it itself, on the
//! connection the thread owns, instead of waking the thread and being woken by
//! it: at one call at a time those two hand-offs per write were most of a
//! call's own cost (BENCHMARKS.md, issue 20). A single-row commit without an
//! fsync is tens of microseconds, less than the hand-offs it saves; when
//! writes gather, callers queue for the group commit as before, so at most one
//! async worker is ever inside a commit.

use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use tokio::sync::mpsc;

use super::checkpointer::Checkpointer;
use super::fold_priority::{FoldPriority, RAISE_AT_BACKLOG};
use super::journal::{
    ADMISSION_VERDICT, FINISH_SQL, finish_params, insert_sql, is_guarded, late_outcome_left_out,
    refusal, row_params,
};
use super::journal_fold::{bind, database_error, execute, fold, prepared};
use super::journal_log::{JournalLog, LoggedKind};
use super::journal_queue::{
    Gathered, JournalWrite, Message, Request, answer, gather, observe_batch,
};
use super::journal_transaction::JournalTransaction;
use super::schema::{CONNECTION_PRAGMAS, SQLITE_BUSY_TIMEOUT};
use crate::error::{Error, Result};
use crate::ids::now_ms;
use crate::store::Admitted;

/// The journal's connection and the checkpoint counter its commits feed.
struct JournalConnection {
    connection: Connection,
    checkpointer: Checkpointer,
}

/// What the journal thread shares with the writers' handle: the connection
/// (taken at close), the journal's log and how many writes are in flight.
///
/// Lock order: the connection, then the log. Appending takes only the log.
pub(super) struct JournalShared {
    connection: Mutex<Option<JournalConnection>>,
    /// None once closed, or after the log could not be restarted: writes
    /// then commit to the table as they did before the log.
    log: Mutex<Option<JournalLog>>,
    /// Records appended and not yet committed to the table: a read that
    /// finds none needs no fold.
    unfolded: AtomicUsize,
    writes: AtomicUsize,
    /// The journal thread's scheduling class: folds run in the background.
    priority: FoldPriority,
}

/// Records waiting to be folded may take this much memory; past it, writes
/// commit to the table as if there were no log.
const MAX_PENDING_BYTES: usize = 64 << 20;
/// A log grown past this is started again once everything in it is folded.
const LOG_RESTART_BYTES: u64 = 16 << 20;
/// How long the thread lets records gather after a nudge before it folds
/// them, unless a write or another nudge comes first. A call's outcome
/// usually comes within this of its `opened` record, and the two are then
/// written as one finished row; reads never wait for it (they fold what is
/// pending themselves, [`JournalShared::settle`]).
const FOLD_DELAY: std::time::Duration = std::time::Duration::from_millis(2);
/// How long the thread waits in the normal scheduling class before it goes
/// back to the background one ([`next_message`]).
const LOWER_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
/// Every this many records appended while a fold is pending, the thread is
/// nudged again (a fold that failed is tried again).
const NUDGE_EVERY: usize = 64;

/// What [`JournalShared::append`] did with a write.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Appended {
    /// In the log; the journal thread should be nudged to fold it.
    Nudge,
    /// In the log, behind records the thread has been nudged for.
    Queued,
    /// Not for the log (an insert with admission conditions) or no log:
    /// the write commits to the table.
    No,
}

/// One journal write in flight, from its start until it is answered or its
/// caller goes away.
pub(super) struct Writing<'a> {
    writes: &'a AtomicUsize,
    alone: bool,
}

impl Writing<'_> {
    /// No other write was in flight when this one started.
    pub(super) fn alone(&self) -> bool {
        self.alone
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.writes.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for JournalShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalShared")
            .field("writes", &self.writes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl JournalShared {
    /// Counts a write in flight until the guard drops.
    pub(super) fn writing(&self) -> Writing<'_> {
        let before = self.writes.fetch_add(1, Ordering::AcqRel);
        Writing {
            writes: &self.writes,
            alone: before == 0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<JournalConnection>> {
        self.connection.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection's lock if it is free now (async workers never wait
    /// for it).
    fn try_lock(&self) -> Option<MutexGuard<'_, Option<JournalConnection>>> {
        match self.connection.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        }
    }

    fn lock_log(&self) -> MutexGuard<'_, Option<JournalLog>> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a write without admission conditions to the journal's log:
    /// when this returns `Nudge` or `Queued` the write is as durable as a
    /// commit and its caller may be answered.
    pub(super) fn append(&self, write: &JournalWrite) -> Result<Appended> {
        let now = now_ms();
        let mut log = self.lock_log();
        let Some(log_file) = log.as_mut() else {
            return Ok(Appended::No);
        };
        if log_file.pending_bytes() >= MAX_PENDING_BYTES {
            // Folds are failing (the database locked or full): the write
            // takes the table's path, which folds first and reports why.
            return Ok(Appended::No);
        }
        let appended = match write {
            JournalWrite::Insert { row, .. } if is_guarded(row) => return Ok(Appended::No),
            JournalWrite::Insert { row, instance_id } => {
                log_file.append(LoggedKind::Insert, &row_params(row, now, instance_id))
            }
            JournalWrite::Finish { id, finish, at } => {
                log_file.append(LoggedKind::Finish, &finish_params(id, finish, *at))
            }
        };
        if let Err(err) = appended {
            // The write goes to the table instead, after a fold of what
            // is before it.
            tracing::warn!(error = %err, "appending to the journal log failed; committing to the table");
            return Ok(Appended::No);
        }
        let before = self.unfolded.fetch_add(1, Ordering::AcqRel);
        if before + 1 >= RAISE_AT_BACKLOG {
            self.priority.raise();
        }
        Ok(if before.is_multiple_of(NUDGE_EVERY) {
            Appended::Nudge
        } else {
            Appended::Queued
        })
    }

    /// Raises the journal thread to the normal scheduling class: call it
    /// after queueing a message the thread must answer
    /// ([`super::fold_priority`]).
    pub(super) fn needs_thread(&self) {
        self.priority.raise();
    }

    /// The journal thread's scheduling class, if the kernel tells.
    #[cfg(test)]
    pub(super) fn thread_class(&self) -> Option<super::fold_priority::Class> {
        self.priority.thread_class()
    }

    /// Waits (up to 10 s) for the journal thread to be in `class`.
    #[cfg(test)]
    pub(super) fn wait_for_class(&self, class: super::fold_priority::Class) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.thread_class() != Some(class) {
            assert!(
                std::time::Instant::now() < deadline,
                "the journal thread never went {class:?}"
            );
            std::thread::yield_now();
        }
    }

    /// The journal's connection, held: nothing folds or commits meanwhile.
    #[cfg(test)]
    pub(super) fn hold_connection(&self) -> impl Sized + '_ {
        self.lock()
    }

    /// Whether records wait to be folded.
    pub(super) fn has_unfolded(&self) -> bool {
        self.unfolded.load(Ordering::Acquire) > 0
    }

    /// Folds every record appended before the call on the caller's thread,
    /// if the connection is free; None when it is busy (the caller then asks
    /// the journal thread, [`Message::Settle`], instead of blocking an async
    /// worker on the lock: the lock's holder may be waiting for a database
    /// lock that a task on that worker holds).
    pub(super) fn try_settle(&self) -> Option<Result<()>> {
        let mut guard = self.try_lock()?;
        match guard.as_mut() {
            Some(journal) => Some(self.fold_locked(journal)),
            // Closed: the close folded what it could; start-up folds the rest.
            None => Some(Ok(())),
        }
    }

    /// Folds every record appended so far, with the connection's lock held.
    fn fold_locked(&self, journal: &mut JournalConnection) -> Result<()> {
        let pending = match self.lock_log().as_mut() {
            Some(log) if !log.is_empty() => log.take(),
            _ => return Ok(()),
        };
        let started = std::time::Instant::now();
        if let Err(err) = fold(&mut journal.connection, &pending) {
            if let Some(log) = self.lock_log().as_mut() {
                log.put_back(pending);
            }
            return Err(err);
        }
        observe_batch(pending.count, started);
        self.unfolded.fetch_sub(pending.count, Ordering::AcqRel);
        journal.checkpointer.committed();
        self.remove_retired(pending.generation);
        self.restart_log_if_long();
        Ok(())
    }

    /// Goes on in a new file once a long log is all folded, so no file grows
    /// for the life of the server. Only files are touched under the log's
    /// lock: appends must never wait for the database.
    fn restart_log_if_long(&self) {
        let mut log = self.lock_log();
        let Some(log_file) = log.as_mut() else { return };
        if log_file.len() < LOG_RESTART_BYTES || !log_file.is_empty() {
            return;
        }
        if let Err(err) = log_file.restart() {
            tracing::warn!(error = %err, "starting the journal log's next file failed; the current one goes on");
        }
    }

    /// Deletes the previous generation's file once the database names the
    /// current one.
    fn remove_retired(&self, folded_generation: i64) {
        let retired = self
            .lock_log()
            .as_mut()
            .and_then(|log| log.retired(folded_generation));
        if let Some(path) = retired {
            super::journal_fold::remove_if_there(&path);
        }
    }

    /// Commits `write` on the caller's thread; None when the connection is
    /// busy (the thread committing a batch left by callers that went away) or
    /// the journal is closed: the caller then queues the write.
    pub(super) fn try_commit(&self, write: &JournalWrite) -> Option<Result<Admitted>> {
        let mut guard = self.try_lock()?;
        let journal = guard.as_mut()?;
        // What the log holds comes first: an admission counts those rows,
        // and an outcome's row may still be there.
        if let Err(err) = self.fold_locked(journal) {
            return Some(Err(err));
        }
        let started = std::time::Instant::now();
        let admitted = apply(&journal.connection, write);
        observe_batch(1, started);
        journal.checkpointer.committed();
        Some(admitted)
    }
}

/// Opens the journal's connection to `path` and starts its thread, which ends
/// when every sender is dropped or on [`Message::Close`].
pub(super) fn spawn(
    path: &Path,
    receiver: mpsc::Receiver<Message>,
) -> anyhow::Result<Arc<JournalShared>> {
    use anyhow::Context;
    let mut connection = open(path)
        .with_context(|| format!("opening the journal's connection to {}", path.display()))?;
    let log =
        super::journal_fold::recover(&mut connection, &super::journal_log::path_beside(path))?;
    // The checkpoint thread holds writes back through the connection's lock;
    // it only gets a weak handle, so it never keeps the journal alive.
    let journal: Arc<OnceLock<Weak<JournalShared>>> = Arc::default();
    let checkpointer = Checkpointer::spawn(path, {
        let journal = journal.clone();
        move |catch_up: &dyn Fn()| {
            if let Some(shared) = journal.get().and_then(Weak::upgrade) {
                let _no_commits = shared.lock();
                catch_up();
            }
        }
    })?;
    let shared = Arc::new(JournalShared {
        connection: Mutex::new(Some(JournalConnection {
            connection,
            checkpointer,
        })),
        log: Mutex::new(Some(log)),
        unfolded: AtomicUsize::new(0),
        writes: AtomicUsize::new(0),
        priority: FoldPriority::new(),
    });
    let _ = journal.set(Arc::downgrade(&shared));
    let thread_shared = shared.clone();
    std::thread::Builder::new()
        .name("toolgate-journal".into())
        .spawn(move || run(&thread_shared, receiver))
        .context("starting the journal thread")?;
    Ok(shared)
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    // Through the VFS that writes a commit's log frames in one go: this
    // connection makes almost every write of a busy server.
    let connection = Connection::open_with_flags_and_vfs(
        PathBuf::from(path),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        super::wal_vfs::registered()?,
    )?;
    apply_settings(&connection)?;
    // Six statements and a transaction's three; keep every one prepared.
    connection.set_prepared_statement_cache_capacity(12);
    Ok(connection)
}

/// The pool's connection settings ([`CONNECTION_PRAGMAS`]) on a rusqlite
/// connection.
pub(super) fn apply_settings(connection: &Connection) -> rusqlite::Result<()> {
    connection.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
    for (name, value) in CONNECTION_PRAGMAS {
        connection.pragma_update(None, name, value)?;
    }
    Ok(())
}

fn run(shared: &JournalShared, mut receiver: mpsc::Receiver<Message>) {
    shared.priority.register_current_thread();
    let mut closing = None;
    // Only a clock for the fold's wait: this thread runs no tasks.
    let clock = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build();
    while let Some(mut message) = next_message(shared, clock.as_ref().ok(), &mut receiver) {
        if let (Message::Fold, Ok(clock)) = (&message, &clock) {
            message = after_fold_delay(clock, &mut receiver);
        }
        let Gathered {
            batch,
            settles,
            close,
        } = gather(message, &mut receiver);
        let mut guard = shared.lock();
        let folded = match guard.as_mut() {
            Some(journal) => shared.fold_locked(journal),
            // Closed: what the close could not fold, start-up folds.
            None => Ok(()),
        };
        for done in settles {
            let _ = done.send(match &folded {
                Ok(()) => Ok(()),
                Err(err) => Err(Error::Internal(anyhow::anyhow!(
                    "journal log fold failed: {err}"
                ))),
            });
        }
        match (guard.as_mut(), folded) {
            (_, _) if batch.is_empty() => {}
            (Some(journal), Ok(())) => {
                commit_and_answer(&mut journal.connection, batch);
                journal.checkpointer.committed();
            }
            (Some(_), Err(err)) => refuse(batch, &err),
            (None, _) => tracing::error!("the journal's connection is gone; writes dropped"),
        }
        drop(guard);
        if let Some(done) = close {
            closing = Some(done);
            break;
        }
    }
    // Closing both connections here, before answering, lets the pool's close
    // checkpoint the write-ahead log without them open. Taking the connection
    // out also turns later callers away from committing on their own; the
    // log goes first, so nothing is appended after the last fold.
    let mut journal = shared.lock().take();
    let log = shared.lock_log().take();
    if let (Some(mut log), Some(open)) = (log, journal.as_mut()) {
        let pending = log.take();
        if pending.count > 0
            && let Err(err) = fold(&mut open.connection, &pending)
        {
            tracing::error!(error = %err, "folding the journal log at close failed; start-up folds it");
        }
    }
    if let Some(JournalConnection {
        connection,
        checkpointer,
    }) = journal
    {
        drop(connection);
        checkpointer.stop();
    }
    // Its id may be given to another thread once it ends.
    shared.priority.forget_thread();
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

/// The thread's next message. Before waiting it goes to the background
/// scheduling class unless something waits for it; while it is in the normal
/// class (raised for a need since met) it wakes after [`LOWER_AFTER`] to go
/// back.
fn next_message(
    shared: &JournalShared,
    clock: Option<&tokio::runtime::Runtime>,
    receiver: &mut mpsc::Receiver<Message>,
) -> Option<Message> {
    loop {
        shared.priority.lower_unless(|| {
            shared.unfolded.load(Ordering::Acquire) >= RAISE_AT_BACKLOG || !receiver.is_empty()
        });
        let clock = match clock {
            Some(clock) if shared.priority.may_lower() => clock,
            _ => return receiver.blocking_recv(),
        };
        // The timer must be made inside the clock's context.
        if let Ok(message) =
            clock.block_on(async { tokio::time::timeout(LOWER_AFTER, receiver.recv()).await })
        {
            return message;
        }
    }
}

/// Waits up to [`FOLD_DELAY`] after a nudge to fold, or until any other
/// message comes, which it returns.
fn after_fold_delay(
    clock: &tokio::runtime::Runtime,
    receiver: &mut mpsc::Receiver<Message>,
) -> Message {
    // The timer must be made inside the clock's context.
    match clock.block_on(async { tokio::time::timeout(FOLD_DELAY, receiver.recv()).await }) {
        Ok(Some(message)) => message,
        Ok(None) | Err(_) => Message::Fold,
    }
}

/// Answers every write of a batch that cannot be committed with `err`.
fn refuse(batch: Vec<Request>, err: &Error) {
    if !batch.is_empty() {
        tracing::error!(error = %err, writes = batch.len(), "folding the journal log failed; writes refused");
    }
    for request in batch {
        let _ = request.done.send(Err(Error::Internal(anyhow::anyhow!(
            "journal log fold failed: {err}"
        ))));
    }
}

fn commit_and_answer(connection: &mut Connection, batch: Vec<Request>) {
    let started = std::time::Instant::now();
    let committed = commit_batch(connection, &batch);
    observe_batch(batch.len(), started);
    if let Some(batch) = answer(batch, committed) {
        for request in batch {
            let _ = request.done.send(apply(connection, &request.write));
        }
    }
}

/// Commits the batch in one transaction (a single write commits by itself: a
/// transaction around it would add two statements for nothing).
fn commit_batch(connection: &mut Connection, batch: &[Request]) -> Result<Vec<Admitted>> {
    if let [single] = batch {
        return Ok(vec![apply(connection, &single.write)?]);
    }
    let tx = JournalTransaction::begin(connection).map_err(database_error)?;
    let admitted = batch
        .iter()
        .map(|request| apply(&tx, &request.write))
        .collect::<Result<Vec<_>>>()?;
    tx.commit().map_err(database_error)?;
    Ok(admitted)
}

fn apply(connection: &Connection, write: &JournalWrite) -> Result<Admitted> {
    match write {
        JournalWrite::Insert { row, instance_id } => {
            let params = row_params(row, now_ms(), instance_id);
            let mut insert = prepared(connection, insert_sql(row))?;
            if execute(&mut insert, &params)? > 0 {
                return Ok(Admitted::Yes);
            }
            let mut verdict = prepared(connection, ADMISSION_VERDICT.as_str())?;
            bind(&mut verdict, &params)?;
            let mut rows = verdict.raw_query();
            let row = rows.next().map_err(database_error)?.ok_or_else(|| {
                Error::Internal(anyhow::anyhow!("admission verdict returned no row"))
            })?;
            let run_open: bool = row.get("run_open").map_err(database_error)?;
            let replay_ok: bool = row.get("replay_ok").map_err(database_error)?;
            let step_ok: bool = row.get("step_ok").map_err(database_error)?;
            Ok(refusal(run_open, replay_ok, step_ok))
        }
        JournalWrite::Finish { id, finish, at } => {
            let mut update = prepared(connection, FINISH_SQL)?;
            if execute(&mut update, &finish_params(id, finish, *at))? == 0 {
                late_outcome_left_out(id, finish);
                return Ok(Admitted::AlreadyDecided);
            }
            Ok(Admitted::Yes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::ExecutionStatus;
    use crate::store::ExecutionFinish;
    use crate::store::fold_priority::Class;

    fn shared(connection: Option<JournalConnection>) -> JournalShared {
        JournalShared {
            connection: Mutex::new(connection),
            log: Mutex::new(None),
            unfolded: AtomicUsize::new(0),
            priority: FoldPriority::new(),
            writes: AtomicUsize::new(0),
        }
    }

    #[test]
    fn only_a_write_with_none_beside_it_is_alone() {
        let shared = shared(None);
        let first = shared.writing();
        assert!(first.alone());
        let second = shared.writing();
        assert!(!second.alone(), "a write overlapping another must queue");
        drop(first);
        drop(second);
        // A caller that went away is counted out.
        assert!(shared.writing().alone());
    }

    fn finish_write(error_message: Option<String>) -> JournalWrite {
        JournalWrite::Finish {
            id: "exec_test".into(),
            finish: ExecutionFinish {
                status: ExecutionStatus::Success,
                provider_started: true,
                result: serde_json::Value::Null,
                error_message,
                reason_code: None,
                commit_outcome: None,
            },
            at: 0,
        }
    }

    #[test]
    fn a_late_outcome_leaves_a_decided_row_and_says_so() {
        let (_dir, database) = super::super::journal_fold::tests::migrated_database();
        let connection = Connection::open(database).unwrap();
        let row = super::super::journal_fold::tests::row("exec_test");
        let opened = JournalWrite::Insert {
            row: Box::new(row),
            instance_id: "inst".into(),
        };
        assert_eq!(apply(&connection, &opened).unwrap(), Admitted::Yes);
        // Another instance took this one for dead and swept its rows.
        connection
            .execute(
                "UPDATE tool_execution_record SET revision = revision + 1, status = 'uncertain', lifecycle_state = 'finished' \
                 WHERE id = 'exec_test'",
                [],
            )
            .unwrap();
        let logged = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SharedWriter(sink.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            apply(&connection, &finish_write(None)).unwrap();
        });
        let status: String = connection
            .query_row(
                "SELECT status FROM tool_execution_record WHERE id = 'exec_test'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(status, "uncertain");
        let logged = String::from_utf8(logged.lock().unwrap().clone()).unwrap();
        assert!(
            logged.contains("after its row was decided") && logged.contains("exec_test"),
            "{logged}"
        );
    }

    /// A log writer into a shared buffer.
    struct SharedWriter(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SharedWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_journal_sends_callers_to_the_queue() {
        let write = finish_write(None);
        assert!(shared(None).try_commit(&write).is_none());
        assert_eq!(shared(None).append(&write).unwrap(), Appended::No);
    }

    #[test]
    fn a_long_log_goes_on_in_the_next_file_and_the_old_one_goes_once_the_database_names_it() {
        let (_dir, database) = super::super::journal_fold::tests::migrated_database();
        let (_sender, receiver) = mpsc::channel(4);
        let shared = spawn(&database, receiver).unwrap();
        let base = super::super::journal_log::path_beside(&database);
        let file = |generation| super::super::journal_log::path_of(&base, generation);
        // A fresh database's log starts at generation 2 (recovery skips the
        // one a run may have started unnamed).
        assert!(file(2).is_file());
        let big = finish_write(Some("x".repeat(4 << 20)));
        while shared.lock_log().as_ref().unwrap().len() < LOG_RESTART_BYTES {
            assert_ne!(shared.append(&big).unwrap(), Appended::No);
        }
        shared
            .try_settle()
            .expect("the connection is free")
            .unwrap();
        assert!(file(3).is_file(), "the next generation's file is started");
        assert!(
            file(2).is_file(),
            "kept until the database names generation 3"
        );
        shared.append(&finish_write(None)).unwrap();
        shared
            .try_settle()
            .expect("the connection is free")
            .unwrap();
        assert!(
            !file(2).exists(),
            "removed once a fold recorded generation 3"
        );
        assert!(!shared.has_unfolded());
        let generation: i64 = shared
            .lock()
            .as_ref()
            .unwrap()
            .connection
            .query_row("SELECT generation FROM journal_log_position", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(generation, 3);
    }

    #[test]
    fn appends_nudge_the_thread_once_per_run_of_records_and_stop_at_the_memory_bound() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(None);
        *shared.lock_log() = Some(JournalLog::create(&dir.path().join("log"), 1).unwrap());
        assert!(!shared.has_unfolded());
        let small = finish_write(None);
        assert_eq!(shared.append(&small).unwrap(), Appended::Nudge);
        assert_eq!(shared.append(&small).unwrap(), Appended::Queued);
        assert!(shared.has_unfolded());
        // Records nobody folds pile up only to the bound; then writes take
        // the table's path.
        let big = finish_write(Some("x".repeat(4 << 20)));
        let mut appended = 0;
        while shared.append(&big).unwrap() != Appended::No {
            appended += 1;
            assert!(appended <= MAX_PENDING_BYTES / (4 << 20) + 1, "no bound");
        }
        let pending = shared.lock_log().as_ref().unwrap().pending_bytes();
        assert!((MAX_PENDING_BYTES..MAX_PENDING_BYTES + (5 << 20)).contains(&pending));
    }

    #[test]
    fn the_thread_waits_in_the_background_and_a_backlog_or_a_waiter_raises_it() {
        if !super::super::fold_priority::raising_permitted() {
            eprintln!(
                "NOT TESTED HERE: this process may not leave SCHED_IDLE, so the journal thread stays normal"
            );
            return;
        }
        let (_dir, database) = super::super::journal_fold::tests::migrated_database();
        let (sender, receiver) = mpsc::channel(4);
        let shared = spawn(&database, receiver).unwrap();
        shared.wait_for_class(Class::Background);

        // With the connection held here nothing folds: the backlog grows
        // until an append raises the thread to fold it.
        let small = finish_write(None);
        {
            let _held = shared.lock();
            for _ in 1..RAISE_AT_BACKLOG {
                shared.append(&small).unwrap();
            }
            assert_eq!(shared.priority.thread_class(), Some(Class::Background));
            shared.append(&small).unwrap();
            assert_eq!(shared.priority.thread_class(), Some(Class::Normal));
        }
        sender.blocking_send(Message::Fold).unwrap();
        shared.wait_for_class(Class::Background);

        // A message the thread must answer raises it once it is queued.
        shared.append(&small).unwrap();
        let (done, answer) = tokio::sync::oneshot::channel();
        {
            let _held = shared.lock();
            sender.blocking_send(Message::Settle(done)).unwrap();
            shared.needs_thread();
            assert_eq!(shared.priority.thread_class(), Some(Class::Normal));
        }
        answer.blocking_recv().unwrap().unwrap();
        assert!(!shared.has_unfolded());
        shared.wait_for_class(Class::Background);
    }
}
