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

use rusqlite::types::{ToSqlOutput, Value as SqlValue};
use rusqlite::{CachedStatement, Connection, ToSql, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use tokio::sync::mpsc;

use super::checkpointer::Checkpointer;
use super::journal::{
    ADMISSION_VERDICT, FINISH_SQL, Param, finish_params, insert_sql, refusal, row_params,
};
use super::journal_queue::{JournalWrite, Message, Request, answer, gather, observe_batch};
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
/// (taken at close) and how many writes are in flight.
pub(super) struct JournalShared {
    connection: Mutex<Option<JournalConnection>>,
    writes: AtomicUsize,
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

    /// Commits `write` on the caller's thread; None when the connection is
    /// busy (the thread committing a batch left by callers that went away) or
    /// the journal is closed: the caller then queues the write.
    pub(super) fn try_commit(&self, write: &JournalWrite) -> Option<Result<Admitted>> {
        let mut guard = match self.connection.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return None,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        let journal = guard.as_mut()?;
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
    let connection = open(path)
        .with_context(|| format!("opening the journal's connection to {}", path.display()))?;
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
        writes: AtomicUsize::new(0),
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
    // Four statements in all; keep every one prepared.
    connection.set_prepared_statement_cache_capacity(8);
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
    let mut closing = None;
    while let Some(message) = receiver.blocking_recv() {
        let (batch, close) = gather(message, &mut receiver);
        if !batch.is_empty() {
            let mut guard = shared.lock();
            match guard.as_mut() {
                Some(journal) => {
                    commit_and_answer(&mut journal.connection, batch);
                    journal.checkpointer.committed();
                }
                None => tracing::error!("the journal's connection is gone; writes dropped"),
            }
        }
        if let Some(done) = close {
            closing = Some(done);
            break;
        }
    }
    // Closing both connections here, before answering, lets the pool's close
    // checkpoint the write-ahead log without them open. Taking the connection
    // out also turns later callers away from committing on their own.
    let journal = shared.lock().take();
    if let Some(JournalConnection {
        connection,
        checkpointer,
    }) = journal
    {
        drop(connection);
        checkpointer.stop();
    }
    if let Some(done) = closing {
        let _ = done.send(());
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
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(database_error)?;
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
            let step_ok: bool = row.get("step_ok").map_err(database_error)?;
            Ok(refusal(run_open, step_ok))
        }
        JournalWrite::Finish { id, finish, at } => {
            let mut update = prepared(connection, FINISH_SQL)?;
            execute(&mut update, &finish_params(id, finish, *at))?;
            Ok(Admitted::Yes)
        }
    }
}

fn prepared<'c>(connection: &'c Connection, sql: &str) -> Result<CachedStatement<'c>> {
    connection.prepare_cached(sql).map_err(database_error)
}

/// Binds the parameters the statement numbers (`?N` up to its highest): the
/// verdict uses only some of a row's.
fn bind(statement: &mut CachedStatement<'_>, params: &[Param<'_>]) -> Result<()> {
    for index in 1..=statement.parameter_count() {
        let param = params.get(index - 1).ok_or_else(|| {
            Error::Internal(anyhow::anyhow!(
                "journal statement parameter ?{index} has no value"
            ))
        })?;
        statement
            .raw_bind_parameter(index, param)
            .map_err(database_error)?;
    }
    Ok(())
}

fn execute(statement: &mut CachedStatement<'_>, params: &[Param<'_>]) -> Result<usize> {
    bind(statement, params)?;
    statement.raw_execute().map_err(database_error)
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Param::Text(Some(text)) => ToSqlOutput::from(text.as_ref()),
            Param::Int(Some(value)) => ToSqlOutput::from(*value),
            Param::Text(None) | Param::Int(None) => ToSqlOutput::Owned(SqlValue::Null),
        })
    }
}

fn database_error(err: rusqlite::Error) -> Error {
    Error::Internal(anyhow::Error::new(err).context("journal write"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::ExecutionStatus;
    use crate::store::ExecutionFinish;

    fn shared(connection: Option<JournalConnection>) -> JournalShared {
        JournalShared {
            connection: Mutex::new(connection),
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

    #[test]
    fn a_closed_journal_sends_callers_to_the_queue() {
        let write = JournalWrite::Finish {
            id: "exec_test".into(),
            finish: ExecutionFinish {
                status: ExecutionStatus::Success,
                provider_started: true,
                result: serde_json::Value::Null,
                error_message: None,
                reason_code: None,
                commit_outcome: None,
            },
            at: 0,
        };
        assert!(shared(None).try_commit(&write).is_none());
    }
}
