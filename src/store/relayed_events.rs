//! A chat session's events, relayed between instances sharing a PostgreSQL
//! database: a batch is stored as one row of `relayed_session_events`, and
//! its id is announced on the change channel in the same statement (a
//! notification's payload is limited to 8,000 bytes, an event is not). The
//! other instances read the row by that id. On SQLite there is one instance
//! and nothing is relayed.

use super::Store;
use super::backend::Pool;
use super::cluster::{CHANNEL, SESSION_EVENTS_TOPIC};
use crate::error::Result;
use crate::ids::now_ms;

/// How long a relayed batch is kept: notifications arrive well under a
/// second after their commit, and an instance that missed one (its listening
/// connection was lost) is not sent what it missed either.
const KEPT_FOR_MS: i64 = 60_000;

impl Store {
    /// Stores a batch of session events (a JSON array, see
    /// `runtime::event_relay`) and tells the other instances its id and the
    /// sessions it concerns (`sessions_json`, a JSON array, or `null` when
    /// they are too many to announce), so that an instance without a stream
    /// of them does not read it. Nothing happens on SQLite.
    pub async fn relay_session_events(&self, events_json: &str, sessions_json: &str) -> Result<()> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(());
        };
        sqlx::query(
            "WITH batch AS (INSERT INTO relayed_session_events (origin, events, created_at) \
             VALUES ($1, $2, $3) RETURNING id) \
             SELECT pg_notify($4, json_build_object('from', $1::text, 'topic', $5::text, \
             'data', json_build_object('id', batch.id, 'sessions', $6::json))::text) \
             FROM batch",
        )
        .bind(self.instance_id())
        .bind(events_json)
        .bind(now_ms())
        .bind(CHANNEL)
        .bind(SESSION_EVENTS_TOPIC)
        .bind(sessions_json)
        .execute(pool)
        .await?;
        Ok(())
    }

    /// The batches other instances relayed as `ids` that are still kept, as
    /// (id, JSON array), by id: one instance's batches in the order it
    /// wrote them (it writes one at a time).
    pub async fn relayed_batches(&self, ids: &[i64]) -> Result<Vec<(i64, String)>> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(Vec::new());
        };
        let batches = sqlx::query_as(
            "SELECT id, events FROM relayed_session_events WHERE id = ANY($1) ORDER BY id",
        )
        .bind(ids)
        .fetch_all(pool)
        .await?;
        Ok(batches)
    }

    /// Deletes the relayed batches every instance has had time to read.
    pub(super) async fn forget_old_relayed_events(&self) -> Result<()> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(());
        };
        sqlx::query("DELETE FROM relayed_session_events WHERE created_at < $1")
            .bind(now_ms() - KEPT_FOR_MS)
            .execute(pool)
            .await?;
        Ok(())
    }
}
