//! The model-facing call path: look the tool up in the session's catalog, check it,
//! validate its arguments, run it, and shape what the model sees.

use serde_json::Value;

use crate::catalog::{Catalog, Invoker, Lookup};
use crate::domain::tool::Slot;
use crate::error::{Error, Result};
use crate::runtime::ToolRuntime;
use crate::store::Session;

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
}

/// How a call ended, as the journal will record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    Success,
    Error,
    Timeout,
    Denied,
    Blocked,
}

/// What the model sees, plus the outcome status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolCallResult {
    pub call_id: String,
    pub name: String,
    pub output: Value,
    pub is_error: bool,
    pub status: CallStatus,
}

/// The provider's answer to one call.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    Success(Value),
    Error(String),
    Timeout(String),
}

impl ToolRuntime {
    /// The catalog of `session` right now.
    pub async fn catalog(&self, session: &Session) -> Result<Catalog> {
        let mut entries = crate::tools::builtin::catalog_entries(self, session).await?;
        entries.extend(self.remote.catalog_entries(&session.character));
        entries.extend(crate::tools::preset::catalog_entries(self, session).await?);
        Ok(Catalog::assemble(&session.id, entries))
    }

    /// Runs one call on the account's session. Client mistakes about the session
    /// are errors; everything about the tool itself is a model-visible result.
    pub async fn call(
        &self,
        account_id: &str,
        session_id: &str,
        call: ToolCall,
    ) -> Result<ToolCallResult> {
        let session = self.store.session(account_id, session_id).await?;
        if let Some(floor_id) = &call.floor_id {
            let floor = self.store.floor(account_id, floor_id).await?;
            if floor.session_id != session.id {
                return Err(Error::not_found(format!("floor {floor_id:?}")));
            }
        }
        let catalog = self.catalog(&session).await?;
        let refuse = |status: CallStatus, message: String| ToolCallResult {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            output: Value::String(message),
            is_error: true,
            status,
        };
        let entry = match catalog.lookup(&call.name) {
            Lookup::Found(entry) => entry,
            Lookup::Unknown => {
                return Ok(refuse(
                    CallStatus::Denied,
                    format!(
                        "unknown tool {:?}: it is not in this session's catalog",
                        call.name
                    ),
                ));
            }
            Lookup::Conflict(conflict) => {
                return Ok(refuse(
                    CallStatus::Denied,
                    format!(
                        "tool {:?} is offered by several providers ({}); the call was refused",
                        conflict.name,
                        conflict.provider_ids.join(", ")
                    ),
                ));
            }
            Lookup::Unavailable(entry) => {
                return Ok(refuse(
                    CallStatus::Denied,
                    format!(
                        "tool {:?} is unavailable: {}",
                        call.name,
                        entry
                            .availability_reason
                            .as_deref()
                            .unwrap_or("no reason given")
                    ),
                ));
            }
        };
        let args = match &call.arguments.parsed {
            Ok(args) => args.clone(),
            Err(problem) => return Ok(refuse(CallStatus::Error, problem.clone())),
        };
        if let Err(problem) = crate::schema::validate_arguments(&entry.spec.parameters, &args) {
            return Ok(refuse(
                CallStatus::Error,
                format!("invalid arguments: {problem}"),
            ));
        }
        let outcome = match &entry.invoker {
            Invoker::Builtin(name) => {
                crate::tools::builtin::call(self, &session, name, &args).await
            }
            Invoker::Remote(tool) => self.remote.call(tool, &call, &args).await,
            Invoker::Preset(tool) => crate::tools::preset::call(self, tool, &args).await,
        };
        Ok(match outcome {
            ToolOutcome::Success(output) => ToolCallResult {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                output,
                is_error: false,
                status: CallStatus::Success,
            },
            ToolOutcome::Error(message) => refuse(CallStatus::Error, message),
            ToolOutcome::Timeout(message) => refuse(CallStatus::Timeout, message),
        })
    }
}
