//! The execution journal (source of truth) and the legacy call-record projection.

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List, WrittenList};
use super::error::ApiResult;
use super::extract::{Path, Query};
use crate::journal::query::{
    CallRecordQuery, CallRecordQueryParams, ExecutionQuery, ExecutionQueryParams,
    FloorExecutionQueryParams,
};
use crate::journal::{CallRecord, ExecutionJson, ExecutionRecord};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_executions))
        .routes(routes!(get_execution))
        .routes(routes!(list_floor_executions))
        .routes(routes!(list_call_records))
}

/// Query the execution journal; needs session_id, floor_id or run_id.
#[utoipa::path(get, path = "/tool-executions", tag = "journal", params(ExecutionQueryParams),
    responses((status = 200, description = "a page of the matching journal rows", body = List<ExecutionRecord>), (status = 400)))]
async fn list_executions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<ExecutionQueryParams>,
) -> ApiResult<WrittenList> {
    let query = ExecutionQuery::parse(params)?;
    journal_page(&state, &account.id, query).await
}

/// One journal row.
#[utoipa::path(get, path = "/tool-executions/{id}", tag = "journal", params(("id" = String, Path)),
    responses((status = 200, description = "the journal row", body = Data<ExecutionRecord>), (status = 404)))]
async fn get_execution(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<ExecutionRecord>>> {
    let record = state
        .runtime
        .store
        .execution(&account.id, &id)
        .await?
        .ok_or_else(|| crate::error::Error::not_found(format!("tool execution {id:?}")))?;
    Ok(axum::Json(Data { data: record }))
}

/// Query the execution journal of one floor.
#[utoipa::path(get, path = "/floors/{id}/tool-executions", tag = "journal",
    params(("id" = String, Path), FloorExecutionQueryParams),
    responses((status = 200, description = "a page of the floor's journal rows", body = List<ExecutionRecord>), (status = 404)))]
async fn list_floor_executions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(floor_id): Path<String>,
    Query(params): Query<FloorExecutionQueryParams>,
) -> ApiResult<WrittenList> {
    let floor = state
        .runtime
        .store
        .floor_ref(&account.id, &floor_id)
        .await?;
    let query = ExecutionQuery::parse(params.with_floor(floor.id))?;
    journal_page(&state, &account.id, query).await
}

/// A page of the journal written as the API answers it.
async fn journal_page(
    state: &AppState,
    account_id: &str,
    query: ExecutionQuery,
) -> ApiResult<WrittenList> {
    Ok(state
        .runtime
        .store
        .query_executions_as::<ExecutionJson>(account_id, query)
        .await?
        .into())
}

/// Legacy call-records: a projection of the journal with five statuses.
#[utoipa::path(get, path = "/tools/call-records", tag = "journal", params(CallRecordQueryParams),
    responses((status = 200, description = "a page of call records", body = List<CallRecord>), (status = 400)))]
async fn list_call_records(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<CallRecordQueryParams>,
) -> ApiResult<axum::Json<List<CallRecord>>> {
    let query = CallRecordQuery::parse(params)?;
    Ok(axum::Json(
        state
            .runtime
            .store
            .query_call_records(&account.id, query)
            .await?
            .into(),
    ))
}
