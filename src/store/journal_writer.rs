//! Group commit for the journal. Every tool call writes its row twice (opened,
//! then finished), and SQLite has one writer: committing each write on its own
//! makes the write path the server's bottleneck. Concurrent journal writes are
//! queued to one task that commits whatever has gathered in a single
//! transaction; each caller is answered only after that commit, so a row a
//! caller was told about is as durable as with its own transaction.
//!
//! On PostgreSQL every commit of the writer takes the write lock first (see
//! [`super::backend`]): the guarded insert's admission checks count other rows,
//! and only that lock serialises them with every other writer, of this instance
//! or another; SQLite's one writer gives the same for free.

use sqlx::postgres::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::backend::{self, Conn, Handle};
use super::journal::{
    Admitted, ExecutionFinish, NewExecution, finish_execution_with, insert_execution_with,
};
use crate::error::{Error, Result};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;
/// Writes that may wait for the writer before submitters wait for room.
const QUEUE: usize = 4096;

/// One journal write.
#[derive(Debug)]
pub(super) enum JournalWrite {
    /// A new row, owned by the instance writing it.
    Insert {
        row: Box<NewExecution>,
        instance_id: String,
    },
    Finish {
        id: String,
        finish: ExecutionFinish,
        at: i64,
    },
}

struct Request {
    write: JournalWrite,
    done: oneshot::Sender<Result<Admitted>>,
}

/// What the writer task receives.
enum Message {
    Write(Request),
    /// Finish what is queued, give the connection back and stop (at shutdown, so
    /// the pool can close).
    Close(oneshot::Sender<()>),
}

/// Handle to the journal's writer task.
#[derive(Debug, Clone)]
pub(super) struct JournalWriter {
    queue: mpsc::Sender<Message>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write.fmt(f)
    }
}

impl JournalWriter {
    /// Starts the writer task; it ends when every handle is dropped.
    pub(super) fn spawn(pool: backend::Pool) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(run(pool, receiver));
        Self { queue }
    }

    /// Queues a write and waits until it is committed; an insert may be refused
    /// by its admission conditions (a finish is always `Admitted::Yes`).
    pub(super) async fn write(&self, write: JournalWrite) -> Result<Admitted> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Message::Write(Request { write, done }))
            .await
            .map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }
}

impl JournalWriter {
    /// Commits what is queued and stops the writer; later writes fail.
    pub(super) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.queue.send(Message::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

fn writer_gone() -> Error {
    Error::Internal(anyhow::anyhow!("the journal writer has stopped"))
}

async fn run(pool: backend::Pool, mut receiver: mpsc::Receiver<Message>) {
    // The writer keeps one connection while writes keep coming, instead of taking
    // one from the pool for every batch.
    let mut connection: Option<Conn> = None;
    let mut closing = None;
    while let Some(message) = receiver.recv().await {
        let first = match message {
            Message::Write(request) => request,
            Message::Close(done) => {
                closing = Some(done);
                break;
            }
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(Message::Write(request)) => batch.push(request),
                Ok(Message::Close(done)) => {
                    closing = Some(done);
                    break;
                }
                Err(_) => break,
            }
        }
        if connection.is_none() {
            connection = pool.acquire().await.ok();
        }
        let Some(conn) = connection.as_mut() else {
            for request in batch {
                let _ = request.done.send(Err(Error::Internal(anyhow::anyhow!(
                    "no database connection for the journal"
                ))));
            }
            if closing.is_some() {
                break;
            }
            continue;
        };
        let started = std::time::Instant::now();
        let committed = commit_batch(conn, &batch).await;
        let metrics = crate::metrics::metrics();
        if metrics.enabled() {
            metrics.journal_batch_rows.observe(batch.len() as f64);
            metrics
                .journal_commit_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        if committed.is_err() {
            // Start the fallback on a fresh connection in case this one is broken.
            connection = None;
        }
        match committed {
            Ok(admitted) => {
                for (request, admitted) in batch.into_iter().zip(admitted) {
                    let _ = request.done.send(Ok(admitted));
                }
            }
            Err(err) => {
                // One bad write must not fail its neighbours: retry each on its own
                // so every caller gets its own answer.
                tracing::warn!(error = %err, writes = batch.len(), "journal batch failed; retrying one by one");
                for request in batch {
                    let result = match pool.acquire().await {
                        Ok(mut conn) => apply_alone(&mut conn, &request.write).await,
                        Err(err) => Err(err.into()),
                    };
                    let _ = request.done.send(result);
                }
            }
        }
        if closing.is_some() {
            break;
        }
    }
    drop(connection);
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

async fn commit_batch(conn: &mut Conn, batch: &[Request]) -> Result<Vec<Admitted>> {
    if let [single] = batch {
        return Ok(vec![apply_alone(conn, &single.write).await?]);
    }
    match conn {
        Conn::Sqlite(conn) => {
            let mut tx = sqlx::Connection::begin(&mut **conn).await?;
            let admitted = apply_all(&mut Handle::Sqlite(&mut tx), batch).await?;
            tx.commit().await?;
            Ok(admitted)
        }
        Conn::Postgres(conn) => {
            let mut tx = begin_locked(conn).await?;
            let admitted = apply_all(&mut Handle::Postgres(&mut tx), batch).await?;
            tx.commit().await?;
            Ok(admitted)
        }
    }
}

/// Commits one write by itself. On SQLite without an explicit transaction: it
/// would add two round trips (BEGIN, COMMIT) to the connection's thread for
/// nothing. On PostgreSQL in a transaction, for the write lock.
async fn apply_alone(conn: &mut Conn, write: &JournalWrite) -> Result<Admitted> {
    match conn {
        Conn::Sqlite(conn) => apply(&mut Handle::Sqlite(conn), write).await,
        Conn::Postgres(conn) => {
            let mut tx = begin_locked(conn).await?;
            let admitted = apply(&mut Handle::Postgres(&mut tx), write).await?;
            tx.commit().await?;
            Ok(admitted)
        }
    }
}

/// A PostgreSQL transaction holding the write lock [`backend::Pool::begin_write`]
/// takes, so the writer's commits are serialised with every other write.
async fn begin_locked(
    conn: &mut PgConnection,
) -> std::result::Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(conn).await?;
    backend::take_write_lock(&mut tx).await?;
    Ok(tx)
}

async fn apply_all(conn: &mut Handle<'_>, batch: &[Request]) -> Result<Vec<Admitted>> {
    let mut admitted = Vec::with_capacity(batch.len());
    for request in batch {
        admitted.push(apply(conn, &request.write).await?);
    }
    Ok(admitted)
}

async fn apply(conn: &mut Handle<'_>, write: &JournalWrite) -> Result<Admitted> {
    match write {
        JournalWrite::Insert { row, instance_id } => {
            insert_execution_with(conn, row, instance_id).await
        }
        JournalWrite::Finish { id, finish, at } => {
            finish_execution_with(conn, id, finish, *at).await?;
            Ok(Admitted::Yes)
        }
    }
}
