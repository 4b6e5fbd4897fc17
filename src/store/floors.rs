//! Floors (turns) and their pages (versions of the reply).

use serde::Serialize;

use super::Store;
use super::backend::{Record, sql};
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

/// Largest user message a floor accepts, in bytes.
pub const MAX_FLOOR_CONTENT_BYTES: usize = 256 * 1024;

impl Store {
    /// Appends a user turn to the account's session.
    pub async fn append_floor(
        &self,
        account_id: &str,
        session_id: &str,
        content: &str,
    ) -> Result<Floor> {
        if content.len() > MAX_FLOOR_CONTENT_BYTES {
            return Err(Error::validation(format!(
                "content must be at most {MAX_FLOOR_CONTENT_BYTES} bytes"
            )));
        }
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

    /// The account's floor with every page.
    pub async fn floor(&self, account_id: &str, floor_id: &str) -> Result<Floor> {
        let found = self.floor_ref(account_id, floor_id).await?;
        self.list_floors(account_id, &found.session_id)
            .await?
            .into_iter()
            .find(|floor| floor.id == found.id)
            .ok_or_else(|| Error::not_found(format!("floor {floor_id:?}")))
    }

    /// Every floor of the account's session, oldest first, with pages.
    pub async fn list_floors(&self, account_id: &str, session_id: &str) -> Result<Vec<Floor>> {
        let session = self.session(account_id, session_id).await?;
        let floors = sql!(self.conn().await?, c => query(
            "SELECT id, session_id, seq, user_content, active_page_id, created_at FROM floors WHERE session_id = ? ORDER BY seq",
        )
        .bind(&session.id)
        .fetch_all(c)
        .await?
        .iter()
        .map(floor_from_row)
        .collect::<Vec<_>>());
        self.attach_pages(floors).await
    }

    /// Fills in the pages of `floors` with one query.
    async fn attach_pages(&self, mut floors: Vec<Floor>) -> Result<Vec<Floor>> {
        let Some(first) = floors.first() else {
            return Ok(floors);
        };
        let pages = sql!(self.conn().await?, c => query(
            "SELECT p.floor_id, p.id, p.page_no, p.content, p.created_at FROM pages p \
             JOIN floors f ON f.id = p.floor_id WHERE f.session_id = ? ORDER BY p.floor_id, p.page_no",
        )
        .bind(&first.session_id)
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
