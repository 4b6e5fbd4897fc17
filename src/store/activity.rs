//! The console's activity figures: the account's calls since a moment, only
//! the three columns the charts need, bounded.

use super::Store;
use super::backend::{Record, sql};
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
        Ok(sql!(self.conn().await?, c => query(
            "SELECT provider_id, started_at, duration_ms FROM tool_execution_record \
             WHERE account_id = ? AND started_at >= ? ORDER BY started_at DESC LIMIT ?",
        )
        .bind(account_id)
        .bind(since_ms)
        .bind(MAX_ACTIVITY_SAMPLES)
        .fetch_all(c)
        .await?
        .iter()
        .map(|row| {
            (
                row.get::<String>("provider_id"),
                row.get::<i64>("started_at"),
                row.get::<i64>("duration_ms"),
            )
        })
        .collect::<Vec<_>>()))
    }
}
