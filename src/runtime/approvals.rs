//! Human approval of risky calls (`approval_required`): the call path holds
//! such a call as a journal row and a job awaiting an operator; approving
//! queues the job (its result reaches the session like a deferred one),
//! rejecting or the deadline passing ends it `denied`. The sweeper ends the
//! calls nobody decided in time.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use super::dispatch::Opened;
use super::journal_rows::CallJournal;
use crate::call::ToolCallResult;
use crate::catalog::CatalogEntry;
use crate::error::Result;
use crate::journal::ExecutionStatus;
use crate::permissions::ToolPermissions;
use crate::reason::ReasonCode;
use crate::store::{Admission, ApprovalDecision, Decided, ReplayParent};

/// How often the sweeper looks for approvals past their deadline.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Longest reason an operator may give for a rejection, in bytes.
pub const MAX_REJECTION_REASON_BYTES: usize = 2000;

/// The call being held: its entry, validated arguments and replay parent.
pub(super) type Held<'a> = (
    &'a CatalogEntry,
    &'a serde_json::Value,
    Option<&'a ReplayParent>,
);

impl ToolRuntime {
    /// Holds a call that needs approval: a row and job awaiting an operator,
    /// answered like a deferred receipt (`awaiting_approval`), and an
    /// `approval_requested` event to the session's live model sessions. A tool
    /// that cannot be snapshotted cannot wait, and is refused.
    pub(super) async fn hold_for_approval(
        &self,
        journal: &CallJournal<'_>,
        (entry, args, replay): Held<'_>,
        admission: Admission,
        permissions: &ToolPermissions,
    ) -> Result<ToolCallResult> {
        let Some(invocation) = super::dispatch::job_snapshot(entry, journal.call, args) else {
            let message = cannot_be_held(&journal.call.name);
            let reason = ReasonCode::ApprovalUnavailable;
            return journal
                .refused(Some(entry), ExecutionStatus::Denied, reason, message)
                .await;
        };
        let timeout_ms = i64::from(permissions.approval_timeout_seconds) * 1000;
        let deadline_at = crate::ids::now_ms() + timeout_ms;
        let opened = journal
            .hold_for_approval(entry, args, replay, admission, invocation, deadline_at)
            .await?;
        let receipt = match opened {
            Opened::Deferred(receipt) => receipt,
            Opened::Refused(refusal) => {
                return journal.refused_admission(entry, refusal, permissions).await;
            }
            Opened::ReplayBlocked(result) => return Ok(result),
            Opened::Running(_) => unreachable!("a held call never runs inline"),
        };
        let event = crate::model_sessions::ModelSessionEvent::new(
            "approval_requested",
            &json!({
                "execution_id": receipt.execution_id,
                "runtime_job_id": receipt.output["runtime_job_id"],
                "session_id": journal.session.id,
                "tool_name": journal.call.name,
                "arguments": args,
                "call_id": journal.call.call_id,
                "caller_slot": journal.call.caller_slot,
                "run_id": journal.call.run_id,
                "approval_deadline_at": deadline_at,
            }),
        );
        self.publish_to_session(&journal.session.id, event);
        Ok(receipt)
    }

    /// Decides one held call of the account (see `Store::decide_approval`):
    /// an approved one is queued and the workers woken; a rejected one's result
    /// goes to the session at once.
    pub async fn decide_approval(
        &self,
        account_id: &str,
        execution_id: &str,
        decision: ApprovalDecision,
    ) -> Result<Decided> {
        if let ApprovalDecision::Reject { reason } = &decision
            && reason.len() > MAX_REJECTION_REASON_BYTES
        {
            return Err(crate::error::Error::validation(format!(
                "`reason` may be at most {MAX_REJECTION_REASON_BYTES} bytes"
            )));
        }
        let decided = self
            .store
            .decide_approval(account_id, execution_id, &decision)
            .await?;
        match &decided.delivery {
            None => {
                tracing::info!(execution_id = %decided.execution_id, job_id = %decided.runtime_job_id, state = %decided.job_state, "approval granted");
                self.jobs.wake();
            }
            Some(delivery) => {
                tracing::info!(execution_id = %decided.execution_id, reason = ?delivery.output, "approval rejected; the call ends denied");
                self.publish_tool_result(delivery).await;
            }
        }
        Ok(decided)
    }

    /// Ends the held calls past their deadline.
    async fn expire_approvals(&self, failures: &mut crate::failure_log::FailureLog) {
        match self.store.expire_approvals().await {
            Ok(expired) => {
                failures.succeeded();
                for delivery in &expired {
                    tracing::info!(execution_id = %delivery.execution_id, "approval timed out; the call ends denied");
                    self.publish_tool_result(delivery).await;
                }
            }
            Err(error) => failures.failed(&error),
        }
    }
}

/// Why a call that needs approval was refused: its tool cannot wait as a job.
pub(super) fn cannot_be_held(tool: &str) -> String {
    format!(
        "tool {tool:?} needs an operator's approval (approval_required), but it cannot be held for one: only callbacks and MCP tools can; the call was not run"
    )
}

/// Ends held calls past their deadline, every second, until `shutdown`. Held
/// calls survive restarts in the store, so a deadline that passed while the
/// server was down ends at the first sweep.
pub async fn run_approval_sweeper(runtime: ToolRuntime, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(SWEEP_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = crate::failure_log::FailureLog::new("ending timed-out approvals");
    loop {
        tokio::select! {
            _ = ticker.tick() => runtime.expire_approvals(&mut failures).await,
            () = shutdown.cancelled() => break,
        }
    }
}
