//! Runs: open a generation attempt on a floor, then commit or discard it.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::{ApiError, ApiResult};
use super::extract::{OptionalJson, Path};
use crate::state::AppState;
use crate::store::Run;

/// Body of `POST /floors/{id}/runs` (may be empty).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenRun {
    /// Earlier executions the client confirms may be repeated.
    #[serde(default)]
    pub confirmed_execution_ids: Vec<String>,
}

/// Body of `POST /runs/{id}/commit` (may be empty).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRun {
    /// The reply text of the committed page.
    pub content: Option<String>,
}

/// Body of `POST /runs/{id}/replay`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRun {
    /// Must be `true`: only dry runs are supported.
    pub dry_run: Option<bool>,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(open_run))
        .routes(routes!(get_run))
        .routes(routes!(commit_run))
        .routes(routes!(discard_run))
        .routes(routes!(regenerate_floor))
        .routes(routes!(get_floor))
        .routes(routes!(select_page))
        .routes(routes!(cancel_run))
        .routes(routes!(replay_run))
}

/// Open a run (a new page) on a floor. Refused with 409
/// `tool_replay_confirmation_required` while earlier attempts hold executions that
/// are not replay-safe and are not confirmed.
#[utoipa::path(post, path = "/floors/{id}/runs", tag = "runs", request_body = OpenRun,
    params(("id" = String, Path)),
    responses((status = 201, description = "the opened run, a new page on the floor", body = Data<Run>), (status = 404),
        (status = 409, description = "tool_replay_confirmation_required; limit_exceeded when the floor holds 100 pages")))]
async fn open_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(floor_id): Path<String>,
    OptionalJson(body): OptionalJson<OpenRun>,
) -> ApiResult<(StatusCode, axum::Json<Data<serde_json::Value>>)> {
    let run = state
        .runtime
        .open_run(&account.id, &floor_id, body.confirmed_execution_ids)
        .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Data {
            data: run_json(&run),
        }),
    ))
}

fn run_json(run: &Run) -> serde_json::Value {
    let mut value = serde_json::to_value(run).unwrap_or_default();
    value["run_id"] = serde_json::Value::String(run.id.clone());
    value
}

/// Get a run.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "the run", body = Data<Run>), (status = 404)))]
async fn get_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(run_id): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let run = state.runtime.store.run(&account.id, &run_id).await?;
    Ok(axum::Json(Data {
        data: run_json(&run),
    }))
}

/// Commit a run: its page becomes active, its executions `committed`, its buffered
/// effects are applied and its deferred jobs are queued.
#[utoipa::path(post, path = "/runs/{id}/commit", tag = "runs", request_body = CommitRun,
    params(("id" = String, Path)),
    responses((status = 200, description = "the committed run", body = Data<Run>), (status = 404),
        (status = 409, description = "run_not_open, or generation_in_progress while the loop still generates the run")))]
async fn commit_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(run_id): Path<String>,
    OptionalJson(body): OptionalJson<CommitRun>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let run = state
        .runtime
        .commit_run(&account.id, &run_id, body.content.as_deref())
        .await?;
    Ok(axum::Json(Data {
        data: run_json(&run),
    }))
}

/// Discard a run: its executions become `discarded`, its effects are dropped.
#[utoipa::path(post, path = "/runs/{id}/discard", tag = "runs",
    params(("id" = String, Path)),
    responses((status = 200, description = "the discarded run", body = Data<Run>), (status = 404),
        (status = 409, description = "run_not_open, or generation_in_progress while the loop still generates the run")))]
async fn discard_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(run_id): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let run = state.runtime.discard_run(&account.id, &run_id).await?;
    Ok(axum::Json(Data {
        data: run_json(&run),
    }))
}

/// Regenerate a floor: a new run and page through the replay guard, generated
/// by the configured model; earlier pages keep their text.
#[utoipa::path(post, path = "/floors/{id}/regenerate", tag = "runs", request_body = OpenRun,
    params(("id" = String, Path)),
    responses((status = 202, description = "`{\"data\": {floor_id, run_id, page_id}}`"), (status = 404),
        (status = 409, description = "`tool_replay_confirmation_required` (naming the executions) or `generation_in_progress`"),
        (status = 503, description = "`model_not_configured`")))]
async fn regenerate_floor(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(floor_id): Path<String>,
    OptionalJson(body): OptionalJson<OpenRun>,
) -> ApiResult<(StatusCode, axum::Json<Data<serde_json::Value>>)> {
    let run = state
        .runtime
        .regenerate(&account.id, &floor_id, body.confirmed_execution_ids)
        .await?;
    let data =
        serde_json::json!({"floor_id": run.floor_id, "run_id": run.id, "page_id": run.page_id});
    Ok((StatusCode::ACCEPTED, axum::Json(Data { data })))
}

/// A floor with every page and its text.
#[utoipa::path(get, path = "/floors/{id}", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "the floor", body = Data<crate::store::Floor>), (status = 404)))]
async fn get_floor(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(floor_id): Path<String>,
) -> ApiResult<axum::Json<Data<crate::store::Floor>>> {
    let floor = state.runtime.store.floor(&account.id, &floor_id).await?;
    Ok(axum::Json(Data { data: floor }))
}

/// Choose a page: its run is committed, the floor's other open runs discarded.
#[utoipa::path(post, path = "/pages/{id}/select", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "the committed run", body = Data<Run>), (status = 404),
        (status = 409, description = "`run_not_open` (the page's run was discarded) or `generation_in_progress`")))]
async fn select_page(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(page_id): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let run = state.runtime.select_page(&account.id, &page_id).await?;
    Ok(axum::Json(Data {
        data: run_json(&run),
    }))
}

/// Stop a run's generation before its next step; calls already started finish.
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": {run_id, cancelled}}` (`cancelled: false` when it was not generating)"),
        (status = 404)))]
async fn cancel_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(run_id): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let cancelled = state
        .runtime
        .cancel_generation(&account.id, &run_id)
        .await?;
    Ok(axum::Json(Data {
        data: serde_json::json!({"run_id": run_id, "cancelled": cancelled}),
    }))
}

/// Dry-run replay of a past run (open, committed or discarded): every call the
/// run journalled, oldest first and at most 1000 of them, re-evaluated against
/// today's catalog and permissions by the call path's own checks, in its order
/// (catalog lookup, permissions for the call's recorded caller slot, the
/// recorded arguments against the tool's schema, the replay guard). No provider
/// starts, nothing is journalled and the run is unchanged; the dry run is
/// logged. Each call's `verdict` is `would_run`, `would_be_denied` (`reason`
/// names the rule), `tool_missing`, `arguments_invalid` (`reason` is the schema
/// error) or `needs_replay_confirmation`: run again in a new run on the same
/// floor, the call would repeat an execution of the same tool with the same
/// arguments on that floor (the original call itself, when it reached its
/// provider) that is not replay-safe and not among the run's
/// `confirmed_execution_ids`. The run's step and call budgets are not
/// simulated. `recorded_status` is the journal's status of the original call.
/// Only `{"dry_run": true}` is accepted: anything else is 400
/// `validation_error` and runs nothing.
#[utoipa::path(post, path = "/runs/{id}/replay", tag = "runs", request_body = ReplayRun,
    params(("id" = String, Path)),
    responses((status = 200, description = "today's verdict on each call of the run", body = Data<crate::runtime::DryRun>),
        (status = 400, description = "`validation_error`: not a dry run, or an unknown field"),
        (status = 404, description = "no such run in the account")))]
async fn replay_run(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(run_id): Path<String>,
    OptionalJson(body): OptionalJson<ReplayRun>,
) -> ApiResult<axum::Json<Data<crate::runtime::DryRun>>> {
    if body.dry_run != Some(true) {
        return Err(ApiError::validation(
            "only dry runs are supported: send {\"dry_run\": true}",
        ));
    }
    let data = state.runtime.dry_run_replay(&account.id, &run_id).await?;
    Ok(axum::Json(Data { data }))
}
