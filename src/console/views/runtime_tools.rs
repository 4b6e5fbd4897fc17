//! The runtime tools registered over `/api/tools` for the account's
//! characters (roles): source, callback, timeout, eviction state.

use maud::html;

use super::{Nav, layout};

/// One registration as the page lists it.
pub struct RuntimeToolRow {
    pub role: String,
    pub name: String,
    pub source: String,
    pub callback_url: String,
    pub timeout_seconds: f64,
    pub side_effect_level: String,
    /// Consecutive connection failures of its origin and source.
    pub failure_streak: u32,
    pub eviction_threshold: u32,
    /// Only plugin sources (`plugin:*`) are evicted.
    pub evictable: bool,
}

/// The runtime tools page.
pub fn runtime_tools_page(nav: &Nav, rows: &[RuntimeToolRow]) -> String {
    layout(
        "Runtime tools",
        Some(nav),
        html! {
            p.hint { "Registrations of the loopback Runtime Tools API (" code { "/api/tools" } ") for this account's characters. They are runtime state: a restart empties them. Accounts other than the admin see a callback URL's origin only: a plugin's path may hold its token." }
            table.list #runtime-tools {
                thead { tr { th { "Role" } th { "Tool" } th { "Source" } th { "Callback URL" } th { "Timeout" } th { "Side effects" } th { "Eviction" } } }
                tbody {
                    @for row in rows {
                        tr data-tool=(row.name) {
                            td { (row.role) } td { code { (row.name) } } td { (row.source) }
                            td { code { (row.callback_url) } } td { (row.timeout_seconds) " s" }
                            td { (row.side_effect_level) }
                            td {
                                @if row.evictable {
                                    (row.failure_streak) " of " (row.eviction_threshold) " failures before eviction"
                                } @else { "not evicted (not a plugin source)" }
                            }
                        }
                    }
                }
            }
            @if rows.is_empty() { p { "No runtime tools are registered for this account's characters." } }
        },
    )
}
