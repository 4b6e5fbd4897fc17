//! A session's page: its runtime catalog, its permissions as a form, its
//! floors and its journal (live when script runs).

use maud::{Markup, html};
use serde_json::Value;

use super::catalog::catalog_table;
use super::journal::{journal_head, journal_row};
use super::{Nav, csrf_input, layout, or_dash, pager_of, time};
use crate::console::forms::{PERMISSIONS_VERSION, fits_one_per_line, permissions_version};
use crate::domain::tool::Slot;
use crate::journal::ExecutionRecord;
use crate::permissions::ToolPermissions;
use crate::store::{Floor, Session};
use crate::tools::mcp::CatalogServer;

/// Everything the session page shows.
pub struct SessionView<'a> {
    pub session: &'a Session,
    /// Catalog entries as the API's runtime catalog answers them.
    pub tools: &'a [Value],
    pub mcp_servers: &'a [CatalogServer],
    pub permissions: &'a ToolPermissions,
    pub floors: &'a [Floor],
    pub journal: &'a [ExecutionRecord],
    pub journal_offset: i64,
    pub journal_limit: i64,
    pub journal_total: i64,
    /// Whether `journal_total` is a lower bound (the journal's count stopped).
    pub journal_total_is_estimate: bool,
    /// A line saying what the last form did.
    pub notice: Option<&'a str>,
}

/// One name per line: a name may hold spaces and commas.
fn lines(names: Option<&Vec<String>>) -> String {
    names.map(|names| names.join("\n")).unwrap_or_default()
}

/// Whether a list can be edited here (see [`fits_one_per_line`]).
fn editable(names: Option<&Vec<String>>) -> bool {
    names.is_none_or(|names| fits_one_per_line(names))
}

/// Said beside a list the form shows but leaves alone.
const KEPT: &str =
    "holds names with line breaks or edge spaces: kept as stored; change it through the API";

fn slot_rows(permissions: &ToolPermissions) -> Markup {
    html! {
        @for slot in Slot::ALL {
            @let name = slot.as_str();
            @let allow = permissions.slot_allow_list.get(&slot);
            @let deny = permissions.slot_deny_list.get(&slot);
            tr {
                th { (name) }
                td {
                    @if editable(allow) {
                        label { input type="checkbox" name={ "restrict_" (name) } checked[allow.is_some()]; " only" }
                        textarea name={ "allow_" (name) } rows="2" { (lines(allow)) }
                    } @else {
                        input type="hidden" name={ "keep_allow_" (name) } value="on";
                        textarea rows="2" disabled { (lines(allow)) }
                        span.muted { (KEPT) }
                    }
                }
                td {
                    @if editable(deny) {
                        textarea name={ "deny_" (name) } id={ "deny_" (name) } rows="2" { (lines(deny)) }
                    } @else {
                        input type="hidden" name={ "keep_deny_" (name) } value="on";
                        textarea rows="2" disabled { (lines(deny)) }
                        span.muted { (KEPT) }
                    }
                }
            }
        }
    }
}

/// The approval rule, shown but not edited here: a save keeps it.
fn approval_line(permissions: &ToolPermissions) -> Markup {
    let rule = permissions.to_json();
    html! {
        p.meta {
            "Approval required: " code { (rule["approval_required"]) }
            " · waits up to " (permissions.approval_timeout_seconds) " s"
            " (set through " code { "PATCH /sessions/{id}/tool-permissions" } "; saving this form keeps it)"
        }
    }
}

fn permissions_form(session_id: &str, permissions: &ToolPermissions, csrf: &str) -> Markup {
    html! {
        form.permissions #permissions method="post" action={ "/console/sessions/" (session_id) "/permissions" } {
            (csrf_input(csrf))
            input type="hidden" name=(PERMISSIONS_VERSION) value=(permissions_version(&permissions.to_json()));
            p {
                label { input type="checkbox" name="enabled" checked[permissions.enabled]; " tools enabled" } " "
                label { input type="checkbox" name="allow_irreversible" checked[permissions.allow_irreversible]; " allow irreversible" }
            }
            p {
                label { "max calls per turn " input type="number" name="max_calls_per_turn" min="0" value=(permissions.max_calls_per_turn); } " "
                label { "max steps per generation " input type="number" name="max_steps_per_generation" min="0" value=(permissions.max_steps_per_generation); }
            }
            table.slots {
                thead { tr { th { "Slot" } th { "Allow list (tick to restrict; one name per line)" } th { "Deny list (one name per line)" } } }
                tbody { (slot_rows(permissions)) }
            }
            (approval_line(permissions))
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
                @if !view.mcp_servers.is_empty() { (super::mcp::catalog_servers_table(view.mcp_servers)) }
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
                (pager_of(&base, view.journal_offset, view.journal_limit, view.journal_total, view.journal_total_is_estimate))
            }
        },
    )
}
