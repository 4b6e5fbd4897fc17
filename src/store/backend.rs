//! The two database backends behind one set of statements.
//!
//! Every statement of the store is written once, in SQLite's dialect with `?`
//! placeholders, inside [`sql!`]: the macro expands its body once per backend,
//! so each expansion is checked by the compiler against that backend's own
//! driver (no `Any` driver, which copies every row and cannot decode SQLite's
//! integer booleans). In the PostgreSQL expansion the statement text goes
//! through [`postgres::query`], which numbers the placeholders the way SQLite
//! does. Where the dialects disagree (full-text search, JSON functions, the
//! schema catalogue) the body asks [`POSTGRES`](sqlite::POSTGRES).
//!
//! Write transactions are serialised on both backends: SQLite by `BEGIN
//! IMMEDIATE` (its one write lock), PostgreSQL by one transaction-scoped
//! advisory lock taken first, so every check-and-write the store does under a
//! write transaction stays atomic across all instances sharing the database.

use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Decode, Postgres, SqlStr, Sqlite, Transaction, Type};

/// The advisory lock every PostgreSQL write transaction takes first (any
/// constant: toolgate's tables are the only ones it guards).
pub(crate) const WRITE_LOCK_KEY: i64 = 0x746f_6f6c_6761_7465; // "toolgate"

/// Which backend a database is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The name reports and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// A connection pool on either backend; cheap to clone.
#[derive(Debug, Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A connection taken from a [`Pool`]; dropping it gives it back.
pub(crate) enum Conn {
    Sqlite(PoolConnection<Sqlite>),
    Postgres(PoolConnection<Postgres>),
}

/// An open transaction; dropping it without [`commit`](Tx::commit) rolls it back.
pub(crate) enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// A borrowed connection of either backend: what [`sql!`] runs statements on.
pub(crate) enum Handle<'c> {
    Sqlite(&'c mut SqliteConnection),
    Postgres(&'c mut PgConnection),
}

/// Anything statements can run on: a pooled connection, a transaction, a handle.
pub(crate) trait AsHandle {
    fn handle(&mut self) -> Handle<'_>;
}

impl AsHandle for Conn {
    fn handle(&mut self) -> Handle<'_> {
        match self {
            Conn::Sqlite(c) => Handle::Sqlite(c),
            Conn::Postgres(c) => Handle::Postgres(c),
        }
    }
}

impl AsHandle for Tx {
    fn handle(&mut self) -> Handle<'_> {
        match self {
            Tx::Sqlite(c) => Handle::Sqlite(c),
            Tx::Postgres(c) => Handle::Postgres(c),
        }
    }
}

impl AsHandle for Handle<'_> {
    fn handle(&mut self) -> Handle<'_> {
        match self {
            Handle::Sqlite(c) => Handle::Sqlite(c),
            Handle::Postgres(c) => Handle::Postgres(c),
        }
    }
}

impl<T: AsHandle + ?Sized> AsHandle for &mut T {
    fn handle(&mut self) -> Handle<'_> {
        (**self).handle()
    }
}

impl Pool {
    /// Which backend this pool is on.
    pub(crate) fn backend(&self) -> Backend {
        match self {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// A connection, the wait recorded (also when it failed: a timed-out wait
    /// is the one an operator most needs to see) as
    /// `toolgate_db_pool_acquire_duration_seconds`.
    pub(crate) async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        let started = Instant::now();
        let connection = match self {
            Pool::Sqlite(pool) => pool.acquire().await.map(Conn::Sqlite),
            Pool::Postgres(pool) => pool.acquire().await.map(Conn::Postgres),
        };
        crate::metrics::metrics().record_pool_wait(started.elapsed());
        connection
    }

    /// A write transaction: serialised with every other write transaction on
    /// the database, whichever instance runs it.
    pub(crate) async fn begin_write(&self) -> Result<Tx, sqlx::Error> {
        match self.acquire().await? {
            Conn::Sqlite(conn) => Ok(Tx::Sqlite(
                Transaction::begin(conn, Some(SqlStr::from_static("BEGIN IMMEDIATE"))).await?,
            )),
            Conn::Postgres(conn) => {
                let mut tx = Transaction::begin(conn, None).await?;
                take_write_lock(&mut tx).await?;
                Ok(Tx::Postgres(tx))
            }
        }
    }

    /// Closes every connection.
    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(pool) => pool.close().await,
            Pool::Postgres(pool) => pool.close().await,
        }
    }

    /// Connections open and idle now.
    pub(crate) fn sizes(&self) -> (u32, usize) {
        match self {
            Pool::Sqlite(pool) => (pool.size(), pool.num_idle()),
            Pool::Postgres(pool) => (pool.size(), pool.num_idle()),
        }
    }
}

/// Takes the write lock inside the PostgreSQL transaction open on `conn`; it
/// is released at its commit or rollback.
pub(crate) async fn take_write_lock(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(WRITE_LOCK_KEY)
        .execute(conn)
        .await
        .map(drop)
}

impl Tx {
    /// Commits the transaction.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await,
            Tx::Postgres(tx) => tx.commit().await,
        }
    }
}

/// Runs `$body` on the connection `$conn` (anything [`AsHandle`]), with `$c`
/// bound to the backend's own connection type. The body is expanded once per
/// backend with that backend's `query`, `query_as`, `query_scalar` and
/// `POSTGRES` in scope, so it must produce the same type in both.
macro_rules! sql {
    ($conn:expr, $c:ident => $body:expr) => {{
        match $crate::store::backend::AsHandle::handle(&mut $conn) {
            $crate::store::backend::Handle::Sqlite($c) => {
                #[allow(unused_imports)]
                use $crate::store::backend::sqlite::*;
                $body
            }
            $crate::store::backend::Handle::Postgres($c) => {
                #[allow(unused_imports)]
                use $crate::store::backend::postgres::*;
                $body
            }
        }
    }};
}
pub(crate) use sql;

/// A column type both drivers decode (and rusqlite, which the journal's
/// reads on SQLite use: `store/journal_reader.rs`, whose rows are records too).
pub(crate) trait Value:
    for<'r> Decode<'r, Sqlite>
    + Type<Sqlite>
    + for<'r> Decode<'r, Postgres>
    + Type<Postgres>
    + rusqlite::types::FromSql
{
}

impl<T> Value for T where
    T: for<'r> Decode<'r, Sqlite>
        + Type<Sqlite>
        + for<'r> Decode<'r, Postgres>
        + Type<Postgres>
        + rusqlite::types::FromSql
{
}

/// A result row of either backend, read by column name; row mappers take
/// `&impl Record` so one mapper serves both.
///
/// Column names are part of their statements, never input: `'static`,
/// which lets the journal reader recognise a name by its address.
pub(crate) trait Record {
    /// The column's value; panics when the column is missing or of another
    /// type (a mistake in the statement, not in the data).
    fn get<T: Value>(&self, column: &'static str) -> T;

    /// A text column borrowed from the row, without a copy; None for NULL.
    /// Panics as [`Record::get`] does.
    fn text_opt(&self, column: &'static str) -> Option<&str>;

    /// A text column that is never NULL, borrowed.
    fn text(&self, column: &'static str) -> &str {
        self.text_opt(column)
            .unwrap_or_else(|| panic!("column {column:?} is NULL"))
    }
}

impl Record for SqliteRow {
    fn get<T: Value>(&self, column: &'static str) -> T {
        sqlx::Row::get(self, column)
    }

    fn text_opt(&self, column: &'static str) -> Option<&str> {
        sqlx::Row::get(self, column)
    }
}

impl Record for PgRow {
    fn get<T: Value>(&self, column: &'static str) -> T {
        sqlx::Row::get(self, column)
    }

    fn text_opt(&self, column: &'static str) -> Option<&str> {
        sqlx::Row::get(self, column)
    }
}

/// What SQLite expansions of [`sql!`] see.
pub(crate) mod sqlite {
    use sqlx::sqlite::{SqliteArguments, SqliteRow};
    use sqlx::{FromRow, SqlSafeStr, Sqlite};

    /// False: this is SQLite.
    pub(crate) const POSTGRES: bool = false;

    pub(crate) fn query<'q>(
        sql: impl SqlSafeStr,
    ) -> sqlx::query::Query<'q, Sqlite, SqliteArguments> {
        sqlx::query(sql)
    }

    pub(crate) fn query_as<'q, O>(
        sql: impl SqlSafeStr,
    ) -> sqlx::query::QueryAs<'q, Sqlite, O, SqliteArguments>
    where
        O: for<'r> FromRow<'r, SqliteRow>,
    {
        sqlx::query_as(sql)
    }

    pub(crate) fn query_scalar<'q, O>(
        sql: impl SqlSafeStr,
    ) -> sqlx::query::QueryScalar<'q, Sqlite, O, SqliteArguments>
    where
        (O,): for<'r> FromRow<'r, SqliteRow>,
    {
        sqlx::query_scalar(sql)
    }
}

/// What PostgreSQL expansions of [`sql!`] see: the same functions, taking
/// SQLite-style statements.
pub(crate) mod postgres {
    use sqlx::postgres::{PgArguments, PgRow};
    use sqlx::{AssertSqlSafe, FromRow, Postgres, SqlSafeStr};

    /// True: this is PostgreSQL.
    pub(crate) const POSTGRES: bool = true;

    pub(crate) fn query<'q>(sql: impl SqlSafeStr) -> sqlx::query::Query<'q, Postgres, PgArguments> {
        sqlx::query(AssertSqlSafe(super::numbered(sql.into_sql_str().as_str())))
    }

    pub(crate) fn query_as<'q, O>(
        sql: impl SqlSafeStr,
    ) -> sqlx::query::QueryAs<'q, Postgres, O, PgArguments>
    where
        O: for<'r> FromRow<'r, PgRow>,
    {
        sqlx::query_as(AssertSqlSafe(super::numbered(sql.into_sql_str().as_str())))
    }

    pub(crate) fn query_scalar<'q, O>(
        sql: impl SqlSafeStr,
    ) -> sqlx::query::QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(AssertSqlSafe(super::numbered(sql.into_sql_str().as_str())))
    }
}

/// `text` as both backends store it: PostgreSQL cannot hold U+0000 in text,
/// so a NUL in what a provider answered (an error message) becomes U+FFFD on
/// either backend. Request strings with NUL are refused before they get here.
pub(crate) use crate::text::without_nul as storable_text;

/// `sql` with SQLite's placeholders written as PostgreSQL's: `?NNN` becomes
/// `$NNN` and a bare `?` takes the number after the largest used so far
/// (SQLite's own rule), so a statement binds the same values on both.
/// String literals and quoted names are left alone.
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut largest = 0u32;
    let mut chars = sql.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(ch) = chars.next() {
        if let Some(open) = quote {
            out.push(ch);
            if ch == open {
                quote = None;
            }
            continue;
        }
        match ch {
            '\'' | '"' => {
                quote = Some(ch);
                out.push(ch);
            }
            '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                let number = match digits.parse::<u32>() {
                    Ok(n) => n,
                    Err(_) => largest + 1,
                };
                largest = largest.max(number);
                out.push('$');
                out.push_str(&number.to_string());
            }
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn placeholders_are_numbered_like_sqlite_numbers_them() {
        assert_eq!(numbered("a = ? AND b = ?"), "a = $1 AND b = $2");
        assert_eq!(numbered("a = ?2 OR b = ?1"), "a = $2 OR b = $1");
        assert_eq!(numbered("a = ?3 AND b = ?"), "a = $3 AND b = $4");
        assert_eq!(numbered("x = '?' AND y = ?"), "x = '?' AND y = $1");
        assert_eq!(numbered("\"we?ird\" = ?"), "\"we?ird\" = $1");
        assert_eq!(numbered("a LIKE ? ESCAPE '\\'"), "a LIKE $1 ESCAPE '\\'");
    }
}
