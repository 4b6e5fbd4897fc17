//! The vocabulary of MCP server configurations: what an account stores about one
//! MCP server, already validated. Secrets (stdio `env`, http `headers`) are held
//! here in clear; the store encrypts them and responses mask them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::tool::{AsyncCapability, DeliveryMode, ReplaySafety, SideEffectLevel, Slot};

/// `connect_timeout_ms` when a request gives none.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 30_000;
/// `call_timeout_ms` when a request gives none.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 60_000;
/// `tool_refresh_interval_ms` when a request gives none (0 turns polling off).
pub const DEFAULT_TOOL_REFRESH_INTERVAL_MS: u64 = 300_000;

/// How toolgate reaches an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transport", rename_all = "snake_case")]
pub enum McpTransport {
    /// A child process speaking MCP on its stdin/stdout.
    Stdio(StdioConfig),
    /// A streamable-HTTP MCP endpoint.
    Http(HttpConfig),
}

impl McpTransport {
    /// The wire word of the transport (`stdio` / `http`).
    pub fn as_str(&self) -> &'static str {
        match self {
            McpTransport::Stdio(_) => "stdio",
            McpTransport::Http(_) => "http",
        }
    }
}

/// A stdio server's command line. `env` values are secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdioConfig {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

/// A streamable-HTTP server's endpoint. `headers` values are secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpConfig {
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// An account's override of one tool's governance values (basis `account_override`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect_level: Option<SideEffectLevel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_slots: Option<Vec<Slot>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_safety: Option<ReplaySafety>,
    /// `false` hides the tool from every catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_capability: Option<AsyncCapability>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_delivery_mode: Option<DeliveryMode>,
}

/// One MCP server as an account configured it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerConfig {
    pub name: String,
    #[serde(flatten)]
    pub transport: McpTransport,
    /// Catalog names are `<prefix>_<tool name>`; without a prefix, the tool's own name.
    #[serde(default)]
    pub tool_prefix: Option<String>,
    pub enabled: bool,
    pub connect_timeout_ms: u64,
    pub call_timeout_ms: u64,
    pub tool_refresh_interval_ms: u64,
    /// The server default (basis `server_default`).
    #[serde(default)]
    pub default_side_effect_level: Option<SideEffectLevel>,
    #[serde(default)]
    pub default_allowed_slots: Option<Vec<Slot>>,
    /// Whether tool annotations (`readOnlyHint`, `idempotentHint`) set metadata.
    #[serde(default)]
    pub trust_annotations: bool,
    /// Server-wide async capability for its tools (overrides may change it per tool).
    #[serde(default)]
    pub default_async_capability: Option<AsyncCapability>,
    /// Keyed by the server's own tool names, without the prefix.
    #[serde(default)]
    pub tool_overrides: BTreeMap<String, ToolOverride>,
}

impl McpServerConfig {
    /// The catalog name of the server's tool `tool`.
    pub fn catalog_name(&self, tool: &str) -> String {
        match self.tool_prefix.as_deref() {
            Some(prefix) if !prefix.is_empty() => format!("{prefix}_{tool}"),
            _ => tool.to_owned(),
        }
    }
}

/// A stored MCP server: its configuration and who owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    pub id: String,
    pub account_id: String,
    pub config: McpServerConfig,
    pub created_at: i64,
    pub updated_at: i64,
}
