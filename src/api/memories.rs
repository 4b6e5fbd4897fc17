//! `POST/GET /sessions/{id}/memories`: facts remembered about a session, which
//! `query_memory` searches together with the session's turns.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::ApiResult;
use super::extract::{Json, Path};
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

/// List the session's memories, oldest first.
#[utoipa::path(get, path = "/sessions/{id}/memories", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, description = "the session's memories, oldest first", body = Data<Vec<Memory>>), (status = 404)))]
async fn list_memories(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
) -> ApiResult<axum::Json<Data<Vec<Memory>>>> {
    Ok(axum::Json(Data {
        data: state
            .runtime
            .store
            .list_memories(&account.id, &session_id)
            .await?,
    }))
}
