//! The model-facing call path, the same for every provider: look the tool up in
//! the session's catalog, check permissions, validate the arguments, apply the
//! replay guard (these four are `evaluate`, which dry runs share), admit the
//! call against its run's steps and budget, run it, and journal every decided
//! call.

use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use super::ToolRuntime;
use super::detach::FinishOnDrop;
use super::journal_rows::{CallJournal, CallScope};
use crate::call::{ToolCall, ToolCallResult};
use crate::catalog::{CallContext, Catalog, CatalogEntry, NotCallable};
use crate::domain::tool::ResultVisibility;
use crate::error::Result;
use crate::journal::{ExecutionStatus, canonical_json};
use crate::permissions::{Refusal, ToolPermissions};
use crate::reason::ReasonCode;
use crate::store::{Admission, Admitted, ReplayParent, Session};

impl ToolRuntime {
    /// Runs one call on the account's session. Client mistakes about the session,
    /// floor or run are errors; everything about the tool itself is a
    /// model-visible result, and every decided call is a journal row.
    ///
    /// A caller that goes away (a client that hangs up) cannot cut the call
    /// short between its journal rows: the rest of it finishes in a task of its
    /// own, which shutdown waits for.
    pub async fn call(
        &self,
        account_id: &str,
        session_id: &str,
        call: ToolCall,
    ) -> Result<ToolCallResult> {
        let runtime = self.clone();
        let (account_id, session_id) = (account_id.to_owned(), session_id.to_owned());
        let span = crate::telemetry::tool_call_span(&session_id, &call.name, call.caller_slot);
        let recorded = span.clone();
        FinishOnDrop::new(
            async move {
                let started = std::time::Instant::now();
                let name = call.name.clone();
                let result = runtime.run_call(&account_id, &session_id, call).await;
                if let Ok(result) = &result {
                    record_call(result, &name, started.elapsed());
                    if crate::telemetry::spans_exported() {
                        let provider = result.provider_type.map_or("none", |p| p.as_str());
                        recorded.record("provider", provider);
                        recorded.record("status", result.status.as_str());
                        recorded.record("execution_id", result.execution_id.as_str());
                    }
                    runtime.publish_journal_row(&session_id, result);
                }
                result
            }
            .instrument(span),
            "tool call",
            self.started_work.clone(),
        )
        .await
    }

    /// Tells the session's observers (the web console) that a journal row
    /// was written; they read the row itself through the store.
    fn publish_journal_row(&self, session_id: &str, result: &ToolCallResult) {
        self.model_sessions.publish_to_observers(session_id, || {
            crate::model_sessions::ModelSessionEvent::new(
                "journal",
                &serde_json::json!({
                    "execution_id": result.execution_id,
                    "status": result.status,
                }),
            )
        });
    }

    async fn run_call(
        &self,
        account_id: &str,
        session_id: &str,
        call: ToolCall,
    ) -> Result<ToolCallResult> {
        let session = self.store.shared_session(account_id, session_id).await?;
        let scope = CallScope::resolve(&self.store, account_id, &session, &call).await?;
        // Only the called name's entries: a call is decided on its own name
        // (and its conflicts), not on every tool of the catalog.
        let catalog = Catalog::for_call(&session, &self.providers, &call.name).await?;
        let journal = CallJournal {
            store: &self.store,
            account_id,
            session: &session,
            call: &call,
            scope: &scope,
        };
        let checked = self
            .evaluate(&session, &catalog, &call, ReplayScope::of(&scope))
            .await?;
        let Checked {
            entry,
            args,
            replay,
            permissions,
        } = match checked {
            Ok(checked) => checked,
            // The paths a call rarely takes are boxed, so that the future of
            // every call is not as large as theirs (BENCHMARKS.md, issue 20).
            Err(refused) => return Box::pin(journal.not_run(refused)).await,
        };
        let admission = admission(&scope, &call, &permissions);
        if permissions.needs_approval(&call.name, &entry.spec.metadata) {
            let held = (entry, &args, replay.as_ref());
            return Box::pin(self.hold_for_approval(&journal, held, admission, &permissions)).await;
        }
        let admitted = journal
            .start(entry, &args, replay.as_ref(), admission)
            .await?;
        let execution_id = match admitted {
            Opened::Running(id) => id,
            Opened::Deferred(result) => {
                // Outside a run the job is claimable at once; inside one, the
                // commit releases it and wakes the workers.
                if scope.run.is_none() {
                    self.jobs.wake();
                }
                return Ok(result);
            }
            Opened::Refused(refusal) => {
                return Box::pin(journal.refused_admission(entry, refusal, &permissions)).await;
            }
            Opened::ReplayBlocked(result) => return Ok(result),
        };
        let cx = CallContext {
            session: &session,
            run: scope.run.as_ref(),
            call: &call,
            attempt: crate::call::Attempt {
                idempotency_key: &execution_id,
                number: 1,
            },
            catalog_events: self,
        };
        let outcome = entry.handler.invoke(&cx, &args).await;
        journal.finish(entry, execution_id, outcome).await
    }

    /// The call's arguments if they parse and satisfy the tool's schema, else
    /// the reason code and the model-visible message. Validation is CPU work of a size the tool's
    /// author and the model chose, so unless the schema is known to be cheap
    /// and the arguments small it runs on the blocking pool within a time
    /// budget, in one of [`MAX_VALIDATIONS_RUNNING`] slots: a schema that
    /// takes too long refuses the call instead of stalling the async workers.
    async fn checked_arguments(
        &self,
        entry: &CatalogEntry,
        call: &ToolCall,
    ) -> std::result::Result<Value, (ReasonCode, String)> {
        let invalid = |problem| (ReasonCode::ValidationError, problem);
        let args = call.arguments.parsed.clone().map_err(invalid)?;
        let validator = entry.spec.validator.clone();
        if validator.is_cheap_for(call.arguments.raw.len()) {
            // Microseconds: a hand-off to the blocking pool would cost more.
            return validator
                .validate(&entry.spec.parameters, &args)
                .map(|()| args)
                .map_err(|problem| invalid(format!("invalid arguments: {problem}")));
        }
        let budget = Duration::from_millis(self.settings.argument_validation_timeout_ms);
        let deadline = tokio::time::Instant::now() + budget;
        let over_budget = |why: &str| {
            (
                ReasonCode::ArgumentValidationTimeout,
                format!(
                    "the arguments were not validated within the time budget of {} ms ({why}); the call was not run",
                    budget.as_millis()
                ),
            )
        };
        // A validation cannot be stopped once it runs, and one its caller gave
        // up on keeps its slot to the end: the slots bound the CPU that
        // refused calls can leave burning (probe J: 8 refused calls left 211
        // CPU-seconds of validations running).
        let Ok(Ok(slot)) =
            tokio::time::timeout_at(deadline, self.validations.clone().acquire_owned()).await
        else {
            tracing::warn!(tool = ?call.name, slots = MAX_VALIDATIONS_RUNNING, "every argument-validation slot is busy with costly validations; call refused without validating");
            return Err(over_budget(
                "every validation slot is busy with costly schemas",
            ));
        };
        let schema = entry.spec.parameters.clone();
        // The arguments travel to the blocking thread and back: no copy of
        // what may be a body-sized value.
        let validation = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let began = std::time::Instant::now();
            let result = validator.validate(&schema, &args).map(|()| args);
            if began.elapsed() > budget {
                tracing::warn!(
                    ran_ms = began.elapsed().as_millis() as u64,
                    budget_ms = budget.as_millis() as u64,
                    "an argument validation ran past its budget (its call was refused); its slot is free again"
                );
            }
            result
        });
        match tokio::time::timeout_at(deadline, validation).await {
            Ok(Ok(Ok(args))) => Ok(args),
            Ok(Ok(Err(problem))) => Err(invalid(format!("invalid arguments: {problem}"))),
            Ok(Err(join)) => {
                tracing::error!(error = %join, tool = ?call.name, "argument validation failed");
                Err((
                    ReasonCode::InternalError,
                    "the arguments could not be validated because of a server error".into(),
                ))
            }
            Err(_) => {
                tracing::warn!(tool = ?call.name, budget_ms = budget.as_millis() as u64, "argument validation over its time budget; call refused");
                Err(over_budget("the tool's schema is too costly"))
            }
        }
    }

    /// The checks a call passes before its first journal row, in order: the
    /// catalog lookup, the session's permissions for the caller's slot, the
    /// arguments against the tool's schema, and the replay guard (when the call
    /// belongs to a run). The first that refuses decides. `run_call` and the
    /// dry-run replay (`dry_run.rs`) both decide through this one function, so
    /// the two cannot disagree about these checks. It reads but never writes;
    /// the admission limits (steps, call budget) are left to the row's insert.
    pub(super) async fn evaluate<'c>(
        &self,
        session: &Session,
        catalog: &'c Catalog,
        call: &ToolCall,
        replay: Option<ReplayScope<'_>>,
    ) -> Result<Verdict<'c>> {
        let entry = match catalog.lookup(&call.name) {
            Ok(entry) => entry,
            Err(refused) => return Ok(Err(NotRun::NotCallable(refused))),
        };
        let permissions = ToolPermissions::from_metadata(&session.metadata)?;
        if let Err(refusal) = permissions.check(&call.name, &entry.spec.metadata, call.caller_slot)
        {
            return Ok(Err(NotRun::Denied { entry, refusal }));
        }
        let args = match self.checked_arguments(entry, call).await {
            Ok(args) => args,
            Err((reason, problem)) => {
                return Ok(Err(NotRun::ArgumentsInvalid {
                    entry,
                    reason,
                    problem,
                }));
            }
        };
        Ok(
            match replay_check(&self.store, replay, entry, &args).await? {
                ReplayCheck::Proceed(replay) => Ok(Checked {
                    entry,
                    args,
                    replay,
                    permissions,
                }),
                ReplayCheck::Blocked(parent) => Err(NotRun::ReplayBlocked {
                    entry,
                    args,
                    parent,
                }),
            },
        )
    }
}

/// How many argument validations may run on the blocking pool at once
/// (cheap ones run inline and take no slot). A call that finds every slot
/// taken waits within its time budget, then is refused as over it.
pub(super) const MAX_VALIDATIONS_RUNNING: usize = 4;

/// Whether this call repeats an execution of an earlier attempt on the floor
/// that may not be repeated without confirmation. Its answer is checked again
/// by the row's insert (`Admitted::ReplayChanged`), under the write lock.
pub(super) async fn replay_check(
    store: &crate::store::Store,
    scope: Option<ReplayScope<'_>>,
    entry: &CatalogEntry,
    args: &Value,
) -> Result<ReplayCheck> {
    let Some(scope) = scope else {
        return Ok(ReplayCheck::Proceed(None));
    };
    let canonical = canonical_json(args);
    // Boxed: only calls in a floor or run read a replay parent, and the
    // read's futures would otherwise make every call's future larger.
    let Some(parent) =
        Box::pin(store.replay_parent(scope.floor_id, scope.run_id, &entry.spec.name, &canonical))
            .await?
    else {
        return Ok(ReplayCheck::Proceed(None));
    };
    if parent.replay_safety != "safe" && !scope.confirmed.contains(&parent.id) {
        return Ok(ReplayCheck::Blocked(parent));
    }
    Ok(ReplayCheck::Proceed(Some(parent)))
}

/// What the checks before a call's first row decided (see
/// [`ToolRuntime::evaluate`]): the call may start, or why it may not.
pub(super) type Verdict<'c> = std::result::Result<Checked<'c>, NotRun<'c>>;

/// A call that passed every check: it starts its provider if its row is
/// admitted (the run's steps and call budget are checked when the row is
/// written).
pub(super) struct Checked<'c> {
    pub entry: &'c CatalogEntry,
    /// The validated arguments.
    pub args: Value,
    /// The earlier execution this call repeats (replay-safe or confirmed).
    pub replay: Option<ReplayParent>,
    pub permissions: ToolPermissions,
}

/// Why a call may not start its provider; it is journalled as not run.
pub(super) enum NotRun<'c> {
    /// The catalog cannot run the name (unknown, conflicting, unavailable).
    NotCallable(NotCallable<'c>),
    /// A permission rule refuses the tool for the caller's slot.
    Denied {
        entry: &'c CatalogEntry,
        refusal: Refusal,
    },
    /// The arguments do not parse or do not satisfy the tool's schema (or
    /// could not be validated in time).
    ArgumentsInvalid {
        entry: &'c CatalogEntry,
        reason: ReasonCode,
        problem: String,
    },
    /// The call repeats an earlier attempt's execution that is not
    /// replay-safe and that the run has not confirmed.
    ReplayBlocked {
        entry: &'c CatalogEntry,
        args: Value,
        parent: ReplayParent,
    },
}

/// Where the replay guard looks: executions on `floor_id` outside run `run_id`
/// repeat, unless listed in `confirmed`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplayScope<'a> {
    pub floor_id: &'a str,
    pub run_id: &'a str,
    pub confirmed: &'a [String],
}

impl<'a> ReplayScope<'a> {
    /// The replay scope of a call in its run; none outside runs.
    pub(super) fn of(scope: &'a CallScope) -> Option<Self> {
        let (Some(run), Some(floor_id)) = (&scope.run, &scope.floor_id) else {
            return None;
        };
        Some(Self {
            floor_id,
            run_id: &run.id,
            confirmed: &run.confirmed_execution_ids,
        })
    }
}

/// The call as a runtime job would run it later (a deferred call, or one
/// held for approval), or None when its tool only runs inline. Whether a
/// lost job may be handed over again is the tool's replay safety, whatever
/// the provider, so the snapshot carries it.
pub(super) fn job_snapshot(
    entry: &CatalogEntry,
    call: &ToolCall,
    args: &Value,
) -> Option<crate::call::JobInvocation> {
    let mut invocation = entry.handler.snapshot(call, args)?;
    invocation.replay_safety = Some(entry.spec.metadata.replay_safety);
    Some(invocation)
}

/// The limits a started call's row must fit in: the run's steps when the call
/// names its step, and the call budget of its run (or floor outside runs).
fn admission(scope: &CallScope, call: &ToolCall, permissions: &ToolPermissions) -> Admission {
    Admission {
        step_limit: scope
            .run
            .as_ref()
            .and(call.step)
            .map(|_| permissions.max_steps_per_generation),
        call_limit: scope
            .floor_id
            .is_some()
            .then_some(permissions.max_calls_per_turn),
    }
}

/// What writing a call's first row decided.
pub(super) enum Opened {
    /// The row is open; the provider runs now.
    Running(String),
    /// A deferred call was queued; this is its receipt.
    Deferred(ToolCallResult),
    /// The row was not admitted (its run's steps or budget are used up).
    Refused(Admitted),
    /// Another run made the same call first, and the replay guard, deciding
    /// again, blocked this one: the answer of its `blocked` row.
    ReplayBlocked(ToolCallResult),
}

/// The replay guard's answer for a call.
pub(super) enum ReplayCheck {
    Proceed(Option<ReplayParent>),
    Blocked(ReplayParent),
}

impl CallJournal<'_> {
    /// Writes the first row of a call that passed every check: a queued job's
    /// row when the tool answers later (deferred receipt) and can be
    /// snapshotted, else the running row of an inline call.
    async fn start(
        &self,
        entry: &CatalogEntry,
        args: &Value,
        replay: Option<&ReplayParent>,
        admission: Admission,
    ) -> Result<Opened> {
        let deferred = (entry.spec.metadata.result_visibility()
            == ResultVisibility::DeferredReceipt)
            .then(|| job_snapshot(entry, self.call, args))
            .flatten();
        match deferred {
            // Boxed: the async-job path's futures are the largest of a call's,
            // and inline every call's future would carry them.
            Some(invocation) => {
                Box::pin(self.defer(entry, args, replay, admission, invocation)).await
            }
            None => self.open(entry, args, replay, admission).await,
        }
    }

    /// Journals a call that one of the checks before its first row refused.
    async fn not_run(&self, refused: NotRun<'_>) -> Result<ToolCallResult> {
        match refused {
            NotRun::NotCallable(refused) => self.refused_lookup(refused).await,
            NotRun::Denied { entry, refusal } => self.denied(entry, refusal).await,
            NotRun::ArgumentsInvalid {
                entry,
                reason,
                problem,
            } => {
                self.refused(Some(entry), ExecutionStatus::Error, reason, problem)
                    .await
            }
            NotRun::ReplayBlocked {
                entry,
                args,
                parent,
            } => self.replay_blocked(entry, &args, &parent).await,
        }
    }

    /// Journals a call that a permission rule refused.
    async fn denied(&self, entry: &CatalogEntry, refusal: Refusal) -> Result<ToolCallResult> {
        tracing::debug!(
            session_id = ?self.session.id,
            tool = ?self.call.name,
            slot = %self.call.caller_slot,
            rule = refusal.rule(),
            "tool call refused by permissions"
        );
        self.refused(
            Some(entry),
            ExecutionStatus::Denied,
            refusal.reason_code(),
            refusal.message(&self.call.name),
        )
        .await
    }

    /// Journals a call whose row its admission conditions refused.
    pub(super) async fn refused_admission(
        &self,
        entry: &CatalogEntry,
        refusal: Admitted,
        permissions: &ToolPermissions,
    ) -> Result<ToolCallResult> {
        match refusal {
            Admitted::StepLimit => {
                let limit = permissions.max_steps_per_generation;
                let message = format!(
                    "tool {:?} was not run: this generation has used all {limit} steps allowed by max_steps_per_generation",
                    self.call.name
                );
                let reason = ReasonCode::PermissionMaxStepsPerGenerationExceeded;
                self.refused(Some(entry), ExecutionStatus::Blocked, reason, message)
                    .await
            }
            Admitted::CallLimit => {
                let limit = permissions.max_calls_per_turn;
                self.denied(entry, Refusal::CallLimitReached { limit })
                    .await
            }
            Admitted::RunNotOpen
            | Admitted::Yes
            | Admitted::ReplayChanged
            | Admitted::AlreadyDecided => Err(self.run_not_open()),
        }
    }
}

/// Counts the decided call in the metrics (by provider type and status).
fn record_call(result: &ToolCallResult, name: &str, elapsed: Duration) {
    let metrics = crate::metrics::metrics();
    if !metrics.enabled() {
        return;
    }
    let provider = result.provider_type.map_or("none", |p| p.as_str());
    let builtin = (provider == "builtin")
        .then(|| crate::tools::builtin::static_name(name))
        .flatten();
    metrics.record_call(provider, result.status.as_str(), name, builtin, elapsed);
}
