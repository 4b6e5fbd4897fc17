//! Dry-run replay of a past run: every call of the run re-evaluated against
//! today's catalog and permissions through the call path's own checks
//! ([`ToolRuntime::evaluate`]), without starting a provider or writing a row.

use serde::Serialize;

use super::ToolRuntime;
use super::dispatch::{NotRun, ReplayScope, Verdict};
use super::journal_rows::{lookup_refusal, replay_blocked_message};
use crate::call::{CallArguments, ToolCall};
use crate::domain::tool::Slot;
use crate::error::{Error, Result};
use crate::ids::new_id;
use crate::journal::{ExecutionRecord, ExecutionStatus};
use crate::store::Run;

/// The most calls of one run a dry run re-evaluates (the oldest ones).
pub const DRY_RUN_MAX_CALLS: i64 = 1000;

/// What the call path would do with a recorded call today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DryRunVerdict {
    /// Every check passes: the call would start its provider.
    WouldRun,
    /// A permission rule refuses it (`reason` names the rule).
    WouldBeDenied,
    /// The catalog cannot run the name: unknown, offered by several providers,
    /// or unavailable (`reason` says which).
    ToolMissing,
    /// The recorded arguments do not satisfy the tool's schema today (`reason`
    /// is the schema error).
    ArgumentsInvalid,
    /// The replay guard would block it in a new run on the floor until the
    /// execution it repeats is confirmed (`reason` names that execution).
    NeedsReplayConfirmation,
}

/// One recorded call and today's verdict on it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DryRunCall {
    /// The journal row of the original call.
    pub execution_id: String,
    pub tool_name: String,
    pub verdict: DryRunVerdict,
    /// Why the call would not run (the message the model would see); null for
    /// `would_run`.
    pub reason: Option<String>,
    /// The journal's status of the original call.
    pub recorded_status: ExecutionStatus,
}

/// The answer of a dry-run replay.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DryRun {
    pub run_id: String,
    /// The run's calls, oldest first (at most [`DRY_RUN_MAX_CALLS`]).
    pub calls: Vec<DryRunCall>,
}

impl ToolRuntime {
    /// Re-evaluates every call of the account's run (open, committed or
    /// discarded) as the call path would decide it now, each with its own
    /// caller slot and recorded arguments. The replay guard is asked about a
    /// new run on the run's floor holding the run's confirmed executions: a
    /// not-replay-safe execution of the same tool and arguments on the floor
    /// (the original call itself included, when it reached its provider) that
    /// is not among them makes the verdict `needs_replay_confirmation`.
    /// Nothing is journalled, no provider starts, and the run is unchanged.
    pub async fn dry_run_replay(&self, account_id: &str, run_id: &str) -> Result<DryRun> {
        let run = self.store.run(account_id, run_id).await?;
        let session = self.store.session(account_id, &run.session_id).await?;
        let ids = self
            .store
            .run_execution_ids(account_id, &run.id, DRY_RUN_MAX_CALLS)
            .await?;
        let catalog = self.catalog(&session).await?;
        // A run that does not exist yet: every execution on the floor is an
        // earlier attempt's.
        let next_run_id = new_id("floorrun");
        let replay = ReplayScope {
            floor_id: &run.floor_id,
            run_id: &next_run_id,
            confirmed: &run.confirmed_execution_ids,
        };
        let mut calls = Vec::with_capacity(ids.len());
        // One row at a time: a run's thousand rows of megabyte arguments read
        // at once took gigabytes (probe I); each is dropped once decided.
        for id in &ids {
            let Some(row) = self.store.execution(account_id, id).await? else {
                continue; // its session was deleted meanwhile
            };
            let row = &row;
            let call = recorded_call(row, &run)?;
            let verdict = self
                .evaluate(&session, &catalog, &call, Some(replay))
                .await?;
            calls.push(dry_run_call(row, &call, verdict));
        }
        log_dry_run(&run, &calls);
        Ok(DryRun {
            run_id: run.id,
            calls,
        })
    }
}

/// The call a journal row recorded, as the call path would receive it again.
/// A refused call's row holds its raw argument text when it did not parse; it
/// parses (and fails) the same way again.
fn recorded_call(row: &ExecutionRecord, run: &Run) -> Result<ToolCall> {
    Ok(ToolCall {
        name: row.tool_name.clone(),
        arguments: CallArguments::from_json(Some(row.args.to_value())),
        call_id: row.call_id.clone(),
        caller_slot: Slot::parse(&row.caller_slot).map_err(|err| {
            Error::Internal(anyhow::anyhow!(
                "journal row {} holds caller_slot {:?}: {err}",
                row.id,
                row.caller_slot
            ))
        })?,
        floor_id: Some(run.floor_id.clone()),
        run_id: Some(run.id.clone()),
        step: None,
    })
}

/// Today's verdict on one recorded call, in the answer's words.
fn dry_run_call(row: &ExecutionRecord, call: &ToolCall, verdict: Verdict<'_>) -> DryRunCall {
    let (verdict, reason) = match verdict {
        // As the call path decides it: a tool that cannot wait as a job is
        // refused when it needs approval.
        Ok(checked)
            if checked
                .permissions
                .needs_approval(&row.tool_name, &checked.entry.spec.metadata)
                && super::dispatch::job_snapshot(checked.entry, call, &checked.args).is_none() =>
        {
            (
                DryRunVerdict::WouldBeDenied,
                Some(super::approvals::cannot_be_held(&row.tool_name)),
            )
        }
        // It would run once an operator approves it: not refused, so the
        // verdict is would_run, and the reason says it waits.
        Ok(checked)
            if checked
                .permissions
                .needs_approval(&row.tool_name, &checked.entry.spec.metadata) =>
        {
            (
                DryRunVerdict::WouldRun,
                Some(
                    "it would wait for an operator's approval first (approval_required)".to_owned(),
                ),
            )
        }
        Ok(_) => (DryRunVerdict::WouldRun, None),
        Err(NotRun::NotCallable(refused)) => {
            let (_, _, message) = lookup_refusal(&row.tool_name, refused);
            (DryRunVerdict::ToolMissing, Some(message))
        }
        Err(NotRun::Denied { refusal, .. }) => (
            DryRunVerdict::WouldBeDenied,
            Some(refusal.message(&row.tool_name)),
        ),
        Err(NotRun::ArgumentsInvalid { problem, .. }) => {
            (DryRunVerdict::ArgumentsInvalid, Some(problem))
        }
        Err(NotRun::ReplayBlocked { parent, .. }) => (
            DryRunVerdict::NeedsReplayConfirmation,
            Some(replay_blocked_message(&row.tool_name, &parent)),
        ),
    };
    DryRunCall {
        execution_id: row.id.clone(),
        tool_name: row.tool_name.clone(),
        verdict,
        reason,
        recorded_status: row.status,
    }
}

/// The dry run's log line: the run, its session and how many calls got each
/// verdict (string fields escaped).
fn log_dry_run(run: &Run, calls: &[DryRunCall]) {
    let count = |verdict| calls.iter().filter(|c| c.verdict == verdict).count();
    tracing::info!(
        run_id = ?run.id,
        session_id = ?run.session_id,
        calls = calls.len(),
        would_run = count(DryRunVerdict::WouldRun),
        would_be_denied = count(DryRunVerdict::WouldBeDenied),
        tool_missing = count(DryRunVerdict::ToolMissing),
        arguments_invalid = count(DryRunVerdict::ArgumentsInvalid),
        needs_replay_confirmation = count(DryRunVerdict::NeedsReplayConfirmation),
        "dry-run replay of a run"
    );
}
