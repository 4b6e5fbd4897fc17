//! Taking a connection from the pool, timed: every statement of the store
//! gets its connection here, so how long callers waited for one is the
//! `toolgate_db_pool_acquire_duration_seconds` histogram (the pool gauges
//! only say how many connections are open and idle at scrape time).

use std::time::Instant;

use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqlitePool;

use super::Store;

/// A connection from `pool`, its wait recorded (also when it failed: a
/// timed-out wait is the one an operator most needs to see).
pub(super) async fn acquire(pool: &SqlitePool) -> Result<PoolConnection<Sqlite>, sqlx::Error> {
    let started = Instant::now();
    let connection = pool.acquire().await;
    crate::metrics::metrics().record_pool_wait(started.elapsed());
    connection
}

impl Store {
    /// A connection for one statement or transaction; dropping it gives it back.
    pub(super) async fn conn(&self) -> Result<PoolConnection<Sqlite>, sqlx::Error> {
        acquire(&self.pool).await
    }
}
