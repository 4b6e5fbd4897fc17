//! A session's page: its runtime catalog, its permissions as a form, its
//! floors and its journal (live when script runs).

use maud::{Markup, html};
use serde_json::Value;

use super::journal::{journal_head, journal_row};
use super::{Nav, csrf_input, layout, or_dash, pager, time};
use crate::domain::tool::Slot;
use crate::journal::ExecutionRecord;
use crate::permissions::ToolPermissions;
use crate::store::{Floor, Session};

/// Everything the session page shows.
pub struct SessionView<'a> {
    pub session: &'a Session,
    /// Catalog entries as the API's runtime catalog answers them.
    pub tools: &'a [Value],
    pub mcp_servers: &'a Value,
    pub permissions: &'a ToolPermissions,
    pub floors: &'a [Floor],
    pub journal: &'a [ExecutionRecord],
    pub journal_offset: i64,
    pub journal_limit: i64,
    pub journal_total: i64,
    /// A line saying what the last form did.
    pub notice: Option<&'a str>,
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "—".into(),
        Value::Array(items) if items.is_empty() => "any".into(),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map_or_else(|| item.to_string(), str::to_owned)
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

fn catalog_table(tools: &[Value]) -> Markup {
    html! {
        table.list.catalog {
            thead { tr {
                th { "Tool" } th { "Provider" } th { "Availability" } th { "Side effects (basis)" }
                th { "Allowed slots" } th { "Catalog source" }
            } }
            tbody {
                @for tool in tools {
                    @let availability = text(&tool["availability"]);
                    tr class={ "availability-" (availability) } data-tool=(text(&tool["name"])) {
                        td.tool { code { (text(&tool["name"])) } }
                        td { (text(&tool["provider_id"])) " (" (text(&tool["provider_type"])) ")" }
                        td {
                            span.availability { (availability) }
                            @if let Some(reason) = tool["availability_reason"].as_str() {
                                div.reason { (reason) }
                            }
                        }
                        td { (text(&tool["side_effect_level"])) " (" (text(&tool["side_effect_level_basis"])) ")" }
                        td { (text(&tool["allowed_slots"])) }
                        td { (text(&tool["catalog_source"])) }
                    }
                }
            }
        }
    }
}

fn slot_rows(permissions: &ToolPermissions) -> Markup {
    html! {
        @for slot in Slot::ALL {
            @let name = slot.as_str();
            @let allow = permissions.slot_allow_list.get(&slot);
            @let deny = permissions.slot_deny_list.get(&slot).map(|l| l.join(", ")).unwrap_or_default();
            tr {
                th { (name) }
                td {
                    label { input type="checkbox" name={ "restrict_" (name) } checked[allow.is_some()]; " only" }
                    input type="text" name={ "allow_" (name) } value=(allow.map(|l| l.join(", ")).unwrap_or_default());
                }
                td { input type="text" name={ "deny_" (name) } id={ "deny_" (name) } value=(deny); }
            }
        }
    }
}

fn permissions_form(session_id: &str, permissions: &ToolPermissions, csrf: &str) -> Markup {
    html! {
        form.permissions #permissions method="post" action={ "/console/sessions/" (session_id) "/permissions" } {
            (csrf_input(csrf))
            p {
                label { input type="checkbox" name="enabled" checked[permissions.enabled]; " tools enabled" } " "
                label { input type="checkbox" name="allow_irreversible" checked[permissions.allow_irreversible]; " allow irreversible" }
            }
            p {
                label { "max calls per turn " input type="number" name="max_calls_per_turn" min="0" value=(permissions.max_calls_per_turn); } " "
                label { "max steps per generation " input type="number" name="max_steps_per_generation" min="0" value=(permissions.max_steps_per_generation); }
            }
            table.slots {
                thead { tr { th { "Slot" } th { "Allow list (tick to restrict)" } th { "Deny list" } } }
                tbody { (slot_rows(permissions)) }
            }
            button type="submit" { "Save permissions" }
        }
    }
}

fn floors_list(floors: &[Floor]) -> Markup {
    html! {
        @if floors.is_empty() { p { "No floors yet." } }
        ul.floors {
            @for floor in floors {
                li { a href={ "/console/floors/" (floor.id) } { "Floor " (floor.seq) } " · " (floor.pages.len()) " page(s) · " (time(floor.created_at)) }
            }
        }
    }
}

/// The session page.
pub fn session_page(nav: &Nav, view: &SessionView<'_>) -> String {
    let session = view.session;
    let base = format!("/console/sessions/{}", session.id);
    layout(
        &format!("Session {}", session.id),
        Some(nav),
        html! {
            p.meta { "Character " strong { (session.character) } " · title " (or_dash(Some(session.title.as_str()).filter(|t| !t.is_empty()))) " · created " (time(session.created_at)) }
            @if let Some(notice) = view.notice { p.notice role="status" { (notice) } }
            section { h2 { "Runtime catalog" } (catalog_table(view.tools))
                @if view.mcp_servers.as_array().is_some_and(|s| !s.is_empty()) {
                    p { "MCP servers: " code { (view.mcp_servers.to_string()) } }
                }
            }
            section { h2 { "Permissions" } (permissions_form(&session.id, view.permissions, &nav.csrf)) }
            section { h2 { "Floors" } (floors_list(view.floors)) }
            section {
                h2 { "Journal" }
                p.live #live-status { "Live updates need script; reload to see new calls." }
                table.list.journal #journal data-events={ (base) "/events" } {
                    (journal_head())
                    tbody { @for record in view.journal { (journal_row(record)) } }
                }
                (pager(&base, view.journal_offset, view.journal_limit, view.journal_total))
            }
        },
    )
}
