//! MCP server configurations (`/mcp/servers`), scoped to the calling account,
//! in the shapes TavernHeadless clients use. Every write is handed to the MCP
//! runtime (`McpHub`) as it was stored; every response carries the server's
//! `live_status`. Secrets are write-only: responses show their keys with
//! masked values.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List};
use super::error::ApiResult;
use super::extract::{Json, Path, Query};
use crate::domain::PageRequest;
use crate::domain::mcp::{McpServer, McpServerConfig, McpTransport, ToolOverride, mask_secrets};
use crate::domain::mcp_input::McpServerBody;
use crate::domain::tool::{AsyncCapability, SideEffectLevel, Slot};
use crate::state::AppState;
use crate::store::McpServerFilter;
use crate::tools::mcp::LiveStatus;

/// Orders an account's configuration writes with their hand-over to the
/// runtime. The database serialises the writes themselves; without this, two
/// racing writes (or a PATCH racing a DELETE) could reach the runtime in the
/// other order and leave it running a stale or deleted configuration. A
/// hand-over may wait seconds for an old connection to close, so the lock is
/// the account's own: one account's slow servers never hold up another's
/// writes.
static CONFIG_WRITES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>,
> = std::sync::LazyLock::new(Default::default);

/// Takes `account_id`'s configuration-write lock.
async fn config_writes_of(account_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
    let lock = {
        let mut locks = CONFIG_WRITES.lock().unwrap_or_else(|p| p.into_inner());
        // Locks nobody holds or waits for are gone; their entries go too.
        locks.retain(|_, lock| lock.strong_count() > 0);
        match locks.get(account_id).and_then(std::sync::Weak::upgrade) {
            Some(lock) => lock,
            None => {
                let lock = std::sync::Arc::new(tokio::sync::Mutex::new(()));
                locks.insert(account_id.to_owned(), std::sync::Arc::downgrade(&lock));
                lock
            }
        }
    };
    lock.lock_owned().await
}

/// Body of `PATCH /mcp/servers/{id}/toggle`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToggleMcpServer {
    pub enabled: bool,
}

/// Query of `GET /mcp/servers`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct McpServerListParams {
    /// Only enabled (`true`) or disabled (`false`) servers.
    pub enabled: Option<bool>,
    /// Page size, 1-200 (default 50).
    pub limit: Option<i64>,
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    /// `created_at` (default) | `name`
    pub sort_by: Option<String>,
    /// `asc` | `desc` (default)
    pub sort_order: Option<String>,
}

/// A stdio server's command as responses show it: `env` keys with masked values.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StdioView {
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    /// Each env variable with its value masked (`toke****5678` for values of
    /// 24 characters or more, `****` otherwise).
    pub env_masked: BTreeMap<String, String>,
}

/// An http server's endpoint as responses show it: header names with masked values.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HttpView {
    pub url: String,
    /// Each header with its value masked (`Bear****5678` for values of 24
    /// characters or more, `****` otherwise).
    pub headers_masked: BTreeMap<String, String>,
}

/// An MCP server as the API shows it. The object of the transport not in use
/// is `null`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct McpServerView {
    pub id: String,
    pub name: String,
    /// `stdio` | `http`
    pub transport: String,
    pub stdio: Option<StdioView>,
    pub http: Option<HttpView>,
    pub tool_prefix: Option<String>,
    pub enabled: bool,
    pub connect_timeout_ms: u64,
    pub call_timeout_ms: u64,
    pub tool_refresh_interval_ms: u64,
    pub default_side_effect_level: Option<SideEffectLevel>,
    pub default_allowed_slots: Option<Vec<Slot>>,
    pub trust_annotations: bool,
    pub default_async_capability: Option<AsyncCapability>,
    pub tool_overrides: BTreeMap<String, ToolOverride>,
    /// Set when the stored secrets cannot be decrypted with the server's
    /// current secrets key; `env_masked` / `headers_masked` are empty then.
    pub secrets_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The runtime's view of the server: `{attached, reason, state, tool_count,
    /// connected_at, tools_refreshed_at, error, reconnect_required,
    /// last_timeout_at}`; `state` is `disconnected` | `connecting` |
    /// `connected` | `reconnect_required` | `error`, `reason` says why a
    /// server is not attached (`disabled`, `not_attached`).
    #[schema(value_type = Object)]
    pub live_status: LiveStatus,
}

/// The view of `server`, with the runtime's status of it.
fn view(state: &AppState, server: McpServer) -> McpServerView {
    let live_status = state.runtime.mcp.live_status(&server);
    let config = server.config;
    let (stdio, http) = match config.transport {
        McpTransport::Stdio(stdio) => (
            Some(StdioView {
                env_masked: mask_secrets(&stdio.env),
                command: stdio.command,
                args: stdio.args,
                cwd: stdio.cwd,
            }),
            None,
        ),
        McpTransport::Http(http) => (
            None,
            Some(HttpView {
                headers_masked: mask_secrets(&http.headers),
                url: http.url,
            }),
        ),
    };
    McpServerView {
        id: server.id,
        name: config.name,
        transport: if stdio.is_some() { "stdio" } else { "http" }.to_owned(),
        stdio,
        http,
        tool_prefix: config.tool_prefix,
        enabled: config.enabled,
        connect_timeout_ms: config.connect_timeout_ms,
        call_timeout_ms: config.call_timeout_ms,
        tool_refresh_interval_ms: config.tool_refresh_interval_ms,
        default_side_effect_level: config.default_side_effect_level,
        default_allowed_slots: config.default_allowed_slots,
        trust_annotations: config.trust_annotations,
        default_async_capability: config.default_async_capability,
        tool_overrides: config.tool_overrides,
        secrets_error: server.secrets_error,
        created_at: server.created_at,
        updated_at: server.updated_at,
        live_status,
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_server, list_servers))
        .routes(routes!(get_server, update_server, delete_server))
        .routes(routes!(toggle_server))
}

/// Create an MCP server configuration. An enabled one is connected in the
/// background at once.
#[utoipa::path(post, path = "/mcp/servers", tag = "mcp servers",
    request_body = McpServerBody,
    responses((status = 201, description = "the created server", body = Data<McpServerView>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "forbidden: an enabled stdio server of an account other than the admin (see --mcp-stdio-for-all-accounts)"),
        (status = 409, description = "mcp_server_conflict")))]
async fn create_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Json(body): Json<McpServerBody>,
) -> ApiResult<(StatusCode, axum::Json<Data<McpServerView>>)> {
    let config = body.create()?;
    may_run(&state, &account, &config)?;
    let _ordered = config_writes_of(&account.id).await;
    let created = state
        .runtime
        .store
        .create_mcp_server(&account.id, &config)
        .await?;
    state.runtime.mcp.upsert(created.clone()).await;
    crate::runtime::cluster::announce_mcp_server(&state.runtime, &account.id, &created.id).await;
    tracing::info!(server = %created.id, name = ?created.config.name,
        transport = created.config.transport.as_str(), "MCP server created");
    Ok((
        StatusCode::CREATED,
        axum::Json(Data {
            data: view(&state, created),
        }),
    ))
}

/// List the account's MCP servers (filter `enabled`; sort_by `created_at` |
/// `name`, really applied; sort_order default `desc`).
#[utoipa::path(get, path = "/mcp/servers", tag = "mcp servers",
    params(McpServerListParams),
    responses((status = 200, description = "a page of the account's servers", body = List<McpServerView>),
        (status = 400, description = "validation_error")))]
async fn list_servers(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<McpServerListParams>,
) -> ApiResult<axum::Json<List<McpServerView>>> {
    let page = PageRequest::parse(
        params.limit,
        params.offset,
        params.sort_by.as_deref(),
        params.sort_order.as_deref(),
        &["created_at", "name"],
    )?;
    let filter = McpServerFilter {
        enabled: params.enabled,
    };
    let page = state
        .runtime
        .store
        .list_mcp_servers(&account.id, filter, page)
        .await?;
    Ok(axum::Json(page.map(|server| view(&state, server)).into()))
}

/// Get one of the account's MCP servers.
#[utoipa::path(get, path = "/mcp/servers/{id}", tag = "mcp servers",
    params(("id" = String, Path)),
    responses((status = 200, description = "the server", body = Data<McpServerView>),
        (status = 404, description = "not_found")))]
async fn get_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<McpServerView>>> {
    let found = state.runtime.store.mcp_server(&account.id, &id).await?;
    Ok(axum::Json(Data {
        data: view(&state, found),
    }))
}

/// Change some fields of an MCP server (at least one; `null` resets a field
/// to its default). The runtime takes the new configuration at once.
#[utoipa::path(patch, path = "/mcp/servers/{id}", tag = "mcp servers",
    request_body = McpServerBody, params(("id" = String, Path)),
    responses((status = 200, description = "the changed server", body = Data<McpServerView>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "forbidden: an enabled stdio server of an account other than the admin (see --mcp-stdio-for-all-accounts)"),
        (status = 404, description = "not_found"),
        (status = 409, description = "mcp_server_conflict")))]
async fn update_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Json(body): Json<McpServerBody>,
) -> ApiResult<axum::Json<Data<McpServerView>>> {
    // Before the lookup: an empty PATCH is wrong whatever it targets.
    body.check_not_empty()?;
    let saved = save_change(&state, &account.id, &id, |existing| {
        let changed = body.apply(existing)?;
        may_run(&state, &account, &changed.config)?;
        Ok(changed)
    })
    .await?;
    tracing::info!(server = %saved.id, name = ?saved.config.name, "MCP server updated");
    Ok(axum::Json(Data {
        data: view(&state, saved),
    }))
}

/// Enable or disable an MCP server: enabling connects it in the background,
/// disabling disconnects it and removes its tools from every catalog.
#[utoipa::path(patch, path = "/mcp/servers/{id}/toggle", tag = "mcp servers",
    request_body = ToggleMcpServer, params(("id" = String, Path)),
    responses((status = 200, description = "the server, enabled or disabled as asked", body = Data<McpServerView>),
        (status = 400, description = "validation_error"),
        (status = 403, description = "forbidden: an enabled stdio server of an account other than the admin (see --mcp-stdio-for-all-accounts)"),
        (status = 404, description = "not_found")))]
async fn toggle_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Json(body): Json<ToggleMcpServer>,
) -> ApiResult<axum::Json<Data<McpServerView>>> {
    // Inside the write transaction, like the PATCH: flipping `enabled` on a
    // stale copy would write back the other fields as they were before.
    let saved = save_change(&state, &account.id, &id, |existing| {
        let mut server = existing.clone();
        server.config.enabled = body.enabled;
        may_run(&state, &account, &server.config)?;
        Ok(server)
    })
    .await?;
    tracing::info!(server = %saved.id, enabled = saved.config.enabled, "MCP server toggled");
    Ok(axum::Json(Data {
        data: view(&state, saved),
    }))
}

/// Delete an MCP server: its connection is closed and its snapshot deleted.
#[utoipa::path(delete, path = "/mcp/servers/{id}", tag = "mcp servers",
    params(("id" = String, Path)),
    responses((status = 200, description = "{\"data\":{\"id\":\"...\",\"deleted\":true}}"),
        (status = 404, description = "not_found")))]
async fn delete_server(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<Data<Value>>> {
    let _ordered = config_writes_of(&account.id).await;
    state
        .runtime
        .store
        .delete_mcp_server(&account.id, &id)
        .await?;
    state.runtime.mcp.remove(&account.id, &id).await;
    crate::runtime::cluster::announce_mcp_server(&state.runtime, &account.id, &id).await;
    tracing::info!(server = %id, "MCP server deleted");
    Ok(axum::Json(Data {
        data: serde_json::json!({ "id": id, "deleted": true }),
    }))
}

/// Refuses an enabled stdio server to any account but the admin (see
/// [`may_spawn`]); a disabled one runs nothing.
fn may_run(
    state: &AppState,
    account: &crate::store::Account,
    config: &McpServerConfig,
) -> crate::error::Result<()> {
    match config.enabled {
        true => may_spawn(state, account, config),
        false => Ok(()),
    }
}

/// Refuses to start `config` for `account` when the runtime's rules do not
/// allow it: a stdio server's command
/// ([`crate::runtime::ToolRuntime::may_run_mcp_command`]), or an HTTP server
/// on loopback or a private network
/// ([`crate::runtime::ToolRuntime::may_reach_mcp_url`]).
pub(super) fn may_spawn(
    state: &AppState,
    account: &crate::store::Account,
    config: &McpServerConfig,
) -> crate::error::Result<()> {
    if !state.runtime.may_run_mcp_command(config, account.is_admin) {
        return Err(crate::error::Error::refused(
            crate::error::ErrorCode::Forbidden,
            "only the admin account may run stdio MCP servers (their commands run as the server's user); use the http transport, or start the server with --mcp-stdio-for-all-accounts",
        ));
    }
    if !state.runtime.may_reach_mcp_url(config, account.is_admin) {
        return Err(crate::error::Error::refused(
            crate::error::ErrorCode::Forbidden,
            "only the admin account may attach HTTP MCP servers on loopback or private-network addresses (toolgate itself and the machine's other services answer there); use a public address, or start the server with --mcp-private-urls-for-all-accounts",
        ));
    }
    Ok(())
}

/// Changes a stored server in one write transaction (`change` sees the row as
/// it is inside it) and hands the result to the runtime.
async fn save_change(
    state: &AppState,
    account_id: &str,
    id: &str,
    change: impl FnOnce(&McpServer) -> crate::error::Result<McpServer> + Send,
) -> crate::error::Result<McpServer> {
    let _ordered = config_writes_of(account_id).await;
    let saved = state
        .runtime
        .store
        .update_mcp_server(account_id, id, change)
        .await?;
    state.runtime.mcp.upsert(saved.clone()).await;
    crate::runtime::cluster::announce_mcp_server(&state.runtime, account_id, id).await;
    Ok(saved)
}
