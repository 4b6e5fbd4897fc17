//! Sessions: one chat between a user and a character.

use std::sync::Arc;

use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
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

/// How many sessions [`Store::shared_sessions`] reads in one statement, well
/// under both backends' limits on bound values.
pub const SESSIONS_PER_READ: usize = 256;

fn from_row(row: &impl Record) -> Session {
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

/// Most sessions one account holds: a sessions list counts them exactly,
/// and a million took 0.8 s of CPU a request (probe I).
pub const MAX_SESSIONS_PER_ACCOUNT: i64 = 100_000;

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
        // Counted and inserted by one statement under the write lock: two
        // creates at the cap cannot both pass it.
        let mut tx = self.begin_write().await?;
        let inserted = sql!(tx, c => query(
            "INSERT INTO sessions (id, account_id, character_id, title, metadata_json, created_at, updated_at) \
             SELECT ?, ?, ?, ?, '{}', ?, ? WHERE (SELECT COUNT(*) FROM sessions WHERE account_id = ?) < ?",
        )
        .bind(&id)
        .bind(account_id)
        .bind(&character.id)
        .bind(title)
        .bind(now)
        .bind(now)
        .bind(account_id)
        .bind(MAX_SESSIONS_PER_ACCOUNT)
        .execute(c)
        .await?
        .rows_affected());
        tx.commit().await?;
        if inserted == 0 {
            return Err(Error::refused(
                crate::error::ErrorCode::LimitExceeded,
                format!(
                    "the account holds {MAX_SESSIONS_PER_ACCOUNT} sessions, the most it may (MAX_SESSIONS_PER_ACCOUNT); delete some first"
                ),
            ));
        }
        self.session(account_id, &id).await
    }

    /// The account's session; another account's is "not found".
    /// On a shared database the session is read fresh every time: its
    /// permissions decide the next call, and another instance may have changed
    /// them a moment ago (its announcement may still be on its way).
    pub async fn session(&self, account_id: &str, id: &str) -> Result<Session> {
        self.shared_session(account_id, id)
            .await
            .map(Arc::unwrap_or_clone)
    }

    /// [`Store::session`], shared with the cache rather than copied: what a
    /// call or a live model session's catalog reads and then lets go.
    pub async fn shared_session(&self, account_id: &str, id: &str) -> Result<Arc<Session>> {
        let cached = if self.shared_database() {
            None
        } else {
            self.session_cache.get(id)
        };
        if let Some(session) = cached {
            if session.account_id == account_id {
                return Ok(session);
            }
            return Err(Error::not_found(format!("session {id:?}")));
        }
        // Boxed: the read's database futures are kilobytes, and inline they
        // would make every caller's future that large, copied whole into its
        // box on every cached lookup too (a tenth of a register fan-out's
        // instructions, BENCHMARKS.md issue 20).
        Box::pin(self.read_session(account_id, id)).await
    }

    /// The sessions `wanted` names by account and id, as they are now: one
    /// per entry, `None` for one that no longer exists or is another
    /// account's. What the cache may not answer ([`Store::shared_session`]) is
    /// read in one statement per [`SESSIONS_PER_READ`], not one per session:
    /// a registration into every role reads every live model session's
    /// session, and on a shared database each read is a round trip.
    pub async fn shared_sessions(
        &self,
        wanted: &[(&str, &str)],
    ) -> Result<Vec<Option<Arc<Session>>>> {
        let mut found: Vec<Option<Arc<Session>>> = if self.shared_database() {
            vec![None; wanted.len()]
        } else {
            wanted
                .iter()
                .map(|(_, id)| self.session_cache.get(id))
                .collect()
        };
        let missing: Vec<usize> = (0..wanted.len()).filter(|&i| found[i].is_none()).collect();
        if !missing.is_empty() {
            let generation = self.session_cache.generation();
            for chunk in missing.chunks(SESSIONS_PER_READ) {
                let ids: Vec<&str> = chunk.iter().map(|&i| wanted[i].1).collect();
                let read: crate::fast_map::FastMap<String, Arc<Session>> = self
                    .read_sessions(&ids)
                    .await?
                    .into_iter()
                    .map(|session| (session.id.clone(), Arc::new(session)))
                    .collect();
                for session in read.values() {
                    self.session_cache
                        .put(&session.id, generation, session.clone());
                }
                for &i in chunk {
                    found[i] = read.get(wanted[i].1).cloned();
                }
            }
        }
        for (slot, (account_id, _)) in found.iter_mut().zip(wanted) {
            if slot
                .as_ref()
                .is_some_and(|session| session.account_id != *account_id)
            {
                *slot = None;
            }
        }
        Ok(found)
    }

    /// The sessions of `ids` that exist, in one statement.
    async fn read_sessions(&self, ids: &[&str]) -> Result<Vec<Session>> {
        let placeholders = vec!["?"; ids.len()].join(", ");
        let sql = format!("{SELECT} WHERE s.id IN ({placeholders})");
        Ok(sql!(self.conn().await?, c => {
            let mut read = query(AssertSqlSafe(sql));
            for id in ids {
                read = read.bind(*id);
            }
            read.fetch_all(c).await?.iter().map(from_row).collect()
        }))
    }

    /// Which of `ids` name a session that exists now, read from the database
    /// (never the cache), [`SESSIONS_PER_READ`] a statement: what closes the
    /// event streams of sessions deleted where this instance was not told.
    pub async fn existing_session_ids(
        &self,
        ids: &[&str],
    ) -> Result<std::collections::HashSet<String>> {
        let mut found = std::collections::HashSet::with_capacity(ids.len());
        for chunk in ids.chunks(SESSIONS_PER_READ) {
            found.extend(self.read_sessions(chunk).await?.into_iter().map(|s| s.id));
        }
        Ok(found)
    }

    /// The account's session read from the database, then cached.
    async fn read_session(&self, account_id: &str, id: &str) -> Result<Arc<Session>> {
        self.shared_sessions(&[(account_id, id)])
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| Error::not_found(format!("session {id:?}")))
    }

    /// Forgets cached sessions after a write to sessions or characters (a
    /// character's rename or deletion changes its sessions too), here and on
    /// the other instances sharing the database.
    pub(crate) async fn sessions_changed(&self) {
        self.session_cache.invalidate_all();
        self.announce("sessions", serde_json::Value::Null).await;
    }

    pub async fn list_sessions(
        &self,
        account_id: &str,
        character: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<Session>> {
        let filter = "s.account_id = ? AND (? IS NULL OR c.name = ?)";
        let total = sql!(self.conn().await?, c => query_scalar::<i64>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM sessions s JOIN characters c ON c.id = s.character_id WHERE {filter}"
        )))
        .bind(account_id)
        .bind(character)
        .bind(character)
        .fetch_one(c)
        .await?);
        // sort_by comes from a closed list validated by PageRequest, never from input.
        let sql = format!(
            "{SELECT} WHERE {filter} ORDER BY s.{} {}, s.id {} LIMIT ? OFFSET ?",
            page.sort_by,
            page.sort_order.sql(),
            page.sort_order.sql()
        );
        let sessions = sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(account_id)
            .bind(character)
            .bind(character)
            .bind(page.limit)
            .bind(page.offset)
            .fetch_all(c)
            .await?
            .iter()
            .map(from_row)
            .collect::<Vec<_>>());
        Ok(Page::new(sessions, total, page))
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
        // LIKE's wildcards in the text match themselves. LOWER on both sides
        // keeps SQLite's case-insensitive LIKE on PostgreSQL, whose LIKE is not.
        let escaped = text
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        let pattern = format!("%{escaped}%");
        let filter = "s.account_id = ? AND (LOWER(s.id) LIKE LOWER(?2) ESCAPE '\\' \
            OR LOWER(s.title) LIKE LOWER(?2) ESCAPE '\\' OR LOWER(c.name) LIKE LOWER(?2) ESCAPE '\\')";
        let total = sql!(self.conn().await?, c => query_scalar::<i64>(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM sessions s JOIN characters c ON c.id = s.character_id WHERE {filter}"
        )))
        .bind(account_id)
        .bind(&pattern)
        .fetch_one(c)
        .await?);
        let sql = format!(
            "{SELECT} WHERE {filter} ORDER BY s.updated_at DESC, s.id DESC LIMIT ?3 OFFSET ?4"
        );
        let sessions = sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(account_id)
            .bind(&pattern)
            .bind(limit)
            .bind(offset)
            .fetch_all(c)
            .await?
            .iter()
            .map(from_row)
            .collect::<Vec<_>>());
        Ok((sessions, total))
    }

    pub async fn delete_session(&self, account_id: &str, id: &str) -> Result<Session> {
        let session = self.session(account_id, id).await?;
        let mut tx = self.begin_write().await?;
        super::runs::end_calls_of_deleted_session(&mut tx, &session.id).await?;
        let deleted = sql!(tx, c => query("DELETE FROM sessions WHERE id = ?")
            .bind(&session.id)
            .execute(c)
            .await
            .map(|done| done.rows_affected()))?;
        tx.commit().await?;
        self.sessions_changed().await;
        // Of two deletes that both read the row, only the one that removed
        // it answers that it did.
        if deleted == 0 {
            return Err(Error::not_found(format!("session {id:?}")));
        }
        Ok(session)
    }
}
