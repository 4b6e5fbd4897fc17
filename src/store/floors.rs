//! Floors (turns) and their pages (versions of the reply).

use futures::TryStreamExt;
use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
use super::page_bytes::{row_bytes, take_within};
use crate::domain::PageRequest;
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// One version of a floor's reply.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FloorPage {
    pub id: String,
    pub page_no: i64,
    pub content: String,
    pub created_at: i64,
}

/// One turn of a session: the user's message and the reply's pages.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Floor {
    pub id: String,
    pub session_id: String,
    pub seq: i64,
    pub content: String,
    pub active_page_id: Option<String>,
    pub pages: Vec<FloorPage>,
    pub created_at: i64,
}

/// What the call path needs of a floor: who owns it and its active page.
#[derive(Debug, Clone)]
pub struct FloorRef {
    pub id: String,
    pub session_id: String,
    pub active_page_id: Option<String>,
}

/// Largest text a floor or a page holds, in bytes: a user's message, a
/// committed `content`, a model's reply.
pub const MAX_FLOOR_CONTENT_BYTES: usize = 256 * 1024;

/// Refuses a floor's or a page's text longer than [`MAX_FLOOR_CONTENT_BYTES`];
/// `what` names it in the error ("content", "the model's reply").
pub(super) fn check_content_fits(what: &str, content: &str) -> Result<()> {
    if content.len() > MAX_FLOOR_CONTENT_BYTES {
        return Err(Error::validation(format!(
            "{what} is {} bytes, more than a floor or page holds ({MAX_FLOOR_CONTENT_BYTES} bytes)",
            content.len()
        )));
    }
    Ok(())
}

impl Store {
    /// Appends a user turn to the account's session.
    pub async fn append_floor(
        &self,
        account_id: &str,
        session_id: &str,
        content: &str,
    ) -> Result<Floor> {
        check_content_fits("content", content)?;
        let session = self.session(account_id, session_id).await?;
        let id = new_id("floor");
        let now = now_ms();
        // The sequence number is computed inside the INSERT, under the write
        // lock, so two concurrent appends cannot take the same one (the UNIQUE
        // constraint backs this up; PostgreSQL would run both subqueries at once).
        let mut tx = self.begin_write().await?;
        let seq = sql!(tx, c => query_scalar::<i64>(
            "INSERT INTO floors (id, session_id, seq, user_content, active_page_id, created_at) \
             VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM floors WHERE session_id = ?), ?, NULL, ?) \
             RETURNING seq",
        )
        .bind(&id)
        .bind(&session.id)
        .bind(&session.id)
        .bind(content)
        .bind(now)
        .fetch_one(c)
        .await?);
        tx.commit().await?;
        Ok(Floor {
            id,
            session_id: session.id,
            seq,
            content: content.to_owned(),
            active_page_id: None,
            pages: Vec::new(),
            created_at: now,
        })
    }

    /// The account's floor (without its pages); another account's is "not found".
    pub async fn floor_ref(&self, account_id: &str, floor_id: &str) -> Result<FloorRef> {
        sql!(self.conn().await?, c => query(
            "SELECT f.id, f.session_id, f.active_page_id \
             FROM floors f JOIN sessions s ON s.id = f.session_id WHERE f.id = ? AND s.account_id = ?",
        )
        .bind(floor_id)
        .bind(account_id)
        .fetch_optional(c)
        .await?
        .map(|row| FloorRef {
            id: row.get("id"),
            session_id: row.get("session_id"),
            active_page_id: row.get("active_page_id"),
        }))
        .ok_or_else(|| Error::not_found(format!("floor {floor_id:?}")))
    }

    /// The account's floor with every page: that floor's rows only, however
    /// long its session.
    pub async fn floor(&self, account_id: &str, floor_id: &str) -> Result<Floor> {
        let found = self.floor_without_pages(account_id, floor_id).await?;
        let mut floors = self.attach_pages(vec![found]).await?;
        Ok(floors.remove(0))
    }

    /// The account's floor with `pages` left empty: what starting a new page
    /// needs (its session and message) without reading up to 100 replies.
    pub async fn floor_without_pages(&self, account_id: &str, floor_id: &str) -> Result<Floor> {
        sql!(self.conn().await?, c => query(
            "SELECT f.id, f.session_id, f.seq, f.user_content, f.active_page_id, f.created_at \
             FROM floors f JOIN sessions s ON s.id = f.session_id WHERE f.id = ? AND s.account_id = ?",
        )
        .bind(floor_id)
        .bind(account_id)
        .fetch_optional(c)
        .await?
        .as_ref()
        .map(floor_from_row))
        .ok_or_else(|| Error::not_found(format!("floor {floor_id:?}")))
    }

    /// A page of the account's session's floors with their pages, oldest
    /// first (or newest first), and how many floors the session has.
    pub async fn floors_page(
        &self,
        account_id: &str,
        session_id: &str,
        range: &PageRequest,
    ) -> Result<(Vec<Floor>, i64)> {
        let session = self.session(account_id, session_id).await?;
        let order = range.sort_order.sql();
        // A floor's size is its message and all its pages' texts (200 floors
        // of a few pages of model replies each would otherwise be read whole
        // for one request), from the lengths, without reading the pages.
        let sql = format!(
            "SELECT id, session_id, seq, user_content, active_page_id, created_at, \
             CAST(octet_length(user_content) + COALESCE((SELECT SUM(octet_length(p.content)) \
             FROM pages p WHERE p.floor_id = floors.id), 0) AS BIGINT) AS floor_bytes \
             FROM floors WHERE session_id = ? ORDER BY seq {order} LIMIT ? OFFSET ?"
        );
        let mut conn = self.conn().await?;
        let (floors, _) = sql!(conn, c => take_within(
            query(AssertSqlSafe(sql))
                .bind(&session.id)
                .bind(range.limit)
                .bind(range.offset)
                .fetch(c),
            |row| (floor_from_row(&row), row_bytes(&row, "floor_bytes")),
        )
        .await?);
        let total = sql!(conn, c => query_scalar::<i64>("SELECT COUNT(*) FROM floors WHERE session_id = ?")
            .bind(&session.id)
            .fetch_one(c)
            .await?);
        drop(conn);
        Ok((self.attach_pages(floors).await?, total))
    }

    /// The newest committed turns of `session_id` before `floor_id` whose
    /// texts together fit `max_bytes`, oldest first: each floor with an
    /// active page, as its user message and that page's reply; and whether
    /// older turns were left out. One query that reads no other page (a
    /// turn's history, however many pages were regenerated), newest first,
    /// a row at a time: the turns past the budget are never read, so a long
    /// session does not load its whole history for every turn. The caller
    /// owns the session.
    pub async fn committed_turns_within(
        &self,
        session_id: &str,
        floor_id: &str,
        max_bytes: usize,
    ) -> Result<(Vec<(String, Option<String>)>, bool)> {
        let (mut turns, left_out) = sql!(self.conn().await?, c => {
            let mut rows = query_as::<(String, Option<String>)>(
                "SELECT f.user_content, p.content FROM floors f \
                 LEFT JOIN pages p ON p.id = f.active_page_id \
                 WHERE f.session_id = ?1 AND f.active_page_id IS NOT NULL \
                 AND f.seq < (SELECT seq FROM floors WHERE id = ?2 AND session_id = ?1) \
                 ORDER BY f.seq DESC",
            )
            .bind(session_id)
            .bind(floor_id)
            .fetch(c);
            let mut turns = Vec::new();
            let mut bytes = 0usize;
            let mut left_out = false;
            while let Some((user, reply)) = rows.try_next().await? {
                bytes = bytes.saturating_add(user.len() + reply.as_ref().map_or(0, String::len));
                if bytes > max_bytes {
                    left_out = true;
                    break;
                }
                turns.push((user, reply));
            }
            (turns, left_out)
        });
        turns.reverse();
        Ok((turns, left_out))
    }

    /// Fills in the pages of `floors` (of one session) with one query that
    /// reads theirs only.
    async fn attach_pages(&self, mut floors: Vec<Floor>) -> Result<Vec<Floor>> {
        let (Some(first), Some(last)) = (
            floors.iter().map(|f| f.seq).min(),
            floors.iter().map(|f| f.seq).max(),
        ) else {
            return Ok(floors);
        };
        let session_id = floors[0].session_id.clone();
        let pages = sql!(self.conn().await?, c => query(
            "SELECT p.floor_id, p.id, p.page_no, p.content, p.created_at FROM pages p \
             JOIN floors f ON f.id = p.floor_id WHERE f.session_id = ? AND f.seq BETWEEN ? AND ? \
             ORDER BY p.floor_id, p.page_no",
        )
        .bind(&session_id)
        .bind(first)
        .bind(last)
        .fetch_all(c)
        .await?
        .iter()
        .map(|row| {
            let page = FloorPage {
                id: row.get("id"),
                page_no: row.get("page_no"),
                content: row.get("content"),
                created_at: row.get("created_at"),
            };
            (row.get::<String>("floor_id"), page)
        })
        .collect::<Vec<_>>());
        let mut by_floor: std::collections::HashMap<String, Vec<FloorPage>> = Default::default();
        for (floor_id, page) in pages {
            by_floor.entry(floor_id).or_default().push(page);
        }
        for floor in &mut floors {
            floor.pages = by_floor.remove(&floor.id).unwrap_or_default();
        }
        Ok(floors)
    }
}

fn floor_from_row(row: &impl Record) -> Floor {
    Floor {
        id: row.get("id"),
        session_id: row.get("session_id"),
        seq: row.get("seq"),
        content: row.get("user_content"),
        active_page_id: row.get("active_page_id"),
        pages: Vec::new(),
        created_at: row.get("created_at"),
    }
}
