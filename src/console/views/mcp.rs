//! The account's MCP servers and their live status.

use maud::html;
use serde_json::Value;

use super::{Nav, layout};

/// One server as the page lists it.
pub struct McpRow {
    pub id: String,
    pub name: String,
    pub transport: String,
    pub enabled: bool,
    /// `live_status` exactly as `GET /mcp/servers/{id}` answers it.
    pub live_status: Value,
}

/// The MCP servers page.
pub fn mcp_page(nav: &Nav, rows: &[McpRow]) -> String {
    layout(
        "MCP servers",
        Some(nav),
        html! {
            table.list #mcp-servers {
                thead { tr { th { "Server" } th { "Name" } th { "Transport" } th { "Enabled" } th { "Live status" } } }
                tbody {
                    @for row in rows {
                        tr {
                            td { code { (row.id) } } td { (row.name) } td { (row.transport) }
                            td { (row.enabled) }
                            td { code { (row.live_status.to_string()) } }
                        }
                    }
                }
            }
            @if rows.is_empty() { p { "This account has no MCP servers (" code { "POST /mcp/servers" } " adds one)." } }
        },
    )
}
