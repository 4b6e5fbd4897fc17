//! Journal reads on an SQLite file, on connections of their own. sqlx's
//! SQLite driver hands every row from its worker thread to the caller over a
//! channel, a wake-up per row, and a journal page is up to 500 full rows; here
//! a read runs whole on the blocking pool with a prepared statement, and only
//! the finished page crosses threads (BENCHMARKS.md, issue 20). PostgreSQL and
//! in-memory SQLite read through the pool.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::config::DbConfig;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OpenFlags, Row};
use tokio::sync::Semaphore;

use super::rendered_rows::{KEPT_BYTES, RenderedRows};
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
    /// Journal rows written as JSON by earlier reads.
    rendered: Arc<RenderedRows>,
}

impl JournalReader {
    pub fn new(path: PathBuf) -> Self {
        Self {
            inner: Arc::new(Inner {
                path,
                idle: Mutex::new(Vec::new()),
                reads: Semaphore::new(MAX_READS),
                rendered: Arc::new(RenderedRows::new(KEPT_BYTES)),
            }),
        }
    }

    /// The journal rows this reader's pages wrote as JSON, for the next.
    pub fn rendered_rows(&self) -> Arc<RenderedRows> {
        self.inner.rendered.clone()
    }

    /// Every row of `sql` with `params`, each mapped by `map` on the reading
    /// thread.
    pub async fn rows<T: Send + 'static>(
        &self,
        sql: String,
        params: Vec<ReadParam>,
        map: impl Fn(&ReaderRow<'_, '_>) -> T + Send + 'static,
    ) -> Result<Vec<T>> {
        let (rows, _) = self.rows_within(sql, params, map, |_: &T| 0).await?;
        Ok(rows)
    }

    /// The rows of `sql` with `params`, each mapped by `map` on the reading
    /// thread, up to a page's byte bound with each row's size told by `size`
    /// (`page_bytes::take_within`); and whether rows were left there.
    pub async fn rows_within<T: Send + 'static>(
        &self,
        sql: String,
        params: Vec<ReadParam>,
        map: impl Fn(&ReaderRow<'_, '_>) -> T + Send + 'static,
        size: impl Fn(&T) -> usize + Send + 'static,
    ) -> Result<(Vec<T>, bool)> {
        let _permit = self
            .inner
            .reads
            .acquire()
            .await
            .map_err(|_| internal("the journal reader is closed"))?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.read(&sql, &params, map, size))
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
        size: impl Fn(&T) -> usize,
    ) -> Result<(Vec<T>, bool)> {
        let popped = self.idle().pop();
        let connection = match popped {
            Some(connection) => connection,
            None => open(&self.path)
                .map_err(|err| internal(format!("opening a journal reader: {err}")))?,
        };
        let rows = query_within(&connection, sql, params, map, size);
        // A connection whose read failed is still sound (the failure was the
        // statement's); it goes back for the next read, unless the reader
        // closed meanwhile.
        if !self.reads.is_closed() {
            self.idle().push(connection);
        }
        rows.map_err(|err| internal(format!("a journal read failed: {err}")))
    }
}

/// Every row of `sql` (the tests' reads of a connection of their own).
#[cfg(test)]
pub(super) fn query<T>(
    connection: &Connection,
    sql: &str,
    params: &[ReadParam],
    map: impl Fn(&ReaderRow<'_, '_>) -> T,
) -> rusqlite::Result<Vec<T>> {
    let (rows, _) = query_within(connection, sql, params, map, |_: &T| 0)?;
    Ok(rows)
}

/// The rows of `sql` up to a page's byte bound, each row's size told by
/// `size`; and whether rows were left there (never stepped to).
fn query_within<T>(
    connection: &Connection,
    sql: &str,
    params: &[ReadParam],
    map: impl Fn(&ReaderRow<'_, '_>) -> T,
    size: impl Fn(&T) -> usize,
) -> rusqlite::Result<(Vec<T>, bool)> {
    let mut statement = connection.prepare_cached(sql)?;
    // Row mappers read by column name; rusqlite finds a name by asking
    // SQLite for every column's (a quarter of a page's time, measured), so
    // the names are read once per statement.
    let columns = Columns::of(&statement);
    let order = ReadOrder::default();
    let values = params.iter().map(|param| match param {
        ReadParam::Text(text) => SqlValue::Text(text.clone()),
        ReadParam::Int(n) => SqlValue::Integer(*n),
    });
    let rows = statement.query_map(rusqlite::params_from_iter(values), |row| {
        Ok(map(&ReaderRow {
            row,
            columns: &columns,
            order: &order,
            reads: Cell::new(0),
        }))
    })?;
    super::page_bytes::take_within_blocking(rows, |row| {
        let bytes = size(&row);
        (row, bytes)
    })
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

/// The column each read of the last row went to, in the order of the reads:
/// a mapper reads every row alike, so the n-th read of the next row is
/// usually the same name, passed as the same `'static` text, and its column
/// is known from the text's address without comparing names (which, with
/// SQLite's per-column calls, was most of a page's column lookups, measured).
#[derive(Default)]
struct ReadOrder(RefCell<Vec<(&'static str, usize)>>);

impl ReadOrder {
    /// The column of the `read`-th read of the last row, when it was `column`.
    fn known(&self, read: usize, column: &'static str) -> Option<usize> {
        let order = self.0.borrow();
        // Same address and length: the same static text, so the same name.
        let &(name, index) = order.get(read)?;
        std::ptr::eq(name, column).then_some(index)
    }

    fn remember(&self, read: usize, column: &'static str, index: usize) {
        let mut order = self.0.borrow_mut();
        if read < order.len() {
            order[read] = (column, index);
        } else if read == order.len() {
            order.push((column, index));
        }
    }
}

/// A row of a journal read, read by column name through the statement's
/// names.
pub(crate) struct ReaderRow<'a, 'stmt> {
    row: &'a Row<'stmt>,
    columns: &'a Columns,
    order: &'a ReadOrder,
    /// How many columns of this row were read so far.
    reads: Cell<usize>,
}

impl ReaderRow<'_, '_> {
    fn position(&self, column: &'static str) -> usize {
        let read = self.reads.get();
        self.reads.set(read + 1);
        if let Some(index) = self.order.known(read, column) {
            return index;
        }
        // The first row of a statement, or a read that differs from the last
        // row's: the few names are compared.
        let index = self
            .columns
            .0
            .iter()
            .position(|name| name == column)
            .unwrap_or_else(|| panic!("a journal read has no column {column:?}"));
        self.order.remember(read, column, index);
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
    fn get<T: super::backend::Value>(&self, column: &'static str) -> T {
        let index = self.position(column);
        self.row
            .get(index)
            .unwrap_or_else(|err| panic!("column {column:?} of a journal read: {err}"))
    }

    fn text_opt(&self, column: &'static str) -> Option<&str> {
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
    // The journal's reads filter by equality and follow an index's order, so
    // their plans never depend on the values bound. Without the planner's
    // stability guarantee SQLite reads a bound LIMIT while planning and then
    // prepares the statement again at every execution: 0.37 M of the 0.65 M
    // instructions of a small page (BENCHMARKS.md, issue 20, tenth pass).
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
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

    /// Reads in an order that depends on the row, with names that are the
    /// same text at other addresses, so that the order remembered from one
    /// row is wrong for the next.
    fn read_by_row(row: &ReaderRow<'_, '_>) -> Vec<i64> {
        let a_again: &'static str = String::from("a").leak();
        let first = row.get::<i64>("a");
        let order: &[&'static str] = match first {
            1 => &["b", "c", "a"],
            10 => &["c", "b", a_again],
            _ => &["a", "a", "c", "b"],
        };
        std::iter::once(first)
            .chain(order.iter().map(|column| row.get::<i64>(column)))
            .collect()
    }

    #[test]
    fn columns_are_found_when_rows_are_read_differently() {
        let connection = Connection::open_in_memory().expect("in-memory database");
        let rows = query(
            &connection,
            "SELECT 1 AS a, 2 AS b, 3 AS c UNION ALL SELECT 10, 20, 30 \
             UNION ALL SELECT 100, 200, 300 UNION ALL SELECT 1, 2, 3",
            &[],
            read_by_row,
        )
        .expect("the query runs");
        assert_eq!(
            rows,
            vec![
                vec![1, 2, 3, 1],
                vec![10, 30, 20, 10],
                vec![100, 100, 100, 300, 200],
                vec![1, 2, 3, 1],
            ]
        );
    }

    #[test]
    fn a_cached_read_is_not_prepared_again_for_new_values() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("journal.db");
        Connection::open(&path)
            .and_then(|db| {
                db.execute_batch(
                    "CREATE TABLE t (a INTEGER, b TEXT); CREATE INDEX t_a ON t (a, b); \
                     INSERT INTO t VALUES (1, 'x'), (1, 'y'), (2, 'z');",
                )
            })
            .expect("a database");
        let connection = open(&path).expect("a reader");
        let sql = "SELECT b FROM t WHERE a = ? ORDER BY b LIMIT ? OFFSET ?";
        let read = |a: i64, limit: i64, offset: i64| {
            let params = [
                ReadParam::Int(a),
                ReadParam::Int(limit),
                ReadParam::Int(offset),
            ];
            query(&connection, sql, &params, |row| {
                row.first::<String>().expect("b")
            })
            .expect("the read runs")
        };
        assert_eq!(read(1, 10, 0), ["x", "y"]);
        assert_eq!(read(1, 1, 1), ["y"]);
        assert_eq!(read(2, 5, 0), ["z"]);
        let reprepared = connection
            .prepare_cached(sql)
            .expect("still cached")
            .get_status(rusqlite::StatementStatus::RePrepare);
        assert_eq!(reprepared, 0, "the read was prepared again for new values");
    }
}
