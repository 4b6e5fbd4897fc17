//! The request body of `POST /mcp/servers` and `PATCH /mcp/servers/{id}`, and
//! how it becomes a configuration: defaults on create, a merge on update,
//! then the whole result checked by [`mcp_rules::validate`].
//!
//! One rule for `null`: it means "the default" (no prefix, no env, 30000 ms,
//! ...), exactly like leaving the field out of a create. In a PATCH, an
//! absent field keeps its value and `null` resets it. Fields without a default
//! (`name`, `transport`, `stdio.command`, `http.url`) refuse `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::domain::mcp::{
    DEFAULT_CALL_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_TOOL_REFRESH_INTERVAL_MS,
    HttpConfig, McpServer, McpServerConfig, McpTransport, StdioConfig, ToolOverride,
};
use crate::domain::mcp_rules;
use crate::domain::tool::{AsyncCapability, SideEffectLevel, Slot};
use crate::error::{Error, Result};

/// A field that was sent, possibly as `null`: absent is `None`, `null` is
/// `Some(None)`.
type Sent<T> = Option<Option<T>>;

fn sent<'de, D, T>(deserializer: D) -> std::result::Result<Sent<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// The transports, as the body names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    Stdio,
    Http,
}

impl TransportKind {
    fn of(transport: &McpTransport) -> Self {
        match transport {
            McpTransport::Stdio(_) => TransportKind::Stdio,
            McpTransport::Http(_) => TransportKind::Http,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            TransportKind::Stdio => "stdio",
            TransportKind::Http => "http",
        }
    }
}

/// `stdio`: the command toolgate starts and speaks MCP with over its stdin and
/// stdout. In a PATCH of a stdio server, the fields sent replace theirs and
/// the others are kept; `env` is replaced whole.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdioBody {
    /// Program to run (a path, or a name looked up in PATH): 1-1024 bytes, no NUL.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = String, required = false)]
    pub command: Sent<String>,
    /// Its arguments: at most 64, each at most 4096 bytes.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<Vec<String>>, nullable)]
    pub args: Sent<Vec<String>>,
    /// Extra environment variables (write-only secrets, shown as `env_masked`):
    /// at most 64, names `[A-Za-z_][A-Za-z0-9_]*` of at most 128 bytes, values
    /// at most 8192 bytes.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<BTreeMap<String, String>>, nullable)]
    pub env: Sent<BTreeMap<String, String>>,
    /// Working directory (default: toolgate's own): 1-1024 bytes.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<String>, nullable)]
    pub cwd: Sent<String>,
}

/// `http`: a streamable-HTTP MCP endpoint. In a PATCH of an http server, the
/// fields sent replace theirs; `headers` is replaced whole.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpBody {
    /// `http` or `https` URL of any host, without user information; at most 2048 bytes.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = String, required = false)]
    pub url: Sent<String>,
    /// Request headers (write-only secrets, shown as `headers_masked`): at
    /// most 64, valid header names (case-insensitively distinct; not the ones
    /// the MCP client sets itself, such as `Host` or `Mcp-Session-Id`), values
    /// of printable ASCII of at most 8192 bytes.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<BTreeMap<String, String>>, nullable)]
    pub headers: Sent<BTreeMap<String, String>>,
}

/// Body of `POST /mcp/servers` (`name` and `transport` required, with the
/// transport's object) and of `PATCH /mcp/servers/{id}` (every field
/// optional, at least one; `null` resets a field to its default). The other
/// transport's object must be absent or `null`. Unknown fields are refused.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerBody {
    /// Unique in the account; trimmed, 1-128 characters, no control characters.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = String, required = false)]
    pub name: Sent<String>,
    /// `stdio` or `http` (streamable HTTP). Changing it in a PATCH needs the
    /// new transport's object, with its `command` or `url`.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = TransportKind, required = false)]
    pub transport: Sent<TransportKind>,
    /// Required when `transport` is `stdio`.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<StdioBody>, nullable)]
    pub stdio: Sent<StdioBody>,
    /// Required when `transport` is `http`.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<HttpBody>, nullable)]
    pub http: Sent<HttpBody>,
    /// Catalog names are `<prefix>_<tool name>`: at most 32 of `a-z A-Z 0-9 _ -`
    /// (default none: the tool's own name; `""` is none too).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<String>, nullable)]
    pub tool_prefix: Sent<String>,
    /// Default `true`.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<bool>, nullable)]
    pub enabled: Sent<bool>,
    /// 100-300000 (default 30000).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<u64>, nullable)]
    pub connect_timeout_ms: Sent<u64>,
    /// 100-3600000 (default 60000).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<u64>, nullable)]
    pub call_timeout_ms: Sent<u64>,
    /// 0 (no polling) or 1000-86400000 (default 300000).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<u64>, nullable)]
    pub tool_refresh_interval_ms: Sent<u64>,
    /// The server's default for its tools (basis `server_default`); default
    /// none, which leaves the platform default `irreversible`.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<SideEffectLevel>, nullable)]
    pub default_side_effect_level: Sent<SideEffectLevel>,
    /// Slots that may call the server's tools, each at most once (default none:
    /// no restriction).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<Vec<Slot>>, nullable)]
    pub default_allowed_slots: Sent<Vec<Slot>>,
    /// Whether tool annotations (`readOnlyHint`, `idempotentHint`) set
    /// governance metadata (default `false`).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<bool>, nullable)]
    pub trust_annotations: Sent<bool>,
    /// `inline_only` or `deferred_ok` for every tool of the server (default none:
    /// `inline_only`).
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<AsyncCapability>, nullable)]
    pub default_async_capability: Sent<AsyncCapability>,
    /// Per-tool overrides (basis `account_override`), keyed by the server's own
    /// tool names without the prefix: at most 256, names of 1-128 characters
    /// without whitespace. Replaced whole by a PATCH.
    #[serde(default, deserialize_with = "sent")]
    #[schema(value_type = Option<BTreeMap<String, ToolOverride>>, nullable)]
    pub tool_overrides: Sent<BTreeMap<String, ToolOverride>>,
}

/// The value of a field without a default.
fn required<T>(field: &str, value: Sent<T>) -> Result<T> {
    match value {
        Some(Some(value)) => Ok(value),
        Some(None) => Err(Error::validation(format!("{field} must not be null"))),
        None => Err(Error::validation(format!("{field} is required"))),
    }
}

/// A field of a merge: absent keeps `current`, `null` is `default`.
fn merged<T>(current: T, value: Sent<T>, default: impl FnOnce() -> T) -> T {
    match value {
        None => current,
        Some(None) => default(),
        Some(Some(value)) => value,
    }
}

/// A field without a default in a merge: absent keeps `current`.
fn merged_required<T>(field: &str, current: T, value: Sent<T>) -> Result<T> {
    match value {
        None => Ok(current),
        other => required(field, other),
    }
}

impl StdioBody {
    /// The stdio configuration: this body over `base` (a create has none).
    fn merge(self, base: Option<StdioConfig>) -> Result<StdioConfig> {
        let Some(base) = base else {
            return Ok(StdioConfig {
                command: required("stdio.command", self.command)?,
                args: self.args.flatten().unwrap_or_default(),
                env: self.env.flatten().unwrap_or_default(),
                cwd: self.cwd.flatten(),
            });
        };
        Ok(StdioConfig {
            command: merged_required("stdio.command", base.command, self.command)?,
            args: merged(base.args, self.args, Vec::new),
            env: merged(base.env, self.env, BTreeMap::new),
            cwd: merged(base.cwd, self.cwd.map(|cwd| cwd.map(Some)), || None),
        })
    }
}

impl HttpBody {
    /// The http configuration: this body over `base` (a create has none).
    fn merge(self, base: Option<HttpConfig>) -> Result<HttpConfig> {
        let Some(base) = base else {
            return Ok(HttpConfig {
                url: required("http.url", self.url)?,
                headers: self.headers.flatten().unwrap_or_default(),
            });
        };
        Ok(HttpConfig {
            url: merged_required("http.url", base.url, self.url)?,
            headers: merged(base.headers, self.headers, BTreeMap::new),
        })
    }
}

/// The transport object `field` sent over `current` (None: there is none of
/// that kind yet, so the object is required whole), and whether the secret
/// map was written.
fn merge_object<B, C>(
    field: &str,
    key_field: &str,
    sent: Sent<B>,
    current: Option<C>,
    writes_secrets: impl Fn(&B) -> bool,
    merge: impl FnOnce(B, Option<C>) -> Result<C>,
) -> Result<(C, bool)> {
    match (sent, current) {
        (None, Some(current)) => Ok((current, false)),
        (Some(Some(body)), Some(current)) => {
            let written = writes_secrets(&body);
            Ok((merge(body, Some(current))?, written))
        }
        (Some(Some(body)), None) => Ok((merge(body, None)?, true)),
        (Some(None), Some(_)) => Err(Error::validation(format!(
            "{field} must not be null while transport is {field}"
        ))),
        (_, None) => Err(Error::validation(format!(
            "{field} is required when transport is {field} (an object with its {key_field})"
        ))),
    }
}

impl McpServerBody {
    /// True when the body sets nothing (a PATCH must set something).
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.transport.is_none()
            && self.stdio.is_none()
            && self.http.is_none()
            && self.tool_prefix.is_none()
            && self.enabled.is_none()
            && self.connect_timeout_ms.is_none()
            && self.call_timeout_ms.is_none()
            && self.tool_refresh_interval_ms.is_none()
            && self.default_side_effect_level.is_none()
            && self.default_allowed_slots.is_none()
            && self.trust_annotations.is_none()
            && self.default_async_capability.is_none()
            && self.tool_overrides.is_none()
    }

    /// A PATCH must change at least one field.
    pub fn check_not_empty(&self) -> Result<()> {
        if self.is_empty() {
            return Err(Error::validation(
                "PATCH needs at least one field: name, transport, stdio, http, tool_prefix, enabled, connect_timeout_ms, call_timeout_ms, tool_refresh_interval_ms, default_side_effect_level, default_allowed_slots, trust_annotations, default_async_capability, tool_overrides",
            ));
        }
        Ok(())
    }

    /// The configuration a `POST` asks for: defaults applied, every field checked.
    pub fn create(self) -> Result<McpServerConfig> {
        let name = required("name", self.name.clone())?;
        let kind = required("transport", self.transport)?;
        let (transport, _) = self.transport_over(None, kind)?;
        let defaults = McpServerConfig {
            name,
            transport,
            tool_prefix: None,
            enabled: true,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
            tool_refresh_interval_ms: DEFAULT_TOOL_REFRESH_INTERVAL_MS,
            default_side_effect_level: None,
            default_allowed_slots: None,
            trust_annotations: false,
            default_async_capability: None,
            tool_overrides: BTreeMap::new(),
        };
        let config = self.merge_settings(defaults);
        mcp_rules::validate(&config)?;
        Ok(config)
    }

    /// `existing` with this PATCH applied and checked whole. Writing new
    /// secrets (the transport's `env` / `headers`, or another transport) clears
    /// `secrets_error`; otherwise it stays, and so do the stored secrets.
    pub fn apply(self, existing: &McpServer) -> Result<McpServer> {
        let mut config = existing.config.clone();
        if let Some(name) = self.name.clone() {
            config.name = required("name", Some(name))?;
        }
        let current = TransportKind::of(&config.transport);
        let kind = merged_required("transport", current, self.transport)?;
        let (transport, secrets_written) = self.transport_over(Some(&config.transport), kind)?;
        config.transport = transport;
        let config = self.merge_settings(config);
        mcp_rules::validate(&config)?;
        let mut server = existing.clone();
        server.config = config;
        if secrets_written {
            server.secrets_error = None;
        }
        Ok(server)
    }

    /// The transport of kind `kind` this body describes over `base` (the
    /// current transport; a create has none), and whether its secret map was
    /// written anew. A create or a switch to another kind needs the kind's
    /// object whole; otherwise the object sent is merged into the current one.
    fn transport_over(
        &self,
        base: Option<&McpTransport>,
        kind: TransportKind,
    ) -> Result<(McpTransport, bool)> {
        let (other, other_sent) = match kind {
            TransportKind::Stdio => (TransportKind::Http, matches!(self.http, Some(Some(_)))),
            TransportKind::Http => (TransportKind::Stdio, matches!(self.stdio, Some(Some(_)))),
        };
        if other_sent {
            return Err(Error::validation(format!(
                "{} must be absent or null when transport is {}",
                other.as_str(),
                kind.as_str()
            )));
        }
        Ok(match kind {
            TransportKind::Stdio => {
                let current = match base {
                    Some(McpTransport::Stdio(current)) => Some(current.clone()),
                    _ => None,
                };
                let (stdio, written) = merge_object(
                    "stdio",
                    "command",
                    self.stdio.clone(),
                    current,
                    |body| body.env.is_some(),
                    StdioBody::merge,
                )?;
                (McpTransport::Stdio(stdio), written)
            }
            TransportKind::Http => {
                let current = match base {
                    Some(McpTransport::Http(current)) => Some(current.clone()),
                    _ => None,
                };
                let (http, written) = merge_object(
                    "http",
                    "url",
                    self.http.clone(),
                    current,
                    |body| body.headers.is_some(),
                    HttpBody::merge,
                )?;
                (McpTransport::Http(http), written)
            }
        })
    }

    /// Every field but name and transport, merged over `config`.
    fn merge_settings(self, config: McpServerConfig) -> McpServerConfig {
        let prefix = merged(
            config.tool_prefix,
            self.tool_prefix.map(|p| p.map(Some)),
            || None,
        );
        McpServerConfig {
            tool_prefix: prefix.filter(|prefix| !prefix.is_empty()),
            enabled: merged(config.enabled, self.enabled, || true),
            connect_timeout_ms: merged(config.connect_timeout_ms, self.connect_timeout_ms, || {
                DEFAULT_CONNECT_TIMEOUT_MS
            }),
            call_timeout_ms: merged(config.call_timeout_ms, self.call_timeout_ms, || {
                DEFAULT_CALL_TIMEOUT_MS
            }),
            tool_refresh_interval_ms: merged(
                config.tool_refresh_interval_ms,
                self.tool_refresh_interval_ms,
                || DEFAULT_TOOL_REFRESH_INTERVAL_MS,
            ),
            default_side_effect_level: merged(
                config.default_side_effect_level,
                self.default_side_effect_level.map(|v| v.map(Some)),
                || None,
            ),
            default_allowed_slots: merged(
                config.default_allowed_slots,
                self.default_allowed_slots.map(|v| v.map(Some)),
                || None,
            ),
            trust_annotations: merged(config.trust_annotations, self.trust_annotations, || false),
            default_async_capability: merged(
                config.default_async_capability,
                self.default_async_capability.map(|v| v.map(Some)),
                || None,
            ),
            tool_overrides: merged(config.tool_overrides, self.tool_overrides, BTreeMap::new),
            name: config.name.trim().to_owned(),
            transport: config.transport,
        }
    }
}
