//! Session resources: named text or JSON documents a session's tools manage.

use super::run_effects::{Kind, STAGED_BY_OTHER_OPEN_RUNS};
use serde_json::Value;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
use super::state_names::check_state_name;
use crate::error::{Error, Result};
use crate::ids::now_ms;

/// Longest resource name, in characters.
pub const MAX_RESOURCE_NAME_CHARS: usize = 128;
/// Largest resource content, in bytes (JSON resources: serialized).
pub const MAX_RESOURCE_BYTES: usize = 64 * 1024;
/// Most resources one session may hold.
pub const MAX_RESOURCES_PER_SESSION: i64 = 100;

/// The content of a resource: plain text or a JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum ResourceContent {
    Text(String),
    Json(Value),
}

impl ResourceContent {
    /// `text` or `json`.
    pub fn kind(&self) -> &'static str {
        match self {
            ResourceContent::Text(_) => "text",
            ResourceContent::Json(_) => "json",
        }
    }

    /// How the content is stored (and measured against the size limit).
    pub(crate) fn stored(&self) -> String {
        match self {
            ResourceContent::Text(text) => text.clone(),
            ResourceContent::Json(value) => value.to_string(),
        }
    }

    /// The content as the model sees it: the text, or the JSON value itself.
    pub fn to_value(&self) -> Value {
        match self {
            ResourceContent::Text(text) => Value::String(text.clone()),
            ResourceContent::Json(value) => value.clone(),
        }
    }
}

/// A resource without its content, as a listing shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResourceSummary {
    pub name: String,
    pub kind: String,
    pub bytes: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A resource with its content.
#[derive(Debug, Clone)]
pub struct Resource {
    pub summary: ResourceSummary,
    pub content: ResourceContent,
}

impl Store {
    /// Every resource of the session, by name.
    pub async fn list_resources(&self, session_id: &str) -> Result<Vec<ResourceSummary>> {
        Ok(sql!(self.conn().await?, c => {
            // PostgreSQL has no BLOB to cast to, SQLite no octet_length before 3.43.
            let bytes = if POSTGRES {
                "CAST(octet_length(content) AS BIGINT)"
            } else {
                "length(CAST(content AS BLOB))"
            };
            query(AssertSqlSafe(format!(
                "SELECT name, kind, {bytes} AS bytes, created_at, updated_at \
                 FROM session_resources WHERE session_id = ? ORDER BY name"
            )))
            .bind(session_id)
            .fetch_all(c)
            .await?
            .iter()
            .map(|row| ResourceSummary {
                name: row.get("name"),
                kind: row.get("kind"),
                bytes: row.get("bytes"),
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
            })
            .collect::<Vec<_>>()
        }))
    }

    /// One resource of the session, if it exists.
    pub async fn resource(&self, session_id: &str, name: &str) -> Result<Option<Resource>> {
        check_state_name("resource", name, MAX_RESOURCE_NAME_CHARS)?;
        let read = sql!(self.conn().await?, c => query(
            "SELECT name, kind, content, created_at, updated_at FROM session_resources \
             WHERE session_id = ? AND name = ?",
        )
        .bind(session_id)
        .bind(name)
        .fetch_optional(c)
        .await?
        .map(|row| {
            let summary = ResourceSummary {
                name: row.get("name"),
                kind: row.get("kind"),
                bytes: 0,
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
            };
            (summary, row.get::<String>("content"))
        }));
        let Some((mut summary, raw)) = read else {
            return Ok(None);
        };
        let content = decode_resource(name, &summary.kind, &raw)?;
        summary.bytes = raw.len() as i64;
        Ok(Some(Resource { summary, content }))
    }

    /// Creates or replaces a resource; returns whether it was created.
    pub async fn write_resource(
        &self,
        session_id: &str,
        name: &str,
        content: &ResourceContent,
    ) -> Result<bool> {
        let stored = checked_resource(name, content)?;
        // Informational only: a concurrent writer may create it in between.
        let existed = sql!(self.conn().await?, c => query_scalar::<bool>(
            "SELECT EXISTS (SELECT 1 FROM session_resources WHERE session_id = ? AND name = ?)",
        )
        .bind(session_id)
        .bind(name)
        .fetch_one(c)
        .await?);
        let now = now_ms();
        // One statement checks the per-session count and writes, under the
        // write lock: concurrent writers cannot overshoot the limit (SQLite
        // serializes writes anyway; PostgreSQL would run two counts side by side).
        // The names the session's open runs set count too: they may commit.
        let sql = format!(
            "WITH held AS ( \
                 SELECT name FROM session_resources WHERE session_id = ?2 \
                 UNION {STAGED_BY_OTHER_OPEN_RUNS} \
             ) \
             INSERT INTO session_resources (session_id, name, kind, content, created_at, updated_at) \
             SELECT ?2, ?4, ?5, ?6, ?7, ?7 \
             WHERE (SELECT COUNT(*) FROM held) < ?8 OR ?4 IN (SELECT name FROM held) \
             ON CONFLICT (session_id, name) DO UPDATE SET kind = excluded.kind, \
                content = excluded.content, updated_at = excluded.updated_at"
        );
        let mut tx = self.begin_write().await?;
        let written = sql!(tx, c => query(sqlx::AssertSqlSafe(sql))
        .bind("")
        .bind(session_id)
        .bind(Kind::Resource.as_str())
        .bind(name)
        .bind(content.kind())
        .bind(&stored)
        .bind(now)
        .bind(MAX_RESOURCES_PER_SESSION)
        .execute(c)
        .await?
        .rows_affected());
        tx.commit().await?;
        if written == 0 {
            return Err(too_many_resources());
        }
        Ok(!existed)
    }

    /// Deletes a resource; returns whether it existed.
    pub async fn delete_resource(&self, session_id: &str, name: &str) -> Result<bool> {
        check_state_name("resource", name, MAX_RESOURCE_NAME_CHARS)?;
        let deleted = sql!(self.conn().await?, c => query(
            "DELETE FROM session_resources WHERE session_id = ? AND name = ?",
        )
        .bind(session_id)
        .bind(name)
        .execute(c)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }
}

/// Checks a resource write (name and size) and answers the content as stored.
/// Direct and buffered (per-run) writes share it, so a buffered write that was
/// accepted can always be applied.
pub(crate) fn checked_resource(name: &str, content: &ResourceContent) -> Result<String> {
    check_state_name("resource", name, MAX_RESOURCE_NAME_CHARS)?;
    let stored = content.stored();
    if stored.len() > MAX_RESOURCE_BYTES {
        return Err(Error::validation(format!(
            "resource content must be at most {MAX_RESOURCE_BYTES} bytes, got {}",
            stored.len()
        )));
    }
    Ok(stored)
}

/// The refusal of a write that would create one resource too many.
pub(crate) fn too_many_resources() -> Error {
    Error::validation(format!(
        "the session already holds the maximum of {MAX_RESOURCES_PER_SESSION} resources; delete one first"
    ))
}

/// Stored resource content of `kind` (`text` | `json`), parsed.
pub(crate) fn decode_resource(name: &str, kind: &str, raw: &str) -> Result<ResourceContent> {
    if kind == "json" {
        serde_json::from_str(raw)
            .map(ResourceContent::Json)
            .map_err(|err| {
                Error::Internal(anyhow::anyhow!(
                    "stored resource {name:?} is not JSON: {err}"
                ))
            })
    } else {
        Ok(ResourceContent::Text(raw.to_owned()))
    }
}
