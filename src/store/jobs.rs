//! Durable runtime jobs with leases, and the results they deliver to sessions.

use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Row};

use super::Store;
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

const COLUMNS: &str = "id, account_id, session_id, execution_id, run_id, tool_name, state, invocation_json, \
    attempts, result_json, error_message, lease_expires_at, created_at, updated_at, started_at, finished_at";

fn from_row(row: &SqliteRow) -> RuntimeJob {
    let json = |column: &str| {
        row.get::<Option<String>, _>(column)
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
    /// `staged` inside an open run (claimable only after commit), else `queued`.
    pub state: &'static str,
    pub invocation: serde_json::Value,
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
        let mut conn = self.conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let admitted = super::journal::insert_execution_with(&mut tx, row).await?;
        if admitted != super::Admitted::Yes {
            return Ok(admitted);
        }
        insert_job_with(&mut *tx, job).await?;
        tx.commit().await?;
        Ok(admitted)
    }

    /// The account's job.
    pub async fn job(&self, account_id: &str, id: &str) -> Result<RuntimeJob> {
        let sql = format!("SELECT {COLUMNS} FROM runtime_jobs WHERE id = ? AND account_id = ?");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(&mut *self.conn().await?)
            .await?
            .map(|row| from_row(&row))
            .ok_or_else(|| Error::not_found(format!("runtime job {id:?}")))
    }

    /// Claims the oldest queued job for `owner` with a lease until `lease_until`.
    pub async fn claim_job(&self, owner: &str, lease_until: i64) -> Result<Option<RuntimeJob>> {
        let now = now_ms();
        let sql = format!(
            "UPDATE runtime_jobs SET state = 'running', lease_owner = ?, lease_expires_at = ?, \
             attempts = attempts + 1, started_at = ?, updated_at = ? \
             WHERE id = (SELECT id FROM runtime_jobs WHERE state = 'queued' ORDER BY created_at, id LIMIT 1) \
             AND state = 'queued' RETURNING {COLUMNS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(owner)
            .bind(lease_until)
            .bind(now)
            .bind(now)
            .fetch_optional(&mut *self.conn().await?)
            .await?;
        let Some(job) = row.map(|row| from_row(&row)) else {
            return Ok(None);
        };
        sqlx::query(
            "UPDATE tool_execution_record SET status = 'running' WHERE id = ? AND lifecycle_state = 'opened'",
        )
        .bind(&job.execution_id)
        .execute(&mut *self.conn().await?)
        .await?;
        Ok(Some(job))
    }

    /// Extends the lease; false when the lease is no longer ours.
    pub async fn heartbeat_job(&self, id: &str, owner: &str, lease_until: i64) -> Result<bool> {
        let changed = sqlx::query(
            "UPDATE runtime_jobs SET lease_expires_at = ?, updated_at = ? WHERE id = ? AND lease_owner = ? AND state = 'running'",
        )
        .bind(lease_until)
        .bind(now_ms())
        .bind(id)
        .bind(owner)
        .execute(&mut *self.conn().await?)
        .await?
        .rows_affected();
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
        let mut conn = self.conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let job_state = if is_error { "failed" } else { "succeeded" };
        let error_message = is_error.then(|| output.as_str().unwrap_or_default().to_owned());
        let changed = sqlx::query(
            "UPDATE runtime_jobs SET state = ?, result_json = ?, error_message = ?, finished_at = ?, updated_at = ?, \
             lease_expires_at = NULL WHERE id = ? AND lease_owner = ? AND state = 'running'",
        )
        .bind(job_state)
        .bind(output.to_string())
        .bind(&error_message)
        .bind(now)
        .bind(now)
        .bind(&job.id)
        .bind(owner)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 0 {
            return Ok(None);
        }
        let reason_code = settled.reason_code.map(ReasonCode::as_str);
        sqlx::query(
            "UPDATE tool_execution_record SET status = ?, result_json = ?, error_message = ?, execution_reason_code = ?, \
             lifecycle_state = 'finished', finished_at = ?, duration_ms = MAX(0, ? - started_at), provider_started = ?, \
             commit_outcome = CASE WHEN ? = 'uncertain' THEN 'uncertain' ELSE commit_outcome END WHERE id = ?",
        )
        .bind(settled.status.as_str())
        .bind((!is_error).then(|| output.to_string()))
        .bind(&error_message)
        .bind(reason_code)
        .bind(now)
        .bind(now)
        .bind(settled.provider_started)
        .bind(settled.status.as_str())
        .bind(&job.execution_id)
        .execute(&mut *tx)
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
        sqlx::query(
            "INSERT INTO session_deliveries (id, session_id, execution_id, runtime_job_id, call_id, tool_name, output_json, is_error, \
             execution_reason_code, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&delivery.id)
        .bind(&delivery.session_id)
        .bind(&delivery.execution_id)
        .bind(&delivery.runtime_job_id)
        .bind(&delivery.call_id)
        .bind(&delivery.tool_name)
        .bind(delivery.output.to_string())
        .bind(is_error as i64)
        .bind(reason_code)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(delivery))
    }

    /// Jobs whose lease ran out (or, with `all_running`, every running job: the
    /// embedded database has one instance, so at start-up every running job was
    /// lost) become `uncertain` and are never re-run. Returns their ids.
    pub async fn expire_lost_jobs(&self, all_running: bool) -> Result<Vec<String>> {
        let now = now_ms();
        let mut conn = self.conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE runtime_jobs SET state = 'uncertain', updated_at = ?, finished_at = ?, \
             error_message = 'the worker running this job lost its lease; its outcome is unknown and it is not re-run' \
             WHERE state = 'running' AND (? OR lease_expires_at < ?) RETURNING execution_id",
        )
        .bind(now)
        .bind(now)
        .bind(all_running)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        for execution_id in &ids {
            sqlx::query(
                "UPDATE tool_execution_record SET status = 'uncertain', lifecycle_state = 'finished', finished_at = ?, \
                 duration_ms = MAX(0, ? - started_at), error_message = 'the job running this call lost its lease; its outcome is unknown', \
                 execution_reason_code = ? WHERE id = ?",
            )
            .bind(now)
            .bind(now)
            .bind(ReasonCode::JobLeaseLost.as_str())
            .bind(execution_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Results delivered to the account's session, oldest first.
    pub async fn deliveries(&self, account_id: &str, session_id: &str) -> Result<Vec<Delivery>> {
        self.deliveries_where(account_id, session_id, false).await
    }

    /// Delivered results the generation loop has not yet given to the model.
    pub async fn unconsumed_deliveries(
        &self,
        account_id: &str,
        session_id: &str,
    ) -> Result<Vec<Delivery>> {
        self.deliveries_where(account_id, session_id, true).await
    }

    /// Marks deliveries as given to the model.
    pub async fn consume_deliveries(&self, ids: &[String]) -> Result<()> {
        let now = now_ms();
        let mut conn = self.conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            sqlx::query("UPDATE session_deliveries SET consumed_at = ? WHERE id = ? AND consumed_at IS NULL")
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn deliveries_where(
        &self,
        account_id: &str,
        session_id: &str,
        unconsumed_only: bool,
    ) -> Result<Vec<Delivery>> {
        let session = self.session(account_id, session_id).await?;
        let rows = sqlx::query(
            "SELECT id, session_id, execution_id, runtime_job_id, call_id, tool_name, output_json, is_error, \
             execution_reason_code, created_at FROM session_deliveries \
             WHERE session_id = ? AND (? = 0 OR consumed_at IS NULL) ORDER BY created_at, id",
        )
        .bind(&session.id)
        .bind(unconsumed_only)
        .fetch_all(&mut *self.conn().await?)
        .await?;
        Ok(rows
            .iter()
            .map(|row| Delivery {
                id: row.get("id"),
                session_id: row.get("session_id"),
                execution_id: row.get("execution_id"),
                runtime_job_id: row.get("runtime_job_id"),
                call_id: row.get("call_id"),
                tool_name: row.get("tool_name"),
                output: serde_json::from_str(&row.get::<String, _>("output_json"))
                    .unwrap_or(serde_json::Value::Null),
                is_error: row.get::<i64, _>("is_error") != 0,
                execution_reason_code: row
                    .get::<Option<String>, _>("execution_reason_code")
                    .as_deref()
                    .and_then(ReasonCode::parse),
                created_at: row.get("created_at"),
            })
            .collect())
    }
}

async fn insert_job_with<'e>(executor: impl sqlx::SqliteExecutor<'e>, job: &NewJob) -> Result<()> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO runtime_jobs (id, account_id, session_id, execution_id, run_id, tool_name, state, \
         invocation_json, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
    .execute(executor)
    .await?;
    Ok(())
}

impl Store {
    /// Runtime jobs by state, and the queue age (ms) of the oldest claimable
    /// job: what `/metrics` shows about the job queue.
    pub async fn job_queue_stats(&self) -> Result<(Vec<(String, u64)>, Option<i64>)> {
        queue_stats(&mut *self.conn().await?).await
    }

    /// Open and idle connections of the pool.
    pub fn pool_stats(&self) -> (u64, u64) {
        (self.pool.size() as u64, self.pool.num_idle() as u64)
    }

    /// Whether the database takes a write within `limit`: every call writes
    /// its journal row, so a database that reads but cannot write (locked,
    /// read-only, gone) is not ready. The probe writes nothing.
    pub async fn answers_within(&self, limit: std::time::Duration) -> bool {
        let probe = async {
            let mut conn = self.conn().await?;
            let tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            tx.rollback().await
        };
        matches!(tokio::time::timeout(limit, probe).await, Ok(Ok(())))
    }
}

/// Runtime jobs by state, and the queue age (ms) of the oldest claimable job.
pub(super) async fn queue_stats(
    conn: &mut sqlx::SqliteConnection,
) -> Result<(Vec<(String, u64)>, Option<i64>)> {
    let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM runtime_jobs GROUP BY state")
        .fetch_all(&mut *conn)
        .await?;
    let by_state = rows
        .iter()
        .map(|row| (row.get::<String, _>("state"), row.get::<i64, _>("n") as u64))
        .collect();
    let oldest: Option<i64> =
        sqlx::query_scalar("SELECT MIN(updated_at) FROM runtime_jobs WHERE state = 'queued'")
            .fetch_one(&mut *conn)
            .await?;
    Ok((by_state, oldest.map(|at| crate::ids::now_ms() - at)))
}
