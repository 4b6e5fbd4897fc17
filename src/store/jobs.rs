//! Durable runtime jobs with leases, and the results they deliver to sessions.

use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{AsHandle, Record, sql, storable_text};
use super::page_bytes::{row_bytes, take_within};
use crate::domain::PageRequest;
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};
use crate::reason::ReasonCode;

/// A deferred tool call waiting for, or run by, a worker.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RuntimeJob {
    pub id: String,
    pub session_id: String,
    pub execution_id: String,
    pub run_id: Option<String>,
    pub tool_name: String,
    /// `staged` | `queued` | `running` | `succeeded` | `failed` | `uncertain` | `cancelled`
    pub state: String,
    pub attempts: i64,
    #[schema(value_type = Object)]
    pub result: serde_json::Value,
    pub error_message: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    #[serde(skip)]
    pub account_id: String,
    #[serde(skip)]
    pub invocation: serde_json::Value,
}

/// A tool result delivered to a session after its turn, for the model's next one.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Delivery {
    pub id: String,
    pub session_id: String,
    pub execution_id: String,
    pub runtime_job_id: Option<String>,
    pub call_id: String,
    pub tool_name: String,
    #[schema(value_type = Object)]
    pub output: serde_json::Value,
    pub is_error: bool,
    /// Why the job's call did not succeed; null on success (the journal row's
    /// `execution_reason_code`).
    pub execution_reason_code: Option<ReasonCode>,
    pub created_at: i64,
}

/// A delivered result's columns, in `delivery_from_row`'s terms.
const DELIVERY_COLUMNS: &str = "id, session_id, execution_id, runtime_job_id, call_id, tool_name, \
    output_json, is_error, execution_reason_code, created_at";

const COLUMNS: &str = "id, account_id, session_id, execution_id, run_id, tool_name, state, invocation_json, \
    attempts, result_json, error_message, lease_expires_at, created_at, updated_at, started_at, finished_at";

fn from_row(row: &impl Record) -> RuntimeJob {
    let json = |column: &'static str| {
        row.get::<Option<String>>(column)
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    RuntimeJob {
        id: row.get("id"),
        account_id: row.get("account_id"),
        session_id: row.get("session_id"),
        execution_id: row.get("execution_id"),
        run_id: row.get("run_id"),
        tool_name: row.get("tool_name"),
        state: row.get("state"),
        invocation: json("invocation_json"),
        attempts: row.get("attempts"),
        result: json("result_json"),
        error_message: row.get("error_message"),
        lease_expires_at: row.get("lease_expires_at"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
    }
}

/// A new job as the call path writes it.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: String,
    pub account_id: String,
    pub session_id: String,
    pub execution_id: String,
    pub run_id: Option<String>,
    pub tool_name: String,
    /// `staged` inside an open run (claimable only after commit), else `queued`;
    /// `awaiting_approval` until an operator decides.
    pub state: &'static str,
    pub invocation: serde_json::Value,
    /// When an approval not decided by then ends `denied` (`approval_timeout`).
    pub approval_deadline_at: Option<i64>,
}

impl Store {
    /// Writes a deferred call's journal row and its job in one transaction, so
    /// that neither can exist without the other, if the row is admitted (its run
    /// still open, within its limits): a run that closes first never gets a
    /// staged job it would neither release nor cancel.
    pub async fn insert_deferred(
        &self,
        row: &super::NewExecution,
        job: &NewJob,
    ) -> Result<super::Admitted> {
        let mut tx = self.begin_write().await?;
        let admitted =
            super::journal::insert_execution_with(&mut tx, row, self.instance_id()).await?;
        if admitted != super::Admitted::Yes {
            return Ok(admitted);
        }
        insert_job_with(&mut tx, job).await?;
        tx.commit().await?;
        Ok(admitted)
    }

    /// The account's job.
    pub async fn job(&self, account_id: &str, id: &str) -> Result<RuntimeJob> {
        let sql = format!("SELECT {COLUMNS} FROM runtime_jobs WHERE id = ? AND account_id = ?");
        sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        .ok_or_else(|| Error::not_found(format!("runtime job {id:?}")))
    }

    /// Claims the oldest queued job for `owner` with a lease until `lease_until`.
    pub async fn claim_job(&self, owner: &str, lease_until: i64) -> Result<Option<RuntimeJob>> {
        self.settle_journal().await?;
        let now = now_ms();
        let mut conn = self.conn().await?;
        let job = sql!(conn, c => {
            // SQLite runs one write at a time, so two claims never pick the same
            // job. PostgreSQL runs them side by side: the pick locks its row and
            // skips rows another claim has locked, so concurrent claims (of any
            // instance) take different jobs instead of one waiting on the other's
            // row and then finding it no longer queued.
            let pick = if POSTGRES {
                "SELECT id FROM runtime_jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1 \
                 FOR UPDATE SKIP LOCKED"
            } else {
                "SELECT id FROM runtime_jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1"
            };
            let sql = format!(
                "UPDATE runtime_jobs SET state = 'running', lease_owner = ?, lease_expires_at = ?, \
                 attempts = attempts + 1, started_at = ?, updated_at = ? \
                 WHERE id = ({pick}) AND state = 'queued' RETURNING {COLUMNS}"
            );
            query(AssertSqlSafe(sql))
                .bind(owner)
                .bind(lease_until)
                .bind(now)
                .bind(now)
                .fetch_optional(c)
                .await?
                .as_ref()
                .map(from_row)
        });
        let Some(job) = job else {
            return Ok(None);
        };
        sql!(conn, c => query(
            "UPDATE tool_execution_record SET revision = revision + 1, status = 'running' WHERE id = ? AND lifecycle_state = 'opened'",
        )
        .bind(&job.execution_id)
        .execute(c)
        .await
        .map(|_| ())?);
        Ok(Some(job))
    }

    /// Extends the lease; false when the lease is no longer ours.
    /// The claim is the job's attempt: after a re-delivery, the lost
    /// attempt's heartbeat (same instance, same owner) no longer holds it.
    pub async fn heartbeat_job(
        &self,
        job: &RuntimeJob,
        owner: &str,
        lease_until: i64,
    ) -> Result<bool> {
        let changed = sql!(self.conn().await?, c => query(
            "UPDATE runtime_jobs SET lease_expires_at = ?, updated_at = ? \
             WHERE id = ? AND lease_owner = ? AND state = 'running' AND attempts = ?",
        )
        .bind(lease_until)
        .bind(now_ms())
        .bind(&job.id)
        .bind(owner)
        .bind(job.attempts)
        .execute(c)
        .await?
        .rows_affected());
        Ok(changed == 1)
    }

    /// Finishes a job we still hold, its journal row and its delivery, atomically.
    /// Returns the delivery, or None when the lease had been lost.
    pub async fn complete_job(
        &self,
        job: &RuntimeJob,
        owner: &str,
        settled: &crate::call::Settled,
        call_id: &str,
    ) -> Result<Option<Delivery>> {
        let (output, is_error) = (&settled.output, settled.is_error);
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let job_state = if is_error { "failed" } else { "succeeded" };
        let error_message = is_error.then(|| output.as_str().unwrap_or_default().to_owned());
        let changed = sql!(tx, c => query(
            "UPDATE runtime_jobs SET state = ?, result_json = ?, error_message = ?, finished_at = ?, updated_at = ?, \
             lease_expires_at = NULL WHERE id = ? AND lease_owner = ? AND state = 'running' AND attempts = ?",
        )
        .bind(job_state)
        .bind(output.to_string())
        .bind(error_message.as_deref().map(storable_text))
        .bind(now)
        .bind(now)
        .bind(&job.id)
        .bind(owner)
        .bind(job.attempts)
        .execute(c)
        .await?
        .rows_affected());
        if changed == 0 {
            return Ok(None);
        }
        finish_job_execution(
            &mut tx,
            &job.execution_id,
            settled,
            error_message.as_deref(),
            now,
        )
        .await?;
        let delivery = Delivery {
            id: new_id("delivery"),
            session_id: job.session_id.clone(),
            execution_id: job.execution_id.clone(),
            runtime_job_id: Some(job.id.clone()),
            call_id: call_id.to_owned(),
            tool_name: job.tool_name.clone(),
            output: output.clone(),
            is_error,
            execution_reason_code: settled.reason_code,
            created_at: now,
        };
        insert_delivery(&mut tx, &delivery).await?;
        tx.commit().await?;
        Ok(Some(delivery))
    }

    /// Jobs whose lease ran out (or, with `all_running`, every running job: the
    /// embedded database has one instance, so at start-up every running job was
    /// lost; or whose lease `dead_owner` holds, an instance known to be dead).
    /// A replay-safe tool's job is handed over again under the same
    /// idempotency key, at most [`MAX_JOB_ATTEMPTS`] times in all; every other
    /// becomes `uncertain` and is never re-run. One write transaction.
    pub async fn expire_lost_jobs(
        &self,
        all_running: bool,
        dead_owner: Option<&str>,
    ) -> Result<LostJobs> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        let lost: Vec<LostJob> = sql!(tx, c => query_as(
            "SELECT id, execution_id, invocation_json, attempts, session_id, tool_name FROM runtime_jobs \
             WHERE state = 'running' AND (?2 = 1 OR lease_expires_at < ?1 OR lease_owner = ?3)",
        )
        .bind(now)
        .bind(all_running as i64)
        .bind(dead_owner)
        .fetch_all(c)
        .await?);
        let mut outcome = LostJobs::default();
        let lost_now = LostNow {
            now,
            all_running,
            dead_owner,
        };
        for (job_id, execution_id, invocation, attempts, session_id, tool_name) in lost {
            let again = redeliverable(&invocation, attempts);
            if !take_lost_job(&mut tx, &job_id, &lost_now, again).await? {
                continue;
            }
            if again {
                requeue_row(&mut tx, &execution_id).await?;
                outcome.redelivered.push(execution_id);
                continue;
            }
            end_row_uncertain(&mut tx, &execution_id, now).await?;
            // The model was given a receipt for this call: it is told how
            // the call ended, as for any other finished job.
            let delivery = Delivery {
                id: new_id("delivery"),
                session_id,
                execution_id: execution_id.clone(),
                runtime_job_id: Some(job_id),
                call_id: call_id_of(&invocation),
                tool_name,
                output: serde_json::Value::String(LEASE_LOST.to_owned()),
                is_error: true,
                execution_reason_code: Some(ReasonCode::JobLeaseLost),
                created_at: now,
            };
            insert_delivery(&mut tx, &delivery).await?;
            outcome.uncertain.push(execution_id);
            outcome.delivered.push(delivery);
        }
        tx.commit().await?;
        Ok(outcome)
    }

    /// Results delivered to the account's session, oldest first.
    /// A page of the results delivered to the account's session, oldest
    /// first (or newest first), and how many the session has.
    pub async fn deliveries_page(
        &self,
        account_id: &str,
        session_id: &str,
        range: &PageRequest,
    ) -> Result<(Vec<Delivery>, i64)> {
        let session = self.session(account_id, session_id).await?;
        let order = range.sort_order.sql();
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS}, CAST(octet_length(output_json) AS BIGINT) AS output_bytes \
             FROM session_deliveries \
             WHERE session_id = ? ORDER BY created_at {order}, id {order} LIMIT ? OFFSET ?"
        );
        let mut conn = self.conn().await?;
        // 200 results of 1 MB read whole took the server 700 MB a request.
        let (deliveries, _) = sql!(conn, c => take_within(
            query(AssertSqlSafe(sql))
                .bind(&session.id)
                .bind(range.limit)
                .bind(range.offset)
                .fetch(c),
            |row| (delivery_from_row(&row), row_bytes(&row, "output_bytes")),
        )
        .await?);
        let total = sql!(conn, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM session_deliveries WHERE session_id = ?",
        )
        .bind(&session.id)
        .fetch_one(c)
        .await?);
        Ok((deliveries, total))
    }

    /// The oldest `limit` delivered results the generation loop has not yet
    /// given to the model.
    pub async fn unconsumed_deliveries(
        &self,
        account_id: &str,
        session_id: &str,
        limit: i64,
    ) -> Result<Vec<Delivery>> {
        let session = self.session(account_id, session_id).await?;
        Ok(sql!(self.conn().await?, c => query(
            AssertSqlSafe(format!(
                "SELECT {DELIVERY_COLUMNS} FROM session_deliveries \
                 WHERE session_id = ? AND consumed_at IS NULL ORDER BY created_at, id LIMIT ?"
            )),
        )
        .bind(&session.id)
        .bind(limit)
        .fetch_all(c)
        .await?
        .iter()
        .map(delivery_from_row)
        .collect()))
    }

    /// Marks deliveries as given to the model.
    pub async fn consume_deliveries(&self, ids: &[String]) -> Result<()> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        for id in ids {
            sql!(tx, c => query(
                "UPDATE session_deliveries SET consumed_at = ? WHERE id = ? AND consumed_at IS NULL",
            )
            .bind(now)
            .bind(id)
            .execute(c)
            .await
            .map(|_| ())?);
        }
        tx.commit().await?;
        Ok(())
    }
}

fn delivery_from_row(row: &impl Record) -> Delivery {
    Delivery {
        id: row.get("id"),
        session_id: row.get("session_id"),
        execution_id: row.get("execution_id"),
        runtime_job_id: row.get("runtime_job_id"),
        call_id: row.get("call_id"),
        tool_name: row.get("tool_name"),
        output: serde_json::from_str(&row.get::<String>("output_json"))
            .unwrap_or(serde_json::Value::Null),
        is_error: row.get::<i64>("is_error") != 0,
        execution_reason_code: row
            .get::<Option<String>>("execution_reason_code")
            .as_deref()
            .and_then(ReasonCode::parse),
        created_at: row.get("created_at"),
    }
}

/// Finishes the journal row of a completed job (in the completion's transaction).
pub(super) async fn finish_job_execution(
    conn: &mut impl AsHandle,
    execution_id: &str,
    settled: &crate::call::Settled,
    error_message: Option<&str>,
    now: i64,
) -> Result<()> {
    let result = (!settled.is_error).then(|| settled.output.to_string());
    sql!(*conn, c => query(
        "UPDATE tool_execution_record SET revision = revision + 1, status = ?1, result_json = ?2, error_message = ?3, execution_reason_code = ?4, \
         lifecycle_state = 'finished', finished_at = ?5, \
         duration_ms = CASE WHEN ?5 > started_at THEN ?5 - started_at ELSE 0 END, provider_started = ?6, \
         commit_outcome = CASE WHEN ?1 = 'uncertain' THEN 'uncertain' ELSE commit_outcome END WHERE id = ?7",
    )
    .bind(settled.status.as_str())
    .bind(&result)
    .bind(error_message.map(storable_text))
    .bind(settled.reason_code.map(ReasonCode::as_str))
    .bind(now)
    .bind(settled.provider_started as i64)
    .bind(execution_id)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}

/// Writes a job's delivery to its session (in the completion's transaction);
/// none when the session was deleted since the call, which leaves no one to
/// deliver to. A missing session must not fail the completion: the journal
/// row is finished in the same transaction, and the approval sweep ends every
/// due call in one.
pub(super) async fn insert_delivery(conn: &mut impl AsHandle, delivery: &Delivery) -> Result<()> {
    sql!(*conn, c => query(
        "INSERT INTO session_deliveries (id, session_id, execution_id, runtime_job_id, call_id, tool_name, output_json, is_error, \
         execution_reason_code, created_at) SELECT ?, id, ?, ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE id = ?",
    )
    .bind(&delivery.id)
    .bind(&delivery.execution_id)
    .bind(&delivery.runtime_job_id)
    .bind(&delivery.call_id)
    .bind(&delivery.tool_name)
    .bind(delivery.output.to_string())
    .bind(delivery.is_error as i64)
    .bind(delivery.execution_reason_code.map(ReasonCode::as_str))
    .bind(delivery.created_at)
    .bind(&delivery.session_id)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}

async fn insert_job_with(conn: &mut impl AsHandle, job: &NewJob) -> Result<()> {
    let now = now_ms();
    sql!(*conn, c => query(
        "INSERT INTO runtime_jobs (id, account_id, session_id, execution_id, run_id, tool_name, state, \
         invocation_json, created_at, updated_at, approval_deadline_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&job.id)
    .bind(&job.account_id)
    .bind(&job.session_id)
    .bind(&job.execution_id)
    .bind(&job.run_id)
    .bind(&job.tool_name)
    .bind(job.state)
    .bind(job.invocation.to_string())
    .bind(now)
    .bind(now)
    .bind(job.approval_deadline_at)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}

impl Store {
    /// Runtime jobs by state, and the queue age (ms) of the oldest claimable
    /// job: what `/metrics` shows about the job queue.
    pub async fn job_queue_stats(&self) -> Result<(Vec<(String, u64)>, Option<i64>)> {
        queue_stats(&mut self.conn().await?).await
    }

    /// Open and idle connections of the pool.
    pub fn pool_stats(&self) -> (u64, u64) {
        let (open, idle) = self.pool.sizes();
        (u64::from(open), idle as u64)
    }

    /// Whether the database takes a write within `limit`: every call writes
    /// its journal row, so a database that reads but cannot write (locked,
    /// read-only, gone) is not ready. The probe writes nothing.
    pub async fn answers_within(&self, limit: std::time::Duration) -> bool {
        let probe = async {
            // Dropping the transaction rolls it back.
            drop(self.pool.begin_write().await?);
            Ok::<(), sqlx::Error>(())
        };
        matches!(tokio::time::timeout(limit, probe).await, Ok(Ok(())))
    }
}

/// Runtime jobs by state, and the queue age (ms) of the oldest claimable job.
pub(super) async fn queue_stats(
    conn: &mut impl AsHandle,
) -> Result<(Vec<(String, u64)>, Option<i64>)> {
    let by_state = sql!(*conn, c => query(
        "SELECT state, COUNT(*) AS n FROM runtime_jobs GROUP BY state",
    )
    .fetch_all(c)
    .await?
    .iter()
    .map(|row| (row.get::<String>("state"), row.get::<i64>("n") as u64))
    .collect::<Vec<_>>());
    let oldest = sql!(*conn, c => query_scalar::<Option<i64>>(
        "SELECT MIN(updated_at) FROM runtime_jobs WHERE state = 'queued'",
    )
    .fetch_one(c)
    .await?);
    Ok((by_state, oldest.map(|at| crate::ids::now_ms() - at)))
}

/// How many times in all a replay-safe job is handed to its provider when
/// workers keep losing it.
pub const MAX_JOB_ATTEMPTS: i64 = 3;

/// What `expire_lost_jobs` did, by execution id.
#[derive(Debug, Default)]
pub struct LostJobs {
    /// Queued again for another hand-over under the same idempotency key.
    pub redelivered: Vec<String>,
    /// Ended `uncertain` (`job_lease_lost`).
    pub uncertain: Vec<String>,
    /// What the sessions of the uncertain ones were given (one each).
    pub delivered: Vec<Delivery>,
}

/// A running job whose lease is lost: id, execution, invocation, attempts,
/// session and tool.
type LostJob = (String, String, String, i64, String, String);

/// What a session is told of a call whose job lost its lease.
const LEASE_LOST: &str = "the job running this call lost its lease; its outcome is unknown";

/// The model's id of the call a job's invocation ran (empty when unreadable).
fn call_id_of(invocation: &str) -> String {
    #[derive(serde::Deserialize)]
    struct CallId {
        call_id: String,
    }
    serde_json::from_str::<CallId>(invocation)
        .map(|c| c.call_id)
        .unwrap_or_default()
}

/// Whether a lost job may be handed over again: its tool was replay-safe
/// when it was called (a snapshot without that fact never is), and it has
/// attempts left.
fn redeliverable(invocation: &str, attempts: i64) -> bool {
    #[derive(serde::Deserialize)]
    struct Safety {
        replay_safety: Option<crate::domain::tool::ReplaySafety>,
    }
    let safe = serde_json::from_str::<Safety>(invocation)
        .is_ok_and(|s| s.replay_safety == Some(crate::domain::tool::ReplaySafety::Safe));
    safe && attempts < MAX_JOB_ATTEMPTS
}

/// What makes a running job lost, as `expire_lost_jobs` was asked.
struct LostNow<'a> {
    now: i64,
    all_running: bool,
    dead_owner: Option<&'a str>,
}

/// Moves a lost job out of `running`: queued again (`again`) or ended
/// `uncertain`. False when it turned out not to be lost: the lease is checked
/// again here, because a heartbeat may have renewed it since the read
/// (PostgreSQL's heartbeats take no write lock).
async fn take_lost_job(
    tx: &mut impl AsHandle,
    job_id: &str,
    lost: &LostNow<'_>,
    again: bool,
) -> Result<bool> {
    let changed = sql!(*tx, c => query(
        "UPDATE runtime_jobs SET updated_at = ?1, lease_owner = NULL, lease_expires_at = NULL, \
         state = CASE WHEN ?5 = 1 THEN 'queued' ELSE 'uncertain' END, \
         finished_at = CASE WHEN ?5 = 1 THEN finished_at ELSE ?1 END, \
         error_message = CASE WHEN ?5 = 1 THEN error_message ELSE \
             'the worker running this job lost its lease; its outcome is unknown and it is not re-run' END \
         WHERE id = ?4 AND state = 'running' AND (?2 = 1 OR lease_expires_at < ?1 OR lease_owner = ?3)",
    )
    .bind(lost.now)
    .bind(lost.all_running as i64)
    .bind(lost.dead_owner)
    .bind(job_id)
    .bind(again as i64)
    .execute(c)
    .await?
    .rows_affected());
    Ok(changed == 1)
}

/// A re-queued job's row waits again, still opened.
async fn requeue_row(tx: &mut impl AsHandle, execution_id: &str) -> Result<()> {
    sql!(*tx, c => query(
        "UPDATE tool_execution_record SET revision = revision + 1, status = 'queued' WHERE id = ? AND lifecycle_state = 'opened'",
    )
    .bind(execution_id)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}

/// An ended lost job's row: `uncertain`, `job_lease_lost`.
async fn end_row_uncertain(tx: &mut impl AsHandle, execution_id: &str, now: i64) -> Result<()> {
    sql!(*tx, c => query(
        "UPDATE tool_execution_record SET revision = revision + 1, status = 'uncertain', lifecycle_state = 'finished', finished_at = ?1, \
         duration_ms = CASE WHEN ?1 > started_at THEN ?1 - started_at ELSE 0 END, \
         error_message = ?4, \
         execution_reason_code = ?2 WHERE id = ?3 AND lifecycle_state = 'opened'",
    )
    .bind(now)
    .bind(ReasonCode::JobLeaseLost.as_str())
    .bind(execution_id)
    .bind(LEASE_LOST)
    .execute(c)
    .await
    .map(|_| ())?);
    Ok(())
}
