//! The account's MCP servers and their live status, and the servers a
//! session's catalog takes tools from.

use maud::{Markup, html};

use super::{Nav, layout, or_dash, time};
use crate::tools::mcp::{CatalogServer, LiveStatus};

/// One server as the page lists it.
pub struct McpRow {
    pub id: String,
    pub name: String,
    pub transport: String,
    pub enabled: bool,
    /// `live_status` exactly as `GET /mcp/servers/{id}` answers it.
    pub live_status: LiveStatus,
}

fn when(ms: Option<i64>) -> String {
    ms.map_or_else(|| "—".to_owned(), time)
}

fn live_status(status: &LiveStatus) -> Markup {
    html! {
        span.state data-state=(status.state.as_str()) { (status.state.as_str()) }
        @if let Some(reason) = &status.reason { " (" (reason) ")" }
        @if status.reconnect_required { " · reconnect required" }
        @if let Some(error) = &status.error { div.reason { (error) } }
    }
}

/// The MCP servers page.
pub fn mcp_page(nav: &Nav, rows: &[McpRow]) -> String {
    layout(
        "MCP servers",
        Some(nav),
        html! {
            table.list #mcp-servers {
                thead { tr {
                    th { "Server" } th { "Name" } th { "Transport" } th { "Enabled" } th { "State" }
                    th { "Tools" } th { "Connected" } th { "Tools refreshed" } th { "Last timeout" }
                } }
                tbody {
                    @for row in rows {
                        @let status = &row.live_status;
                        tr data-server=(row.id) {
                            td { code { (row.id) } } td { (row.name) } td { (row.transport) }
                            td { @if row.enabled { "yes" } @else { "no" } }
                            td.status { (live_status(status)) }
                            td { (status.tool_count) }
                            td { (when(status.connected_at)) }
                            td { (when(status.tools_refreshed_at)) }
                            td { (when(status.last_timeout_at)) }
                        }
                    }
                }
            }
            @if rows.is_empty() { p { "This account has no MCP servers (" code { "POST /mcp/servers" } " adds one)." } }
        },
    )
}

/// The MCP servers a session's catalog draws on, as its `mcp_servers` lists
/// them.
pub fn catalog_servers_table(servers: &[CatalogServer]) -> Markup {
    html! {
        table.list.mcp-catalog {
            thead { tr { th { "MCP server" } th { "Catalog source" } th { "Tools" } th { "Snapshot" } th { "Reason" } } }
            tbody {
                @for server in servers {
                    tr data-server=(server.server_id) {
                        td { (server.name) " " code.muted { (server.server_id) } }
                        td.source { (server.catalog_source) }
                        td { (server.tool_count) }
                        td { (when(server.snapshot_at)) }
                        td.reason { (or_dash(server.reason.as_deref())) }
                    }
                }
            }
        }
    }
}
