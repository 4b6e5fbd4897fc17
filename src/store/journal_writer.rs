//! Group commit for the journal. Every tool call writes its row twice (opened,
//! then finished), and SQLite has one writer: committing each write on its own
//! makes the write path the server's bottleneck. Concurrent journal writes are
//! queued to one writer that commits whatever has gathered in a single
//! transaction; each caller is answered only after that commit, so a row a
//! caller was told about is as durable as with its own transaction.
//!
//! On a SQLite file the writer is a thread with its own connection
//! ([`super::journal_thread`]); otherwise a task on a pool connection
//! ([`super::journal_task`]).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::backend;
use super::journal::Admitted;
use super::journal_queue::{JournalWrite, Message, Request};
use super::journal_thread::{Appended, JournalShared};
use crate::error::{Error, Result};

/// Writes that may wait for the writer before submitters wait for room.
const QUEUE: usize = 4096;

/// Handle to the journal's writer.
#[derive(Debug, Clone)]
pub(super) struct JournalWriter {
    queue: mpsc::Sender<Message>,
    /// The journal thread's connection, which a write alone in flight
    /// commits on itself (SQLite files only).
    inline: Option<Arc<JournalShared>>,
}

impl JournalWriter {
    /// Starts the writer (the journal thread on a SQLite file, else a task);
    /// it ends when every handle is dropped.
    pub(super) fn spawn(pool: backend::Pool) -> anyhow::Result<Self> {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let inline = match sqlite_file(&pool) {
            Some(path) => Some(super::journal_thread::spawn(&path, receiver)?),
            None => {
                drop(tokio::spawn(super::journal_task::run(pool, receiver)));
                None
            }
        };
        Ok(Self { queue, inline })
    }

    /// Queues a write and waits until it is committed; an insert may be refused
    /// by its admission conditions (a finish is always `Admitted::Yes`).
    pub(super) async fn write(&self, write: JournalWrite) -> Result<Admitted> {
        let Some(shared) = &self.inline else {
            return self.queued(write).await;
        };
        match shared.append(&write)? {
            Appended::Nudge => {
                // A full queue has a batch coming, and every batch folds.
                let _ = self.queue.try_send(Message::Fold);
                return Ok(Admitted::Yes);
            }
            Appended::Queued => return Ok(Admitted::Yes),
            Appended::No => {}
        }
        let writing = shared.writing();
        // The only write in flight would be a batch of one, so it may as well
        // commit here (see `journal_thread`); writes that overlap go to the
        // thread, whose group commit is what carries the journal under load.
        if writing.alone()
            && let Some(admitted) = shared.try_commit(&write)
        {
            return admitted;
        }
        self.queued(write).await
    }

    async fn queued(&self, write: JournalWrite) -> Result<Admitted> {
        let (done, answer) = oneshot::channel();
        self.send_awaited(Message::Write(Request { write, done }))
            .await?;
        answer.await.map_err(|_| writer_gone())?
    }

    /// Queues a message the writer must answer. A journal thread waiting in
    /// the background scheduling class is raised once the message is queued,
    /// so the answer never waits for an idle core
    /// ([`super::fold_priority`]); a nudge to fold does not raise it.
    async fn send_awaited(&self, message: Message) -> Result<()> {
        self.queue.send(message).await.map_err(|_| writer_gone())?;
        if let Some(shared) = &self.inline {
            shared.needs_thread();
        }
        Ok(())
    }
}

impl JournalWriter {
    /// Returns once every write acknowledged before the call is in the
    /// journal's table, where reads and other writes find it.
    pub(super) async fn settle(&self) -> Result<()> {
        let Some(shared) = &self.inline else {
            return Ok(());
        };
        if !shared.has_unfolded() {
            return Ok(());
        }
        if let Some(settled) = shared.try_settle() {
            return settled;
        }
        let (done, answer) = oneshot::channel();
        self.send_awaited(Message::Settle(done)).await?;
        answer.await.map_err(|_| writer_gone())?
    }

    /// Commits what is queued and stops the writer; later writes fail.
    pub(super) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.send_awaited(Message::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

/// The database file of a SQLite pool, when it is one another connection can
/// open (not an in-memory database).
pub(super) fn sqlite_file(pool: &backend::Pool) -> Option<std::path::PathBuf> {
    let backend::Pool::Sqlite(pool) = pool else {
        return None;
    };
    let path = pool.connect_options().get_filename().to_path_buf();
    path.is_file().then_some(path)
}

fn writer_gone() -> Error {
    Error::Internal(anyhow::anyhow!("the journal writer has stopped"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::ExecutionStatus;
    use crate::store::ExecutionFinish;
    use crate::store::fold_priority::{Class, raising_permitted};

    #[test]
    fn a_read_waiting_behind_a_fold_raises_the_journal_thread() {
        if !raising_permitted() {
            eprintln!(
                "NOT TESTED HERE: this process may not leave SCHED_IDLE, so the journal thread stays normal"
            );
            return;
        }
        let (dir, _database) = super::super::journal_fold::tests::migrated_database();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let location = crate::store::schema::Location::DataDir(dir.path().to_owned());
        let pool = runtime
            .block_on(crate::store::schema::connect(&location, false))
            .unwrap();
        let writer = JournalWriter::spawn(pool).unwrap();
        let shared = writer.inline.clone().expect("a journal thread on a file");
        shared.wait_for_class(Class::Background);

        // The thread is nudged to fold but cannot take the connection, held
        // here: a read's settle finds it busy and queues behind it.
        let held = shared.hold_connection();
        let finish = JournalWrite::Finish {
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
        runtime.block_on(writer.write(finish)).unwrap();
        let settling = runtime.spawn({
            let writer = writer.clone();
            async move { writer.settle().await }
        });
        shared.wait_for_class(Class::Normal);
        drop(held);
        runtime.block_on(settling).unwrap().unwrap();
        assert!(!shared.has_unfolded());
        runtime.block_on(writer.close());
    }
}
