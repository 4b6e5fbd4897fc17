//! Runtime jobs and the tool results they delivered to sessions.

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::ApiResult;
use super::extract::Path;
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

/// Results of deferred tool calls delivered to the session, oldest first: what
/// the model is shown on its next turn.
#[utoipa::path(get, path = "/sessions/{id}/tool-results", tag = "jobs", params(("id" = String, Path)),
    responses((status = 200, description = "the delivered results, oldest first", body = Data<Vec<Delivery>>), (status = 404)))]
async fn list_tool_results(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Vec<Delivery>>>> {
    Ok(axum::Json(Data {
        data: state.runtime.store.deliveries(&account.id, &id).await?,
    }))
}
