//! Sessions: one chat between a user and a character.

use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use crate::domain::{Page, PageRequest};
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// One chat with a character. `metadata` is the session's `metadata_json`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Session {
    pub id: String,
    #[serde(skip)]
    pub account_id: String,
    #[serde(skip)]
    pub character_id: String,
    /// Name of the session's character.
    pub character: String,
    pub title: String,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    pub created_at: i64,
    pub updated_at: i64,
}

const SELECT: &str = "SELECT s.id, s.account_id, s.character_id, c.name AS character_name, s.title, \
    s.metadata_json, s.created_at, s.updated_at FROM sessions s JOIN characters c ON c.id = s.character_id";

fn from_row(row: &SqliteRow) -> Session {
    let metadata: String = row.get("metadata_json");
    Session {
        id: row.get("id"),
        account_id: row.get("account_id"),
        character_id: row.get("character_id"),
        character: row.get("character_name"),
        title: row.get("title"),
        metadata: serde_json::from_str(&metadata).unwrap_or_else(|_| serde_json::json!({})),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}

impl Store {
    pub async fn create_session(
        &self,
        account_id: &str,
        character_name: &str,
        title: &str,
    ) -> Result<Session> {
        let character = self.character(account_id, character_name).await?;
        let now = now_ms();
        let id = new_id("sess");
        sqlx::query(
            "INSERT INTO sessions (id, account_id, character_id, title, metadata_json, created_at, updated_at) VALUES (?, ?, ?, ?, '{}', ?, ?)",
        )
        .bind(&id)
        .bind(account_id)
        .bind(&character.id)
        .bind(title)
        .bind(now)
        .bind(now)
        .execute(&mut *self.conn().await?)
        .await?;
        self.session(account_id, &id).await
    }

    /// The account's session; another account's is "not found".
    pub async fn session(&self, account_id: &str, id: &str) -> Result<Session> {
        if let Some(session) = self.session_cache.get(id) {
            if session.account_id == account_id {
                return Ok(session);
            }
            return Err(Error::not_found(format!("session {id:?}")));
        }
        let generation = self.session_cache.generation();
        let sql = format!("{SELECT} WHERE s.id = ?");
        let session = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut *self.conn().await?)
            .await?
            .map(|row| from_row(&row));
        match session {
            Some(session) => {
                self.session_cache.put(id, generation, session.clone());
                if session.account_id == account_id {
                    Ok(session)
                } else {
                    Err(Error::not_found(format!("session {id:?}")))
                }
            }
            None => Err(Error::not_found(format!("session {id:?}"))),
        }
    }

    /// Forgets cached sessions after a write to sessions or characters (a
    /// character's rename or deletion changes its sessions too).
    pub(crate) fn sessions_changed(&self) {
        self.session_cache.invalidate_all();
    }

    pub async fn list_sessions(
        &self,
        account_id: &str,
        character: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<Session>> {
        let filter = "s.account_id = ? AND (? IS NULL OR c.name = ?)";
        let total: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM sessions s JOIN characters c ON c.id = s.character_id WHERE {filter}"
        )))
        .bind(account_id)
        .bind(character)
        .bind(character)
        .fetch_one(&mut *self.conn().await?)
        .await?;
        // sort_by comes from a closed list validated by PageRequest, never from input.
        let sql = format!(
            "{SELECT} WHERE {filter} ORDER BY s.{} {}, s.id {} LIMIT ? OFFSET ?",
            page.sort_by,
            page.sort_order.sql(),
            page.sort_order.sql()
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(account_id)
            .bind(character)
            .bind(character)
            .bind(page.limit)
            .bind(page.offset)
            .fetch_all(&mut *self.conn().await?)
            .await?;
        Ok(Page::new(rows.iter().map(from_row).collect(), total, page))
    }

    /// The account's sessions whose id, title or character name contains
    /// `text` (case-insensitive for ASCII), newest first: the console's search.
    pub async fn search_sessions(
        &self,
        account_id: &str,
        text: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<Session>, i64)> {
        // LIKE's wildcards in the text match themselves.
        let escaped = text
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        let pattern = format!("%{escaped}%");
        let filter = "s.account_id = ? AND (s.id LIKE ?2 ESCAPE '\\' OR s.title LIKE ?2 ESCAPE '\\' OR c.name LIKE ?2 ESCAPE '\\')";
        let total: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM sessions s JOIN characters c ON c.id = s.character_id WHERE {filter}"
        )))
        .bind(account_id)
        .bind(&pattern)
        .fetch_one(&mut *self.conn().await?)
        .await?;
        let sql = format!(
            "{SELECT} WHERE {filter} ORDER BY s.updated_at DESC, s.id DESC LIMIT ?3 OFFSET ?4"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(account_id)
            .bind(&pattern)
            .bind(limit)
            .bind(offset)
            .fetch_all(&mut *self.conn().await?)
            .await?;
        Ok((rows.iter().map(from_row).collect(), total))
    }

    pub async fn delete_session(&self, account_id: &str, id: &str) -> Result<Session> {
        let session = self.session(account_id, id).await?;
        sqlx::query("DELETE FROM sessions WHERE id = ?")
            .bind(&session.id)
            .execute(&mut *self.conn().await?)
            .await?;
        self.sessions_changed();
        Ok(session)
    }
}
