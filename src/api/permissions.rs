//! `GET/PUT/PATCH /sessions/{id}/tool-permissions`: a session's base tool
//! permissions, stored in its `metadata_json.tool_permissions`.

use axum::extract::{Request, State};
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::error::ApiResult;
use super::extract::{Path, body_bytes, parse_json};
use crate::catalog::{CatalogChange, CatalogScope};
use crate::permissions::{METADATA_KEY, ToolPermissions};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(
        get_permissions,
        replace_permissions,
        patch_permissions
    ))
}

fn envelope(permissions: &ToolPermissions) -> axum::Json<Value> {
    axum::Json(json!({ "data": permissions.to_json() }))
}

/// Reads the body as JSON of any shape; the permission parser names the fields.
async fn read_body(req: Request, state: &AppState) -> ApiResult<Value> {
    let bytes = body_bytes(req, state).await?;
    parse_json::<Value>(&bytes).map_err(super::error::ApiError::validation)
}

/// Read the session's tool permissions (defaults when never set).
#[utoipa::path(get, path = "/sessions/{id}/tool-permissions", tag = "tool-permissions",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": {enabled, max_calls_per_turn, max_steps_per_generation, allow_irreversible, slot_allow_list, slot_deny_list}}`"),
        (status = 404)))]
async fn get_permissions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
) -> ApiResult<axum::Json<Value>> {
    let session = state
        .runtime
        .store
        .session(&account.id, &session_id)
        .await?;
    Ok(envelope(&ToolPermissions::from_metadata(
        &session.metadata,
    )?))
}

/// Replace the session's tool permissions; missing fields take their defaults.
#[utoipa::path(put, path = "/sessions/{id}/tool-permissions", tag = "tool-permissions",
    params(("id" = String, Path)), request_body(content = Object),
    responses((status = 200, description = "the stored permissions"),
        (status = 400, description = "validation_error"), (status = 404)))]
async fn replace_permissions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    req: Request,
) -> ApiResult<axum::Json<Value>> {
    let body = read_body(req, &state).await?;
    let permissions = ToolPermissions::replaced(&body)?;
    save(&state, &account.id, &session_id, |_| Ok(permissions)).await
}

/// Merge into the session's tool permissions: slot lists per slot key (`null`
/// removes a slot's list), other fields overwrite.
#[utoipa::path(patch, path = "/sessions/{id}/tool-permissions", tag = "tool-permissions",
    params(("id" = String, Path)), request_body(content = Object),
    responses((status = 200, description = "the merged permissions"),
        (status = 400, description = "validation_error"), (status = 404)))]
async fn patch_permissions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    req: Request,
) -> ApiResult<axum::Json<Value>> {
    let body = read_body(req, &state).await?;
    save(&state, &account.id, &session_id, |metadata| {
        ToolPermissions::from_metadata(metadata)?.patched(&body)
    })
    .await
}

/// Stores what `compute` makes of the current metadata, atomically.
pub(in crate::api) async fn save(
    state: &AppState,
    account_id: &str,
    session_id: &str,
    compute: impl FnOnce(&Value) -> crate::error::Result<ToolPermissions> + Send,
) -> ApiResult<axum::Json<Value>> {
    let runtime = &state.runtime;
    let write = runtime.store.update_session_metadata_key(
        account_id,
        session_id,
        METADATA_KEY,
        |metadata| compute(metadata).map(|permissions| permissions.to_json()),
    );
    // Permissions decide what the session's model is offered.
    let stored = runtime
        .write_catalog(Box::pin(write), |_| {
            CatalogChange::new(CatalogScope::Session(session_id.to_owned()))
        })
        .await?;
    tracing::info!(session = session_id, permissions = %stored, "tool permissions changed");
    Ok(axum::Json(json!({ "data": stored })))
}
