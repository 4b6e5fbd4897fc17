//! Custom tool definitions (`/tools/definitions`), scoped to the calling account.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List};
use super::error::ApiResult;
use super::extract::{Json, Path, Query};
use crate::catalog::{CatalogChange, CatalogScope};
use crate::domain::PageRequest;
use crate::domain::definition::{
    self, DefinitionChanges, DefinitionSource, HandlerType, ScriptHandler, ToolDefinition,
};
use crate::domain::tool::{SideEffectLevel, Slot};
use crate::state::AppState;
use crate::store::DefinitionFilter;

/// Body of `POST /tools/definitions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDefinition {
    /// Tool name: 1-64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    /// Default `""`.
    pub description: Option<String>,
    /// JSON Schema of the arguments; default `{"type":"object","properties":{}}`.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Default `none`.
    pub side_effect_level: Option<SideEffectLevel>,
    /// Slots allowed to call the tool; empty means no extra restriction.
    pub allowed_slots: Option<Vec<Slot>>,
    /// Default `custom`.
    pub source: Option<DefinitionSource>,
    pub source_id: Option<String>,
    /// Default `true`.
    pub enabled: Option<bool>,
    /// Only `script` is public.
    pub handler_type: Option<HandlerType>,
    pub handler: Option<ScriptHandler>,
}

/// Body of `PATCH /tools/definitions/{id}`: the create fields, all optional, at
/// least one present. `source_id` may be set to null.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDefinition {
    pub name: Option<String>,
    pub description: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    pub side_effect_level: Option<SideEffectLevel>,
    pub allowed_slots: Option<Vec<Slot>>,
    pub source: Option<DefinitionSource>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable)]
    pub source_id: Option<Option<String>>,
    pub enabled: Option<bool>,
    pub handler_type: Option<HandlerType>,
    pub handler: Option<ScriptHandler>,
}

/// Body of `PATCH /tools/definitions/{id}/toggle`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToggleDefinition {
    pub enabled: bool,
}

/// Query of `GET /tools/definitions`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DefinitionListParams {
    /// `preset` | `character` | `custom`
    pub source: Option<DefinitionSource>,
    pub source_id: Option<String>,
    pub enabled: Option<bool>,
    /// Page size, 1-200 (default 50).
    pub limit: Option<i64>,
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    /// `updated_at` (default) | `name`
    pub sort_by: Option<String>,
    /// `asc` | `desc` (default)
    pub sort_order: Option<String>,
}

/// A field that was present in the body, possibly as null.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl From<CreateDefinition> for DefinitionChanges {
    fn from(body: CreateDefinition) -> Self {
        Self {
            name: Some(body.name),
            description: body.description,
            parameters: body.parameters,
            side_effect_level: body.side_effect_level,
            allowed_slots: body.allowed_slots,
            source: body.source,
            source_id: Some(body.source_id),
            enabled: body.enabled,
            handler_type: body.handler_type,
            handler: body.handler,
        }
    }
}

impl From<UpdateDefinition> for DefinitionChanges {
    fn from(body: UpdateDefinition) -> Self {
        Self {
            name: body.name,
            description: body.description,
            parameters: body.parameters,
            side_effect_level: body.side_effect_level,
            allowed_slots: body.allowed_slots,
            source: body.source,
            source_id: body.source_id,
            enabled: body.enabled,
            handler_type: body.handler_type,
            handler: body.handler,
        }
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_definition, list_definitions))
        .routes(routes!(
            get_definition,
            update_definition,
            delete_definition
        ))
        .routes(routes!(toggle_definition))
}

/// Create a tool definition. Script handlers need `ENABLE_UNSAFE_SCRIPT_HANDLER=true`.
#[utoipa::path(post, path = "/tools/definitions", tag = "tool definitions",
    request_body = CreateDefinition,
    responses((status = 201, description = "the created definition", body = Data<ToolDefinition>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "tool_script_handler_disabled"),
        (status = 409, description = "tool_definition_conflict; limit_exceeded past 256 definitions in the account")))]
async fn create_definition(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Json(body): Json<CreateDefinition>,
) -> ApiResult<(StatusCode, axum::Json<Data<ToolDefinition>>)> {
    let created = create(&state, &account.id, DefinitionChanges::from(body)).await?;
    Ok((StatusCode::CREATED, axum::Json(Data { data: created })))
}

/// Creates a definition (`POST /tools/definitions`, the console's form) and
/// tells the account's live model sessions.
pub(crate) async fn create(
    state: &AppState,
    account_id: &str,
    changes: DefinitionChanges,
) -> crate::error::Result<ToolDefinition> {
    let scripts_enabled = state.runtime.settings.enable_unsafe_script_handler;
    definition::check_script_switch(&changes, scripts_enabled)?;
    let draft = definition::create(changes)?;
    definition::check_create_allowed(&draft, scripts_enabled)?;
    let runtime = &state.runtime;
    let created = runtime
        .write_catalog(
            Box::pin(runtime.store.create_definition(account_id, draft)),
            |created| definition_change(account_id, None, Some(created)),
        )
        .await?;
    tracing::info!(definition = %created.id, name = ?created.name, "tool definition created");
    Ok(created)
}

/// List the account's tool definitions (filter by source, source_id, enabled;
/// sort_by `updated_at` | `name`).
#[utoipa::path(get, path = "/tools/definitions", tag = "tool definitions",
    params(DefinitionListParams),
    responses((status = 200, description = "a page of the account's definitions", body = List<ToolDefinition>),
        (status = 400, description = "validation_error")))]
async fn list_definitions(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<DefinitionListParams>,
) -> ApiResult<axum::Json<List<ToolDefinition>>> {
    let page = PageRequest::parse(
        params.limit,
        params.offset,
        params.sort_by.as_deref(),
        params.sort_order.as_deref(),
        &["updated_at", "name"],
    )?;
    let filter = DefinitionFilter {
        source: params.source,
        source_id: params.source_id,
        enabled: params.enabled,
    };
    let page = state
        .runtime
        .store
        .list_definitions(&account.id, &filter, page)
        .await?;
    Ok(axum::Json(page.into()))
}

/// Get one of the account's tool definitions.
#[utoipa::path(get, path = "/tools/definitions/{id}", tag = "tool definitions",
    params(("id" = String, Path)),
    responses((status = 200, description = "the definition", body = Data<ToolDefinition>), (status = 404, description = "not_found")))]
async fn get_definition(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<ToolDefinition>>> {
    let found = state.runtime.store.definition(&account.id, &id).await?;
    Ok(axum::Json(Data { data: found }))
}

/// Change some fields of a tool definition (at least one).
#[utoipa::path(patch, path = "/tools/definitions/{id}", tag = "tool definitions",
    request_body = UpdateDefinition, params(("id" = String, Path)),
    responses((status = 200, description = "the changed definition", body = Data<ToolDefinition>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "tool_script_handler_disabled"),
        (status = 404, description = "not_found"),
        (status = 409, description = "tool_definition_conflict")))]
async fn update_definition(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Json(body): Json<UpdateDefinition>,
) -> ApiResult<axum::Json<Data<ToolDefinition>>> {
    let saved = update(&state, &account.id, &id, DefinitionChanges::from(body)).await?;
    Ok(axum::Json(Data { data: saved }))
}

/// Changes some fields of a definition (`PATCH /tools/definitions/{id}`, the
/// console's form).
pub(crate) async fn update(
    state: &AppState,
    account_id: &str,
    id: &str,
    changes: DefinitionChanges,
) -> crate::error::Result<ToolDefinition> {
    // Before the lookup: an empty PATCH is wrong whatever it targets.
    changes.check_not_empty()?;
    let scripts_enabled = state.runtime.settings.enable_unsafe_script_handler;
    // Merged and checked against the row as it is inside the write transaction, so
    // a concurrent update is neither lost nor merged past these checks.
    let saved = save_change(state, account_id, id, |existing| {
        definition::check_update_allowed(existing, &changes, scripts_enabled)?;
        definition::update(existing, changes.clone())
    })
    .await?;
    tracing::info!(definition = %saved.id, "tool definition updated");
    Ok(saved)
}

/// Enable or disable a tool definition.
#[utoipa::path(patch, path = "/tools/definitions/{id}/toggle", tag = "tool definitions",
    request_body = ToggleDefinition, params(("id" = String, Path)),
    responses((status = 200, description = "the definition, enabled or disabled as asked", body = Data<ToolDefinition>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "tool_script_handler_disabled"),
        (status = 404, description = "not_found")))]
async fn toggle_definition(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Json(body): Json<ToggleDefinition>,
) -> ApiResult<axum::Json<Data<ToolDefinition>>> {
    let saved = toggle(&state, &account.id, &id, body.enabled).await?;
    Ok(axum::Json(Data { data: saved }))
}

/// Enables or disables a definition (`PATCH /tools/definitions/{id}/toggle`,
/// the console's button).
pub(crate) async fn toggle(
    state: &AppState,
    account_id: &str,
    id: &str,
    enabled: bool,
) -> crate::error::Result<ToolDefinition> {
    let scripts_enabled = state.runtime.settings.enable_unsafe_script_handler;
    // Inside the write transaction, like the PATCH: flipping `enabled` on a stale
    // copy would write back the other fields as they were before a concurrent PATCH.
    let saved = save_change(state, account_id, id, |existing| {
        definition::check_toggle_allowed(existing, enabled, scripts_enabled)?;
        Ok(ToolDefinition {
            enabled,
            ..existing.clone()
        })
    })
    .await?;
    tracing::info!(definition = %saved.id, enabled = saved.enabled, "tool definition toggled");
    Ok(saved)
}

/// Delete a tool definition.
#[utoipa::path(delete, path = "/tools/definitions/{id}", tag = "tool definitions",
    params(("id" = String, Path)),
    responses((status = 200, description = "{\"data\":{\"id\":\"...\",\"deleted\":true}}"),
        (status = 404, description = "not_found")))]
async fn delete_definition(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Value>>> {
    let runtime = &state.runtime;
    let write = async {
        let existing = runtime.store.definition(&account.id, &id).await?;
        runtime.store.delete_definition(&account.id, &id).await?;
        Ok(existing)
    };
    runtime
        .write_catalog(Box::pin(write), |deleted| {
            definition_change(&account.id, Some(deleted), None)
        })
        .await?;
    tracing::info!(definition = %id, "tool definition deleted");
    Ok(axum::Json(Data {
        data: serde_json::json!({ "id": id, "deleted": true }),
    }))
}

/// Changes a stored definition in one write transaction (the merge and checks
/// of `change` see the row as it is inside it) and tells the account's live
/// model sessions how their catalogs changed.
async fn save_change(
    state: &AppState,
    account_id: &str,
    id: &str,
    change: impl FnOnce(&ToolDefinition) -> crate::error::Result<ToolDefinition> + Send,
) -> crate::error::Result<ToolDefinition> {
    let runtime = &state.runtime;
    let write = runtime.store.update_definition(account_id, id, change);
    let (_, saved) = runtime
        .write_catalog(Box::pin(write), |(before, saved)| {
            definition_change(account_id, Some(before), Some(saved))
        })
        .await?;
    Ok(saved)
}

/// The `catalog_changed` a definition write sends to its account's live model
/// sessions, from the row before the write and after it (None: absent): an
/// enabled definition is in the catalogs under its name, a disabled one is
/// not, and a renamed one is the old name removed and the new one added.
fn definition_change(
    account_id: &str,
    before: Option<&ToolDefinition>,
    after: Option<&ToolDefinition>,
) -> CatalogChange {
    let offered = |definition: Option<&ToolDefinition>| {
        definition
            .filter(|definition| definition.enabled)
            .map(|definition| definition.name.clone())
    };
    let mut change = CatalogChange::new(CatalogScope::Account(account_id.to_owned()));
    match (offered(before), offered(after)) {
        (None, None) => {}
        (None, Some(added)) => change.added = vec![added],
        (Some(removed), None) => change.removed = vec![removed],
        (Some(old), Some(new)) if old == new => change.updated = vec![new],
        (Some(old), Some(new)) => {
            change.removed = vec![old];
            change.added = vec![new];
        }
    }
    change
}
