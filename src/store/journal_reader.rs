//! Journal reads on an SQLite file, on connections of their own. sqlx's
//! SQLite driver hands every row from its worker thread to the caller over a
//! channel, a wake-up per row, and a journal page is up to 500 full rows; here
//! a read runs whole on the blocking pool with a prepared statement, and only
//! the finished page crosses threads (BENCHMARKS.md, issue 20). PostgreSQL and
//! in-memory SQLite read through the pool.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OpenFlags, Row};
use tokio::sync::Semaphore;

use super::schema::SQLITE_BUSY_TIMEOUT;
use crate::error::{Error, Result};

/// At most this many journal reads run at once; each holds a connection and
/// a blocking thread while it runs.
const MAX_READS: usize = 4;
/// Statements each connection keeps prepared (the journal's queries differ
/// by their filters and sort).
const PREPARED_STATEMENTS: usize = 64;
/// Each reader's page cache, in KiB (SQLite's default is 2 MiB): a large
/// session's count and deep pages walk thousands of index entries, and lists
/// of other sessions in between should not evict them.
const CACHE_KIB: i64 = 16 * 1024;

/// A parameter of a journal read.
#[derive(Debug, Clone)]
pub(crate) enum ReadParam {
    Text(String),
    Int(i64),
}

/// Read-only connections to the database file, opened on demand.
#[derive(Clone)]
pub(crate) struct JournalReader {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JournalReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalReader")
            .field("path", &self.inner.path)
            .finish()
    }
}

struct Inner {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    reads: Semaphore,
}

impl JournalReader {
    pub fn new(path: PathBuf) -> Self {
        Self {
            inner: Arc::new(Inner {
                path,
                idle: Mutex::new(Vec::new()),
                reads: Semaphore::new(MAX_READS),
            }),
        }
    }

    /// Every row of `sql` with `params`, each mapped by `map` on the reading
    /// thread.
    pub async fn rows<T: Send + 'static>(
        &self,
        sql: String,
        params: Vec<ReadParam>,
        map: impl Fn(&ReaderRow<'_, '_>) -> T + Send + 'static,
    ) -> Result<Vec<T>> {
        let _permit = self
            .inner
            .reads
            .acquire()
            .await
            .map_err(|_| internal("the journal reader is closed"))?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.read(&sql, &params, map))
            .await
            .map_err(|join| internal(format!("a journal read failed: {join}")))?
    }

    /// Closes the idle connections (at shutdown, before the store's last
    /// connection closes, so that it can fold the write-ahead log back).
    pub fn close(&self) {
        self.inner.reads.close();
        self.inner.idle().clear();
    }
}

impl Inner {
    fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read<T>(
        &self,
        sql: &str,
        params: &[ReadParam],
        map: impl Fn(&ReaderRow<'_, '_>) -> T,
    ) -> Result<Vec<T>> {
        let popped = self.idle().pop();
        let connection = match popped {
            Some(connection) => connection,
            None => open(&self.path)
                .map_err(|err| internal(format!("opening a journal reader: {err}")))?,
        };
        let rows = query(&connection, sql, params, map);
        // A connection whose read failed is still sound (the failure was the
        // statement's); it goes back for the next read, unless the reader
        // closed meanwhile.
        if !self.reads.is_closed() {
            self.idle().push(connection);
        }
        rows.map_err(|err| internal(format!("a journal read failed: {err}")))
    }
}

pub(super) fn query<T>(
    connection: &Connection,
    sql: &str,
    params: &[ReadParam],
    map: impl Fn(&ReaderRow<'_, '_>) -> T,
) -> rusqlite::Result<Vec<T>> {
    let mut statement = connection.prepare_cached(sql)?;
    // Row mappers read by column name; rusqlite finds a name by asking
    // SQLite for every column's (a quarter of a page's time, measured), so
    // the names are read once per statement.
    let columns = Columns::of(&statement);
    let values = params.iter().map(|param| match param {
        ReadParam::Text(text) => SqlValue::Text(text.clone()),
        ReadParam::Int(n) => SqlValue::Integer(*n),
    });
    let rows = statement.query_map(rusqlite::params_from_iter(values), |row| {
        Ok(map(&ReaderRow {
            row,
            columns: &columns,
            next: Cell::new(0),
        }))
    })?;
    rows.collect()
}

/// A statement's column names, in order.
struct Columns(Vec<String>);

impl Columns {
    fn of(statement: &rusqlite::Statement<'_>) -> Self {
        Self(
            statement
                .column_names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        )
    }
}

/// A row of a journal read, read by column name through the statement's
/// index of names.
pub(crate) struct ReaderRow<'a, 'stmt> {
    row: &'a Row<'stmt>,
    columns: &'a Columns,
    /// The column after the last one read: mappers read mostly in the
    /// statement's order, so one comparison usually finds the next name (a
    /// hash of every name was 4 % of a 200-row page, measured); a miss scans
    /// the few names, still without rusqlite's per-column FFI calls.
    next: Cell<usize>,
}

impl ReaderRow<'_, '_> {
    fn position(&self, column: &str) -> usize {
        let names = &self.columns.0;
        let guess = self.next.get();
        let index = if names.get(guess).is_some_and(|name| name == column) {
            guess
        } else {
            names
                .iter()
                .position(|name| name == column)
                .unwrap_or_else(|| panic!("a journal read has no column {column:?}"))
        };
        self.next.set(index + 1);
        index
    }
}

impl ReaderRow<'_, '_> {
    /// The first column (a scalar query's answer).
    pub fn first<T: rusqlite::types::FromSql>(&self) -> rusqlite::Result<T> {
        self.row.get(0)
    }
}

impl super::backend::Record for ReaderRow<'_, '_> {
    fn get<T: super::backend::Value>(&self, column: &str) -> T {
        let index = self.position(column);
        self.row
            .get(index)
            .unwrap_or_else(|err| panic!("column {column:?} of a journal read: {err}"))
    }

    fn text_opt(&self, column: &str) -> Option<&str> {
        let index = self.position(column);
        self.row
            .get_ref(index)
            .and_then(|value| Ok(value.as_str_or_null()?))
            .unwrap_or_else(|err| panic!("column {column:?} of a journal read: {err}"))
    }
}

fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    connection.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
    connection.set_prepared_statement_cache_capacity(PREPARED_STATEMENTS);
    connection.pragma_update(None, "cache_size", -CACHE_KIB)?;
    Ok(connection)
}

fn internal(message: impl Into<String>) -> Error {
    Error::Internal(anyhow::anyhow!(message.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::backend::Record;

    fn read_out_of_order(row: &ReaderRow<'_, '_>) -> Vec<i64> {
        // In order, then back, then the same column twice, then past the end.
        ["a", "b", "c", "a", "c", "c", "b"]
            .iter()
            .map(|column| row.get::<i64>(column))
            .collect()
    }

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        let connection = Connection::open_in_memory().expect("in-memory database");
        let rows = query(
            &connection,
            "SELECT 1 AS a, 2 AS b, 3 AS c UNION ALL SELECT 10, 20, 30",
            &[],
            read_out_of_order,
        )
        .expect("the query runs");
        assert_eq!(
            rows,
            vec![vec![1, 2, 3, 1, 3, 3, 2], vec![10, 20, 30, 10, 30, 30, 20]]
        );
    }
}
