//! Builtin tools. (Filled in by the builtin-tools work.)

use serde_json::Value;

use crate::catalog::CatalogEntry;
use crate::dispatch::ToolOutcome;
use crate::error::Result;
use crate::runtime::ToolRuntime;
use crate::store::Session;

pub async fn catalog_entries(
    _runtime: &ToolRuntime,
    _session: &Session,
) -> Result<Vec<CatalogEntry>> {
    Ok(Vec::new())
}

pub async fn call(
    _runtime: &ToolRuntime,
    _session: &Session,
    name: &str,
    _args: &Value,
) -> ToolOutcome {
    ToolOutcome::Error(format!("builtin {name} is not implemented yet"))
}
