//! The call vocabulary every provider speaks: a call as the model made it, the
//! provider's answer, the rule that turns an answer into a journal status, and
//! the snapshot a deferred call keeps until a worker runs it. Providers use these
//! without knowing the dispatcher.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::tool::{ReplaySafety, SideEffectLevel, Slot};
use crate::journal::ExecutionStatus;
use crate::reason::ReasonCode;

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
            None | Some(Value::Null) => Self::parsed(Value::Object(Default::default())),
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
            Some(value @ Value::Object(_)) => Self::parsed(value),
            Some(other) => Self {
                raw: other.to_string(),
                parsed: Err("tool arguments must be a JSON object".to_owned()),
            },
        }
    }

    /// Arguments that are already a parsed object.
    fn parsed(value: Value) -> Self {
        Self {
            raw: value.to_string(),
            parsed: Ok(value),
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

/// The longest tool name a client's call may give, in bytes (a model's call
/// in the generation loop is journalled whatever it names: the model asked).
pub const MAX_CALLED_NAME_BYTES: usize = 256;

impl ToolCall {
    /// Why a client may not call a tool by `name`, if it may not: the refusal
    /// both client doors (`POST /sessions/{id}/tool-calls` and MCP's
    /// `tools/call`) answer before anything is journalled.
    pub fn name_problem(name: &str) -> Option<String> {
        (name.is_empty() || name.len() > MAX_CALLED_NAME_BYTES)
            .then(|| format!("name must be 1-{MAX_CALLED_NAME_BYTES} bytes"))
    }
}

/// What the model sees, plus the outcome status.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ToolCallResult {
    pub call_id: String,
    pub name: String,
    /// The tool's output; a string saying why when `is_error`.
    pub output: Value,
    pub is_error: bool,
    pub status: ExecutionStatus,
    /// Why the call did not succeed; null on success (and for a deferred
    /// receipt, whose job has not run yet).
    pub execution_reason_code: Option<ReasonCode>,
    /// The journal row of this call.
    pub execution_id: String,
    /// Which kind of provider answered; None when no tool of that name was
    /// found (for metrics, not part of the answer).
    #[serde(skip)]
    pub provider_type: Option<crate::domain::tool::ProviderType>,
}

/// The provider's answer to one call. Every failure names its reason, so that
/// the journal and the caller can tell failures apart without parsing messages.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    Success(Value),
    Error {
        reason: ReasonCode,
        message: String,
    },
    Timeout {
        reason: ReasonCode,
        message: String,
    },
    /// The provider never received the call (connection refused, sandbox at
    /// capacity, a switch that is off): nothing can have happened, so the call
    /// counts as neither a step, a replay parent nor against the call budget.
    NotStarted {
        reason: ReasonCode,
        message: String,
        /// When the caller may try again, if the refusal is temporary.
        retry_after_ms: Option<u64>,
    },
}

impl ToolOutcome {
    /// The provider ran the call and it failed.
    pub fn error(reason: ReasonCode, message: impl Into<String>) -> Self {
        ToolOutcome::Error {
            reason,
            message: message.into(),
        }
    }

    /// The provider did not answer in time; `settle` decides whether that is a
    /// `timeout` or `uncertain`.
    pub fn timeout(reason: ReasonCode, message: impl Into<String>) -> Self {
        ToolOutcome::Timeout {
            reason,
            message: message.into(),
        }
    }

    /// A refusal before the provider started, with no retry hint.
    pub fn not_started(reason: ReasonCode, message: impl Into<String>) -> Self {
        ToolOutcome::NotStarted {
            reason,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// Why the call failed; None on success.
    pub fn reason(&self) -> Option<ReasonCode> {
        match self {
            ToolOutcome::Success(_) => None,
            ToolOutcome::Error { reason, .. }
            | ToolOutcome::Timeout { reason, .. }
            | ToolOutcome::NotStarted { reason, .. } => Some(*reason),
        }
    }
}

/// How an outcome is journalled and shown to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub status: ExecutionStatus,
    pub output: Value,
    pub is_error: bool,
    /// Whether the provider received the call (see `ToolOutcome::NotStarted`).
    pub provider_started: bool,
    /// Why the call failed; None on success.
    pub reason_code: Option<ReasonCode>,
}

/// The one rule from a provider's answer to a journal status, for inline calls
/// and runtime jobs alike: a tool with side effects that timed out may or may not
/// have acted, so its status is `uncertain`, not `timeout`.
pub fn settle(outcome: ToolOutcome, side_effect_level: SideEffectLevel) -> Settled {
    let failed = |status, reason, message: String, provider_started| Settled {
        status,
        output: Value::String(message),
        is_error: true,
        provider_started,
        reason_code: Some(reason),
    };
    match outcome {
        ToolOutcome::Success(output) => Settled {
            status: ExecutionStatus::Success,
            output,
            is_error: false,
            provider_started: true,
            reason_code: None,
        },
        ToolOutcome::Error { reason, message } => {
            failed(ExecutionStatus::Error, reason, message, true)
        }
        ToolOutcome::Timeout { reason, message } if side_effect_level != SideEffectLevel::None => {
            failed(ExecutionStatus::Uncertain, reason, message, true)
        }
        ToolOutcome::Timeout { reason, message } => {
            failed(ExecutionStatus::Timeout, reason, message, true)
        }
        ToolOutcome::NotStarted {
            reason,
            message,
            retry_after_ms,
        } => {
            let message = match retry_after_ms {
                Some(ms) => format!("{message}; retry after {ms} ms"),
                None => message,
            };
            failed(ExecutionStatus::Error, reason, message, false)
        }
    }
}

/// One hand-over of an execution to its provider. The key is the execution
/// id: a job handed over again after its worker was lost keeps it, so a
/// provider that honours the key applies the call's effect once.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// The journal row's id: `Idempotency-Key` of a callback,
    /// `toolgate/idempotency_key` in an MCP call's `_meta`.
    pub idempotency_key: &'a str,
    /// 1 for the first hand-over; a job re-delivered after a lost lease counts
    /// on (`X-Toolgate-Attempt`).
    pub number: u32,
}

/// Everything needed to run a deferred call later, even after a restart has
/// emptied the runtime registries: a snapshot taken at call time. `kind` names
/// the provider that can rebuild the tool from `tool`; the serialised shape is
/// flat, so snapshots written before `side_effect_level` existed still load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInvocation {
    /// The provider kind (`ToolProvider::kind`).
    pub kind: String,
    pub call_id: String,
    pub raw_arguments: String,
    pub arguments: Value,
    /// The tool's side-effect level at call time; unknown for old snapshots,
    /// which are then treated as side-effecting (a timeout is `uncertain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect_level: Option<SideEffectLevel>,
    /// The tool's replay safety at call time: only a `safe` tool's job is
    /// handed over again after its worker was lost. Unknown for old
    /// snapshots, which are never re-delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_safety: Option<ReplaySafety>,
    /// The provider's own description of the tool.
    #[serde(flatten)]
    pub tool: serde_json::Map<String, Value>,
}

impl JobInvocation {
    /// A text field of the tool snapshot, or why it is missing.
    pub fn tool_text(&self, field: &str) -> std::result::Result<String, String> {
        self.tool
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("the job snapshot has no {field:?}"))
    }

    /// The side-effect level the outcome rule uses for this job.
    pub fn effective_side_effect_level(&self) -> SideEffectLevel {
        self.side_effect_level
            .unwrap_or(SideEffectLevel::Irreversible)
    }

    /// The call as the worker replays it to the provider.
    pub fn to_call(&self, name: &str) -> ToolCall {
        ToolCall {
            name: name.to_owned(),
            arguments: CallArguments {
                raw: self.raw_arguments.clone(),
                parsed: Ok(self.arguments.clone()),
            },
            call_id: self.call_id.clone(),
            caller_slot: Slot::Narrator,
            floor_id: None,
            run_id: None,
            step: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_of_side_effecting_tools_are_uncertain() {
        let timeout = || ToolOutcome::timeout(ReasonCode::RemoteTimeout, "slow");
        let plain = settle(timeout(), SideEffectLevel::None);
        assert_eq!(plain.status, ExecutionStatus::Timeout);
        assert_eq!(plain.reason_code, Some(ReasonCode::RemoteTimeout));
        for level in [SideEffectLevel::Sandbox, SideEffectLevel::Irreversible] {
            assert_eq!(settle(timeout(), level).status, ExecutionStatus::Uncertain);
        }
    }

    #[test]
    fn refusals_before_the_provider_are_errors_that_never_started() {
        let settled = settle(
            ToolOutcome::NotStarted {
                reason: ReasonCode::ScriptSandboxBusy,
                message: "busy".into(),
                retry_after_ms: Some(250),
            },
            SideEffectLevel::Irreversible,
        );
        assert_eq!(settled.status, ExecutionStatus::Error);
        assert!(!settled.provider_started);
        assert_eq!(settled.reason_code, Some(ReasonCode::ScriptSandboxBusy));
        assert!(settled.output.as_str().unwrap().contains("250 ms"));
        let error = ToolOutcome::error(ReasonCode::BuiltinToolError, "x");
        assert!(settle(error, SideEffectLevel::None).provider_started);
    }

    #[test]
    fn only_success_settles_without_a_reason() {
        let success = settle(ToolOutcome::Success(Value::Null), SideEffectLevel::None);
        assert_eq!(success.reason_code, None);
        assert!(!success.is_error);
        let refused = ToolOutcome::not_started(ReasonCode::JobSessionGone, "gone");
        assert_eq!(refused.reason(), Some(ReasonCode::JobSessionGone));
        let settled = settle(refused, SideEffectLevel::None);
        assert_eq!(settled.reason_code, Some(ReasonCode::JobSessionGone));
        assert_eq!(settled.output, Value::String("gone".into()));
    }

    #[test]
    fn old_job_snapshots_still_load() {
        let old = serde_json::json!({
            "kind": "remote", "name": "t", "callback_url": "http://127.0.0.1:1/cb",
            "source": "s", "role": "Lanlan", "timeout_seconds": 5.0,
            "call_id": "c", "raw_arguments": "{}", "arguments": {},
        });
        let invocation: JobInvocation = serde_json::from_value(old).unwrap();
        assert_eq!(invocation.kind, "remote");
        assert_eq!(invocation.tool["callback_url"], "http://127.0.0.1:1/cb");
        assert_eq!(
            invocation.effective_side_effect_level(),
            SideEffectLevel::Irreversible
        );
    }
}
