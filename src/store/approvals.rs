//! Calls held for an operator's decision: a journal row `awaiting_approval`
//! and a runtime job in state `awaiting_approval` holding the call's snapshot
//! and its deadline. Every decision (approve, reject, the deadline passing, the
//! run closing) is one write transaction that moves the job out of that state,
//! so a call is decided exactly once, by whichever comes first.

use super::Store;
use super::backend::{AsHandle, Record, sql};
use super::jobs::{Delivery, finish_job_execution, insert_delivery};
use crate::call::Settled;
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{new_id, now_ms};
use crate::journal::ExecutionStatus;
use crate::reason::ReasonCode;

/// What an operator decided.
#[derive(Debug, Clone)]
pub enum ApprovalDecision {
    Approve,
    Reject { reason: String },
}

/// A decided approval.
#[derive(Debug, Clone)]
pub struct Decided {
    pub execution_id: String,
    pub runtime_job_id: String,
    pub session_id: String,
    /// The job's state now: `queued`, `staged` (approved inside an open
    /// run: released at its commit) or `cancelled` (rejected).
    pub job_state: String,
    /// The rejection's result for the session (none when approved: the job's
    /// own result follows).
    pub delivery: Option<Delivery>,
}

/// One held call, as the decision reads it.
struct Held {
    job_id: String,
    execution_id: String,
    session_id: String,
    tool_name: String,
    call_id: String,
}

fn held_from(row: &impl Record) -> Held {
    let invocation: String = row.get("invocation_json");
    let call_id = serde_json::from_str::<serde_json::Value>(&invocation)
        .ok()
        .and_then(|value| value["call_id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Held {
        job_id: row.get("id"),
        execution_id: row.get("execution_id"),
        session_id: row.get("session_id"),
        tool_name: row.get("tool_name"),
        call_id,
    }
}

const HELD_COLUMNS: &str = "id, execution_id, session_id, tool_name, invocation_json";

impl Store {
    /// Decides the account's held call `execution_id`: approved, its job is
    /// queued for a worker; rejected, it ends `denied` with the reason and the
    /// session gets that result. 404 for another account's or a missing
    /// execution, 409 `approval_not_pending` when it is not held (any more).
    pub async fn decide_approval(
        &self,
        account_id: &str,
        execution_id: &str,
        decision: &ApprovalDecision,
    ) -> Result<Decided> {
        let mut tx = self.begin_write().await?;
        let approve = matches!(decision, ApprovalDecision::Approve);
        // An approved call of a run that is still open is staged like any
        // deferred call of it: the commit releases it, a discard cancels it.
        // Past its deadline a call is the sweeper's, whoever asks first.
        let sql = format!(
            "UPDATE runtime_jobs SET updated_at = ?2, approval_deadline_at = NULL, \
             state = CASE WHEN ?1 = 0 THEN 'cancelled' \
                 WHEN run_id IS NOT NULL AND EXISTS \
                     (SELECT 1 FROM floor_runs WHERE floor_runs.id = runtime_jobs.run_id AND floor_runs.state = 'open') \
                 THEN 'staged' ELSE 'queued' END, \
             finished_at = CASE WHEN ?1 = 0 THEN ?2 ELSE finished_at END \
             WHERE execution_id = ?3 AND account_id = ?4 AND state = 'awaiting_approval' \
               AND (approval_deadline_at IS NULL OR approval_deadline_at >= ?2) \
             RETURNING {HELD_COLUMNS}, state"
        );
        let now = now_ms();
        let held = sql!(tx, c => query(sqlx::AssertSqlSafe(sql))
            .bind(approve as i64)
            .bind(now)
            .bind(execution_id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(|row| (held_from(row), row.get::<String>("state"))));
        let Some((held, state)) = held else {
            drop(tx);
            return Err(self.not_pending(account_id, execution_id).await?);
        };
        let delivery = match decision {
            ApprovalDecision::Approve => {
                sql!(tx, c => query(
                    "UPDATE tool_execution_record SET revision = revision + 1, status = 'queued' WHERE id = ? AND lifecycle_state = 'opened'",
                )
                .bind(&held.execution_id)
                .execute(c)
                .await
                .map(|_| ())?);
                None
            }
            ApprovalDecision::Reject { reason } => {
                let message = format!("an operator rejected this call: {reason}");
                Some(end_held(&mut tx, &held, ReasonCode::ApprovalRejected, &message, now).await?)
            }
        };
        tx.commit().await?;
        Ok(Decided {
            execution_id: held.execution_id,
            runtime_job_id: held.job_id,
            session_id: held.session_id,
            job_state: state,
            delivery,
        })
    }

    /// 404 when the account has no such execution, else 409.
    async fn not_pending(&self, account_id: &str, execution_id: &str) -> Result<Error> {
        self.settle_journal().await?;
        let exists = sql!(self.conn().await?, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM tool_execution_record WHERE id = ? AND account_id = ?",
        )
        .bind(execution_id)
        .bind(account_id)
        .fetch_one(c)
        .await?);
        Ok(if exists == 0 {
            Error::not_found(format!("tool execution {execution_id:?}"))
        } else {
            Error::refused(
                ErrorCode::ApprovalNotPending,
                format!("tool execution {execution_id} is not awaiting approval"),
            )
        })
    }

    /// Held calls whose deadline has passed end `denied` (`approval_timeout`),
    /// each with a result for its session. One write transaction; the held
    /// state is the guard, so two sweepers end each call once.
    pub async fn expire_approvals(&self) -> Result<Vec<Delivery>> {
        let now = now_ms();
        // Most sweeps find nothing: a read, not a write transaction.
        let due = sql!(self.conn().await?, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM runtime_jobs WHERE approval_deadline_at < ? AND state = 'awaiting_approval'",
        )
        .bind(now)
        .fetch_one(c)
        .await?);
        if due == 0 {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_write().await?;
        let sql = format!(
            "UPDATE runtime_jobs SET state = 'cancelled', updated_at = ?1, finished_at = ?1, approval_deadline_at = NULL \
             WHERE approval_deadline_at < ?1 AND state = 'awaiting_approval' RETURNING {HELD_COLUMNS}"
        );
        let held: Vec<Held> = sql!(tx, c => query(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .fetch_all(c)
            .await?
            .iter()
            .map(held_from)
            .collect());
        let mut deliveries = Vec::with_capacity(held.len());
        for call in &held {
            let message = "nobody approved or rejected this call within approval_timeout_seconds; it never ran";
            deliveries
                .push(end_held(&mut tx, call, ReasonCode::ApprovalTimeout, message, now).await?);
        }
        tx.commit().await?;
        Ok(deliveries)
    }
}

/// Ends a held call that never ran: its row `denied` with `reason`, and the
/// result its session is given.
async fn end_held(
    tx: &mut impl AsHandle,
    held: &Held,
    reason: ReasonCode,
    message: &str,
    now: i64,
) -> Result<Delivery> {
    let settled = Settled {
        status: ExecutionStatus::Denied,
        output: serde_json::Value::String(message.to_owned()),
        is_error: true,
        provider_started: false,
        reason_code: Some(reason),
    };
    finish_job_execution(tx, &held.execution_id, &settled, Some(message), now).await?;
    let delivery = Delivery {
        id: new_id("delivery"),
        session_id: held.session_id.clone(),
        execution_id: held.execution_id.clone(),
        runtime_job_id: Some(held.job_id.clone()),
        call_id: held.call_id.clone(),
        tool_name: held.tool_name.clone(),
        output: settled.output,
        is_error: true,
        execution_reason_code: Some(reason),
        created_at: now,
    };
    insert_delivery(tx, &delivery).await?;
    Ok(delivery)
}

/// The journal's message for a call cancelled because its run closed while
/// it awaited approval.
pub(super) const RUN_CLOSED_WHILE_HELD: &str =
    "the run was committed or discarded while this call awaited approval; it never ran";

/// At a run's discard (a commit does it in `runs::release_run_jobs`): its
/// held calls are cancelled (`blocked`, `approval_cancelled`); the turn they
/// belonged to is over, so no result is delivered.
pub(super) async fn cancel_run_approvals(tx: &mut impl AsHandle, run_id: &str) -> Result<()> {
    super::runs::cancel_run_jobs(
        tx,
        run_id,
        "awaiting_approval",
        ReasonCode::ApprovalCancelled,
        RUN_CLOSED_WHILE_HELD,
    )
    .await
}
