//! The journal connection's write transactions, begun and ended by cached
//! statements.
//!
//! rusqlite's `Transaction` runs `BEGIN IMMEDIATE` and `COMMIT` through
//! `execute_batch`, which parses both again at every use: about 3,400
//! instructions a fold (BENCHMARKS.md, issue 20), on the thread that folds
//! every few milliseconds under load.

use std::ops::Deref;

use rusqlite::Connection;

/// An `IMMEDIATE` transaction on a journal connection, rolled back when it is
/// dropped uncommitted.
pub(super) struct JournalTransaction<'c> {
    connection: &'c Connection,
}

impl<'c> JournalTransaction<'c> {
    pub(super) fn begin(connection: &'c Connection) -> rusqlite::Result<Self> {
        connection.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Self { connection })
    }

    /// Commits; on an error the transaction is rolled back as it is dropped.
    pub(super) fn commit(self) -> rusqlite::Result<()> {
        self.connection.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }
}

impl Drop for JournalTransaction<'_> {
    fn drop(&mut self) {
        // Still inside it: not committed, or its COMMIT failed (a busy
        // database leaves the transaction open).
        if self.connection.is_autocommit() {
            return;
        }
        let rolled_back = self
            .connection
            .prepare_cached("ROLLBACK")
            .and_then(|mut rollback| rollback.execute([]));
        if let Err(error) = rolled_back {
            tracing::error!(%error, "rolling back a journal transaction failed");
        }
    }
}

impl Deref for JournalTransaction<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::open(dir.path().join("t.db")).unwrap();
        connection
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER)")
            .unwrap();
        (dir, connection)
    }

    fn count(connection: &Connection) -> i64 {
        connection
            .query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn a_committed_transaction_is_seen_by_other_connections() {
        let (dir, connection) = database();
        let tx = JournalTransaction::begin(&connection).unwrap();
        assert!(!connection.is_autocommit());
        tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
        tx.commit().unwrap();
        assert!(connection.is_autocommit());
        let other = Connection::open(dir.path().join("t.db")).unwrap();
        assert_eq!(count(&other), 1);
    }

    #[test]
    fn a_dropped_transaction_leaves_nothing_and_the_next_one_begins() {
        let (_dir, connection) = database();
        {
            let tx = JournalTransaction::begin(&connection).unwrap();
            tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
        }
        assert!(connection.is_autocommit());
        assert_eq!(count(&connection), 0);
        let tx = JournalTransaction::begin(&connection).unwrap();
        tx.execute("INSERT INTO t VALUES (2)", []).unwrap();
        tx.commit().unwrap();
        assert_eq!(count(&connection), 1);
    }

    #[test]
    fn a_failed_commit_is_rolled_back() {
        let (_dir, connection) = database();
        connection
            .execute_batch(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE child (parent INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);
                 PRAGMA foreign_keys = ON;",
            )
            .unwrap();
        let tx = JournalTransaction::begin(&connection).unwrap();
        tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
        tx.execute("INSERT INTO child VALUES (7)", []).unwrap();
        assert!(
            tx.commit().is_err(),
            "a deferred foreign key fails at COMMIT"
        );
        assert!(connection.is_autocommit());
        assert_eq!(count(&connection), 0);
    }
}
