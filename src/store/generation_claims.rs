//! A session's right to generate, held in the database so that it holds for
//! every instance sharing it: one row per generating session, taken in one
//! statement, and the cancel asked of a run another instance drives.

use super::Store;
use super::backend::sql;
use super::cluster::{STALE_AFTER_MS, of_a_dead_instance, of_a_live_instance};
use crate::error::Result;
use crate::ids::now_ms;

impl Store {
    /// Takes the session's right to generate as `claim_id`; false while a
    /// live instance holds it. A dead instance's claim is taken over, and so
    /// is one of this instance's own: the caller holds the session's
    /// in-process claim, so such a row is one a release never removed.
    /// The generations dead instances left running in the session are
    /// discarded in the same transaction: one only paused may resume, and its
    /// run must be closed before another generation of the session starts.
    /// Their run ids come back with the answer.
    pub async fn claim_generation(
        &self,
        session_id: &str,
        claim_id: &str,
    ) -> Result<(bool, Vec<String>)> {
        let now = now_ms();
        let claim = format!(
            "INSERT INTO generation_claims (session_id, instance_id, claim_id, claimed_at) \
             VALUES (?1, ?2, ?5, ?4) ON CONFLICT (session_id) DO UPDATE SET \
             instance_id = excluded.instance_id, claim_id = excluded.claim_id, \
             claimed_at = excluded.claimed_at \
             WHERE generation_claims.instance_id = ?2 OR {}",
            of_a_dead_instance("generation_claims.instance_id", [3, 2, 6])
        );
        let mut tx = self.begin_write().await?;
        // Built from a fixed column name and placeholder numbers only.
        let taken = sql!(tx, c => query(sqlx::AssertSqlSafe(claim))
            .bind(session_id)
            .bind(self.instance_id())
            .bind(self.previous_instance())
            .bind(now)
            .bind(claim_id)
            .bind(now - STALE_AFTER_MS)
            .execute(c)
            .await?
            .rows_affected());
        if taken != 1 {
            return Ok((false, Vec::new()));
        }
        let discarded = self
            .discard_dead_generations_in(&mut tx, Some(session_id), now - STALE_AFTER_MS)
            .await?;
        tx.commit().await?;
        Ok((true, discarded))
    }

    /// Gives the session's right to generate back, if `claim_id` still holds it.
    pub async fn release_generation_claim(&self, session_id: &str, claim_id: &str) -> Result<()> {
        sql!(self.conn().await?, c => query(
            "DELETE FROM generation_claims WHERE session_id = ? AND claim_id = ?",
        )
        .bind(session_id)
        .bind(claim_id)
        .execute(c)
        .await
        .map(|_| ())?);
        Ok(())
    }

    /// Whether another live instance holds the session's right to generate.
    pub async fn generating_elsewhere(&self, session_id: &str) -> Result<bool> {
        let held = format!(
            "SELECT COUNT(*) FROM generation_claims WHERE session_id = ?1 \
             AND instance_id <> ?2 AND {}",
            of_a_live_instance("instance_id", [3, 4])
        );
        // Built from a fixed column name and placeholder numbers only.
        let held = sql!(self.conn().await?, c => query_scalar::<i64>(sqlx::AssertSqlSafe(held))
            .bind(session_id)
            .bind(self.instance_id())
            .bind(self.previous_instance())
            .bind(now_ms() - STALE_AFTER_MS)
            .fetch_one(c)
            .await?);
        Ok(held > 0)
    }

    /// The session's run the loop is generating, on any instance.
    pub async fn running_run_of_session(&self, session_id: &str) -> Result<Option<String>> {
        Ok(sql!(self.conn().await?, c => query_scalar::<String>(
            "SELECT id FROM floor_runs WHERE session_id = ? AND generation = 'running' \
             AND state = 'open' ORDER BY created_at DESC LIMIT 1",
        )
        .bind(session_id)
        .fetch_optional(c)
        .await?))
    }

    /// Records a cancel of the account's run, if a live instance other than
    /// this one is generating it; false otherwise.
    pub async fn request_remote_cancel(&self, account_id: &str, run_id: &str) -> Result<bool> {
        let request = format!(
            "UPDATE floor_runs SET cancel_requested_at = ?5 WHERE id = ?1 AND account_id = ?6 \
             AND generation = 'running' AND state = 'open' AND generation_instance <> ?2 \
             AND {}",
            of_a_live_instance("generation_instance", [3, 4])
        );
        // Built from a fixed column name and placeholder numbers only.
        let requested = sql!(self.conn().await?, c => query(sqlx::AssertSqlSafe(request))
            .bind(run_id)
            .bind(self.instance_id())
            .bind(self.previous_instance())
            .bind(now_ms() - STALE_AFTER_MS)
            .bind(now_ms())
            .bind(account_id)
            .execute(c)
            .await?
            .rows_affected());
        Ok(requested == 1)
    }

    /// Which of `run_ids` this instance should stop generating: those another
    /// instance asked to cancel, and those no longer open (discarded by the
    /// sweep of an instance that took this one for dead, or gone with their
    /// session).
    pub async fn runs_to_stop(&self, run_ids: &[String]) -> Result<Vec<String>> {
        let mut stop = Vec::new();
        // A handful of runs per instance: one lookup each keeps the SQL fixed.
        for run_id in run_ids {
            let going_on = sql!(self.conn().await?, c => query_scalar::<i64>(
                "SELECT COUNT(*) FROM floor_runs WHERE id = ? AND state = 'open' \
                 AND generation = 'running' AND cancel_requested_at IS NULL",
            )
            .bind(run_id)
            .fetch_one(c)
            .await?);
            if going_on == 0 {
                stop.push(run_id.clone());
            }
        }
        Ok(stop)
    }
}
