//! Remote tools: HTTP callbacks registered over `/api/tools`. (Filled in by the
//! Runtime Tools API work.)

use serde_json::Value;

use crate::catalog::CatalogEntry;
use crate::dispatch::{ToolCall, ToolOutcome};

/// A callback registered for one role.
#[derive(Debug)]
pub struct RemoteTool {
    pub name: String,
}

/// Per-character registries of remote tools.
#[derive(Debug, Default)]
pub struct RemoteRegistry {}

impl RemoteRegistry {
    pub fn catalog_entries(&self, _role: &str) -> Vec<CatalogEntry> {
        Vec::new()
    }

    pub async fn call(&self, tool: &RemoteTool, _call: &ToolCall, _args: &Value) -> ToolOutcome {
        ToolOutcome::Error(format!("remote tool {} is not implemented yet", tool.name))
    }
}
