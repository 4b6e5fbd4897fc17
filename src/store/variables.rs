//! Session variables: named JSON values a session's tools read and write.

use super::run_effects::{Kind, STAGED_BY_OTHER_OPEN_RUNS};
use serde_json::Value;

use super::Store;
use super::backend::sql;
use super::state_names::check_state_name;
use crate::error::{Error, Result};
use crate::ids::now_ms;

/// Longest variable name, in characters.
pub const MAX_VARIABLE_NAME_CHARS: usize = 64;
/// Largest serialized variable value, in bytes.
pub const MAX_VARIABLE_VALUE_BYTES: usize = 16 * 1024;
/// Most variables one session may hold.
pub const MAX_VARIABLES_PER_SESSION: i64 = 256;

impl Store {
    /// The value of a session variable, if it is set.
    pub async fn variable(&self, session_id: &str, name: &str) -> Result<Option<Value>> {
        check_state_name("variable", name, MAX_VARIABLE_NAME_CHARS)?;
        let raw = sql!(self.conn().await?, c => query_scalar::<String>(
            "SELECT value_json FROM session_variables WHERE session_id = ? AND name = ?",
        )
        .bind(session_id)
        .bind(name)
        .fetch_optional(c)
        .await?);
        raw.map(|raw| decode_variable(name, &raw)).transpose()
    }

    /// Creates or replaces a session variable.
    pub async fn set_variable(&self, session_id: &str, name: &str, value: &Value) -> Result<()> {
        let serialized = checked_variable(name, value)?;
        let now = now_ms();
        // One statement checks the per-session count and writes, under the
        // write lock: concurrent writers cannot overshoot the limit (SQLite
        // serializes writes anyway; PostgreSQL would run two counts side by side).
        // The names the session's open runs set count too: they may commit.
        let sql = format!(
            "WITH held AS ( \
                 SELECT name FROM session_variables WHERE session_id = ?2 \
                 UNION {STAGED_BY_OTHER_OPEN_RUNS} \
             ) \
             INSERT INTO session_variables (session_id, name, value_json, created_at, updated_at) \
             SELECT ?2, ?4, ?5, ?6, ?6 \
             WHERE (SELECT COUNT(*) FROM held) < ?7 OR ?4 IN (SELECT name FROM held) \
             ON CONFLICT (session_id, name) DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at"
        );
        let mut tx = self.begin_write().await?;
        let written = sql!(tx, c => query(sqlx::AssertSqlSafe(sql))
        .bind("")
        .bind(session_id)
        .bind(Kind::Variable.as_str())
        .bind(name)
        .bind(&serialized)
        .bind(now)
        .bind(MAX_VARIABLES_PER_SESSION)
        .execute(c)
        .await?
        .rows_affected());
        tx.commit().await?;
        if written == 0 {
            return Err(too_many_variables());
        }
        Ok(())
    }
}

/// Checks a variable write (name and size) and answers the value as stored.
/// Direct and buffered (per-run) writes share it, so a buffered write that was
/// accepted can always be applied.
pub(crate) fn checked_variable(name: &str, value: &Value) -> Result<String> {
    check_state_name("variable", name, MAX_VARIABLE_NAME_CHARS)?;
    let serialized = value.to_string();
    if serialized.len() > MAX_VARIABLE_VALUE_BYTES {
        return Err(Error::validation(format!(
            "variable value must be at most {MAX_VARIABLE_VALUE_BYTES} bytes as JSON, got {}",
            serialized.len()
        )));
    }
    Ok(serialized)
}

/// The refusal of a write that would create one variable too many.
pub(crate) fn too_many_variables() -> Error {
    Error::validation(format!(
        "the session already holds the maximum of {MAX_VARIABLES_PER_SESSION} variables"
    ))
}

/// A stored variable value, parsed.
pub(crate) fn decode_variable(name: &str, raw: &str) -> Result<Value> {
    serde_json::from_str(raw).map_err(|err| {
        Error::Internal(anyhow::anyhow!(
            "stored variable {name:?} is not JSON: {err}"
        ))
    })
}
