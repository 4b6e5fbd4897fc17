//! Sessions and their floors, scoped to the calling account.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List, ListParams};
use super::error::{ApiError, ApiResult};
use super::extract::{Json, Path, Query};
use crate::domain::Page;
use crate::state::AppState;
use crate::store::{Floor, Session};

/// Body of `POST /sessions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Name of one of the account's characters.
    pub character: String,
    #[serde(default)]
    pub title: String,
}

/// Query of `GET /sessions`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SessionListParams {
    /// Only sessions with this character.
    pub character: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
    /// `created_at` | `updated_at`
    pub sort_by: Option<String>,
    pub sort_order: Option<String>,
}

/// Body of `POST /sessions/{id}/floors`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendFloor {
    /// The user's message.
    pub content: String,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, delete_session))
        .routes(routes!(append_floor, list_floors))
}

/// Start a session with one of the account's characters.
#[utoipa::path(post, path = "/sessions", tag = "sessions", request_body = CreateSession,
    responses((status = 201, description = "the started session", body = Data<Session>), (status = 404, description = "unknown character")))]
async fn create_session(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Json(body): Json<CreateSession>,
) -> ApiResult<(StatusCode, axum::Json<Data<Session>>)> {
    if body.title.chars().count() > 256 {
        return Err(ApiError::validation("title must be at most 256 characters"));
    }
    let session = state
        .runtime
        .store
        .create_session(&account.id, &body.character, &body.title)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(Data { data: session })))
}

/// List the account's sessions.
#[utoipa::path(get, path = "/sessions", tag = "sessions", params(SessionListParams),
    responses((status = 200, description = "a page of the account's sessions", body = List<Session>)))]
async fn list_sessions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<SessionListParams>,
) -> ApiResult<axum::Json<List<Session>>> {
    let page = crate::domain::PageRequest::parse(
        params.limit,
        params.offset,
        params.sort_by.as_deref(),
        params.sort_order.as_deref(),
        &["created_at", "updated_at"],
    )?;
    let page = state
        .runtime
        .store
        .list_sessions(&account.id, params.character.as_deref(), page)
        .await?;
    Ok(axum::Json(page.into()))
}

/// Get one session.
#[utoipa::path(get, path = "/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)), responses((status = 200, description = "the session", body = Data<Session>), (status = 404)))]
async fn get_session(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Session>>> {
    Ok(axum::Json(Data {
        data: state.runtime.store.session(&account.id, &id).await?,
    }))
}

/// Delete a session with its floors.
#[utoipa::path(delete, path = "/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, description = "deleted with its floors: `{\"data\": {id, deleted: true}}`"), (status = 404)))]
async fn delete_session(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let session = state.runtime.delete_session(&account.id, &id).await?;
    Ok(axum::Json(Data {
        data: serde_json::json!({ "id": session.id, "deleted": true }),
    }))
}

/// Append a user turn (a floor) to the session. With a model configured it
/// also starts a generation run (202, its events on `/sessions/{id}/events`);
/// the session's previous finished run is committed first.
#[utoipa::path(post, path = "/sessions/{id}/floors", tag = "sessions", request_body = AppendFloor,
    params(("id" = String, Path)),
    responses(
        (status = 201, description = "no model configured: the appended floor, with `run: null` and `run_error: {code: \"model_not_configured\", message}`"),
        (status = 202, description = "the appended floor with `floor_id`, `run_id`, `page_id` and `run` of the generation it started"),
        (status = 404),
        (status = 409, description = "`generation_in_progress`: the previous turn is still generating")))]
async fn append_floor(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Json(body): Json<AppendFloor>,
) -> ApiResult<(StatusCode, axum::Json<Data<serde_json::Value>>)> {
    let runtime = &state.runtime;
    let session = runtime.store.session(&account.id, &id).await?;
    // Taken before anything is written: two floors at once cannot both start.
    let claim = runtime.claim_turn(&session.id).await?;
    runtime
        .commit_finished_turn(&account.id, &session.id)
        .await?;
    let floor = runtime
        .store
        .append_floor(&account.id, &session.id, &body.content)
        .await?;
    let started = runtime.start_turn(claim, &account.id, &floor).await?;
    let mut data = serde_json::to_value(&floor).unwrap_or_default();
    data["floor_id"] = serde_json::json!(floor.id);
    let status = match started {
        Some(run) => {
            data["run_id"] = serde_json::json!(run.id);
            data["page_id"] = serde_json::json!(run.page_id);
            data["run"] = serde_json::to_value(&run).unwrap_or_default();
            StatusCode::ACCEPTED
        }
        None => {
            let code = crate::error::ErrorCode::ModelNotConfigured;
            data["run"] = serde_json::Value::Null;
            data["run_error"] =
                serde_json::json!({"code": code.as_str(), "message": code.meaning()});
            StatusCode::CREATED
        }
    };
    Ok((status, axum::Json(Data { data })))
}

/// List a page of the session's floors, with their pages and active page
/// (sort_by `seq`, oldest first unless `sort_order=desc`).
#[utoipa::path(get, path = "/sessions/{id}/floors", tag = "sessions",
    params(("id" = String, Path), ListParams),
    responses((status = 200, description = "a page of the session's floors, oldest first by default", body = List<Floor>), (status = 404)))]
async fn list_floors(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<List<Floor>>> {
    let page = params.oldest_first(&["seq"])?;
    let (floors, total) = state
        .runtime
        .store
        .floors_page(&account.id, &id, &page)
        .await?;
    Ok(axum::Json(Page::new(floors, total, page).into()))
}
