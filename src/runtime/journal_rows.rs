//! The journal rows of one call: what the dispatcher writes before, instead of
//! and after running a provider.

use serde_json::Value;

use super::dispatch::{Opened, ReplayCheck, ReplayScope, replay_check};
use crate::call::{JobInvocation, ToolCall, ToolCallResult, ToolOutcome, settle};
use crate::catalog::{CatalogEntry, NotCallable};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{new_id, now_ms};
use crate::journal::{CommitOutcome, ExecutionStatus, LifecycleState, canonical_json};
use crate::reason::ReasonCode;
use crate::store::{
    Admission, Admitted, ExecutionFinish, NewExecution, NewJob, ReplayParent, Run, Session, Store,
};

/// How many times a started row's insert may find the replay guard's answer
/// changed (another run on the floor made the same call meanwhile) before the
/// call fails: each recheck needs yet another run's row, so this is reached
/// only under contention no client should cause.
const MAX_REPLAY_RECHECKS: usize = 8;

/// The run, floor and page a call belongs to (all optional outside runs).
#[derive(Debug, Default)]
pub(super) struct CallScope {
    pub run: Option<Run>,
    pub floor_id: Option<String>,
    pub page_id: Option<String>,
}

impl CallScope {
    /// Resolves the run, floor and page a call names. A run that is already
    /// closed is refused here; one that closes later is caught when the call's
    /// row is written.
    pub async fn resolve(
        store: &Store,
        account_id: &str,
        session: &Session,
        call: &ToolCall,
    ) -> Result<Self> {
        if let Some(run_id) = &call.run_id {
            // Boxed here and below: a lookup's database futures are kilobytes,
            // and inline they would be part of every call's future, copied
            // whole on each call with no floor or run too (BENCHMARKS.md,
            // issue 20).
            let run = Box::pin(store.run(account_id, run_id)).await?;
            if run.session_id != session.id {
                return Err(Error::not_found(format!("run {run_id:?}")));
            }
            if run.state != "open" {
                return Err(Error::refused(
                    ErrorCode::RunNotOpen,
                    format!("run {run_id} is already {}; open a new run", run.state),
                ));
            }
            if call.floor_id.as_ref().is_some_and(|f| *f != run.floor_id) {
                return Err(Error::validation("floor_id does not match the run's floor"));
            }
            return Ok(Self {
                floor_id: Some(run.floor_id.clone()),
                page_id: Some(run.page_id.clone()),
                run: Some(run),
            });
        }
        if let Some(floor_id) = &call.floor_id {
            let floor = Box::pin(store.floor_ref(account_id, floor_id)).await?;
            if floor.session_id != session.id {
                return Err(Error::not_found(format!("floor {floor_id:?}")));
            }
            return Ok(Self {
                floor_id: Some(floor.id),
                page_id: floor.active_page_id,
                run: None,
            });
        }
        Ok(Self::default())
    }
}

/// The step key of a named step (see `ToolCall::step`).
fn step_key(step: u32) -> String {
    format!("step:{step}")
}

/// Writes the journal rows of one call.
pub(super) struct CallJournal<'a> {
    pub store: &'a Store,
    pub account_id: &'a str,
    pub session: &'a Session,
    pub call: &'a ToolCall,
    pub scope: &'a CallScope,
}

impl CallJournal<'_> {
    fn row(
        &self,
        entry: Option<&CatalogEntry>,
        args: &Value,
        status: ExecutionStatus,
    ) -> NewExecution {
        let (provider_id, provider_type, side_effect_level, replay_safety) = match entry {
            Some(entry) => {
                let meta = &entry.spec.metadata;
                (
                    entry.spec.provider_id.clone(),
                    entry.spec.provider_type.as_str().to_owned(),
                    enum_text(&meta.side_effect_level),
                    enum_text(&meta.replay_safety),
                )
            }
            None => (
                "unknown".to_owned(),
                "unknown".to_owned(),
                "none".to_owned(),
                "safe".to_owned(),
            ),
        };
        NewExecution {
            step_key: self.scope.run.as_ref().and(self.call.step).map(step_key),
            id: new_id("texec"),
            account_id: self.account_id.to_owned(),
            session_id: self.session.id.clone(),
            run_id: self.scope.run.as_ref().map(|r| r.id.clone()),
            floor_id: self.scope.floor_id.clone(),
            page_id: self.scope.page_id.clone(),
            call_id: self.call.call_id.clone(),
            caller_slot: self.call.caller_slot.as_str().to_owned(),
            provider_id,
            provider_type,
            tool_name: self.call.name.clone(),
            args: args.clone(),
            args_canonical: canonical_json(args),
            status,
            lifecycle_state: LifecycleState::Opened,
            commit_outcome: CommitOutcome::Pending,
            side_effect_level,
            replay_safety,
            // How the call is delivered, not the tool's default: `defer` marks
            // the async-job rows.
            delivery_mode: "inline".to_owned(),
            attempt_no: 1,
            runtime_job_id: None,
            replay_parent_execution_id: None,
            result: None,
            error_message: None,
            reason_code: None,
            started_at: now_ms(),
            provider_started: false,
            admission: Admission::default(),
        }
    }

    fn logged_args(&self) -> Value {
        match &self.call.arguments.parsed {
            Ok(args) => args.clone(),
            Err(_) => Value::String(self.call.arguments.raw.clone()),
        }
    }

    /// A call that lost the race against its run's commit or discard.
    pub fn run_not_open(&self) -> Error {
        let run = self.scope.run.as_ref().map(|r| r.id.as_str()).unwrap_or("");
        Error::refused(
            ErrorCode::RunNotOpen,
            format!(
                "run {run} was committed or discarded while this call was being made; open a new run"
            ),
        )
    }

    /// Writes a row whose run must still be open.
    async fn insert(&self, row: &NewExecution) -> Result<Admitted> {
        match self.store.insert_execution(row).await? {
            Admitted::RunNotOpen => Err(self.run_not_open()),
            admitted => Ok(admitted),
        }
    }

    /// Journals a name the catalog could not run (unknown, conflicting,
    /// unavailable).
    pub async fn refused_lookup(&self, refused: NotCallable<'_>) -> Result<ToolCallResult> {
        let (entry, reason, message) = lookup_refusal(&self.call.name, refused);
        self.refused(entry, ExecutionStatus::Denied, reason, message)
            .await
    }

    /// Journals a call that was not run, and answers the model with the reason.
    pub async fn refused(
        &self,
        entry: Option<&CatalogEntry>,
        status: ExecutionStatus,
        reason: ReasonCode,
        message: String,
    ) -> Result<ToolCallResult> {
        let mut row = self.row(entry, &self.logged_args(), status);
        row.lifecycle_state = LifecycleState::Finished;
        row.error_message = Some(message.clone());
        row.reason_code = Some(reason);
        self.insert(&row).await?;
        tracing::info!(tool = ?self.call.name, status = status.as_str(), reason_code = reason.as_str(), reason = ?message, "tool call refused");
        Ok(self.result(entry, &row.id, Value::String(message), status, Some(reason)))
    }

    /// Journals a repeat of an earlier attempt's execution that needs confirming.
    pub async fn replay_blocked(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        parent: &ReplayParent,
    ) -> Result<ToolCallResult> {
        let message = replay_blocked_message(&self.call.name, parent);
        let mut row = self.row(Some(entry), args, ExecutionStatus::Blocked);
        row.lifecycle_state = LifecycleState::Finished;
        row.commit_outcome = CommitOutcome::ReplayBlocked;
        row.attempt_no = parent.attempt_no + 1;
        row.replay_parent_execution_id = Some(parent.id.clone());
        row.error_message = Some(message.clone());
        let reason = ReasonCode::ToolReplayConfirmationRequired;
        row.reason_code = Some(reason);
        self.insert(&row).await?;
        tracing::info!(tool = ?self.call.name, parent = %parent.id, "replay blocked");
        Ok(self.result(
            Some(entry),
            &row.id,
            Value::String(message),
            ExecutionStatus::Blocked,
            Some(reason),
        ))
    }

    /// A row that starts its provider, checked against `admission`.
    fn started_row(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        status: ExecutionStatus,
        replay: Option<&ReplayParent>,
        admission: Admission,
    ) -> NewExecution {
        let mut row = self.row(Some(entry), args, status);
        row.provider_started = true;
        row.admission = admission;
        if let Some(parent) = replay {
            row.attempt_no = parent.attempt_no + 1;
            row.replay_parent_execution_id = Some(parent.id.clone());
        }
        row
    }

    /// Writes the row as running before the provider is called, if admitted.
    pub async fn open(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
        admission: Admission,
    ) -> Result<Opened> {
        let mut row = self.started_row(entry, args, ExecutionStatus::Running, replay, admission);
        for _ in 0..MAX_REPLAY_RECHECKS {
            match self.insert(&row).await? {
                Admitted::Yes => return Ok(Opened::Running(row.id)),
                Admitted::ReplayChanged => {
                    if let Some(answer) = self.recheck_replay(entry, args, &mut row).await? {
                        return Ok(Opened::ReplayBlocked(answer));
                    }
                }
                refused => return Ok(Opened::Refused(refused)),
            }
        }
        Err(self.replay_guard_contended())
    }

    /// Decides the replay guard again when a started row's insert found that
    /// another run on the floor made the same call after the guard looked:
    /// the row now repeats that execution (its attempt and parent say so), or
    /// the call is journalled as blocked and this is its answer.
    async fn recheck_replay(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        row: &mut NewExecution,
    ) -> Result<Option<ToolCallResult>> {
        let scope = ReplayScope::of(self.scope);
        match replay_check(self.store, scope, entry, args).await? {
            ReplayCheck::Proceed(parent) => {
                row.attempt_no = parent.as_ref().map_or(1, |p| p.attempt_no + 1);
                row.replay_parent_execution_id = parent.map(|p| p.id);
                Ok(None)
            }
            ReplayCheck::Blocked(parent) => {
                Ok(Some(self.replay_blocked(entry, args, &parent).await?))
            }
        }
    }

    /// A call whose replay guard kept changing under it: each recheck found
    /// yet another run's newer execution of the same call on the floor.
    fn replay_guard_contended(&self) -> Error {
        tracing::warn!(
            tool = ?self.call.name,
            floor_id = ?self.scope.floor_id,
            rechecks = MAX_REPLAY_RECHECKS,
            "the replay guard's answer changed at every recheck (other runs on the floor keep making the same call); the call was not run"
        );
        Error::Internal(anyhow::anyhow!(
            "the replay guard could not settle for a call on a contended floor"
        ))
    }

    /// Writes a deferred call: a `queued` row and its job, staged until the run
    /// commits (or claimable at once outside runs), and answers with the receipt.
    pub async fn defer(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
        admission: Admission,
        invocation: JobInvocation,
    ) -> Result<Opened> {
        let hold = if self.scope.run.is_some() {
            JobHold::Staged
        } else {
            JobHold::Queued
        };
        let started = self.started_row(entry, args, ExecutionStatus::Queued, replay, admission);
        self.queue_job(entry, started, invocation, hold).await
    }

    /// Writes a call that waits for an operator: an `awaiting_approval` row and
    /// its job holding the snapshot until `deadline_at`, and answers with the
    /// receipt. It counts against the run's budget like any started call.
    pub async fn hold_for_approval(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
        admission: Admission,
        invocation: JobInvocation,
        deadline_at: i64,
    ) -> Result<Opened> {
        let status = ExecutionStatus::AwaitingApproval;
        let started = self.started_row(entry, args, status, replay, admission);
        let hold = JobHold::Approval { deadline_at };
        self.queue_job(entry, started, invocation, hold).await
    }

    async fn queue_job(
        &self,
        entry: &CatalogEntry,
        mut row: NewExecution,
        invocation: JobInvocation,
        hold: JobHold,
    ) -> Result<Opened> {
        row.delivery_mode = "async_job".to_owned();
        let job_id = new_id("runtime_job");
        row.runtime_job_id = Some(job_id.clone());
        let job = NewJob {
            id: job_id.clone(),
            account_id: self.account_id.to_owned(),
            session_id: self.session.id.clone(),
            execution_id: row.id.clone(),
            run_id: self.scope.run.as_ref().map(|r| r.id.clone()),
            tool_name: self.call.name.clone(),
            state: hold.state(),
            invocation: serde_json::to_value(&invocation)
                .map_err(|err| Error::Internal(anyhow::Error::new(err)))?,
            approval_deadline_at: hold.deadline_at(),
        };
        let mut rechecks = 0;
        loop {
            match self.store.insert_deferred(&row, &job).await? {
                Admitted::Yes => break,
                Admitted::RunNotOpen => return Err(self.run_not_open()),
                Admitted::ReplayChanged if rechecks < MAX_REPLAY_RECHECKS => {
                    rechecks += 1;
                    let args = row.args.clone();
                    if let Some(answer) = self.recheck_replay(entry, &args, &mut row).await? {
                        return Ok(Opened::ReplayBlocked(answer));
                    }
                }
                Admitted::ReplayChanged => return Err(self.replay_guard_contended()),
                refused => return Ok(Opened::Refused(refused)),
            }
        }
        tracing::debug!(tool = ?self.call.name, execution_id = %row.id, job_id, state = job.state, "tool call handed to a runtime job");
        let receipt = serde_json::json!({
            "accepted": true,
            "execution_id": row.id,
            "runtime_job_id": job_id,
            "status": row.status.as_str(),
        });
        Ok(Opened::Deferred(self.result(
            Some(entry),
            &row.id,
            receipt,
            row.status,
            None,
        )))
    }

    /// Finishes the row with the provider's outcome.
    pub async fn finish(
        &self,
        entry: &CatalogEntry,
        execution_id: String,
        outcome: ToolOutcome,
    ) -> Result<ToolCallResult> {
        let settled = settle(outcome, entry.spec.metadata.side_effect_level);
        let finish = ExecutionFinish {
            status: settled.status,
            provider_started: settled.provider_started,
            result: if settled.is_error {
                Value::Null
            } else {
                settled.output.clone()
            },
            error_message: settled
                .is_error
                .then(|| settled.output.as_str().unwrap_or_default().to_owned()),
            reason_code: settled.reason_code,
            commit_outcome: (settled.status == ExecutionStatus::Uncertain)
                .then_some(CommitOutcome::Uncertain),
        };
        if self.store.finish_execution(&execution_id, &finish).await? == Admitted::AlreadyDecided {
            return self.decided_elsewhere(entry, &execution_id).await;
        }
        // The journal row is the record of the call; at `info` this line would
        // be most of the log under load.
        tracing::debug!(
            tool = ?self.call.name,
            execution_id,
            status = settled.status.as_str(),
            reason_code = settled.reason_code.map(ReasonCode::as_str),
            provider_started = settled.provider_started,
            "tool call finished"
        );
        Ok(self.result(
            Some(entry),
            &execution_id,
            settled.output,
            settled.status,
            settled.reason_code,
        ))
    }

    /// The outcome the journal kept for a row another instance decided while
    /// this one was taken for dead: the caller is told what the journal says
    /// (`uncertain`), not the outcome that arrived after it.
    async fn decided_elsewhere(
        &self,
        entry: &CatalogEntry,
        execution_id: &str,
    ) -> Result<ToolCallResult> {
        let stored = self
            .store
            .execution(self.account_id, execution_id)
            .await?
            .ok_or_else(|| Error::not_found(format!("tool execution {execution_id:?}")))?;
        let output = Value::String(stored.error_message.clone().unwrap_or_else(|| {
            "this call's outcome arrived after it was recorded as uncertain".to_owned()
        }));
        Ok(self.result(
            Some(entry),
            execution_id,
            output,
            stored.status,
            stored.execution_reason_code,
        ))
    }

    /// The model's view of a row: an error exactly when it has a reason (as
    /// `settle` decides for providers' outcomes).
    fn result(
        &self,
        entry: Option<&CatalogEntry>,
        execution_id: &str,
        output: Value,
        status: ExecutionStatus,
        reason: Option<ReasonCode>,
    ) -> ToolCallResult {
        ToolCallResult {
            call_id: self.call.call_id.clone(),
            name: self.call.name.clone(),
            output,
            is_error: reason.is_some(),
            status,
            execution_reason_code: reason,
            execution_id: execution_id.to_owned(),
            provider_type: entry.map(|entry| entry.spec.provider_type),
        }
    }
}

/// Why the catalog cannot run `name`: the entry when there is one, the reason
/// code and the model-visible message.
pub(super) fn lookup_refusal<'c>(
    name: &str,
    refused: NotCallable<'c>,
) -> (Option<&'c CatalogEntry>, ReasonCode, String) {
    match refused {
        NotCallable::Unknown => (
            None,
            ReasonCode::ToolNotFound,
            format!("unknown tool {name:?}: it is not in this session's catalog"),
        ),
        NotCallable::Conflict(conflict) => (
            None,
            ReasonCode::ToolNameConflict,
            format!(
                "tool {:?} is offered by several providers ({}); the call was refused",
                conflict.name,
                conflict.provider_ids.join(", ")
            ),
        ),
        NotCallable::Unavailable(entry) => (
            Some(entry),
            ReasonCode::ToolUnavailable,
            format!(
                "tool {name:?} is unavailable: {}",
                entry
                    .availability_reason
                    .as_deref()
                    .unwrap_or("no reason given")
            ),
        ),
    }
}

/// The model-visible message of a call the replay guard blocked.
pub(super) fn replay_blocked_message(name: &str, parent: &ReplayParent) -> String {
    format!(
        "tool {name:?} already ran with these arguments in an earlier attempt (execution {}), and it is {}: it is not repeated without confirmation",
        parent.id, parent.replay_safety
    )
}

/// The snake_case text of a serde enum value.
fn enum_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// How a call's job waits before a worker may claim it.
#[derive(Debug, Clone, Copy)]
enum JobHold {
    /// Claimable at once (outside runs).
    Queued,
    /// Released when its run commits.
    Staged,
    /// Until an operator decides, or the deadline passes.
    Approval { deadline_at: i64 },
}

impl JobHold {
    fn state(self) -> &'static str {
        match self {
            JobHold::Queued => "queued",
            JobHold::Staged => "staged",
            JobHold::Approval { .. } => "awaiting_approval",
        }
    }

    fn deadline_at(self) -> Option<i64> {
        match self {
            JobHold::Approval { deadline_at } => Some(deadline_at),
            _ => None,
        }
    }
}
