//! `/mcp/sessions/{id}`: a chat session's tools as a streamable-HTTP MCP
//! server (`crate::mcp_server`). The account's bearer key is checked (401) and
//! the session looked up in that account (404) before any MCP exchange; the
//! slot comes from `X-Toolgate-Slot` (default `narrator`).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tower::ServiceExt;

use super::auth::CurrentAccount;
use super::error::ApiResult;
use super::extract::Path;
use crate::domain::tool::Slot;
use crate::mcp_server::{McpScope, SessionMcpServer, handler_factory};
use crate::state::AppState;

/// The header that names the caller slot whose permissions apply.
pub const SLOT_HEADER: &str = "x-toolgate-slot";
/// An MCP session nobody has used for this long is closed (its client
/// initialises again).
const IDLE_SESSION: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// How many MCP sessions may be open at once; each holds a catalog
/// subscription. An `initialize` past it is refused until some close.
pub const MAX_MCP_SESSIONS: usize = 1024;

type McpService = StreamableHttpService<SessionMcpServer, LocalSessionManager>;

/// The MCP service of the server and its sessions.
#[derive(Clone)]
struct Endpoint {
    service: McpService,
    sessions: Arc<LocalSessionManager>,
}

/// The route, with one MCP service (and its MCP sessions) for the server.
pub fn router(state: &AppState) -> Router<AppState> {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(IDLE_SESSION);
    // The bearer key authenticates every request, and toolgate may listen on
    // a name of the operator's choosing: the Host check against DNS
    // rebinding is the key's job here.
    let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    config.max_request_body_bytes = state.runtime.settings.body_limit_bytes;
    config.cancellation_token = state.runtime.model_sessions.closing();
    config.sse_keep_alive = Some(std::time::Duration::from_secs(15));
    let sessions = Arc::new(sessions);
    let endpoint = Endpoint {
        service: StreamableHttpService::new(
            handler_factory(state.runtime.clone()),
            sessions.clone(),
            config,
        ),
        sessions,
    };
    Router::new().route(
        "/mcp/sessions/{id}",
        any(
            move |state: State<AppState>,
                  account: CurrentAccount,
                  path: Path<String>,
                  request: Request| {
                serve(state, account, path, request, endpoint.clone())
            },
        ),
    )
}

async fn serve(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(session_id): Path<String>,
    mut request: Request,
    endpoint: Endpoint,
) -> ApiResult<Response> {
    // Before any MCP exchange: another account's session is as absent as a
    // missing one.
    let session = state
        .runtime
        .store
        .session(&account.id, &session_id)
        .await?;
    let slot = match request.headers().get(SLOT_HEADER) {
        None => Slot::Narrator,
        Some(value) => Slot::parse(value.to_str().unwrap_or_default())?,
    };
    let opens_session = request.method() == axum::http::Method::POST
        && !request.headers().contains_key("mcp-session-id");
    if opens_session && endpoint.sessions.sessions.read().await.len() >= MAX_MCP_SESSIONS {
        return Err(crate::error::Error::refused(
            crate::error::ErrorCode::LimitExceeded,
            format!(
                "max_mcp_sessions = {MAX_MCP_SESSIONS} MCP sessions are open; close one (DELETE with its Mcp-Session-Id) or wait for idle ones to end"
            ),
        )
        .into());
    }
    request.extensions_mut().insert(McpScope {
        account_id: account.id,
        session_id: session.id,
        slot,
    });
    let Ok(response) = endpoint.service.oneshot(request).await;
    Ok(response.into_response())
}
