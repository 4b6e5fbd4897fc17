//! The tool catalogs: `GET /tools/builtin` (the context-free builtins) and
//! `GET /sessions/{id}/tools/runtime` (everything a session can see or call).

use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::error::{ApiError, ApiResult};
use super::extract::{Path, Query};
use axum::response::IntoResponse;

use crate::catalog::{Availability, CatalogEntry};
use crate::domain::tool::Slot;
use crate::state::AppState;

/// Query of `GET /sessions/{id}/tools/runtime`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RuntimeCatalogParams {
    /// Only the tools this slot may call under the session's permissions:
    /// `director` | `memory` | `narrator` | `verifier`.
    pub slot: Option<String>,
    /// `openai`: `tools` becomes a ready-to-send OpenAI `tools` array of the
    /// available tools.
    pub format: Option<String>,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_builtin_tools))
        .routes(routes!(runtime_catalog))
}

/// List the builtin tools that need no session context.
#[utoipa::path(get, path = "/tools/builtin", tag = "tools",
    responses((status = 200, description = "`{\"data\": [{name, description, parameters, side_effect_level, allowed_slots, source}]}`"),
        (status = 401)))]
async fn list_builtin_tools(CurrentAccount(_account): CurrentAccount) -> axum::Json<Value> {
    axum::Json(json!({ "data": crate::tools::builtin::context_free_listing() }))
}

/// The session's runtime tool catalog.
#[utoipa::path(get, path = "/sessions/{id}/tools/runtime", tag = "tools",
    params(("id" = String, Path), RuntimeCatalogParams),
    responses((status = 200, description = "`{\"data\": {session_id, generated_at, tools, conflicts, mcp_servers: [{server_id, name, catalog_source, reason, tool_count, snapshot_at}]}}`"),
        (status = 400, description = "unknown slot or format"), (status = 404)))]
async fn runtime_catalog(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    Query(params): Query<RuntimeCatalogParams>,
) -> ApiResult<axum::response::Response> {
    let slot = params.slot.as_deref().map(Slot::parse).transpose()?;
    let openai = match params.format.as_deref() {
        None => false,
        Some("openai") => true,
        Some(other) => {
            return Err(ApiError::validation(format!(
                "unknown format {other:?}; the only format is \"openai\" (omit it for the catalog)"
            )));
        }
    };
    let session = state
        .runtime
        .store
        .session(&account.id, &session_id)
        .await?;
    // Read before the tools: a server this summary shows live has its tools
    // in the catalog assembled after it (the other order could show a server
    // live whose tools the catalog read a moment before it connected).
    let mcp_servers = state.runtime.mcp.catalog_servers(&session.account_id);
    let catalog = state.runtime.offered_catalog(&session, slot).await?;
    let tools = if openai {
        CatalogTools::OpenAi(
            catalog
                .entries
                .iter()
                .filter(|entry| entry.availability == Availability::Available)
                .map(CatalogEntry::openai_view)
                .collect(),
        )
    } else {
        CatalogTools::Runtime(catalog.entries.iter().map(CatalogEntry::view).collect())
    };
    // Serialised once, from the catalog's own entries: a JSON value of the
    // answer would copy every tool's schema (twice, with `json!`).
    let body = serde_json::to_vec(&CatalogBody {
        data: CatalogData {
            conflicts: &catalog.conflicts,
            generated_at: catalog.generated_at,
            // One per enabled MCP server, so that a server whose tools are
            // unknown is never mistaken for one with no tools.
            mcp_servers: &mcp_servers,
            session_id: &catalog.session_id,
            tools,
        },
    })
    .map_err(|err| ApiError::from(crate::error::Error::Internal(err.into())))?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

/// The runtime catalog's answer, keys in the order `json!` wrote them
/// (sorted), so that the text is what it was.
#[derive(serde::Serialize)]
struct CatalogBody<'a, M: serde::Serialize> {
    data: CatalogData<'a, M>,
}

#[derive(serde::Serialize)]
struct CatalogData<'a, M: serde::Serialize> {
    conflicts: &'a [crate::catalog::Conflict],
    generated_at: i64,
    mcp_servers: &'a M,
    session_id: &'a str,
    tools: CatalogTools<'a>,
}

/// The catalog's tools in the format asked for.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum CatalogTools<'a> {
    Runtime(Vec<crate::catalog::EntryView<'a>>),
    OpenAi(Vec<crate::catalog::OpenAiToolView<'a>>),
}
