//! The MCP runtime routes: a server's connection status, connect / disconnect,
//! a temporary test connection, and the tools it offers now. Configurations are
//! `mcp.rs`; both are scoped to the calling account.

use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::{ApiError, ApiResult};
use super::extract::Path;
use crate::catalog::{Availability, CatalogSource, EntryView};
use crate::domain::mcp::McpServer;
use crate::error::ErrorCode;
use crate::state::AppState;
use crate::tools::mcp::LiveStatus;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(server_status))
        .routes(routes!(account_statuses))
        .routes(routes!(connect_server))
        .routes(routes!(disconnect_server))
        .routes(routes!(test_server))
        .routes(routes!(server_tools))
}

/// The status shape of the runtime routes: the live status with the server's
/// id, name and transport.
fn status_json(server: &McpServer, status: &LiveStatus) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(fields) = value.as_object_mut() {
        fields.insert("server_id".into(), json!(server.id));
        fields.insert("server_name".into(), json!(server.config.name));
        fields.insert("transport".into(), json!(server.config.transport.as_str()));
    }
    value
}

/// The connection status of one server (200 also when it is not attached,
/// saying why).
#[utoipa::path(get, path = "/mcp/servers/{id}/status", tag = "mcp",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": {server_id, server_name, transport, state, tool_count, connected_at, tools_refreshed_at, error, reconnect_required, last_timeout_at, attached, reason}}`"),
        (status = 404, description = "no such server for this account")))]
async fn server_status(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Value>>> {
    let server = state.runtime.store.mcp_server(&account.id, &id).await?;
    let status = state.runtime.mcp.live_status(&server);
    Ok(axum::Json(Data {
        data: status_json(&server, &status),
    }))
}

/// The statuses of the account's attached servers.
#[utoipa::path(get, path = "/mcp/statuses", tag = "mcp",
    responses((status = 200, description = "`{\"data\": [status, …]}` (the shape of `GET /mcp/servers/{id}/status`)")))]
async fn account_statuses(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
) -> axum::Json<Data<Vec<Value>>> {
    let data = state
        .runtime
        .mcp
        .statuses(&account.id)
        .iter()
        .map(|(server, status)| status_json(server, status))
        .collect();
    axum::Json(Data { data })
}

/// Connect (or reconnect now) an enabled server; the connection is made in
/// the background and the answer is the status at once.
#[utoipa::path(post, path = "/mcp/servers/{id}/connect", tag = "mcp",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": status}`"),
        (status = 404, description = "no such server for this account"),
        (status = 403, description = "forbidden: a stdio server of an account other than the admin (see --mcp-stdio-for-all-accounts)"),
        (status = 409, description = "`mcp_server_disabled`")))]
async fn connect_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Value>>> {
    let server = state.runtime.store.mcp_server(&account.id, &id).await?;
    if !server.config.enabled {
        return Err(disabled(&server));
    }
    super::mcp::may_spawn(&state, &account, &server.config)?;
    let status = state.runtime.mcp.connect(server.clone()).await;
    tracing::info!(server_id = %server.id, "MCP server connect requested");
    Ok(axum::Json(Data {
        data: status_json(&server, &status),
    }))
}

/// Close a server's connection until the next connect (or restart).
#[utoipa::path(post, path = "/mcp/servers/{id}/disconnect", tag = "mcp",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": status}`"),
        (status = 404, description = "no such server for this account"),
        (status = 409, description = "`mcp_runtime_not_attached`: disabled or not in the runtime")))]
async fn disconnect_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Value>>> {
    let server = state.runtime.store.mcp_server(&account.id, &id).await?;
    let Some(status) = state.runtime.mcp.disconnect(&server) else {
        return Err(not_attached(&server));
    };
    tracing::info!(server_id = %server.id, "MCP server disconnected on request");
    Ok(axum::Json(Data {
        data: status_json(&server, &status),
    }))
}

/// Open a temporary connection, list the tools and close it; the real
/// connection is left alone.
#[utoipa::path(post, path = "/mcp/servers/{id}/test", tag = "mcp",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": {success, tool_count, duration_ms, error}}`"),
        (status = 403, description = "forbidden: a stdio server of an account other than the admin (see --mcp-stdio-for-all-accounts)"),
        (status = 404, description = "no such server for this account")))]
async fn test_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<crate::tools::mcp::TestReport>>> {
    let server = state.runtime.store.mcp_server(&account.id, &id).await?;
    super::mcp::may_spawn(&state, &account, &server.config)?;
    let report = state.runtime.mcp.test(&server).await;
    tracing::info!(server_id = %server.id, success = report.success, duration_ms = report.duration_ms, "MCP server tested");
    Ok(axum::Json(Data { data: report }))
}

/// The tools a connected server offers now, as catalog entries.
#[utoipa::path(get, path = "/mcp/servers/{id}/tools", tag = "mcp",
    params(("id" = String, Path)),
    responses((status = 200, description = "`{\"data\": [catalog entry, …]}` with prefixed names"),
        (status = 404, description = "no such server for this account"),
        (status = 409, description = "`mcp_server_disabled` or `mcp_runtime_not_attached`"),
        (status = 503, description = "`mcp_runtime_unavailable`: attached but not connected")))]
async fn server_tools(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    let server = state.runtime.store.mcp_server(&account.id, &id).await?;
    if !server.config.enabled {
        return Err(disabled(&server));
    }
    let Some((source, tools)) = state.runtime.mcp.server_tools(&server.id) else {
        return Err(not_attached(&server));
    };
    if source != CatalogSource::Live {
        return Err(ApiError::new(
            ErrorCode::McpRuntimeUnavailable,
            format!(
                "MCP server {} is not connected now; its last known tools are in the session catalogs as cached",
                server.id
            ),
        ));
    }
    // Written from views of the tools: a server's schemas are never copied
    // into JSON values per request.
    let data: Vec<EntryView<'_>> = tools
        .iter()
        .map(|tool| EntryView::of(&tool.spec, Availability::Available, None, Some(source)))
        .collect();
    Ok(axum::Json(Data { data }).into_response())
}

fn disabled(server: &McpServer) -> ApiError {
    ApiError::new(
        ErrorCode::McpServerDisabled,
        format!("MCP server {} is disabled; enable it first", server.id),
    )
}

fn not_attached(server: &McpServer) -> ApiError {
    ApiError::new(
        ErrorCode::McpRuntimeNotAttached,
        format!(
            "MCP server {} is not attached to the runtime (disabled, or not loaded)",
            server.id
        ),
    )
}
