//! Runs: one generation attempt on a floor, producing one page.

use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{AsHandle, Record, Tx, sql};
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// A generation attempt and the page it produces.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Run {
    pub id: String,
    pub session_id: String,
    pub floor_id: String,
    pub page_id: String,
    /// `open` | `committed` | `discarded`
    pub state: String,
    pub confirmed_execution_ids: Vec<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// An earlier execution on a floor that may not be repeated silently.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BlockingExecution {
    pub id: String,
    pub tool_name: String,
    pub replay_safety: String,
    pub run_id: Option<String>,
    pub status: String,
}

/// An earlier execution of the same call, found when a call repeats it.
#[derive(Debug, Clone)]
pub struct ReplayParent {
    pub id: String,
    pub attempt_no: i64,
    pub replay_safety: String,
}

pub(super) const COLUMNS: &str =
    "id, session_id, floor_id, page_id, state, confirmed_execution_ids, created_at, finished_at";

pub(super) fn from_row(row: &impl Record) -> Run {
    let confirmed: String = row.get("confirmed_execution_ids");
    Run {
        id: row.get("id"),
        session_id: row.get("session_id"),
        floor_id: row.get("floor_id"),
        page_id: row.get("page_id"),
        state: row.get("state"),
        confirmed_execution_ids: serde_json::from_str(&confirmed).unwrap_or_default(),
        created_at: row.get("created_at"),
        finished_at: row.get("finished_at"),
    }
}

/// The runs a dead instance left generating, of one session or of all.
/// Placeholders: the session (NULL for every session), previous instance,
/// this instance, oldest live heartbeat, whether the database is shared. A
/// floor's claim names its session in a plain equality so that it searches
/// `floor_runs_by_generation`; an `?1 IS NULL OR` beside it would scan every
/// run of the database on every floor posted.
fn dead_generations_sql(one_session: bool) -> String {
    let sessions = if one_session {
        "session_id = ?1"
    } else {
        "?1 IS NULL"
    };
    format!(
        "SELECT {COLUMNS} FROM floor_runs WHERE {sessions} AND {}",
        super::run_generation::left_by_a_dead_instance([2, 3, 4, 5])
    )
}

impl Store {
    /// Executions of earlier attempts on the floor that are not replay-safe.
    pub async fn blocking_executions(
        &self,
        account_id: &str,
        floor_id: &str,
    ) -> Result<Vec<BlockingExecution>> {
        self.settle_journal().await?;
        Ok(sql!(self.conn().await?, c => query(
            "SELECT id, tool_name, replay_safety, run_id, status FROM tool_execution_record \
             WHERE account_id = ? AND floor_id = ? AND run_id IS NOT NULL AND replay_safety <> 'safe' \
             AND provider_started = 1 ORDER BY created_at, id",
        )
        .bind(account_id)
        .bind(floor_id)
        .fetch_all(c)
        .await?
        .iter()
        .map(|row| BlockingExecution {
            id: row.get("id"),
            tool_name: row.get("tool_name"),
            replay_safety: row.get("replay_safety"),
            run_id: row.get("run_id"),
            status: row.get("status"),
        })
        .collect()))
    }

    /// Opens a run and its (empty) page on the account's floor; a `generating`
    /// run starts `running`, driven by this instance.
    pub async fn open_run(
        &self,
        account_id: &str,
        floor: &super::FloorRef,
        confirmed: &[String],
        generating: bool,
    ) -> Result<Run> {
        let now = now_ms();
        let run_id = new_id("floorrun");
        let page_id = new_id("page");
        let mut tx = self.begin_write().await?;
        // The bound checked in the insert itself: a floor opened a run in
        // two statements where one suffices (each is a round trip to the
        // database's thread).
        let inserted = sql!(tx, c => query(
            "INSERT INTO pages (id, floor_id, page_no, content, created_at) \
             SELECT ?, ?, (SELECT COALESCE(MAX(page_no), 0) + 1 FROM pages WHERE floor_id = ?), '', ? \
             WHERE (SELECT COUNT(*) FROM pages WHERE floor_id = ?) < ?",
        )
        .bind(&page_id)
        .bind(&floor.id)
        .bind(&floor.id)
        .bind(now)
        .bind(&floor.id)
        .bind(MAX_PAGES_PER_FLOOR)
        .execute(c)
        .await?
        .rows_affected());
        if inserted == 0 {
            return Err(Error::refused(
                crate::error::ErrorCode::LimitExceeded,
                format!(
                    "floor {} holds {MAX_PAGES_PER_FLOOR} pages, the most a floor holds (MAX_PAGES_PER_FLOOR = {MAX_PAGES_PER_FLOOR}): discard an open run's page before opening another",
                    floor.id
                ),
            ));
        }
        // The row as stored, returned by the insert: read after the commit,
        // it was one more round trip.
        let sql = format!(
            "INSERT INTO floor_runs (id, account_id, session_id, floor_id, page_id, state, \
             confirmed_execution_ids, created_at, generation, generation_instance) \
             VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?, ?) RETURNING {COLUMNS}"
        );
        let run = sql!(tx, c => query(AssertSqlSafe(sql))
        .bind(&run_id)
        .bind(account_id)
        .bind(&floor.session_id)
        .bind(&floor.id)
        .bind(&page_id)
        .bind(serde_json::to_string(confirmed).unwrap_or_else(|_| "[]".into()))
        .bind(now)
        .bind(generating.then_some("running"))
        .bind(generating.then(|| self.instance_id()))
        .fetch_one(c)
        .await
        .map(|row| from_row(&row))?);
        tx.commit().await?;
        Ok(run)
    }

    /// The account's run.
    pub async fn run(&self, account_id: &str, run_id: &str) -> Result<Run> {
        let sql = format!("SELECT {COLUMNS} FROM floor_runs WHERE id = ? AND account_id = ?");
        sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(run_id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        .ok_or_else(|| Error::not_found(format!("run {run_id:?}")))
    }

    /// Commits an open run: its page becomes the floor's active page and its pending
    /// executions `committed`. `apply` runs inside the same transaction so buffered
    /// effects land atomically with the commit.
    pub async fn commit_run(
        &self,
        account_id: &str,
        run_id: &str,
        content: Option<&str>,
    ) -> Result<Committed> {
        if let Some(content) = content {
            super::floors::check_content_fits("content", content)?;
        }
        let run = self.run(account_id, run_id).await?;
        self.commit_loaded(&run, content).await
    }

    /// [`Self::commit_run`] for a run its caller has just read from the
    /// account's runs (a turn's commit of the finished generation): no read
    /// again. What it read of the run does not change once written (floor,
    /// page); whether it is still open is decided by the commit's update.
    pub async fn commit_read_run(&self, run: &Run) -> Result<Committed> {
        self.commit_loaded(run, None).await
    }

    /// Commits `run`, as read, with `content` (already checked) as its page's.
    async fn commit_loaded(&self, run: &Run, content: Option<&str>) -> Result<Committed> {
        let mut tx = self.begin_write().await?;
        // The floor first, as a select takes it: the two never lock a floor
        // and its runs in opposite orders (PostgreSQL).
        make_active(&mut tx, run).await?;
        let committed = self.commit_in(&mut tx, run, content).await?;
        tx.commit().await?;
        Ok(committed)
    }

    /// Commits `run` in `tx` (its page made active by the caller); the run
    /// as committed.
    async fn commit_in(&self, tx: &mut Tx, run: &Run, content: Option<&str>) -> Result<Committed> {
        let run_after = close_run(tx, run, "committed").await?;
        if let Some(content) = content {
            sql!(*tx, c => query("UPDATE pages SET content = ? WHERE id = ?")
                .bind(content)
                .bind(&run.page_id)
                .execute(c)
                .await
                .map(|_| ())?);
        }
        let jobs_queued = self.apply_run_effects(tx, run).await?;
        Ok(Committed {
            run: run_after,
            jobs_queued,
        })
    }

    /// Makes the page of the account's run `run_id` its floor's reply, in one
    /// write transaction: an open run is committed, a committed one's page
    /// becomes active again, and the floor's other open runs are discarded
    /// (those still generating are left, as their generation closes them).
    /// Answers the chosen run and the runs discarded. Two selects on one
    /// floor queue on the floor's row, so they never both commit: the second
    /// finds its run discarded by the first.
    pub async fn select_run(&self, account_id: &str, run_id: &str) -> Result<Selected> {
        let run = self.run(account_id, run_id).await?;
        let mut tx = self.begin_write().await?;
        make_active(&mut tx, &run).await?;
        let state = sql!(tx, c => query_scalar::<String>("SELECT state FROM floor_runs WHERE id = ?")
            .bind(&run.id)
            .fetch_one(c)
            .await?);
        let jobs_queued = match state.as_str() {
            "open" => self.commit_in(&mut tx, &run, None).await?.jobs_queued,
            "committed" => 0,
            _ => return Err(run_not_open(&Run { state, ..run })),
        };
        let others = sql!(tx, c => query(AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM floor_runs WHERE floor_id = ? AND state = 'open' AND id <> ? ORDER BY created_at, id"
        )))
        .bind(&run.floor_id)
        .bind(&run.id)
        .fetch_all(c)
        .await?
        .iter()
        .map(from_row)
        .collect::<Vec<Run>>());
        let mut discarded = Vec::new();
        for other in others {
            match self.discard_in(&mut tx, &other).await {
                Ok(_) => discarded.push(other.id),
                Err(Error::Refused {
                    code:
                        crate::error::ErrorCode::GenerationInProgress
                        | crate::error::ErrorCode::RunNotOpen,
                    ..
                }) => {
                    tracing::info!(run_id = %other.id, "left a run its generation or another request closes")
                }
                Err(error) => return Err(error),
            }
        }
        tx.commit().await?;
        Ok(Selected {
            run: self.run(account_id, run_id).await?,
            discarded,
            jobs_queued,
        })
    }

    /// The account's run that made page `page_id`.
    pub async fn run_of_page(&self, account_id: &str, page_id: &str) -> Result<Run> {
        let sql = format!("SELECT {COLUMNS} FROM floor_runs WHERE page_id = ? AND account_id = ?");
        sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(page_id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        .ok_or_else(|| Error::not_found(format!("page {page_id:?}")))
    }

    /// The runs of the account's floor that are still open, oldest first.
    pub async fn open_runs_of_floor(&self, account_id: &str, floor_id: &str) -> Result<Vec<Run>> {
        self.runs_of_floor_where(account_id, floor_id, "AND state = 'open'")
            .await
    }

    /// Every run of the account's floor, discarded ones included (their pages
    /// are gone), oldest first.
    pub async fn runs_of_floor(&self, account_id: &str, floor_id: &str) -> Result<Vec<Run>> {
        self.runs_of_floor_where(account_id, floor_id, "").await
    }

    async fn runs_of_floor_where(
        &self,
        account_id: &str,
        floor_id: &str,
        condition: &'static str,
    ) -> Result<Vec<Run>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM floor_runs WHERE floor_id = ? AND account_id = ? {condition} ORDER BY created_at, id"
        );
        Ok(sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(floor_id)
            .bind(account_id)
            .fetch_all(c)
            .await?
            .iter()
            .map(from_row)
            .collect()))
    }

    /// Writes the text a run produced into its page (before the run is
    /// committed). A page holds what a client may commit, whoever wrote it,
    /// so that a floor of 100 pages stays a readable answer (a runaway
    /// model's 4 MiB replies made `GET /floors/{id}` 400 MB, probe I).
    pub async fn set_page_content(&self, page_id: &str, content: &str) -> Result<()> {
        super::floors::check_content_fits("the model's reply", content)?;
        sql!(self.conn().await?, c => query("UPDATE pages SET content = ? WHERE id = ?")
            .bind(content)
            .bind(page_id)
            .execute(c)
            .await
            .map(|_| ())?);
        Ok(())
    }

    /// Discards an open run: its pending executions become `discarded`, its page and
    /// its buffered effects are dropped.
    pub async fn discard_run(&self, account_id: &str, run_id: &str) -> Result<Run> {
        let run = self.run(account_id, run_id).await?;
        let mut tx = self.begin_write().await?;
        let discarded = self.discard_in(&mut tx, &run).await?;
        tx.commit().await?;
        Ok(discarded)
    }

    /// Discards, in `tx`, the runs that a dead instance left generating, of
    /// one session or (`None`) of every session (see [`super::cluster`]'s
    /// rule; on an unshared database every instance but this one is dead).
    /// Their ids, for the cancel a paused instance hears.
    pub(super) async fn discard_dead_generations_in(
        &self,
        tx: &mut Tx,
        session_id: Option<&str>,
        stale_before: i64,
    ) -> Result<Vec<String>> {
        let left = dead_generations_sql(session_id.is_some());
        // Built from fixed column names and placeholder numbers only.
        let runs: Vec<Run> = sql!(*tx, c => query(AssertSqlSafe(left))
            .bind(session_id)
            .bind(self.previous_instance())
            .bind(self.instance_id())
            .bind(stale_before)
            .bind(i64::from(self.shared_database()))
            .fetch_all(c)
            .await?
            .iter()
            .map(from_row)
            .collect());
        for run in &runs {
            sql!(*tx, c => query(super::run_generation::END_GENERATION_SQL)
            .bind(super::run_generation::GenerationState::Failed.as_str())
            .bind(&run.id)
            .execute(c)
            .await
            .map(|_| ())?);
            self.discard_in(tx, run).await?;
        }
        Ok(runs.into_iter().map(|run| run.id).collect())
    }

    /// Discards `run` in `tx`: its page goes, its effects are dropped. The
    /// run as discarded.
    async fn discard_in(&self, tx: &mut Tx, run: &Run) -> Result<Run> {
        let discarded = close_run(tx, run, "discarded").await?;
        sql!(*tx, c => query("DELETE FROM pages WHERE id = ?")
            .bind(&run.page_id)
            .execute(c)
            .await
            .map(|_| ())?);
        self.drop_run_effects(tx, run).await?;
        super::approvals::cancel_run_approvals(tx, &run.id).await?;
        Ok(discarded)
    }

    /// The latest earlier execution on the floor (outside `run_id`) with the same
    /// tool and canonical arguments: the call being made now repeats it.
    pub async fn replay_parent(
        &self,
        floor_id: &str,
        run_id: &str,
        tool_name: &str,
        args_canonical: &str,
    ) -> Result<Option<ReplayParent>> {
        self.settle_journal().await?;
        Ok(sql!(self.conn().await?, c => query(
            "SELECT id, attempt_no, replay_safety FROM tool_execution_record \
             WHERE floor_id = ? AND run_id IS NOT NULL AND run_id <> ? AND tool_name = ? AND args_canonical = ? \
             AND provider_started = 1 ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(floor_id)
        .bind(run_id)
        .bind(tool_name)
        .bind(args_canonical)
        .fetch_optional(c)
        .await?
        .map(|row| ReplayParent {
            id: row.get("id"),
            attempt_no: row.get("attempt_no"),
            replay_safety: row.get("replay_safety"),
        })))
    }

    /// At commit: the run's staged jobs become claimable (the outbox is released
    /// in the same transaction as the commit, so a failed turn never starts one),
    /// its calls still awaiting approval are cancelled, and its buffered
    /// sandbox writes land in the session's state.
    async fn apply_run_effects(&self, tx: &mut Tx, run: &Run) -> Result<u64> {
        let applied = super::run_effects::apply_state_effects(tx, &run.id).await?;
        let memories = super::run_generation::apply_run_memories(tx, run).await?;
        tracing::info!(run_id = %run.id, applied, memories, "buffered session-state writes applied at commit");
        release_run_jobs(tx, &run.id).await
    }

    /// At discard: the run's staged jobs are cancelled before they ever start,
    /// and their journal rows finish as blocked; its buffered sandbox writes are
    /// forgotten.
    async fn drop_run_effects(&self, tx: &mut Tx, run: &Run) -> Result<()> {
        let dropped = super::run_effects::drop_state_effects(tx, &run.id).await?;
        super::run_generation::drop_run_memories(tx, run).await?;
        tracing::info!(run_id = %run.id, dropped, "buffered session-state writes dropped at discard");
        cancel_run_jobs(
            tx,
            &run.id,
            "staged",
            crate::reason::ReasonCode::JobRunDiscarded,
            "the run was discarded before this deferred call started; it never ran",
        )
        .await
    }
}

/// Which jobs [`cancel_jobs`] ends.
#[derive(Clone, Copy)]
enum Jobs<'a> {
    /// A run's jobs in one state.
    OfRun {
        run_id: &'a str,
        state: &'static str,
    },
    /// A session's jobs that have not started (the partial index
    /// `runtime_jobs_unstarted_by_session` serves this very condition).
    UnstartedOfSession(&'a str),
}

impl Jobs<'_> {
    /// The `runtime_jobs` condition (one parameter) and its value. States are
    /// this module's constants, written into the statement.
    fn condition(&self) -> (String, &str) {
        match *self {
            Jobs::OfRun { run_id, state } => (format!("run_id = ? AND state = '{state}'"), run_id),
            Jobs::UnstartedOfSession(session_id) => (
                "session_id = ? AND state IN ('staged', 'queued', 'awaiting_approval')".to_owned(),
                session_id,
            ),
        }
    }
}

/// At a run's commit, in one statement: its staged jobs become queued and
/// its calls awaiting approval are cancelled (the turn they belonged to is
/// over); then only the cancelled calls' rows finish `blocked`. A run that
/// held neither, the usual commit, costs one statement instead of three.
/// Answers how many jobs it queued.
async fn release_run_jobs(tx: &mut impl AsHandle, run_id: &str) -> Result<u64> {
    let now = now_ms();
    // SET's expressions read the row as it was, RETURNING as it is now: a
    // returned `cancelled` was awaiting approval.
    let released: Vec<(String, bool)> = sql!(*tx, c => query(
        "UPDATE runtime_jobs SET \
         state = CASE state WHEN 'staged' THEN 'queued' ELSE 'cancelled' END, \
         updated_at = ?1, \
         finished_at = CASE state WHEN 'staged' THEN finished_at ELSE ?1 END, \
         approval_deadline_at = CASE state WHEN 'staged' THEN approval_deadline_at ELSE NULL END \
         WHERE run_id = ?2 AND state IN ('staged', 'awaiting_approval') \
         RETURNING execution_id, state",
    )
    .bind(now)
    .bind(run_id)
    .fetch_all(c)
    .await?
    .iter()
    .map(|row| (row.get::<String>("execution_id"), row.get::<String>("state") == "cancelled"))
    .collect());
    let cancelled: Vec<&str> = released
        .iter()
        .filter(|(_, cancelled)| *cancelled)
        .map(|(id, _)| id.as_str())
        .collect();
    // A run may hold any number of calls: their rows are finished a chunk
    // of ids a statement, not one statement each.
    for ids in cancelled.chunks(EXECUTIONS_PER_STATEMENT) {
        block_executions(
            tx,
            ids,
            crate::reason::ReasonCode::ApprovalCancelled,
            super::approvals::RUN_CLOSED_WHILE_HELD,
            now,
        )
        .await?;
    }
    Ok(released.iter().filter(|(_, cancelled)| !cancelled).count() as u64)
}

/// The update that finishes never-started calls' journal rows `blocked`
/// (finished at, message, reason), up to its `WHERE` condition.
const BLOCK_EXECUTIONS: &str = "UPDATE tool_execution_record SET revision = revision + 1, status = 'blocked', lifecycle_state = 'finished', \
     finished_at = ?, provider_started = 0, error_message = ?, execution_reason_code = ? WHERE";

/// Most journal rows one `blocked` update names by id.
const EXECUTIONS_PER_STATEMENT: usize = 256;

/// Finishes never-started calls' journal rows (`ids`, at most
/// [`EXECUTIONS_PER_STATEMENT`]) `blocked` with `reason`, in one statement.
async fn block_executions(
    tx: &mut impl AsHandle,
    ids: &[&str],
    reason: crate::reason::ReasonCode,
    message: &str,
    now: i64,
) -> Result<()> {
    let placeholders = vec!["?"; ids.len()].join(", ");
    sql!(*tx, c => {
        let mut update = query(AssertSqlSafe(format!("{BLOCK_EXECUTIONS} id IN ({placeholders})")))
            .bind(now)
            .bind(message)
            .bind(reason.as_str());
        for id in ids {
            update = update.bind(*id);
        }
        update.execute(c).await.map(|_| ())?
    });
    Ok(())
}

/// Cancels the run's jobs in `state` before they ever start, and finishes
/// their journal rows `blocked` with `reason`: what a discard does to staged
/// jobs and to calls awaiting approval (a commit: `release_run_jobs`).
pub(super) async fn cancel_run_jobs(
    tx: &mut impl AsHandle,
    run_id: &str,
    state: &'static str,
    reason: crate::reason::ReasonCode,
    message: &str,
) -> Result<()> {
    cancel_jobs(tx, Jobs::OfRun { run_id, state }, reason, message).await
}

/// Cancels `jobs` before they ever start, and finishes their journal rows
/// `blocked` with `reason`.
async fn cancel_jobs(
    tx: &mut impl AsHandle,
    jobs: Jobs<'_>,
    reason: crate::reason::ReasonCode,
    message: &str,
) -> Result<()> {
    let (condition, id) = jobs.condition();
    let now = now_ms();
    sql!(*tx, c => query(AssertSqlSafe(format!(
        "{BLOCK_EXECUTIONS} id IN (SELECT execution_id FROM runtime_jobs WHERE {condition})"
    )))
    .bind(now)
    .bind(message)
    .bind(reason.as_str())
    .bind(id)
    .execute(c)
    .await
    .map(|_| ())?);
    sql!(*tx, c => query(AssertSqlSafe(format!(
        "UPDATE runtime_jobs SET state = 'cancelled', updated_at = ?, finished_at = ?, approval_deadline_at = NULL \
         WHERE {condition}"
    )))
    .bind(now)
    .bind(now)
    .bind(id)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}

/// A run as its commit left it, and how many of its staged jobs the commit
/// made claimable (none: the job workers need not be woken).
#[derive(Debug)]
pub struct Committed {
    pub run: Run,
    pub jobs_queued: u64,
}

/// What choosing a page did: the chosen run as it is now, the runs
/// discarded, and the jobs its commit made claimable (none when it was
/// already committed).
#[derive(Debug)]
pub struct Selected {
    pub run: Run,
    pub discarded: Vec<String>,
    pub jobs_queued: u64,
}

/// Most pages (replies of its committed and open runs) one floor holds: a
/// floor is read whole, each page up to 256 KiB.
pub const MAX_PAGES_PER_FLOOR: i64 = 100;

/// Ends what a session being deleted still holds (in the delete's
/// transaction): its open runs go with it, so their executions' commit
/// outcome becomes `discarded` instead of staying `pending` for ever; and its
/// deferred calls that have not started (staged by an open run, queued, or
/// awaiting approval) are cancelled, their rows `blocked` with
/// `job_session_gone`, so none starts, and none can be approved, for a
/// session that is gone.
pub(super) async fn end_calls_of_deleted_session(
    tx: &mut impl AsHandle,
    session_id: &str,
) -> Result<()> {
    sql!(*tx, c => query(
        "UPDATE tool_execution_record SET revision = revision + 1, commit_outcome = 'discarded' WHERE commit_outcome = 'pending' \
         AND run_id IN (SELECT id FROM floor_runs WHERE session_id = ? AND state = 'open')",
    )
    .bind(session_id)
    .execute(c)
    .await
    .map(|_| ())?);
    cancel_jobs(
        tx,
        Jobs::UnstartedOfSession(session_id),
        crate::reason::ReasonCode::JobSessionGone,
        "the session was deleted before this deferred call started; it never ran",
    )
    .await
}

/// Makes `run`'s page its floor's active page.
async fn make_active(tx: &mut impl AsHandle, run: &Run) -> Result<()> {
    sql!(*tx, c => query("UPDATE floors SET active_page_id = ? WHERE id = ?")
        .bind(&run.page_id)
        .bind(&run.floor_id)
        .execute(c)
        .await
        .map(|_| ())?);
    Ok(())
}

/// Moves an open run to `outcome` (`committed` | `discarded`) together with its
/// pending executions, or refuses when another request already closed it or
/// the generation loop (of any instance) still drives it: the loop ends its
/// run's generation before it closes the run.
async fn close_run(tx: &mut impl AsHandle, run: &Run, outcome: &'static str) -> Result<Run> {
    // The closed row comes back from the update: the callers answered it
    // with a read after their commit, one more round trip.
    let sql = format!(
        "UPDATE floor_runs SET state = ?, finished_at = ? WHERE id = ? AND state = 'open' \
         AND (generation IS NULL OR generation <> 'running') RETURNING {COLUMNS}"
    );
    let closed = sql!(*tx, c => query(AssertSqlSafe(sql))
    .bind(outcome)
    .bind(now_ms())
    .bind(&run.id)
    .fetch_optional(c)
    .await?
    .as_ref()
    .map(from_row));
    let Some(closed) = closed else {
        let state = sql!(*tx, c => query_scalar::<String>("SELECT state FROM floor_runs WHERE id = ?")
            .bind(&run.id)
            .fetch_one(c)
            .await?);
        return Err(match state.as_str() {
            "open" => Error::refused(
                crate::error::ErrorCode::GenerationInProgress,
                format!(
                    "run {} is still generating; wait for run_finished or cancel it",
                    run.id
                ),
            ),
            _ => run_not_open(&Run {
                state,
                ..run.clone()
            }),
        });
    };
    sql!(*tx, c => query(
        "UPDATE tool_execution_record SET revision = revision + 1, commit_outcome = ? WHERE run_id = ? AND commit_outcome = 'pending'",
    )
    .bind(outcome)
    .bind(&run.id)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(closed)
}

fn run_not_open(run: &Run) -> Error {
    Error::refused(
        crate::error::ErrorCode::RunNotOpen,
        format!("run {} is already {}", run.id, run.state),
    )
}

#[cfg(test)]
mod tests {
    use super::super::backend::{Pool, Tx};

    /// A job row of `run_id` in `state`, its call `execution_id`.
    async fn job(pool: &sqlx::SqlitePool, id: &str, run_id: &str, state: &str) {
        sqlx::query(
            "INSERT INTO runtime_jobs (id, account_id, session_id, execution_id, run_id, tool_name, state, \
             invocation_json, created_at, updated_at, approval_deadline_at) \
             VALUES (?1, 'acct', 'sess', 'exec_' || ?1, ?2, 'send_email', ?3, '{}', 1, 1, 99)",
        )
        .bind(id)
        .bind(run_id)
        .bind(state)
        .execute(pool)
        .await
        .unwrap();
    }

    /// A journal row for job `id`'s call, `awaiting_approval`.
    async fn held_row(pool: &sqlx::SqlitePool, id: &str) {
        sqlx::query(
            "INSERT INTO tool_execution_record (id, account_id, session_id, call_id, caller_slot, \
             provider_id, provider_type, tool_name, args_json, args_canonical, status, lifecycle_state, \
             commit_outcome, side_effect_level, replay_safety, started_at, delivery_mode, created_at) \
             VALUES ('exec_' || ?1, 'acct', 'sess', ?1, 'narrator', 'remote', 'remote', 'send_email', '{}', '{}', \
             'awaiting_approval', 'opened', 'pending', 'irreversible', 'unsafe', 1, 'deferred', 1)",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    }

    /// More held calls than one `blocked` update names all end `blocked`,
    /// and a row of a job the release queued is left as it was.
    #[tokio::test]
    async fn releasing_more_held_calls_than_one_statement_names_blocks_every_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::Store::open(None, dir.path()).await.unwrap();
        let Pool::Sqlite(pool) = &store.pool else {
            panic!("Store::open(None, …) opens SQLite");
        };
        let held = super::EXECUTIONS_PER_STATEMENT + 3;
        for n in 0..held {
            let id = format!("held{n:04}");
            job(pool, &id, "run_a", "awaiting_approval").await;
            held_row(pool, &id).await;
        }
        job(pool, "staged", "run_a", "staged").await;
        held_row(pool, "staged").await;
        let mut tx: Tx = store.begin_write().await.unwrap();
        assert_eq!(super::release_run_jobs(&mut tx, "run_a").await.unwrap(), 1);
        tx.commit().await.unwrap();
        let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
            "SELECT id, status, lifecycle_state, execution_reason_code FROM tool_execution_record ORDER BY id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), held + 1);
        for (id, status, lifecycle, reason) in &rows {
            if id == "exec_staged" {
                assert_eq!(
                    (status.as_str(), lifecycle.as_str()),
                    ("awaiting_approval", "opened")
                );
                assert_eq!(reason, &None);
            } else {
                assert_eq!(
                    (status.as_str(), lifecycle.as_str()),
                    ("blocked", "finished"),
                    "{id}"
                );
                assert_eq!(reason.as_deref(), Some("approval_cancelled"), "{id}");
            }
        }
    }

    /// A commit's release queues the run's staged jobs, cancels its held
    /// ones, touches no other run's or state's, and counts only the queued
    /// (the commit wakes the job workers only for those).
    #[tokio::test]
    async fn releasing_a_runs_jobs_queues_the_staged_cancels_the_held_and_counts_the_queued() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::Store::open(None, dir.path()).await.unwrap();
        let Pool::Sqlite(pool) = &store.pool else {
            panic!("Store::open(None, …) opens SQLite");
        };
        for (id, run, state) in [
            ("staged1", "run_a", "staged"),
            ("staged2", "run_a", "staged"),
            ("held", "run_a", "awaiting_approval"),
            ("running", "run_a", "running"),
            ("other", "run_b", "staged"),
        ] {
            job(pool, id, run, state).await;
        }
        let mut tx: Tx = store.begin_write().await.unwrap();
        assert_eq!(super::release_run_jobs(&mut tx, "run_a").await.unwrap(), 2);
        assert_eq!(super::release_run_jobs(&mut tx, "run_c").await.unwrap(), 0);
        tx.commit().await.unwrap();
        let rows: Vec<(String, String, Option<i64>, Option<i64>)> = sqlx::query_as(
            "SELECT id, state, finished_at, approval_deadline_at FROM runtime_jobs ORDER BY id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        let state = |id: &str| rows.iter().find(|row| row.0 == id).unwrap().clone();
        assert_eq!(state("staged1").1, "queued");
        assert_eq!(
            state("staged2"),
            ("staged2".into(), "queued".into(), None, Some(99))
        );
        let held = state("held");
        assert_eq!(held.1, "cancelled");
        assert!(held.2.is_some(), "{held:?}");
        assert_eq!(held.3, None, "{held:?}");
        assert_eq!(state("running").1, "running");
        assert_eq!(state("other").1, "staged");
        let mut again: Tx = store.begin_write().await.unwrap();
        assert_eq!(
            super::release_run_jobs(&mut again, "run_a").await.unwrap(),
            0
        );
    }
    /// A floor's claim looks for its session's dead generations in the
    /// session's own index entries, not through every run of the database.
    #[tokio::test]
    async fn a_claims_search_for_dead_generations_uses_the_sessions_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::Store::open(None, dir.path()).await.unwrap();
        let super::super::backend::Pool::Sqlite(pool) = &store.pool else {
            panic!("Store::open(None, …) opens SQLite");
        };
        let plan: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {}",
            super::dead_generations_sql(true)
        )))
        .fetch_all(pool)
        .await
        .expect("a plan")
        .iter()
        .map(|row| sqlx::Row::get::<String, _>(row, "detail"))
        .collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX floor_runs_by_generation (session_id=?")),
            "{plan:?}"
        );
    }
}
