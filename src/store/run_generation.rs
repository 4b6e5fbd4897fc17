//! The generation loop's durable state of a run: whether the loop is driving
//! it, finished it (so the next floor commits its page) or gave up, and the
//! memories its memory slot wrote, which land in the session only when the
//! run is committed.

use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{AsHandle, Record, sql};
use super::memory::{MAX_MEMORIES_PER_SESSION, MAX_MEMORY_BYTES};
use super::runs::Run;
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// Most memories one run's memory slot may write.
pub const MAX_MEMORIES_PER_RUN: usize = 16;

/// How the generation loop ended a run it drove (a generated run is stored
/// `running` from its insert, see [`Store::open_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationState {
    /// The answer is on the page; the session's next floor commits it.
    Finished,
    Failed,
}

impl GenerationState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            GenerationState::Finished => "finished",
            GenerationState::Failed => "failed",
        }
    }
}

/// The most floors one new floor commits: the generation loop leaves one
/// finished run per floor it answered, and only regenerating an earlier floor
/// leaves more than one floor open.
const MAX_FLOORS_COMMITTED_AT_ONCE: i64 = 64;

/// Ends a run's generation as `?1` (a [`GenerationState`]), if it is still
/// generating: the loop's own ending and a dead instance's discarded run
/// write it alike.
pub(super) const END_GENERATION_SQL: &str =
    "UPDATE floor_runs SET generation = ?1 WHERE id = ?2 AND generation = 'running'";

/// The SQL condition that a run is still generating on a dead instance;
/// placeholders `[previous, this, stale_before]` as in
/// [`super::cluster::of_a_dead_instance`], and `shared`: 0 on an unshared
/// database, where every instance but this one is dead (an earlier process
/// there never renewed its heartbeat, so a short-lived one would look alive).
pub(super) fn left_by_a_dead_instance([previous, this, stale_before, shared]: [u8; 4]) -> String {
    format!(
        "generation = 'running' AND state = 'open' AND ((?{shared} = 0 AND \
         (generation_instance IS NULL OR generation_instance <> ?{this})) OR {})",
        super::cluster::of_a_dead_instance("generation_instance", [previous, this, stale_before])
    )
}

impl Store {
    /// Records how the loop ended `run_id`, if the run is still generating;
    /// false for one that another instance already ended (it took this one
    /// for dead and discarded the run), which keeps what that instance wrote.
    pub async fn end_run_generation(&self, run_id: &str, state: GenerationState) -> Result<bool> {
        let ended = sql!(self.conn().await?, c => query(END_GENERATION_SQL)
            .bind(state.as_str())
            .bind(run_id)
            .execute(c)
            .await?
            .rows_affected());
        Ok(ended == 1)
    }

    /// For each floor of the session, its newest run the loop finished and
    /// nobody committed or discarded yet, oldest floor first: what the
    /// session's next floor commits. A floor regenerated after a later floor
    /// was answered leaves two such floors, and both replies stand.
    pub async fn finished_runs_to_commit(
        &self,
        account_id: &str,
        session_id: &str,
    ) -> Result<Vec<Run>> {
        // The runs whole, not their ids to read one by one: this is on every
        // floor's way to its first model request.
        let sql = format!(
            "SELECT {} FROM floor_runs r WHERE r.session_id = ? AND r.account_id = ? \
             AND r.generation = 'finished' AND r.state = 'open' AND NOT EXISTS ( \
               SELECT 1 FROM floor_runs n WHERE n.floor_id = r.floor_id \
               AND n.generation = 'finished' AND n.state = 'open' \
               AND (n.created_at > r.created_at OR (n.created_at = r.created_at AND n.id > r.id))) \
             ORDER BY r.created_at, r.id LIMIT ?",
            super::runs::COLUMNS
        );
        Ok(sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(session_id)
            .bind(account_id)
            .bind(MAX_FLOORS_COMMITTED_AT_ONCE)
            .fetch_all(c)
            .await?
            .iter()
            .map(super::runs::from_row)
            .collect()))
    }

    /// Discards, in one write transaction, the runs the loop was driving
    /// when the previous process stopped (no process drives them now): on a
    /// shared database only those of dead instances (the previous one on this
    /// data directory, those without a heartbeat for
    /// [`super::cluster::STALE_AFTER_MS`], and runs from before instances were
    /// recorded; a live instance's generation is its own). Their ids, for the
    /// cancel a paused instance hears.
    pub async fn discard_interrupted_generations(&self) -> Result<Vec<String>> {
        let mut tx = self.begin_write().await?;
        let discarded = self
            .discard_dead_generations_in(&mut tx, None, now_ms() - super::cluster::STALE_AFTER_MS)
            .await?;
        tx.commit().await?;
        Ok(discarded)
    }

    /// Buffers the memory slot's notes in the run; blank notes are skipped,
    /// long ones refused, and at most [`MAX_MEMORIES_PER_RUN`] are kept.
    pub async fn add_run_memories(&self, run: &Run, notes: &[String]) -> Result<usize> {
        if let Some(long) = notes.iter().find(|n| n.len() > MAX_MEMORY_BYTES) {
            return Err(Error::validation(format!(
                "a memory must be at most {MAX_MEMORY_BYTES} bytes, got {}",
                long.len()
            )));
        }
        let notes: Vec<&String> = notes
            .iter()
            .filter(|n| !n.trim().is_empty())
            .take(MAX_MEMORIES_PER_RUN)
            .collect();
        let mut tx = self.begin_write().await?;
        let now = now_ms();
        for (seq, note) in notes.iter().enumerate() {
            sql!(tx, c => query(
                "INSERT INTO run_memories (run_id, seq, session_id, content, created_at) \
                 VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_memories WHERE run_id = ?), ?, ?, ?)",
            )
            .bind(&run.id)
            .bind(&run.id)
            .bind(&run.session_id)
            .bind(note.as_str())
            .bind(now + seq as i64)
            .execute(c)
            .await
            .map(|_| ())?);
        }
        tx.commit().await?;
        Ok(notes.len())
    }
}

/// At commit: the run's memories become the session's, as many as the
/// session still has room for (the rest are logged and dropped).
pub(super) async fn apply_run_memories(tx: &mut impl AsHandle, run: &Run) -> Result<u64> {
    // Taken and forgotten in one statement, as the run's state writes are
    // (`run_effects::apply_state_effects`); RETURNING keeps no order.
    let mut rows = sql!(*tx, c => query(
        "DELETE FROM run_memories WHERE run_id = ? RETURNING seq, content, created_at",
    )
    .bind(&run.id)
    .fetch_all(c)
    .await?
    .iter()
    .map(|row| (row.get::<i64>("seq"), row.get::<String>("content"), row.get::<i64>("created_at")))
    .collect::<Vec<_>>());
    rows.sort_unstable_by_key(|(seq, ..)| *seq);
    let mut applied = 0;
    for (_, content, created_at) in &rows {
        let written = sql!(*tx, c => query(
            "INSERT INTO session_memories (id, session_id, content, created_at) SELECT ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM session_memories WHERE session_id = ?) < ?",
        )
        .bind(new_id("mem"))
        .bind(&run.session_id)
        .bind(content)
        .bind(*created_at)
        .bind(&run.session_id)
        .bind(MAX_MEMORIES_PER_SESSION)
        .execute(c)
        .await?
        .rows_affected());
        applied += written;
    }
    if applied < rows.len() as u64 {
        tracing::warn!(run_id = %run.id, dropped = rows.len() as u64 - applied,
            "the session holds the most memories it may; the run's other memories were dropped");
    }
    Ok(applied)
}

/// At discard: the run's buffered memories are forgotten.
pub(super) async fn drop_run_memories(tx: &mut impl AsHandle, run: &Run) -> Result<()> {
    sql!(*tx, c => query("DELETE FROM run_memories WHERE run_id = ?")
        .bind(&run.id)
        .execute(c)
        .await
        .map(|_| ())?);
    Ok(())
}
