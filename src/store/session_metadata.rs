//! Read-modify-write of one key of a session's `metadata_json`.

use serde_json::Value;

use super::Store;
use super::backend::sql;
use crate::error::{Error, Result};
use crate::ids::now_ms;

impl Store {
    /// Replaces `metadata_json.<key>` of the account's session with what `update`
    /// computes from the current metadata, and returns that value. The transaction
    /// takes the write lock before reading (`begin_write`), so two concurrent
    /// updates (say, two PATCHes merging different slot lists) cannot lose one
    /// another's change.
    pub async fn update_session_metadata_key(
        &self,
        account_id: &str,
        session_id: &str,
        key: &'static str,
        update: impl FnOnce(&Value) -> Result<Value>,
    ) -> Result<Value> {
        let mut tx = self.begin_write().await?;
        let raw = sql!(tx, c => query_scalar::<String>(
            "SELECT metadata_json FROM sessions WHERE id = ? AND account_id = ?",
        )
        .bind(session_id)
        .bind(account_id)
        .fetch_optional(c)
        .await?);
        let raw = raw.ok_or_else(|| Error::not_found(format!("session {session_id:?}")))?;
        let metadata: Value = serde_json::from_str(&raw).unwrap_or_else(|_| serde_json::json!({}));
        let value = update(&metadata)?;
        sql!(tx, c => {
            // The same path both ways: SQLite's `$.a.b` is PostgreSQL's `{a,b}`,
            // which string_to_array makes of `a.b` with no array-literal quoting.
            let (statement, path) = if POSTGRES {
                (
                    "UPDATE sessions SET metadata_json = \
                     jsonb_set(metadata_json::jsonb, string_to_array(?, '.'), ?::jsonb)::text, \
                     updated_at = ? WHERE id = ?",
                    key.to_owned(),
                )
            } else {
                (
                    "UPDATE sessions SET metadata_json = json_set(metadata_json, ?, json(?)), updated_at = ? WHERE id = ?",
                    format!("$.{key}"),
                )
            };
            query(statement)
                .bind(path)
                .bind(value.to_string())
                .bind(now_ms())
                .bind(session_id)
                .execute(c)
                .await
                .map(|_| ())
        })?;
        tx.commit().await?;
        // After the commit, so no reader can cache the value it replaced.
        self.sessions_changed().await;
        Ok(value)
    }
}
