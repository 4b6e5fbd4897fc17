//! The MCP provider: an account's enabled servers' tools in its sessions'
//! catalogs, and `tools/call` on the call path. A call always gets an outcome
//! with a reason code — also while its server is down or reconnecting — and a
//! call that outlives `call_timeout_ms` is answered at the timeout.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, CallToolResult, RequestParamsMeta};
use rmcp::service::ServiceError;
use serde_json::Value;

use super::status::ConnectionState;
use super::{Command, McpHub};
use crate::call::{Attempt, JobInvocation, ToolCall, ToolOutcome};
use crate::catalog::{
    Availability, CallContext, CatalogEntry, EntryKey, ToolHandler, ToolProvider,
};
use crate::domain::tool::{SideEffectLevel, ToolSpec};
use crate::error::Result;
use crate::ids::now_ms;
use crate::reason::ReasonCode;
use crate::store::Session;

/// The `kind` of MCP job snapshots.
const KIND: &str = "mcp";
/// The `_meta` key of a call's idempotency key (its execution id).
pub const META_IDEMPOTENCY_KEY: &str = "toolgate/idempotency_key";
/// The `_meta` key of a call's hand-over count, from 1.
pub const META_ATTEMPT: &str = "toolgate/attempt";

/// Offers the tools of the session's account's enabled MCP servers.
pub struct McpProvider {
    hub: Arc<McpHub>,
}

impl McpProvider {
    pub fn new(hub: Arc<McpHub>) -> Self {
        Self { hub }
    }
}

impl McpProvider {
    /// The entries of the account's listed server tools whose spec `keep`
    /// keeps.
    fn entries_where(
        &self,
        session: &Session,
        keep: impl Fn(&ToolSpec) -> bool,
    ) -> Vec<CatalogEntry> {
        let mut entries = Vec::new();
        for slot in self.hub.account_slots(&session.account_id) {
            let state = slot.state();
            let Some(listed) = state.listed.as_ref() else {
                continue;
            };
            let source = state.catalog_source();
            for tool in listed.tools.iter().filter(|tool| keep(&tool.spec)) {
                let handler = McpHandler {
                    hub: self.hub.clone(),
                    server_id: slot.server.id.clone(),
                    remote_name: tool.remote_name.clone(),
                    side_effect_level: tool.spec.metadata.side_effect_level,
                };
                let mut entry = CatalogEntry::available(tool.spec.clone(), Arc::new(handler));
                entry.catalog_source = Some(source);
                entries.push(entry);
            }
        }
        entries
    }
}

impl ToolProvider for McpProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn entries<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(std::future::ready(
            Ok(self.entries_where(session, |_| true)),
        ))
    }

    fn entry_keys(&self, session: &Session, keys: &mut Vec<EntryKey>) -> bool {
        // A listing's specs are shared by every entry built from it while it
        // lasts, and every server tool is offered available: the keys are the
        // entries' own, in the entries' order.
        for slot in self.hub.account_slots(&session.account_id) {
            if let Some(listed) = slot.state().listed.as_ref() {
                keys.extend(
                    listed
                        .tools
                        .iter()
                        .map(|tool| EntryKey::new(&tool.spec, Availability::Available)),
                );
            }
        }
        true
    }

    fn entries_named<'a>(
        &'a self,
        session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        let entries = self.entries_where(session, |spec| spec.name == name);
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn restore(
        &self,
        invocation: &JobInvocation,
    ) -> std::result::Result<Arc<dyn ToolHandler>, String> {
        Ok(Arc::new(McpHandler {
            hub: self.hub.clone(),
            server_id: invocation.tool_text("server_id")?,
            remote_name: invocation.tool_text("tool")?,
            side_effect_level: invocation.effective_side_effect_level(),
        }))
    }
}

/// Runs one tool of one server; the server's connection is looked up at call
/// time, so a call made during a reconnect uses the new connection.
#[derive(Debug)]
struct McpHandler {
    hub: Arc<McpHub>,
    server_id: String,
    remote_name: String,
    side_effect_level: SideEffectLevel,
}

impl ToolHandler for McpHandler {
    fn invoke<'a>(
        &'a self,
        cx: &'a CallContext<'a>,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(self.call(cx.attempt, args))
    }

    fn snapshot(&self, call: &ToolCall, args: &Value) -> Option<JobInvocation> {
        let mut fields = serde_json::Map::new();
        fields.insert("server_id".into(), self.server_id.clone().into());
        fields.insert("tool".into(), self.remote_name.clone().into());
        Some(JobInvocation {
            kind: KIND.to_owned(),
            call_id: call.call_id.clone(),
            raw_arguments: call.arguments.raw.clone(),
            arguments: args.clone(),
            side_effect_level: Some(self.side_effect_level),
            replay_safety: None,
            tool: fields,
        })
    }
}

impl McpHandler {
    async fn call(&self, attempt: Attempt<'_>, args: &Value) -> ToolOutcome {
        let Some(slot) = self.hub.slot(&self.server_id) else {
            return ToolOutcome::not_started(
                ReasonCode::McpServerUnavailable,
                format!(
                    "MCP server {} is disabled or deleted; the call was not sent",
                    self.server_id
                ),
            );
        };
        let state = slot.state();
        let live = match (&state.peer, state.connection) {
            (Some(live), ConnectionState::Connected) => live.clone(),
            (_, ConnectionState::ReconnectRequired) => {
                return ToolOutcome::not_started(
                    ReasonCode::McpConnectionReconnectRequired,
                    format!(
                        "MCP server {:?} is reconnecting; the call was not sent",
                        slot.server.config.name
                    ),
                );
            }
            _ => {
                return ToolOutcome::not_started(
                    ReasonCode::McpNotConnected,
                    format!(
                        "MCP server {:?} is not connected ({}); the call was not sent",
                        slot.server.config.name,
                        state.reason().unwrap_or_else(|| "disconnected".into())
                    ),
                );
            }
        };
        let params = self.params(attempt, args);
        let timeout_ms = slot.server.config.call_timeout_ms;
        let answer = tokio::time::timeout(Duration::from_millis(timeout_ms), async {
            tokio::select! {
                answer = live.peer.call_tool(params) => Some(answer),
                () = live.given_up.cancelled() => None,
            }
        });
        let answer = match answer.await {
            Ok(Some(answer)) => Ok(answer),
            // Sent on a connection given up since (dropped, recycled, the
            // server deleted): the server may have run it.
            Ok(None) => {
                return ToolOutcome::timeout(
                    ReasonCode::McpTransportError,
                    "the MCP connection was given up while the call was in flight; the call may or may not have run",
                );
            }
            Err(elapsed) => Err(elapsed),
        };
        match answer {
            Ok(Ok(result)) => outcome(result, self.hub.shared.max_result_bytes),
            Ok(Err(error)) => self.failed(error),
            Err(_) => {
                slot.update(|state| state.last_timeout_at = Some(now_ms()));
                if self.side_effect_level == SideEffectLevel::None {
                    return ToolOutcome::timeout(
                        ReasonCode::McpCallTimeout,
                        format!(
                            "the MCP tool did not answer within call_timeout_ms = {timeout_ms}"
                        ),
                    );
                }
                // The server may still be running it: this connection is not
                // trusted again, and the call is never retried.
                slot.send(Command::Recycle);
                ToolOutcome::timeout(
                    ReasonCode::McpCallTimeoutUncertain,
                    format!(
                        "the MCP tool did not answer within call_timeout_ms = {timeout_ms}; it may or may not have acted, and is not retried"
                    ),
                )
            }
        }
    }

    /// The `tools/call` parameters, with this call's trace context in
    /// `_meta` (SEP-414): rmcp sends from its own task, where the call's span
    /// is not current, and the HTTP transport lifts it into `traceparent`.
    /// `_meta` also carries the idempotency key and attempt, as callbacks get
    /// them in headers.
    fn params(&self, attempt: Attempt<'_>, args: &Value) -> CallToolRequestParams {
        let arguments = args.as_object().cloned().unwrap_or_default();
        let mut params =
            CallToolRequestParams::new(self.remote_name.clone()).with_arguments(arguments);
        let meta = params.meta_or_default();
        meta.insert(
            META_IDEMPOTENCY_KEY.to_owned(),
            attempt.idempotency_key.into(),
        );
        meta.insert(META_ATTEMPT.to_owned(), attempt.number.into());
        let trace = crate::telemetry::current_fields();
        if let Some(parent) = trace.get("traceparent") {
            params.set_traceparent(parent);
        }
        if let Some(state) = trace.get("tracestate").filter(|state| !state.is_empty()) {
            params.set_tracestate(state);
        }
        params
    }

    fn failed(&self, error: ServiceError) -> ToolOutcome {
        match error {
            ServiceError::McpError(error) => ToolOutcome::error(
                ReasonCode::McpRemoteError,
                truncate(
                    format!("the MCP server refused the call: {}", error.message),
                    self.hub.shared.max_result_bytes,
                ),
            ),
            ServiceError::TransportSend(error) if never_sent(&error) => ToolOutcome::not_started(
                ReasonCode::McpTransportError,
                format!(
                    "the call could not be sent to the MCP server: {}",
                    error.error
                ),
            ),
            // Over HTTP the request and its answer are one exchange: an answer
            // too large or unreadable fails the "send" after the server ran it.
            ServiceError::TransportSend(error) => ToolOutcome::timeout(
                ReasonCode::McpTransportError,
                format!(
                    "the MCP server's answer could not be read ({}); the call may or may not have run",
                    error.error
                ),
            ),
            // Sent, but the answer never came: it may have run.
            ServiceError::TransportClosed => ToolOutcome::timeout(
                ReasonCode::McpTransportError,
                "the MCP connection closed before the server answered; the call may or may not have run",
            ),
            other => ToolOutcome::error(
                ReasonCode::McpProviderError,
                format!("the MCP call failed: {other}"),
            ),
        }
    }
}

/// Whether a request the transport failed surely never reached the server:
/// an HTTP connection that was never made, the transport's channel already
/// closed, or a write to a stdio child that is gone. Anything else may have
/// been received and run, so it must not be journalled as never started (the
/// replay guard trusts that).
fn never_sent(error: &rmcp::transport::DynamicTransportError) -> bool {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    if let Some(http) = error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return match http {
            StreamableHttpError::Client(error) => error.is_connect(),
            StreamableHttpError::TransportChannelClosed => true,
            _ => false,
        };
    }
    error.error.downcast_ref::<std::io::Error>().is_some()
}

/// A `tools/call` answer as the model sees it: `isError` results are tool
/// errors with the server's text; otherwise `structuredContent` when given,
/// else the text content.
fn outcome(result: CallToolResult, max_bytes: usize) -> ToolOutcome {
    let text: Vec<&str> = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect();
    if result.is_error == Some(true) {
        let message = if text.is_empty() {
            "the MCP tool reported an error".to_owned()
        } else {
            text.join("\n")
        };
        return ToolOutcome::error(ReasonCode::McpRemoteError, truncate(message, max_bytes));
    }
    let output = match (result.structured_content, text.as_slice()) {
        (Some(structured), _) => structured,
        (None, [one]) => Value::String((*one).to_owned()),
        (None, []) => serde_json::to_value(&result.content).unwrap_or(Value::Null),
        (None, many) => Value::String(many.join("\n")),
    };
    let size = output.to_string().len();
    if size > max_bytes {
        return ToolOutcome::error(
            ReasonCode::McpProviderError,
            format!(
                "the MCP tool's result takes {size} bytes, more than the limit of {max_bytes}; it was discarded"
            ),
        );
    }
    ToolOutcome::Success(output)
}

fn truncate(mut message: String, max_bytes: usize) -> String {
    crate::text::truncate_to_bytes(&mut message, max_bytes);
    message
}
