//! `/mcp/sessions/{id}`: a chat session's tools as a streamable-HTTP MCP
//! server (`crate::mcp_server`). The account's bearer key is checked (401) and
//! the session looked up in that account (404) before any MCP exchange; the
//! slot comes from `X-Toolgate-Slot` (default `narrator`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use futures::StreamExt;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tower::ServiceExt;

use super::auth::CurrentAccount;
use super::error::ApiResult;
use super::extract::Path;
use super::mcp_messages;
use crate::domain::tool::Slot;
use crate::error::ErrorCode;
use crate::mcp_server::{McpScope, SessionMcpServer, handler_factory};
use crate::state::AppState;
use crate::tools::mcp::DEPLOYMENT_HEADER;

/// The header that names the caller slot whose permissions apply.
pub const SLOT_HEADER: &str = "x-toolgate-slot";
/// An MCP session nobody has used for this long is closed (its client
/// initialises again).
const IDLE_SESSION: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// How many MCP sessions may be open at once; each holds a catalog
/// subscription. An `initialize` past it is refused until some close.
pub const MAX_MCP_SESSIONS: usize = 1024;
/// How many of them one account may hold, so that no account can take
/// every one.
pub const MAX_MCP_SESSIONS_PER_ACCOUNT: usize = 64;
/// The header rmcp names an MCP session by.
const SESSION_HEADER: &str = "mcp-session-id";

type McpService = StreamableHttpService<SessionMcpServer, LocalSessionManager>;

/// The MCP service of the server, its sessions, and the scope each session
/// was opened in: a request naming a session (its stream, its `DELETE`, any
/// message) is served only in that scope, before rmcp sees it.
#[derive(Clone)]
struct Endpoint {
    service: McpService,
    sessions: Arc<LocalSessionManager>,
    owners: Arc<tokio::sync::Mutex<HashMap<String, McpScope>>>,
    /// (MCP session, JSON-RPC id) of the requests being answered now.
    in_flight: Arc<std::sync::Mutex<HashSet<(String, String)>>>,
}

/// A request id taken for the time rmcp answers it, shared by the answer's
/// body and the request's parts rmcp hands the handler: removed from the
/// taken ones when both are over (rmcp goes on with a request whose client
/// went away, and routes its answer by id).
struct InFlight {
    taken: Arc<std::sync::Mutex<HashSet<(String, String)>>>,
    key: (String, String),
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
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
        owners: Arc::default(),
        in_flight: Arc::default(),
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
    request: Request,
    endpoint: Endpoint,
) -> ApiResult<Response> {
    refuse_own_client(&state, &request)?;
    let named = request
        .headers()
        .get(SESSION_HEADER)
        .map(|value| value.to_str().unwrap_or_default().to_owned());
    // An MCP session's end needs only its own scope: its chat session may
    // have been deleted since, and the client must still be able to free
    // its place under the caps.
    if request.method() == axum::http::Method::DELETE
        && let Some(id) = &named
        && let Some(owner) = endpoint.owner(id).await
        && owner.account_id == account.id
        && owner.session_id == session_id
    {
        return serve_session(&endpoint, request, owner, id.clone(), None).await;
    }
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
    let scope = McpScope {
        account_id: account.id,
        session_id: session.id,
        slot,
    };
    // Read and checked here, before any lock of the endpoint is taken: a
    // client sending its body slowly holds up nobody else.
    let checked = match mcp_messages::checked(request, &state).await {
        Ok(checked) => checked,
        Err(answer) => return Ok(answer),
    };
    match named {
        Some(id) => serve_session(&endpoint, checked.request, scope, id, checked.request_id).await,
        None => open_session(&endpoint, &state, checked.request, scope).await,
    }
}

/// Refuses a request of this deployment's own MCP client: an MCP server
/// configured with this endpoint would list the catalog it is part of, and
/// every listing would grow it.
fn refuse_own_client(state: &AppState, request: &Request) -> crate::error::Result<()> {
    let mark = state.runtime.store.deployment_mark();
    let own = request
        .headers()
        .get_all(DEPLOYMENT_HEADER)
        .iter()
        .any(|value| value.as_bytes() == mark.as_bytes());
    if own {
        tracing::warn!(
            "refused an MCP request from this deployment's own MCP client: an MCP server is configured with this toolgate's /mcp/sessions endpoint"
        );
        return Err(crate::error::Error::refused(
            ErrorCode::McpSelfConnection,
            "this is the MCP client of the same toolgate deployment: an MCP server configured with its own /mcp/sessions endpoint would feed its own catalog",
        ));
    }
    Ok(())
}

impl Endpoint {
    /// The scope the MCP session `id` was opened in, if it is open.
    async fn owner(&self, id: &str) -> Option<McpScope> {
        self.owners.lock().await.get(id).cloned()
    }
}

/// A request of an open MCP session: only in the scope it was opened in.
async fn serve_session(
    endpoint: &Endpoint,
    mut request: Request,
    scope: McpScope,
    id: String,
    request_id: Option<rmcp::model::NumberOrString>,
) -> ApiResult<Response> {
    let owner = endpoint.owner(&id).await;
    // Messages are the slot's calls, so they must name the session's slot;
    // its event stream (slot-blind list_changed) and its end need only be
    // the same account's same chat session.
    let messages = request.method() == axum::http::Method::POST;
    let same = |owner: &McpScope| {
        owner.account_id == scope.account_id
            && owner.session_id == scope.session_id
            && (!messages || owner.slot == scope.slot)
    };
    let Some(owner) = owner.filter(same) else {
        // Unknown, ended, or another account's, session's or slot's: the
        // same answer, so that an id reveals nothing.
        return Err(crate::error::Error::not_found("MCP session").into());
    };
    let ends = request.method() == axum::http::Method::DELETE;
    let in_flight = match request_id {
        Some(request_id) => match endpoint.take_request_id(&id, &request_id) {
            Some(taken) => Some(taken),
            None => return Ok(mcp_messages::id_in_flight(request_id)),
        },
        None => None,
    };
    request.extensions_mut().insert(owner);
    if let Some(taken) = &in_flight {
        // The id stays taken while the handler runs.
        request.extensions_mut().insert(taken.clone());
    }
    let Ok(response) = endpoint.service.clone().oneshot(request).await;
    if ends && response.status().is_success() {
        endpoint.owners.lock().await.remove(&id);
    }
    let response = response.into_response();
    Ok(match in_flight {
        // Held by the answer's body: an answer streams after this returns.
        Some(taken) => response.map(|body| {
            axum::body::Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _held = &taken;
                chunk
            }))
        }),
        None => response,
    })
}

impl Endpoint {
    /// Takes `request_id` for the MCP session `session` while its answer is
    /// given; None when a request of the session still in flight has it.
    fn take_request_id(
        &self,
        session: &str,
        request_id: &rmcp::model::NumberOrString,
    ) -> Option<Arc<InFlight>> {
        // Serialized, so that the number 1 and the string "1" stay two ids.
        let id = serde_json::to_string(request_id).unwrap_or_default();
        let key = (session.to_owned(), id);
        let mut taken = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if !taken.insert(key.clone()) {
            return None;
        }
        Some(Arc::new(InFlight {
            taken: self.in_flight.clone(),
            key,
        }))
    }
}

/// A request without a session (an `initialize`), within the session caps.
/// The owners' lock is held until rmcp has answered, so parallel opens
/// cannot pass the caps together (the body was read before).
async fn open_session(
    endpoint: &Endpoint,
    state: &AppState,
    mut request: Request,
    scope: McpScope,
) -> ApiResult<Response> {
    let mut owners = endpoint.owners.lock().await;
    {
        // Sessions rmcp closed (idle, or their client gone) free their place.
        let live = endpoint.sessions.sessions.read().await;
        owners.retain(|id, _| live.contains_key(id.as_str()));
    }
    let of_account = |owners: &HashMap<String, McpScope>| {
        owners
            .values()
            .filter(|owner| owner.account_id == scope.account_id)
            .count()
    };
    let full = |owners: &HashMap<String, McpScope>| {
        owners.len() >= MAX_MCP_SESSIONS || of_account(owners) >= MAX_MCP_SESSIONS_PER_ACCOUNT
    };
    if full(&owners) {
        close_orphans(endpoint, state, &mut owners).await?;
    }
    if full(&owners) {
        return Err(crate::error::Error::refused(
            crate::error::ErrorCode::LimitExceeded,
            format!(
                "too many open MCP sessions (max_mcp_sessions = {MAX_MCP_SESSIONS}, {MAX_MCP_SESSIONS_PER_ACCOUNT} per account); close one (DELETE with its Mcp-Session-Id) or wait for idle ones to end"
            ),
        )
        .into());
    }
    request.extensions_mut().insert(scope.clone());
    let Ok(response) = endpoint.service.clone().oneshot(request).await;
    if let Some(id) = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
    {
        owners.insert(id.to_owned(), scope);
    }
    Ok(response.into_response())
}

/// Closes the MCP sessions whose chat session was deleted since they were
/// opened: nothing can use them, and they would hold their place under the
/// caps until they idle out. Run only when a cap is reached, so at most one
/// lookup per distinct chat session then.
async fn close_orphans(
    endpoint: &Endpoint,
    state: &AppState,
    owners: &mut HashMap<String, McpScope>,
) -> ApiResult<()> {
    let chats: HashSet<(&str, &str)> = owners
        .values()
        .map(|owner| (owner.account_id.as_str(), owner.session_id.as_str()))
        .collect();
    let mut gone = HashSet::new();
    for (account_id, session_id) in chats {
        match state.runtime.store.session(account_id, session_id).await {
            Ok(_) => {}
            Err(crate::error::Error::NotFound(_)) => {
                gone.insert((account_id.to_owned(), session_id.to_owned()));
            }
            Err(err) => return Err(err.into()),
        }
    }
    let orphans: Vec<String> = owners
        .iter()
        .filter(|(_, owner)| gone.contains(&(owner.account_id.clone(), owner.session_id.clone())))
        .map(|(id, _)| id.clone())
        .collect();
    for id in orphans {
        owners.remove(&id);
        let _ = endpoint.sessions.close_session(&id.as_str().into()).await;
    }
    Ok(())
}
