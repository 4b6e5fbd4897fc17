//! The hand-written `ServerHandler`: one shared tool list (it grows at run
//! time, which the `#[tool]` macros cannot do), paging, the call log, and the
//! sessions to tell when the list changes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::HeaderMap;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::catalog;

/// HTTP requests whose headers are kept for `request_headers`, newest last.
const KEPT_REQUESTS: usize = 256;

/// How long one session may take to accept a `list_changed` notification; a
/// stuck client must not hold up the `add_tool` answer.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(2);

/// The test MCP server. Cheap to clone: every HTTP session gets a clone, and
/// all of them share one tool list and one call log, as one real server would.
#[derive(Clone)]
pub struct TestServer {
    shared: Arc<Shared>,
}

struct Shared {
    tools: Mutex<Vec<Tool>>,
    calls: Mutex<Vec<String>>,
    /// The method and headers of the latest HTTP requests (streamable HTTP
    /// only), so a test sees what requests no tool call answers carried.
    requests: Mutex<VecDeque<(String, HeaderMap)>>,
    /// Every session that went through `initialize`; closed ones are dropped
    /// when a notification is sent.
    peers: Mutex<Vec<Peer<RoleServer>>>,
    page_size: Option<usize>,
    /// `tools/list` is never answered (a server that hangs after the
    /// handshake).
    hang_tools_list: bool,
    /// Cancelled when the stdio client closes stdin: sleeping tools give up.
    closing: CancellationToken,
}

/// Why `add_tool` refused a name.
#[derive(Debug)]
pub enum AddToolError {
    /// The server already lists a tool with that name.
    Exists,
    /// A built-in name: an added tool would not behave like echo under it.
    Reserved,
    /// Empty, too long, or characters outside `[A-Za-z0-9_.-]`.
    Invalid,
}

impl TestServer {
    /// A server listing `tools`, `page_size` per `tools/list` page (all at once
    /// when `None`).
    pub fn new(tools: Vec<Tool>, page_size: Option<usize>, hang_tools_list: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                tools: Mutex::new(tools),
                calls: Mutex::new(Vec::new()),
                requests: Mutex::new(VecDeque::new()),
                peers: Mutex::new(Vec::new()),
                page_size,
                hang_tools_list,
                closing: CancellationToken::new(),
            }),
        }
    }

    fn tool(&self, name: &str) -> Option<Tool> {
        lock(&self.shared.tools)
            .iter()
            .find(|tool| tool.name == name)
            .cloned()
    }

    /// Cancelled once the process is closing (stdin reached its end).
    pub fn closing(&self) -> &CancellationToken {
        &self.shared.closing
    }

    /// The tool names asked for so far (known or not), oldest first.
    pub fn calls(&self) -> Vec<String> {
        lock(&self.shared.calls).clone()
    }

    /// Keeps an HTTP request's method and headers (the last few hundred).
    pub fn record_request(&self, method: &str, headers: &HeaderMap) {
        let mut requests = lock(&self.shared.requests);
        if requests.len() == KEPT_REQUESTS {
            requests.pop_front();
        }
        requests.push_back((method.to_owned(), headers.clone()));
    }

    /// The kept requests' methods with their value of header `name`, oldest first.
    pub fn request_headers(&self, name: &str) -> Vec<(String, Option<String>)> {
        lock(&self.shared.requests)
            .iter()
            .map(|(method, headers)| {
                let value = headers
                    .get(name)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                (method.clone(), value)
            })
            .collect()
    }

    /// Adds an echo-like tool `name` and tells every connected session.
    pub async fn add_tool(&self, name: &str) -> Result<(), AddToolError> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(AddToolError::Invalid);
        }
        if catalog::builtin(name).is_some() {
            return Err(AddToolError::Reserved);
        }
        {
            let mut tools = lock(&self.shared.tools);
            if tools.iter().any(|tool| tool.name == name) {
                return Err(AddToolError::Exists);
            }
            tools.push(catalog::echo_like(name));
        }
        self.announce_list_changed().await;
        Ok(())
    }

    async fn announce_list_changed(&self) {
        let peers: Vec<Peer<RoleServer>> = {
            let mut peers = lock(&self.shared.peers);
            peers.retain(|peer| !peer.is_transport_closed());
            peers.clone()
        };
        let sends = peers.iter().map(|peer| async move {
            match tokio::time::timeout(NOTIFY_TIMEOUT, peer.notify_tool_list_changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "list_changed not delivered"),
                Err(_) => tracing::warn!("list_changed not delivered in time"),
            }
        });
        futures::future::join_all(sends).await;
        tracing::info!(sessions = peers.len(), "announced tools/list_changed");
    }

    fn page(&self, cursor: Option<&str>) -> Result<ListToolsResult, McpError> {
        let tools = lock(&self.shared.tools);
        let Some(size) = self.shared.page_size else {
            return Ok(ListToolsResult::with_all_items(tools.clone()));
        };
        // The cursor is the offset of the page's first tool; opaque to clients.
        let start = match cursor {
            None => 0,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|start| *start <= tools.len())
                .ok_or_else(|| McpError::invalid_params("invalid cursor", None))?,
        };
        let end = (start + size).min(tools.len());
        let mut result = ListToolsResult::with_all_items(tools[start..end].to_vec());
        if end < tools.len() {
            result.next_cursor = Some(end.to_string());
        }
        Ok(result)
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "toolgate-test-mcp",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        lock(&self.shared.peers).push(context.peer.clone());
        tracing::info!(protocol_version = %request.protocol_version, "session initialized");
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        if self.shared.hang_tools_list {
            self.shared.closing.cancelled().await;
            return Err(McpError::internal_error("closing", None));
        }
        self.page(request.as_ref().and_then(|params| params.cursor.as_deref()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        tracing::info!(tool = ?name, "tools/call");
        lock(&self.shared.calls).push(name.clone());
        let Some(tool) = self.tool(&name) else {
            return Err(McpError::invalid_params(
                "tool not found",
                Some(json!({"name": name})),
            ));
        };
        if name == "meta" {
            // rmcp moves a request's `_meta` into its context.
            let meta = Value::Object(context.meta.0.0.clone());
            return Ok(CallToolResult::structured(json!({ "meta": meta })).into());
        }
        let arguments = request.arguments.unwrap_or_default();
        let result = crate::tools::run(self, &tool, arguments, &context).await;
        Ok(result.into())
    }
}

/// A poisoned lock only means a panicking tool; the data is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
