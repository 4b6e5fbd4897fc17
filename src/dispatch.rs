//! The model-facing call path: look the tool up in the session's catalog, check it,
//! validate its arguments, run it, and shape what the model sees.

use serde_json::Value;

use crate::catalog::{Catalog, CatalogEntry, Invoker, Lookup};
use crate::domain::tool::{ResultVisibility, SideEffectLevel, Slot};
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};
use crate::journal::{CommitOutcome, ExecutionStatus, LifecycleState, canonical_json};
use crate::permissions::{Refusal, ToolPermissions};
use crate::runtime::ToolRuntime;
use crate::store::{ExecutionFinish, NewExecution, NewJob, ReplayParent, Run, Session};

/// Arguments exactly as the model produced them, plus their parsed form.
#[derive(Debug, Clone)]
pub struct CallArguments {
    /// The raw argument string (what callbacks receive as `raw_arguments`).
    pub raw: String,
    /// The parsed arguments, or why they could not be parsed.
    pub parsed: std::result::Result<Value, String>,
}

impl CallArguments {
    /// Accepts a JSON object, or the model's raw argument string. An absent or
    /// empty value means "no arguments".
    pub fn from_json(value: Option<Value>) -> Self {
        match value {
            None | Some(Value::Null) => Self {
                raw: "{}".into(),
                parsed: Ok(Value::Object(Default::default())),
            },
            Some(Value::String(raw)) => {
                let parsed = if raw.trim().is_empty() {
                    Ok(Value::Object(Default::default()))
                } else {
                    match serde_json::from_str::<Value>(&raw) {
                        Ok(value @ Value::Object(_)) => Ok(value),
                        Ok(_) => Err("tool arguments must be a JSON object".to_owned()),
                        Err(err) => Err(format!("tool arguments are not valid JSON: {err}")),
                    }
                };
                Self { raw, parsed }
            }
            Some(value @ Value::Object(_)) => Self {
                raw: value.to_string(),
                parsed: Ok(value),
            },
            Some(other) => Self {
                raw: other.to_string(),
                parsed: Err("tool arguments must be a JSON object".to_owned()),
            },
        }
    }
}

/// One tool call as a model (or an integrator acting for it) makes it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub name: String,
    pub arguments: CallArguments,
    pub call_id: String,
    pub caller_slot: Slot,
    pub floor_id: Option<String>,
    /// The run (generation attempt) this call belongs to.
    pub run_id: Option<String>,
    /// The model round trip (step) within the run that made this call; calls of
    /// one step share it. Only calls that name their step are held to
    /// `max_steps_per_generation`: the step structure belongs to whoever runs the
    /// model loop, and guessing it would refuse legitimate calls.
    pub step: Option<u32>,
}

/// What the model sees, plus the outcome status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolCallResult {
    pub call_id: String,
    pub name: String,
    pub output: Value,
    pub is_error: bool,
    pub status: ExecutionStatus,
    /// The journal row of this call.
    pub execution_id: String,
}

/// The provider's answer to one call.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    Success(Value),
    Error(String),
    Timeout(String),
}

impl ToolRuntime {
    /// The session's permission rules in their fixed order, the run's step guard,
    /// then the reservation of one call from the floor's `max_calls_per_turn`
    /// budget. The reservation is taken before the tool runs, so calls in flight
    /// count against it.
    async fn authorize(
        &self,
        session: &Session,
        entry: &crate::catalog::CatalogEntry,
        call: &ToolCall,
        run: Option<&Run>,
        floor_id: Option<&str>,
    ) -> Result<std::result::Result<(), Stop>> {
        let permissions = ToolPermissions::from_metadata(&session.metadata)?;
        if let Err(refusal) = permissions.check(&call.name, &entry.spec.metadata, call.caller_slot)
        {
            return Ok(Err(Stop::Denied(refusal)));
        }
        if let (Some(run), Some(step)) = (run, call.step) {
            let used = self.store.run_step_keys(&run.id).await?;
            let opens_a_step = !used.contains(&step_key(step));
            let limit = permissions.max_steps_per_generation as usize;
            if opens_a_step && used.len() >= limit {
                return Ok(Err(Stop::Blocked(format!(
                    "tool {:?} was not run: this generation has used all {limit} steps allowed by max_steps_per_generation",
                    call.name
                ))));
            }
        }
        if let Some(floor_id) = floor_id {
            let limit = permissions.max_calls_per_turn;
            if !self.store.reserve_floor_call(floor_id, limit).await? {
                return Ok(Err(Stop::Denied(Refusal::CallLimitReached { limit })));
            }
        }
        Ok(Ok(()))
    }

    /// The catalog of `session` right now.
    pub async fn catalog(&self, session: &Session) -> Result<Catalog> {
        let mut entries = crate::tools::builtin::catalog_entries(self, session).await?;
        entries.extend(self.remote.catalog_entries(&session.character_id));
        entries.extend(crate::tools::preset::catalog_entries(self, session).await?);
        Ok(Catalog::assemble(&session.id, entries))
    }

    /// Runs one call on the account's session. Client mistakes about the session,
    /// floor or run are errors; everything about the tool itself is a model-visible
    /// result, and every decided call is a journal row.
    pub async fn call(
        &self,
        account_id: &str,
        session_id: &str,
        call: ToolCall,
    ) -> Result<ToolCallResult> {
        let session = self.store.session(account_id, session_id).await?;
        let scope = self.call_scope(account_id, &session, &call).await?;
        let catalog = self.catalog(&session).await?;
        let journal = Journal {
            runtime: self,
            account_id,
            session: &session,
            call: &call,
            scope: &scope,
        };
        let entry = match catalog.lookup(&call.name) {
            Lookup::Found(entry) => entry,
            Lookup::Unknown => {
                let message = format!(
                    "unknown tool {:?}: it is not in this session's catalog",
                    call.name
                );
                return journal
                    .refused(None, ExecutionStatus::Denied, message)
                    .await;
            }
            Lookup::Conflict(conflict) => {
                let message = format!(
                    "tool {:?} is offered by several providers ({}); the call was refused",
                    conflict.name,
                    conflict.provider_ids.join(", ")
                );
                return journal
                    .refused(None, ExecutionStatus::Denied, message)
                    .await;
            }
            Lookup::Unavailable(entry) => {
                let message = format!(
                    "tool {:?} is unavailable: {}",
                    call.name,
                    entry
                        .availability_reason
                        .as_deref()
                        .unwrap_or("no reason given")
                );
                return journal
                    .refused(Some(entry), ExecutionStatus::Denied, message)
                    .await;
            }
        };
        match self
            .authorize(
                &session,
                entry,
                &call,
                scope.run.as_ref(),
                scope.floor_id.as_deref(),
            )
            .await?
        {
            Ok(()) => {}
            Err(Stop::Denied(refusal)) => {
                tracing::info!(
                    session = %session.id,
                    tool = %call.name,
                    slot = %call.caller_slot,
                    rule = refusal.rule(),
                    "tool call refused by permissions"
                );
                return journal
                    .refused(
                        Some(entry),
                        ExecutionStatus::Denied,
                        refusal.message(&call.name),
                    )
                    .await;
            }
            Err(Stop::Blocked(message)) => {
                return journal
                    .refused(Some(entry), ExecutionStatus::Blocked, message)
                    .await;
            }
        }
        let args = match &call.arguments.parsed {
            Ok(args) => args.clone(),
            Err(problem) => {
                return journal
                    .refused(Some(entry), ExecutionStatus::Error, problem.clone())
                    .await;
            }
        };
        if let Err(problem) = crate::schema::validate_arguments(&entry.spec.parameters, &args) {
            let message = format!("invalid arguments: {problem}");
            return journal
                .refused(Some(entry), ExecutionStatus::Error, message)
                .await;
        }
        let replay = match self.replay_check(&scope, entry, &args).await? {
            ReplayCheck::Proceed(replay) => replay,
            ReplayCheck::Blocked(parent) => {
                let message = format!(
                    "tool {:?} already ran with these arguments in an earlier attempt (execution {}), and it is {}: it is not repeated without confirmation",
                    call.name, parent.id, parent.replay_safety
                );
                return journal.replay_blocked(entry, &args, &parent, message).await;
            }
        };
        if entry.spec.metadata.result_visibility() == ResultVisibility::DeferredReceipt
            && let Invoker::Remote(tool) = &entry.invoker
        {
            let invocation = crate::jobs::JobInvocation::remote(tool, &call, &args);
            return journal
                .defer(entry, &args, replay.as_ref(), invocation)
                .await;
        }
        let execution_id = journal.open(entry, &args, replay.as_ref()).await?;
        let outcome = match &entry.invoker {
            Invoker::Builtin(name) => {
                crate::tools::builtin::call(self, &session, scope.run.as_ref(), name, &args).await
            }
            Invoker::Remote(tool) => self.call_remote(tool, &call, &args).await,
            Invoker::Preset(tool) => crate::tools::preset::call(self, tool, &args).await,
        };
        journal.finish(entry, execution_id, outcome).await
    }

    /// Resolves the run, floor and page a call belongs to.
    async fn call_scope(
        &self,
        account_id: &str,
        session: &Session,
        call: &ToolCall,
    ) -> Result<CallScope> {
        if let Some(run_id) = &call.run_id {
            let run = self.store.run(account_id, run_id).await?;
            if run.session_id != session.id {
                return Err(Error::not_found(format!("run {run_id:?}")));
            }
            if run.state != "open" {
                return Err(Error::Conflict {
                    code: "run_not_open",
                    message: format!("run {run_id} is already {}; open a new run", run.state),
                });
            }
            if call.floor_id.as_ref().is_some_and(|f| *f != run.floor_id) {
                return Err(Error::validation("floor_id does not match the run's floor"));
            }
            return Ok(CallScope {
                floor_id: Some(run.floor_id.clone()),
                page_id: Some(run.page_id.clone()),
                run: Some(run),
            });
        }
        if let Some(floor_id) = &call.floor_id {
            let floor = self.store.floor_ref(account_id, floor_id).await?;
            if floor.session_id != session.id {
                return Err(Error::not_found(format!("floor {floor_id:?}")));
            }
            return Ok(CallScope {
                floor_id: Some(floor.id),
                page_id: floor.active_page_id,
                run: None,
            });
        }
        Ok(CallScope::default())
    }

    /// Whether this call repeats an execution of an earlier attempt on the floor.
    async fn replay_check(
        &self,
        scope: &CallScope,
        entry: &CatalogEntry,
        args: &Value,
    ) -> Result<ReplayCheck> {
        let (Some(run), Some(floor_id)) = (&scope.run, &scope.floor_id) else {
            return Ok(ReplayCheck::Proceed(None));
        };
        let canonical = canonical_json(args);
        let Some(parent) = self
            .store
            .replay_parent(floor_id, &run.id, &entry.spec.name, &canonical)
            .await?
        else {
            return Ok(ReplayCheck::Proceed(None));
        };
        if parent.replay_safety != "safe" && !run.confirmed_execution_ids.contains(&parent.id) {
            return Ok(ReplayCheck::Blocked(parent));
        }
        Ok(ReplayCheck::Proceed(Some(parent)))
    }
}

/// Why a call was stopped before its provider ran.
enum Stop {
    /// A permission rule refused it (`denied`).
    Denied(Refusal),
    /// A runtime guard stopped it (`blocked`).
    Blocked(String),
}

/// The step key of a named step (see `ToolCall::step`).
fn step_key(step: u32) -> String {
    format!("step:{step}")
}

/// The run, floor and page a call belongs to (all optional outside runs).
#[derive(Debug, Default)]
struct CallScope {
    run: Option<Run>,
    floor_id: Option<String>,
    page_id: Option<String>,
}

enum ReplayCheck {
    Proceed(Option<ReplayParent>),
    Blocked(ReplayParent),
}

/// Writes the journal rows of one call.
struct Journal<'a> {
    runtime: &'a ToolRuntime,
    account_id: &'a str,
    session: &'a Session,
    call: &'a ToolCall,
    scope: &'a CallScope,
}

impl Journal<'_> {
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
        let id = new_id("texec");
        let step_key = self.scope.run.as_ref().and(self.call.step).map(step_key);
        NewExecution {
            step_key,
            id,
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
            started_at: now_ms(),
        }
    }

    fn logged_args(&self) -> Value {
        match &self.call.arguments.parsed {
            Ok(args) => args.clone(),
            Err(_) => Value::String(self.call.arguments.raw.clone()),
        }
    }

    /// Journals a call that was not run, and answers the model with the reason.
    async fn refused(
        &self,
        entry: Option<&CatalogEntry>,
        status: ExecutionStatus,
        message: String,
    ) -> Result<ToolCallResult> {
        let mut row = self.row(entry, &self.logged_args(), status);
        row.lifecycle_state = LifecycleState::Finished;
        row.error_message = Some(message.clone());
        self.runtime.store.insert_execution(&row).await?;
        tracing::info!(tool = %self.call.name, status = status.as_str(), reason = %message, "tool call refused");
        Ok(self.result(&row.id, Value::String(message), true, status))
    }

    async fn replay_blocked(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        parent: &ReplayParent,
        message: String,
    ) -> Result<ToolCallResult> {
        let mut row = self.row(Some(entry), args, ExecutionStatus::Blocked);
        row.lifecycle_state = LifecycleState::Finished;
        row.commit_outcome = CommitOutcome::ReplayBlocked;
        row.attempt_no = parent.attempt_no + 1;
        row.replay_parent_execution_id = Some(parent.id.clone());
        row.error_message = Some(message.clone());
        self.runtime.store.insert_execution(&row).await?;
        tracing::info!(tool = %self.call.name, parent = %parent.id, "replay blocked");
        Ok(self.result(
            &row.id,
            Value::String(message),
            true,
            ExecutionStatus::Blocked,
        ))
    }

    /// Writes the row as running before the provider is called.
    async fn open(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
    ) -> Result<String> {
        let mut row = self.row(Some(entry), args, ExecutionStatus::Running);
        if let Some(parent) = replay {
            row.attempt_no = parent.attempt_no + 1;
            row.replay_parent_execution_id = Some(parent.id.clone());
        }
        self.runtime.store.insert_execution(&row).await?;
        Ok(row.id)
    }

    /// Writes a deferred call: a `queued` row and its job, staged until the run
    /// commits (or claimable at once outside runs), and answers with the receipt.
    async fn defer(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
        invocation: crate::jobs::JobInvocation,
    ) -> Result<ToolCallResult> {
        let mut row = self.row(Some(entry), args, ExecutionStatus::Queued);
        row.delivery_mode = "async_job".to_owned();
        let job_id = new_id("runtime_job");
        row.runtime_job_id = Some(job_id.clone());
        if let Some(parent) = replay {
            row.attempt_no = parent.attempt_no + 1;
            row.replay_parent_execution_id = Some(parent.id.clone());
        }
        let staged = self.scope.run.is_some();
        let job = NewJob {
            id: job_id.clone(),
            account_id: self.account_id.to_owned(),
            session_id: self.session.id.clone(),
            execution_id: row.id.clone(),
            run_id: self.scope.run.as_ref().map(|r| r.id.clone()),
            tool_name: self.call.name.clone(),
            state: if staged { "staged" } else { "queued" },
            invocation: serde_json::to_value(&invocation)
                .map_err(|err| Error::Internal(anyhow::Error::new(err)))?,
        };
        self.runtime.store.insert_deferred(&row, &job).await?;
        if !staged {
            self.runtime.jobs.wake();
        }
        tracing::info!(tool = %self.call.name, execution_id = %row.id, job_id, staged, "tool call deferred to a runtime job");
        let receipt = serde_json::json!({
            "accepted": true,
            "execution_id": row.id,
            "runtime_job_id": job_id,
            "status": "queued",
        });
        Ok(self.result(&row.id, receipt, false, ExecutionStatus::Queued))
    }

    /// Finishes the row with the provider's outcome.
    async fn finish(
        &self,
        entry: &CatalogEntry,
        execution_id: String,
        outcome: ToolOutcome,
    ) -> Result<ToolCallResult> {
        let has_side_effects = entry.spec.metadata.side_effect_level != SideEffectLevel::None;
        let (status, output, is_error) = match outcome {
            ToolOutcome::Success(output) => (ExecutionStatus::Success, output, false),
            ToolOutcome::Error(message) => (ExecutionStatus::Error, Value::String(message), true),
            // A tool with side effects that timed out may or may not have acted.
            ToolOutcome::Timeout(message) if has_side_effects => {
                (ExecutionStatus::Uncertain, Value::String(message), true)
            }
            ToolOutcome::Timeout(message) => {
                (ExecutionStatus::Timeout, Value::String(message), true)
            }
        };
        let finish = ExecutionFinish {
            status,
            result: if is_error {
                Value::Null
            } else {
                output.clone()
            },
            error_message: is_error.then(|| output.as_str().unwrap_or_default().to_owned()),
            commit_outcome: (status == ExecutionStatus::Uncertain)
                .then_some(CommitOutcome::Uncertain),
        };
        self.runtime
            .store
            .finish_execution(&execution_id, &finish)
            .await?;
        tracing::info!(tool = %self.call.name, execution_id, status = status.as_str(), "tool call finished");
        Ok(self.result(&execution_id, output, is_error, status))
    }

    fn result(
        &self,
        execution_id: &str,
        output: Value,
        is_error: bool,
        status: ExecutionStatus,
    ) -> ToolCallResult {
        ToolCallResult {
            call_id: self.call.call_id.clone(),
            name: self.call.name.clone(),
            output,
            is_error,
            status,
            execution_id: execution_id.to_owned(),
        }
    }
}

/// The snake_case text of a serde enum value.
fn enum_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
