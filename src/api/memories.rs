//! `POST/GET /sessions/{id}/memories`: facts remembered about a session, which
//! `query_memory` searches together with the session's turns.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List, ListParams};
use super::error::ApiResult;
use super::extract::{Json, Path, Query};
use crate::domain::Page;
use crate::state::AppState;
use crate::store::Memory;

/// Body of `POST /sessions/{id}/memories`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMemory {
    /// The remembered text (1-16384 bytes).
    pub content: String,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(add_memory, list_memories))
}

/// Store a memory for the session.
#[utoipa::path(post, path = "/sessions/{id}/memories", tag = "sessions", request_body = NewMemory,
    params(("id" = String, Path)),
    responses((status = 201, description = "the stored memory", body = Data<Memory>), (status = 400), (status = 404)))]
async fn add_memory(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    Json(body): Json<NewMemory>,
) -> ApiResult<(StatusCode, axum::Json<Data<Memory>>)> {
    let memory = state
        .runtime
        .store
        .add_memory(&account.id, &session_id, &body.content)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(Data { data: memory })))
}

/// A page of the session's memories, oldest first unless `sort_order=desc`.
#[utoipa::path(get, path = "/sessions/{id}/memories", tag = "sessions",
    params(("id" = String, Path), ListParams),
    responses((status = 200, description = "a page of the session's memories, oldest first by default", body = List<Memory>), (status = 400), (status = 404)))]
async fn list_memories(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<List<Memory>>> {
    let page = params.oldest_first(&["created_at"])?;
    let (memories, total) = state
        .runtime
        .store
        .list_memories(&account.id, &session_id, &page)
        .await?;
    Ok(axum::Json(Page::new(memories, total, page).into()))
}
