//! `POST /sessions/{id}/tool-calls`: run a tool call exactly as the session's model
//! would, and answer what the model would see.

use axum::extract::State;
use serde::Deserialize;
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::{ApiError, ApiResult};
use super::extract::{Json, Path};
use crate::call::{CallArguments, ToolCall};
use crate::domain::tool::Slot;
use crate::state::AppState;

/// Body of `POST /sessions/{id}/tool-calls`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallBody {
    /// Tool name as the model called it.
    pub name: String,
    /// A JSON object, or the model's raw argument string.
    #[schema(value_type = Object)]
    pub arguments: Option<Value>,
    /// The model's call id; generated when absent.
    pub call_id: Option<String>,
    /// `director` | `memory` | `narrator` | `verifier` (default `narrator`).
    pub caller_slot: Option<String>,
    /// The floor (turn) this call belongs to.
    pub floor_id: Option<String>,
    /// The run (generation attempt) this call belongs to; implies its floor.
    pub run_id: Option<String>,
    /// Index of the model round trip within the run that made this call; the
    /// parallel calls of one round trip share it. Calls that name a step are held
    /// to `max_steps_per_generation` per run.
    pub step: Option<u32>,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_tool_call))
}

/// Execute a tool call as the session's model would.
#[utoipa::path(post, path = "/sessions/{id}/tool-calls", tag = "tools", request_body = ToolCallBody,
    params(("id" = String, Path)),
    responses((status = 200, description = "what the model sees: call_id, name, output, is_error, status, execution_reason_code (null on success)", body = Data<crate::call::ToolCallResult>), (status = 404)))]
async fn create_tool_call(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    Json(body): Json<ToolCallBody>,
) -> ApiResult<axum::Json<Data<crate::call::ToolCallResult>>> {
    if let Some(problem) = ToolCall::name_problem(&body.name) {
        return Err(ApiError::validation(problem));
    }
    let caller_slot = match body.caller_slot.as_deref() {
        None => Slot::Narrator,
        Some(raw) => Slot::parse(raw)?,
    };
    let call_id = match body.call_id {
        Some(id) if id.is_empty() || id.len() > 256 => {
            return Err(ApiError::validation("call_id must be 1-256 bytes"));
        }
        Some(id) => id,
        None => crate::ids::new_id("call"),
    };
    let call = ToolCall {
        name: body.name,
        arguments: CallArguments::from_json(body.arguments),
        call_id,
        caller_slot,
        floor_id: body.floor_id,
        run_id: body.run_id,
        step: body.step,
    };
    let result = state.runtime.call(&account.id, &session_id, call).await?;
    Ok(axum::Json(Data { data: result }))
}
