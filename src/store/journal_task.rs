//! The journal writer as a task on a pool connection: PostgreSQL, and an
//! in-memory SQLite database (which the journal thread's own connection could
//! not open).
//!
//! On PostgreSQL every commit of the writer takes the write lock first (see
//! [`super::backend`]): the guarded insert's admission checks count other rows,
//! and only that lock serialises them with every other writer, of this instance
//! or another; SQLite's one writer gives the same for free.

use sqlx::postgres::PgConnection;
use tokio::sync::mpsc;

use super::backend::{self, Conn, Handle};
use super::journal::{Admitted, finish_execution_with, insert_execution_with};
use super::journal_queue::{
    Gathered, JournalWrite, Message, Request, answer, gather, observe_batch,
};
use crate::error::{Error, Result};

/// Runs the writer until its handles are dropped or it is closed.
pub(super) async fn run(pool: backend::Pool, mut receiver: mpsc::Receiver<Message>) {
    // The writer keeps one connection while writes keep coming, instead of taking
    // one from the pool for every batch.
    let mut connection: Option<Conn> = None;
    let mut closing = None;
    while let Some(message) = receiver.recv().await {
        let Gathered {
            batch,
            settles,
            close,
        } = gather(message, &mut receiver);
        // Only a SQLite file's journal has a log to fold.
        for done in settles {
            let _ = done.send(Ok(()));
        }
        closing = close;
        if batch.is_empty() {
            if closing.is_some() {
                break;
            }
            continue;
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
        observe_batch(batch.len(), started);
        if committed.is_err() {
            // Start the fallback on a fresh connection in case this one is broken.
            connection = None;
        }
        if let Some(batch) = answer(batch, committed) {
            for request in batch {
                let result = match pool.acquire().await {
                    Ok(mut conn) => apply_alone(&mut conn, &request.write).await,
                    Err(err) => Err(err.into()),
                };
                let _ = request.done.send(result);
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
            finish_execution_with(conn, id, finish, *at).await
        }
    }
}
