//! The per-floor budget of tool calls (`max_calls_per_turn`).

use super::Store;
use crate::error::Result;

impl Store {
    /// Reserves one call on `floor_id` if fewer than `limit` were reserved before.
    /// The check and the increment are one statement, so parallel calls cannot both
    /// take the last slot, and the count survives restarts.
    pub async fn reserve_floor_call(&self, floor_id: &str, limit: u32) -> Result<bool> {
        if limit == 0 {
            return Ok(false);
        }
        let _turn = self.write_turn().await;
        let reserved = sqlx::query(
            "INSERT INTO floor_tool_call_counts (floor_id, calls) VALUES (?, 1) \
             ON CONFLICT (floor_id) DO UPDATE SET calls = calls + 1 WHERE calls < ?",
        )
        .bind(floor_id)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(reserved > 0)
    }
}
