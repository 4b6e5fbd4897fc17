//! What a server's connection looks like from outside: `live_status` on the
//! management API, the runtime status routes, and the `mcp_servers` entries of a
//! runtime catalog; and the state the supervisor keeps to answer them.

use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::service::Peer;
use serde::Serialize;

use super::tools::CatalogTool;
use crate::catalog::CatalogSource;

/// The connection states of the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionState {
    Disconnected,
    Connecting,
    Connected,
    ReconnectRequired,
    Error,
}

impl ConnectionState {
    /// The state's name, as the management API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Disconnected => "disconnected",
            ConnectionState::Connecting => "connecting",
            ConnectionState::Connected => "connected",
            ConnectionState::ReconnectRequired => "reconnect_required",
            ConnectionState::Error => "error",
        }
    }
}

/// A server's connection as the runtime sees it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveStatus {
    /// Whether the server is in the runtime (enabled and supervised).
    pub attached: bool,
    /// Why it is not attached (`disabled`, `not_attached`); null when attached.
    pub reason: Option<String>,
    pub state: ConnectionState,
    pub tool_count: usize,
    pub connected_at: Option<i64>,
    pub tools_refreshed_at: Option<i64>,
    pub error: Option<String>,
    pub reconnect_required: bool,
    pub last_timeout_at: Option<i64>,
}

impl LiveStatus {
    /// A server outside the runtime, and why.
    pub fn detached(reason: &str) -> Self {
        Self {
            attached: false,
            reason: Some(reason.to_owned()),
            state: ConnectionState::Disconnected,
            tool_count: 0,
            connected_at: None,
            tools_refreshed_at: None,
            error: None,
            reconnect_required: false,
            last_timeout_at: None,
        }
    }
}

/// One enabled server in a runtime catalog, so that a server with no tool
/// entries is never mistaken for one with zero tools.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CatalogServer {
    pub server_id: String,
    pub name: String,
    pub catalog_source: &'static str,
    pub reason: Option<String>,
    pub tool_count: usize,
    pub snapshot_at: Option<i64>,
}

/// The tools a server last listed, as catalog tools for its current config.
#[derive(Debug, Clone)]
pub struct Listed {
    pub tools: Arc<Vec<CatalogTool>>,
    /// When the server listed them.
    pub at: i64,
}

/// A connected server's peer, and the token its connection cancels when it
/// is given up (closed, dropped, timed out): a call in flight ends then, not
/// at its own timeout.
#[derive(Debug, Clone)]
pub struct LivePeer {
    pub peer: Peer<RoleClient>,
    pub given_up: tokio_util::sync::CancellationToken,
}

/// What the supervisor knows about its server's connection.
#[derive(Debug, Clone)]
pub struct SlotState {
    pub connection: ConnectionState,
    /// Set while connected: what calls are sent through.
    pub peer: Option<LivePeer>,
    /// The last listing (live while connected, the snapshot otherwise).
    pub listed: Option<Listed>,
    pub connected_at: Option<i64>,
    pub error: Option<String>,
    pub last_timeout_at: Option<i64>,
}

impl SlotState {
    /// A server not connected yet, with the snapshot it had.
    pub fn starting(listed: Option<Listed>) -> Self {
        Self {
            connection: ConnectionState::Connecting,
            peer: None,
            listed,
            connected_at: None,
            error: None,
            last_timeout_at: None,
        }
    }

    /// Whether the tools come from a live connection.
    pub fn is_live(&self) -> bool {
        self.connection == ConnectionState::Connected && self.peer.is_some()
    }

    /// Where the tools offered now come from.
    pub fn catalog_source(&self) -> CatalogSource {
        match (&self.listed, self.is_live()) {
            (Some(_), true) => CatalogSource::Live,
            (Some(_), false) => CatalogSource::Cached,
            (None, _) => CatalogSource::Unavailable,
        }
    }

    /// Why the tools are not live, in a word or a sentence.
    pub fn reason(&self) -> Option<String> {
        if self.is_live() {
            return None;
        }
        Some(match (&self.error, self.connection) {
            (Some(error), _) => error.clone(),
            (None, ConnectionState::Connecting) => "connecting".to_owned(),
            (None, ConnectionState::ReconnectRequired) => "reconnecting".to_owned(),
            (None, _) => "disconnected".to_owned(),
        })
    }

    /// The state as `live_status` shows it.
    pub fn live_status(&self) -> LiveStatus {
        LiveStatus {
            attached: true,
            reason: None,
            state: self.connection,
            tool_count: self.listed.as_ref().map_or(0, |l| l.tools.len()),
            connected_at: self.connected_at,
            tools_refreshed_at: self.listed.as_ref().map(|l| l.at),
            error: self.error.clone(),
            reconnect_required: self.connection == ConnectionState::ReconnectRequired,
            last_timeout_at: self.last_timeout_at,
        }
    }
}

#[cfg(test)]
mod state_name_tests {
    use super::ConnectionState;

    #[test]
    fn state_names_match_their_serde_form() {
        for state in [
            ConnectionState::Disconnected,
            ConnectionState::Connecting,
            ConnectionState::Connected,
            ConnectionState::ReconnectRequired,
            ConnectionState::Error,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}
