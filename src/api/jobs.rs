//! Runtime jobs and the tool results they delivered to sessions.

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List, ListParams};
use super::error::ApiResult;
use super::extract::{Path, Query};
use crate::domain::Page;
use crate::state::AppState;
use crate::store::{Delivery, RuntimeJob};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_job))
        .routes(routes!(list_tool_results))
}

/// Show a runtime job (a deferred tool call).
#[utoipa::path(get, path = "/runtime-jobs/{id}", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, description = "the job", body = Data<RuntimeJob>), (status = 404)))]
async fn get_job(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<RuntimeJob>>> {
    Ok(axum::Json(Data {
        data: state.runtime.store.job(&account.id, &id).await?,
    }))
}

/// A page of the results of deferred tool calls delivered to the session
/// (sort_by `created_at`, oldest first unless `sort_order=desc`): what the
/// model is shown on its next turns.
#[utoipa::path(get, path = "/sessions/{id}/tool-results", tag = "jobs",
    params(("id" = String, Path), ListParams),
    responses((status = 200, description = "a page of the delivered results, oldest first by default", body = List<Delivery>), (status = 404)))]
async fn list_tool_results(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<List<Delivery>>> {
    let page = params.oldest_first(&["created_at"])?;
    let (deliveries, total) = state
        .runtime
        .store
        .deliveries_page(&account.id, &id, &page)
        .await?;
    Ok(axum::Json(Page::new(deliveries, total, page).into()))
}
