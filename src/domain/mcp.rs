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
    /// Whether it runs a command on this machine.
    pub fn is_stdio(&self) -> bool {
        matches!(self, McpTransport::Stdio(_))
    }

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
/// Every field is optional; an absent one leaves the tool's own value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
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
    /// Set when the stored secrets (stdio `env` / http `headers`) could not be
    /// decrypted with the current secrets key (it changed): the server is
    /// loaded with those maps empty, and this says why. Connecting it without
    /// them would run it misconfigured; writing new values clears it.
    pub secrets_error: Option<String>,
}

impl McpServer {
    /// The server's secret map: the stdio `env` or the http `headers`.
    pub fn secrets(&self) -> &BTreeMap<String, String> {
        self.config.secrets()
    }
}

impl McpServerConfig {
    /// The configuration's secret map: the stdio `env` or the http `headers`.
    pub fn secrets(&self) -> &BTreeMap<String, String> {
        match &self.transport {
            McpTransport::Stdio(stdio) => &stdio.env,
            McpTransport::Http(http) => &http.headers,
        }
    }

    /// The secret map, to fill it with what was decrypted.
    pub fn secrets_mut(&mut self) -> &mut BTreeMap<String, String> {
        match &mut self.transport {
            McpTransport::Stdio(stdio) => &mut stdio.env,
            McpTransport::Http(http) => &mut http.headers,
        }
    }

    /// A copy without the secret values, as it may be stored in clear.
    pub fn without_secrets(&self) -> McpServerConfig {
        let mut copy = self.clone();
        copy.secrets_mut().clear();
        copy
    }
}

/// Values of at least this many characters are masked as their first and last
/// four characters around `****`; shorter ones as `****` alone, so that a mask
/// never shows more than a third of a value.
pub const MASK_REVEAL_MIN_CHARS: usize = 24;

/// A secret value as responses show it (`toke****5678`, or `****`).
pub fn mask_secret(value: &str) -> String {
    let chars: Vec<char> = value.chars().collect();
    if chars.len() < MASK_REVEAL_MIN_CHARS {
        return "****".to_owned();
    }
    let head: String = chars[..4].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}****{tail}")
}

/// The keys of a secret map with masked values.
pub fn mask_secrets(secrets: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    secrets
        .iter()
        .map(|(key, value)| (key.clone(), mask_secret(value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_show_at_most_the_ends_of_long_values() {
        assert_eq!(mask_secret(""), "****");
        assert_eq!(mask_secret("Bearer token"), "****");
        assert_eq!(mask_secret(&"x".repeat(23)), "****");
        assert_eq!(mask_secret("token-abcdefghijklmnop-5678"), "toke****5678");
        assert_eq!(
            mask_secret("密钥密钥abcdefghijklmnopq尾巴尾巴"),
            "密钥密钥****尾巴尾巴"
        );
    }
}
