//! toolgate as an MCP server: one chat session's runtime catalog, for one
//! caller slot, to any MCP client over streamable HTTP (`/mcp/sessions/{id}`).
//! `tools/list` is what the session's model may see for the slot; `tools/call`
//! runs the same call path as `POST /sessions/{id}/tool-calls`; a catalog
//! change of the session reaches the client as `notifications/tools/list_changed`.
//!
//! The HTTP route authenticates and resolves the session before any MCP
//! exchange, and hands the handler that scope with every request
//! ([`McpScope`], in the request's extensions). The route also binds each
//! MCP session to the scope it was initialised in (`api/mcp_sessions.rs`), so
//! the handler trusts the scope it is given.

mod convert;

use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::call::{CallArguments, ToolCall};
use crate::catalog::Availability;
use crate::domain::tool::Slot;
use crate::runtime::ToolRuntime;

/// The newest protocol revision served. Later revisions drop the session
/// (SEP-2567), and a session is what binds a client to one chat session and
/// carries its `list_changed` notifications; clients negotiate this one.
const NEWEST_PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// Whose catalog one request addresses: the account the bearer key named, the
/// chat session of the path, and the slot of `X-Toolgate-Slot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpScope {
    pub account_id: String,
    pub session_id: String,
    pub slot: Slot,
}

/// The MCP server of one MCP session (rmcp makes one per session).
pub struct SessionMcpServer {
    runtime: ToolRuntime,
    /// Set once the `list_changed` forwarder runs (at the first `initialize`).
    forwarding: OnceLock<()>,
    /// Ends the `list_changed` forwarder when rmcp drops this session.
    ended: CancellationToken,
    _end_on_drop: DropGuard,
}

impl SessionMcpServer {
    /// A handler for a new MCP session.
    pub fn new(runtime: ToolRuntime) -> Self {
        let ended = CancellationToken::new();
        Self {
            runtime,
            forwarding: OnceLock::new(),
            _end_on_drop: ended.clone().drop_guard(),
            ended,
        }
    }

    /// The request's scope, as the route checked it.
    fn scope(&self, context: &RequestContext<RoleServer>) -> Result<McpScope, McpError> {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<McpScope>())
            .cloned()
            .ok_or_else(|| McpError::internal_error("the request has no toolgate scope", None))
    }

    /// Sends `notifications/tools/list_changed` for every catalog change of
    /// the session until the MCP session ends or the server shuts down.
    fn forward_catalog_changes(&self, scope: &McpScope, peer: Peer<RoleServer>) {
        let runtime = self.runtime.clone();
        let ended = self.ended.clone();
        let scope = scope.clone();
        tokio::spawn(async move {
            let session = match runtime
                .store
                .session(&scope.account_id, &scope.session_id)
                .await
            {
                Ok(session) => session,
                Err(error) => {
                    tracing::warn!(%error, session_id = ?scope.session_id, "MCP session without its chat session");
                    return;
                }
            };
            // The endpoint caps its own sessions per account; this watcher
            // still counts toward the account's streams.
            let Ok(mut events) = runtime.model_sessions.observe(session, None) else {
                return; // shutting down
            };
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    () = ended.cancelled() => None,
                };
                let Some(event) = event else { break };
                if event.kind != "catalog_changed" {
                    continue;
                }
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
                tracing::debug!(session_id = ?scope.session_id, "MCP client told tools/list_changed");
            }
        });
    }
}

impl ServerHandler for SessionMcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("toolgate", env!("CARGO_PKG_VERSION")))
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&NEWEST_PROTOCOL))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let scope = self.scope(&context)?;
        if self.forwarding.set(()).is_ok() {
            self.forward_catalog_changes(&scope, context.peer.clone());
        }
        context.peer.set_peer_info(request.clone());
        tracing::info!(
            session_id = ?scope.session_id,
            slot = %scope.slot,
            client = ?request.client_info.name,
            "MCP client connected to a session's tools"
        );
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let scope = self.scope(&context)?;
        let session = self
            .runtime
            .store
            .session(&scope.account_id, &scope.session_id)
            .await
            .map_err(convert::mcp_error)?;
        let catalog = self
            .runtime
            .offered_catalog(&session, Some(scope.slot))
            .await
            .map_err(convert::mcp_error)?;
        let tools = catalog
            .entries
            .iter()
            .filter(|entry| entry.availability == Availability::Available)
            .map(convert::tool)
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let scope = self.scope(&context)?;
        if let Some(problem) = ToolCall::name_problem(&request.name) {
            return Err(McpError::invalid_params(problem, None));
        }
        let call = ToolCall {
            name: request.name.to_string(),
            arguments: CallArguments::from_json(request.arguments.map(serde_json::Value::Object)),
            call_id: crate::ids::new_id("mcpcall"),
            caller_slot: scope.slot,
            floor_id: None,
            run_id: None,
            step: None,
        };
        // rmcp runs each request in a task of its own that shutdown neither
        // drops nor waits for: the call runs in one shutdown waits for, so a
        // stop cannot cut it short between its journal rows.
        let runtime = self.runtime.clone();
        let result = self
            .runtime
            .run_to_the_end(async move {
                runtime
                    .call(&scope.account_id, &scope.session_id, call)
                    .await
            })
            .await
            .map_err(|err| McpError::internal_error(format!("the tool call failed: {err}"), None))?
            .map_err(convert::mcp_error)?;
        Ok(convert::call_result(&result).into())
    }
}

/// Builds the per-session handlers for rmcp's streamable-HTTP service.
pub fn handler_factory(
    runtime: ToolRuntime,
) -> impl Fn() -> std::io::Result<SessionMcpServer> + Send + Sync + 'static {
    let runtime = Arc::new(runtime);
    move || Ok(SessionMcpServer::new((*runtime).clone()))
}
