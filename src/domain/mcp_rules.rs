//! The bounds of an MCP server configuration and the check that holds a whole
//! configuration to them. Every refusal names the field it is about
//! (`stdio.command`, `tool_overrides.search.allowed_slots`, ...) and never
//! repeats a secret value.

use std::collections::{BTreeMap, BTreeSet};

use crate::domain::mcp::{HttpConfig, McpServerConfig, McpTransport, StdioConfig, ToolOverride};
use crate::domain::tool::{AsyncCapability, DeliveryMode, Slot};
use crate::error::{Error, Result};

/// Longest server name, in characters (after trimming).
pub const MAX_NAME_CHARS: usize = 128;
/// Longest `tool_prefix`, in characters; `<prefix>_<tool>` must stay a tool name.
pub const MAX_PREFIX_CHARS: usize = 32;
/// Longest `stdio.command` and `stdio.cwd`, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Most `stdio.args`.
pub const MAX_ARGS: usize = 64;
/// Longest single argument, in bytes.
pub const MAX_ARG_BYTES: usize = 4096;
/// Most entries of `stdio.env` and of `http.headers`.
pub const MAX_SECRET_ENTRIES: usize = 64;
/// Longest env variable or header name, in bytes.
pub const MAX_SECRET_KEY_BYTES: usize = 128;
/// Longest env or header value, in bytes.
pub const MAX_SECRET_VALUE_BYTES: usize = 8192;
/// Longest `http.url`, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// Most entries of `tool_overrides`.
pub const MAX_TOOL_OVERRIDES: usize = 256;
/// Longest server tool name (a `tool_overrides` key), in characters.
pub const MAX_TOOL_NAME_CHARS: usize = 128;
/// Range of `connect_timeout_ms`.
pub const CONNECT_TIMEOUT_MS: (u64, u64) = (100, 300_000);
/// Range of `call_timeout_ms`.
pub const CALL_TIMEOUT_MS: (u64, u64) = (100, 3_600_000);
/// Range of `tool_refresh_interval_ms` when polling is on (0 turns it off).
pub const REFRESH_INTERVAL_MS: (u64, u64) = (1_000, 86_400_000);

/// Headers the MCP client sets itself or that frame the request: a configured
/// one would break the protocol rather than authenticate it.
const RESERVED_HEADERS: &[&str] = &[
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "mcp-protocol-version",
    "mcp-session-id",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn invalid(field: &str, problem: impl std::fmt::Display) -> Error {
    Error::validation(format!("{field} {problem}"))
}

/// Checks every field of `config` against the bounds above.
pub fn validate(config: &McpServerConfig) -> Result<()> {
    check_name(&config.name)?;
    if let Some(prefix) = &config.tool_prefix {
        check_prefix(prefix)?;
    }
    match &config.transport {
        McpTransport::Stdio(stdio) => check_stdio(stdio)?,
        McpTransport::Http(http) => check_http(http)?,
    }
    check_range(
        "connect_timeout_ms",
        config.connect_timeout_ms,
        CONNECT_TIMEOUT_MS,
    )?;
    check_range("call_timeout_ms", config.call_timeout_ms, CALL_TIMEOUT_MS)?;
    if config.tool_refresh_interval_ms != 0 {
        check_range(
            "tool_refresh_interval_ms",
            config.tool_refresh_interval_ms,
            REFRESH_INTERVAL_MS,
        )
        .map_err(|_| {
            invalid(
                "tool_refresh_interval_ms",
                format!(
                    "must be 0 (no polling) or between {} and {}, got {}",
                    REFRESH_INTERVAL_MS.0, REFRESH_INTERVAL_MS.1, config.tool_refresh_interval_ms
                ),
            )
        })?;
    }
    if let Some(slots) = &config.default_allowed_slots {
        check_slots("default_allowed_slots", slots)?;
    }
    check_overrides(&config.tool_overrides, config.default_async_capability)
}

fn check_name(name: &str) -> Result<()> {
    let count = name.chars().count();
    if count == 0 {
        return Err(invalid("name", "must not be empty"));
    }
    if count > MAX_NAME_CHARS {
        return Err(invalid(
            "name",
            format!("must be at most {MAX_NAME_CHARS} characters, got {count}"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid("name", "must not contain control characters"));
    }
    Ok(())
}

fn check_prefix(prefix: &str) -> Result<()> {
    let count = prefix.chars().count();
    if count > MAX_PREFIX_CHARS {
        return Err(invalid(
            "tool_prefix",
            format!("must be at most {MAX_PREFIX_CHARS} characters, got {count}"),
        ));
    }
    if !prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(invalid(
            "tool_prefix",
            format!(
                "may contain only a-z A-Z 0-9 _ - (tool names are built as <prefix>_<tool>), got {prefix:?}"
            ),
        ));
    }
    Ok(())
}

fn check_range(field: &str, value: u64, (min, max): (u64, u64)) -> Result<()> {
    if !(min..=max).contains(&value) {
        return Err(invalid(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

/// A text that ends up in a process's command line, directory or environment:
/// bounded, and without NUL, which no such place can carry.
fn check_os_text(field: &str, value: &str, max_bytes: usize) -> Result<()> {
    if value.len() > max_bytes {
        return Err(invalid(
            field,
            format!("must be at most {max_bytes} bytes, got {}", value.len()),
        ));
    }
    if value.contains('\0') {
        return Err(invalid(field, "must not contain NUL characters"));
    }
    Ok(())
}

fn check_stdio(stdio: &StdioConfig) -> Result<()> {
    if stdio.command.trim().is_empty() {
        return Err(invalid("stdio.command", "must not be empty"));
    }
    check_os_text("stdio.command", &stdio.command, MAX_PATH_BYTES)?;
    if stdio.args.len() > MAX_ARGS {
        return Err(invalid(
            "stdio.args",
            format!(
                "may hold at most {MAX_ARGS} arguments, got {}",
                stdio.args.len()
            ),
        ));
    }
    for (index, arg) in stdio.args.iter().enumerate() {
        check_os_text(&format!("stdio.args[{index}]"), arg, MAX_ARG_BYTES)?;
    }
    if let Some(cwd) = &stdio.cwd {
        if cwd.trim().is_empty() {
            return Err(invalid(
                "stdio.cwd",
                "must not be empty (omit it or send null)",
            ));
        }
        check_os_text("stdio.cwd", cwd, MAX_PATH_BYTES)?;
    }
    check_entries("stdio.env", &stdio.env)?;
    for (key, value) in &stdio.env {
        let valid = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(invalid(
                "stdio.env",
                format!(
                    "has the variable name {key:?}; names are a letter or _ followed by letters, digits or _"
                ),
            ));
        }
        check_os_text(&format!("stdio.env.{key}"), value, MAX_SECRET_VALUE_BYTES)?;
    }
    Ok(())
}

/// The count and key lengths of a secret map (before a key is ever quoted).
fn check_entries(field: &str, entries: &BTreeMap<String, String>) -> Result<()> {
    if entries.len() > MAX_SECRET_ENTRIES {
        return Err(invalid(
            field,
            format!(
                "may hold at most {MAX_SECRET_ENTRIES} entries, got {}",
                entries.len()
            ),
        ));
    }
    for key in entries.keys() {
        if key.is_empty() || key.len() > MAX_SECRET_KEY_BYTES {
            return Err(invalid(
                field,
                format!(
                    "has a name of {} bytes; names are 1-{MAX_SECRET_KEY_BYTES} bytes",
                    key.len()
                ),
            ));
        }
    }
    Ok(())
}

fn check_http(http: &HttpConfig) -> Result<()> {
    check_url(&http.url)?;
    check_entries("http.headers", &http.headers)?;
    let mut seen = BTreeSet::new();
    for (name, value) in &http.headers {
        let token = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
        if !token {
            return Err(invalid(
                "http.headers",
                format!("has the header name {name:?}, which is not a valid HTTP header name"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(invalid(
                "http.headers",
                format!("must not set {name:?}: the MCP client sets it itself"),
            ));
        }
        if !seen.insert(lower) {
            return Err(invalid(
                "http.headers",
                format!("has {name:?} more than once (header names ignore case)"),
            ));
        }
        let field = format!("http.headers.{name}");
        if value.len() > MAX_SECRET_VALUE_BYTES {
            return Err(invalid(
                &field,
                format!(
                    "must be at most {MAX_SECRET_VALUE_BYTES} bytes, got {}",
                    value.len()
                ),
            ));
        }
        if !value.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
            return Err(invalid(
                &field,
                "may contain only printable ASCII characters and tabs",
            ));
        }
    }
    Ok(())
}

fn check_url(raw: &str) -> Result<()> {
    if raw.trim().is_empty() {
        return Err(invalid("http.url", "must not be empty"));
    }
    if raw.len() > MAX_URL_BYTES {
        return Err(invalid(
            "http.url",
            format!("must be at most {MAX_URL_BYTES} bytes, got {}", raw.len()),
        ));
    }
    let url = url::Url::parse(raw)
        .map_err(|err| invalid("http.url", format!("is not a valid URL: {err}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(
            "http.url",
            format!("must use http or https, got {:?}", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("http.url", "must name a host"));
    }
    // Every account may attach HTTP servers: the rule all of them share.
    if !Reach::Any.allows_url(&url) {
        return Err(invalid("http.url", LINK_LOCAL_REFUSAL));
    }
    // The URL is stored and shown in clear; credentials belong in the headers,
    // which are not.
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "http.url",
            "must not contain user information; send credentials in http.headers",
        ));
    }
    Ok(())
}

/// Why a configured link-local address is refused.
const LINK_LOCAL_REFUSAL: &str = "must not be a link-local address (169.254.0.0/16, fe80::/10), where cloud metadata services answer";

/// Whether an MCP connection may not go to `ip`: link-local addresses, where
/// cloud metadata services answer with the machine's credentials. Any account
/// may attach an HTTP server, so its URL (and every address its host name
/// resolves to) is held to this. Loopback stays allowed: local MCP servers
/// are the usual case.
fn is_link_local(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_link_local(),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_link_local(),
            None => v6.is_unicast_link_local(),
        },
    }
}

/// Where an HTTP MCP connection may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Anywhere but link-local addresses: the admin's servers, or every
    /// account's with `--mcp-private-urls-for-all-accounts`.
    Any,
    /// Public addresses only: toolgate itself, trusting loopback peers on
    /// `/api/tools`, and the machine's other services answer on the rest.
    PublicOnly,
}

impl Reach {
    /// Where the servers of an account may go: anywhere (but link-local) for
    /// the admin, or for everyone with `--mcp-private-urls-for-all-accounts`
    /// (`for_all_accounts`).
    pub fn of_owner(is_admin: bool, for_all_accounts: bool) -> Self {
        if is_admin || for_all_accounts {
            Reach::Any
        } else {
            Reach::PublicOnly
        }
    }

    /// What this reach keeps a connection from, in words.
    pub fn refusal(self) -> &'static str {
        match self {
            Reach::Any => "link-local addresses are refused",
            Reach::PublicOnly => {
                "link-local, loopback and private-network addresses are refused; only the admin may attach servers there, unless --mcp-private-urls-for-all-accounts"
            }
        }
    }

    /// Whether a connection may go to `ip`.
    pub fn allows(self, ip: std::net::IpAddr) -> bool {
        !is_link_local(ip) && (self == Reach::Any || !is_private(ip))
    }

    /// Whether a connection may go to the URL's host as far as its text
    /// tells (an IP address, or a `localhost` name); a host name's addresses
    /// are checked again when it is resolved.
    pub fn allows_url(self, url: &url::Url) -> bool {
        match literal_ip(url) {
            Some(ip) => self.allows(ip),
            None => self == Reach::Any || !names_localhost(url),
        }
    }
}

/// Loopback, private-network, shared (carrier-grade NAT), unique-local and
/// unspecified addresses, and IPv4 ones mapped into IPv6.
fn is_private(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_unspecified()
                || (a == 100 && (64..128).contains(&b))
        }
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private(v4.into()),
            None => v6.is_loopback() || v6.is_unspecified() || v6.is_unique_local(),
        },
    }
}

fn names_localhost(url: &url::Url) -> bool {
    url.host_str().is_some_and(|host| {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host == "localhost" || host.ends_with(".localhost")
    })
}

/// The URL's host when it is an IP address (decimal and other IPv4 spellings
/// are normalised by the URL parser).
fn literal_ip(url: &url::Url) -> Option<std::net::IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(v4.into()),
        url::Host::Ipv6(v6) => Some(v6.into()),
        url::Host::Domain(_) => None,
    }
}

fn check_slots(field: &str, slots: &[Slot]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for slot in slots {
        if !seen.insert(*slot) {
            return Err(invalid(field, format!("lists {slot} more than once")));
        }
    }
    Ok(())
}

fn check_overrides(
    overrides: &BTreeMap<String, ToolOverride>,
    server_capability: Option<AsyncCapability>,
) -> Result<()> {
    if overrides.len() > MAX_TOOL_OVERRIDES {
        return Err(invalid(
            "tool_overrides",
            format!(
                "may hold at most {MAX_TOOL_OVERRIDES} tools, got {}",
                overrides.len()
            ),
        ));
    }
    for (tool, entry) in overrides {
        let count = tool.chars().count();
        if count == 0 || count > MAX_TOOL_NAME_CHARS {
            return Err(invalid(
                "tool_overrides",
                format!("has a tool name of {count} characters; names are 1-{MAX_TOOL_NAME_CHARS}"),
            ));
        }
        if tool.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid(
                "tool_overrides",
                format!(
                    "has the tool name {tool:?}; names contain no whitespace or control characters"
                ),
            ));
        }
        if let Some(slots) = &entry.allowed_slots {
            check_slots(&format!("tool_overrides.{tool}.allowed_slots"), slots)?;
        }
        let capability = entry.async_capability.or(server_capability);
        if entry.default_delivery_mode == Some(DeliveryMode::AsyncJob)
            && capability != Some(AsyncCapability::DeferredOk)
        {
            return Err(invalid(
                &format!("tool_overrides.{tool}.default_delivery_mode"),
                "async_job needs async_capability deferred_ok (on the override or as the server's default_async_capability)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::mcp::{
        DEFAULT_CALL_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_TOOL_REFRESH_INTERVAL_MS,
    };

    fn stdio() -> McpServerConfig {
        McpServerConfig {
            name: "fs".into(),
            transport: McpTransport::Stdio(StdioConfig {
                command: "node".into(),
                args: vec![],
                env: BTreeMap::new(),
                cwd: None,
            }),
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
        }
    }

    fn refusal(config: &McpServerConfig) -> String {
        validate(config).unwrap_err().to_string()
    }

    fn http(url: &str) -> McpServerConfig {
        McpServerConfig {
            transport: McpTransport::Http(HttpConfig {
                url: url.into(),
                headers: BTreeMap::new(),
            }),
            ..stdio()
        }
    }

    #[test]
    fn public_only_reach_keeps_off_loopback_and_private_networks() {
        let reaches = |url: &str| {
            let url = url::Url::parse(url).unwrap();
            (
                Reach::Any.allows_url(&url),
                Reach::PublicOnly.allows_url(&url),
            )
        };
        for url in [
            "http://127.0.0.1:8700/api/tools",
            "http://2130706433/",
            "http://[::1]/mcp",
            "http://[::ffff:127.0.0.1]/mcp",
            "http://10.1.2.3/",
            "http://172.20.0.1/",
            "http://192.168.1.1/",
            "http://100.100.0.1/",
            "http://0.0.0.0:8700/",
            "http://[fd00::1]/",
            "http://localhost:8700/mcp",
            "http://api.LOCALHOST./mcp",
        ] {
            assert_eq!(reaches(url), (true, false), "{url}");
        }
        for url in [
            "https://mcp.example.com/mcp",
            "http://8.8.8.8/",
            "http://[2001:db8::1]/",
        ] {
            assert_eq!(reaches(url), (true, true), "{url}");
        }
        assert_eq!(reaches("http://169.254.169.254/"), (false, false));
    }

    #[test]
    fn link_local_urls_are_refused_in_every_spelling() {
        for url in [
            "http://169.254.169.254/latest/meta-data",
            "http://2852039166/mcp",
            "http://0xa9.0xfe.0xa9.0xfe/mcp",
            "http://[fe80::1]/mcp",
            "http://[::ffff:169.254.169.254]/mcp",
        ] {
            let refused = refusal(&http(url));
            assert!(refused.contains("link-local"), "{url}: {refused}");
        }
        for url in [
            "http://127.0.0.1:8080/mcp",
            "http://[::1]/mcp",
            "https://mcp.example.com/mcp",
            "http://10.0.0.5/mcp",
        ] {
            assert!(validate(&http(url)).is_ok(), "{url}");
        }
    }

    #[test]
    fn the_defaults_pass_and_bounds_are_inclusive() {
        let mut config = stdio();
        validate(&config).unwrap();
        config.connect_timeout_ms = CONNECT_TIMEOUT_MS.1;
        config.call_timeout_ms = CALL_TIMEOUT_MS.0;
        config.tool_refresh_interval_ms = 0;
        config.tool_prefix = Some("smoke_".into());
        validate(&config).unwrap();
        config.connect_timeout_ms = CONNECT_TIMEOUT_MS.1 + 1;
        assert!(refusal(&config).starts_with("connect_timeout_ms "));
    }

    #[test]
    fn secret_values_are_never_quoted() {
        let mut config = stdio();
        if let McpTransport::Stdio(stdio) = &mut config.transport {
            stdio.env.insert("TOKEN".into(), "s3cr3t\0value".into());
        }
        let message = refusal(&config);
        assert!(message.starts_with("stdio.env.TOKEN "), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        config.transport = McpTransport::Http(HttpConfig {
            url: "https://mcp.example.com/mcp".into(),
            headers: [("Authorization".into(), "Bearer s3cr3t\n".into())].into(),
        });
        let message = refusal(&config);
        assert!(
            message.starts_with("http.headers.Authorization "),
            "{message}"
        );
        assert!(!message.contains("s3cr3t"), "{message}");
    }
}
