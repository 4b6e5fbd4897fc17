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
        self.queue
            .send(Message::Write(Request { write, done }))
            .await
            .map_err(|_| writer_gone())?;
        if let Some(shared) = &self.inline {
            shared.needs_thread();
        }
        answer.await.map_err(|_| writer_gone())?
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
        self.queue
            .send(Message::Settle(done))
            .await
            .map_err(|_| writer_gone())?;
        shared.needs_thread();
        answer.await.map_err(|_| writer_gone())?
    }

    /// Commits what is queued and stops the writer; later writes fail.
    pub(super) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.queue.send(Message::Close(done)).await.is_ok() {
            if let Some(shared) = &self.inline {
                shared.needs_thread();
            }
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
