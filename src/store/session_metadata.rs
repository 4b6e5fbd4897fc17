//! Read-modify-write of one key of a session's `metadata_json`.

use serde_json::Value;
use sqlx::Connection;

use super::Store;
use crate::error::{Error, Result};
use crate::ids::now_ms;

impl Store {
    /// Replaces `metadata_json.<key>` of the account's session with what `update`
    /// computes from the current metadata, and returns that value. The transaction
    /// takes the write lock before reading (`BEGIN IMMEDIATE`), so two concurrent
    /// updates (say, two PATCHes merging different slot lists) cannot lose one
    /// another's change.
    pub async fn update_session_metadata_key(
        &self,
        account_id: &str,
        session_id: &str,
        key: &'static str,
        update: impl FnOnce(&Value) -> Result<Value>,
    ) -> Result<Value> {
        let mut conn = self.conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let raw: Option<String> = sqlx::query_scalar(
            "SELECT metadata_json FROM sessions WHERE id = ? AND account_id = ?",
        )
        .bind(session_id)
        .bind(account_id)
        .fetch_optional(&mut *tx)
        .await?;
        let raw = raw.ok_or_else(|| Error::not_found(format!("session {session_id:?}")))?;
        let metadata: Value = serde_json::from_str(&raw).unwrap_or_else(|_| serde_json::json!({}));
        let value = update(&metadata)?;
        sqlx::query(
            "UPDATE sessions SET metadata_json = json_set(metadata_json, ?, json(?)), updated_at = ? WHERE id = ?",
        )
        .bind(format!("$.{key}"))
        .bind(value.to_string())
        .bind(now_ms())
        .bind(session_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        // After the commit, so no reader can cache the value it replaced.
        self.sessions_changed();
        Ok(value)
    }
}
