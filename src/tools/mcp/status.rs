//! What a server's connection looks like from outside: `live_status` on the
//! management API and the runtime status routes.

use serde::Serialize;

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
