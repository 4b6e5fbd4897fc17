//! The console's activity figures: the account's calls since a moment, only
//! the three columns the charts need, bounded.

use super::Store;
use super::backend::{Record, sql};
use super::journal_reader::ReadParam;
use crate::error::Result;

/// Most calls one activity read returns (the newest are kept).
pub const MAX_ACTIVITY_SAMPLES: i64 = 200_000;

impl Store {
    /// (provider_id, started_at, duration_ms) of the account's calls started
    /// at or after `since_ms`, newest first, at most `MAX_ACTIVITY_SAMPLES`.
    pub async fn activity_samples(
        &self,
        account_id: &str,
        since_ms: i64,
    ) -> Result<Vec<(String, i64, i64)>> {
        self.settle_journal().await?;
        let sql = "SELECT provider_id, started_at, duration_ms FROM tool_execution_record \
             WHERE account_id = ? AND started_at >= ? ORDER BY started_at DESC LIMIT ?";
        // On an SQLite file the rows are read on a journal reader's thread,
        // each kept as its three values only: through the pool each row was
        // a driver row with a copy of every value, and a busy hour's 200,000
        // took the server from 70 to over 280 MB resident, which it kept
        // (BENCHMARKS.md, `server_idle_rss_mb`).
        if let Some(reader) = &self.journal_reader {
            let binds = vec![
                ReadParam::Text(account_id.to_owned()),
                ReadParam::Int(since_ms),
                ReadParam::Int(MAX_ACTIVITY_SAMPLES),
            ];
            return reader
                .rows(sql.to_owned(), binds, |row| sample_of(row))
                .await;
        }
        Ok(sql!(self.conn().await?, c => query(sql)
            .bind(account_id)
            .bind(since_ms)
            .bind(MAX_ACTIVITY_SAMPLES)
            .fetch_all(c)
            .await?
            .iter()
            .map(sample_of)
            .collect::<Vec<_>>()))
    }
}

/// A call's (provider_id, started_at, duration_ms).
fn sample_of(row: &impl Record) -> (String, i64, i64) {
    (
        row.get::<String>("provider_id"),
        row.get::<i64>("started_at"),
        row.get::<i64>("duration_ms"),
    )
}
