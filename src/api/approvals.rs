//! Deciding calls held for approval (`approval_required` in a session's tool
//! permissions): approve one, reject one, or decide several in one request,
//! each decision on its own.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::{ApiError, ApiResult};
use super::extract::{Json, OptionalJson, Path};
use crate::error::Error;
use crate::state::AppState;
use crate::store::{ApprovalDecision, Decided};

/// Most decisions one batch may carry.
pub const MAX_DECISIONS: usize = 100;
/// The reason recorded when a rejection gives none.
const DEFAULT_REASON: &str = "no reason given";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(approve))
        .routes(routes!(reject))
        .routes(routes!(decide_many))
}

/// Body of `POST /tool-executions/{id}/reject` (may be empty).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rejection {
    /// Why; recorded in the journal row and given to the model.
    pub reason: Option<String>,
}

/// One decision of a batch.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchDecision {
    pub execution_id: String,
    /// true approves, false rejects.
    pub approve: bool,
    /// A rejection's reason.
    pub reason: Option<String>,
}

/// Body of `POST /tool-executions/approvals`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decisions {
    pub decisions: Vec<BatchDecision>,
}

/// A decided approval.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DecisionAnswer {
    pub execution_id: String,
    pub runtime_job_id: String,
    /// `queued` (approved: a worker runs it), `staged` (approved inside an
    /// open run: it runs once the run commits) or `denied` (rejected).
    pub status: String,
}

/// One answer of a batch: the decision, or why it was not taken.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BatchAnswer {
    pub execution_id: String,
    /// `approved`, `rejected`, or `failed` (see `error`).
    pub outcome: String,
    pub runtime_job_id: Option<String>,
    /// `{code, message}` of a decision not taken (e.g. `approval_not_pending`).
    #[schema(value_type = Option<Object>)]
    pub error: Option<serde_json::Value>,
}

fn answer(decided: Decided) -> DecisionAnswer {
    DecisionAnswer {
        status: if decided.delivery.is_some() {
            "denied".to_owned()
        } else {
            decided.job_state.clone()
        },
        execution_id: decided.execution_id,
        runtime_job_id: decided.runtime_job_id,
    }
}

fn rejection(reason: Option<String>) -> ApprovalDecision {
    let reason = reason
        .map(|reason| reason.trim().to_owned())
        .filter(|reason| !reason.is_empty())
        .unwrap_or_else(|| DEFAULT_REASON.to_owned());
    ApprovalDecision::Reject { reason }
}

/// Approve a call awaiting approval: its job is queued, and its result reaches
/// the session as a `tool_result` event, like a deferred call's. 409
/// `approval_not_pending` when it is not awaiting approval (decided, timed
/// out, cancelled by its run, or never held).
#[utoipa::path(post, path = "/tool-executions/{id}/approve", tag = "approvals",
    params(("id" = String, Path)),
    responses((status = 202, description = "approved; the call is queued", body = Data<DecisionAnswer>),
        (status = 404), (status = 409, description = "approval_not_pending")))]
async fn approve(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, axum::Json<Data<DecisionAnswer>>)> {
    let decided = state
        .runtime
        .decide_approval(&account.id, &id, ApprovalDecision::Approve)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(Data {
            data: answer(decided),
        }),
    ))
}

/// Reject a call awaiting approval: it ends `denied` (`approval_rejected`)
/// with the reason, at once, and never runs; the session gets that result.
#[utoipa::path(post, path = "/tool-executions/{id}/reject", tag = "approvals",
    params(("id" = String, Path)), request_body = Rejection,
    responses((status = 200, description = "rejected", body = Data<DecisionAnswer>),
        (status = 404), (status = 409, description = "approval_not_pending")))]
async fn reject(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    OptionalJson(body): OptionalJson<Rejection>,
) -> ApiResult<axum::Json<Data<DecisionAnswer>>> {
    let decided = state
        .runtime
        .decide_approval(&account.id, &id, rejection(body.reason))
        .await?;
    Ok(axum::Json(Data {
        data: answer(decided),
    }))
}

/// Decide several calls awaiting approval (e.g. the parallel calls of one
/// model answer). Each decision is taken on its own and atomically; one that
/// cannot be taken is answered `failed` with its error, and the others stand.
#[utoipa::path(post, path = "/tool-executions/approvals", tag = "approvals",
    request_body = Decisions,
    responses((status = 200, description = "one answer per decision, in order", body = Data<Vec<BatchAnswer>>),
        (status = 400)))]
async fn decide_many(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Json(body): Json<Decisions>,
) -> ApiResult<axum::Json<Data<Vec<BatchAnswer>>>> {
    if body.decisions.is_empty() || body.decisions.len() > MAX_DECISIONS {
        return Err(Error::validation(format!(
            "`decisions` must hold 1 to {MAX_DECISIONS} decisions"
        ))
        .into());
    }
    let mut answers = Vec::with_capacity(body.decisions.len());
    for decision in body.decisions {
        let (outcome, wanted) = if decision.approve {
            ("approved", ApprovalDecision::Approve)
        } else {
            ("rejected", rejection(decision.reason))
        };
        let taken = state
            .runtime
            .decide_approval(&account.id, &decision.execution_id, wanted)
            .await;
        answers.push(match taken {
            Ok(decided) => BatchAnswer {
                execution_id: decided.execution_id,
                outcome: outcome.to_owned(),
                runtime_job_id: Some(decided.runtime_job_id),
                error: None,
            },
            Err(error) => {
                let error = ApiError::from(error);
                BatchAnswer {
                    execution_id: decision.execution_id,
                    outcome: "failed".to_owned(),
                    runtime_job_id: None,
                    error: Some(serde_json::json!({
                        "code": error.code.as_str(),
                        "message": error.message,
                    })),
                }
            }
        });
    }
    Ok(axum::Json(Data { data: answers }))
}
