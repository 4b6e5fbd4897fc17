//! The console's pages, rendered on the server with maud (checked at compile
//! time, every interpolation HTML-escaped). Each page reads without script;
//! `console.js` only adds live updates.

pub mod activity;
pub mod catalog;
pub mod definitions;
pub mod execution;
pub mod floor;
pub mod journal;
pub mod login;
pub mod mcp;
pub mod runtime_tools;
pub mod session;
pub mod sessions;

use maud::{DOCTYPE, Markup, html};

/// What the navigation bar of a signed-in page shows.
#[derive(Debug, Clone)]
pub struct Nav {
    pub account_name: String,
    /// The CSRF token of this sign-in's forms (sign-out included).
    pub csrf: String,
}

/// A whole page around `body`.
pub fn layout(title: &str, nav: Option<&Nav>, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolgate console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/console/sessions" { "toolgate" }
                    @if let Some(nav) = nav {
                        nav {
                            a href="/console/sessions" { "Sessions" }
                            a href="/console/definitions" { "Definitions" }
                            a href="/console/runtime-tools" { "Runtime tools" }
                            a href="/console/activity" { "Activity" }
                            a href="/console/mcp" { "MCP servers" }
                        }
                        form.logout method="post" action="/console/logout" {
                            (csrf_input(&nav.csrf))
                            span.account { (nav.account_name) }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
    .into_string()
}

/// The hidden CSRF input every form carries.
pub fn csrf_input(token: &str) -> Markup {
    html! { input type="hidden" name="csrf_token" value=(token); }
}

/// A page saying what went wrong (404 for another account's ids, 403 for a
/// refused post, a validation message for a bad form).
pub fn error_page(nav: Option<&Nav>, status: u16, code: &str, message: &str) -> String {
    let title = match status {
        404 => "Not found",
        403 => "Refused",
        401 => "Sign in",
        400..=499 => "Not accepted",
        _ => "Server error",
    };
    layout(
        title,
        nav,
        html! {
            p.error { code { (code) } ": " (message) }
            p { a href="/console/sessions" { "Back to the sessions" } }
        },
    )
}

/// A timestamp in milliseconds as UTC RFC 3339 (`2025-01-02T03:04:05.678Z`).
pub fn time(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// JSON shown as indented text.
pub fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A value that may be missing, shown as an em dash when it is.
pub fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("—")
}

/// Links to the previous and next pages of a listing.
pub fn pager(base: &str, offset: i64, limit: i64, total: i64) -> Markup {
    pager_of(base, offset, limit, total, false)
}

/// The same, for a total that may be a lower bound (`at_least`: the journal
/// stopped counting at its bound).
pub fn pager_of(base: &str, offset: i64, limit: i64, total: i64, at_least: bool) -> Markup {
    let sep = if base.contains('?') { '&' } else { '?' };
    // Any non-negative offset is a valid request: the end saturates.
    let end = offset.saturating_add(limit);
    let limit = limit.max(1);
    // Past the end, "newer" goes to the last page that has rows.
    let last_page = (total.max(1) - 1) / limit * limit;
    let newer = if offset >= total {
        last_page
    } else {
        offset.saturating_sub(limit).max(0)
    };
    html! {
        p.pager {
            @if total == 0 {
                "No rows "
            } @else if offset >= total {
                "No rows this far (" @if at_least { "at least " } (total) " in all) "
            } @else {
                // Rows are counted from 1 for people.
                "Rows " (offset + 1) "–" (end.min(total)) " of "
                @if at_least { "at least " }
                (total) " "
            }
            @if offset > 0 && total > 0 {
                a href={ (base) (sep) "offset=" (newer) } { "newer" } " "
            }
            @if end < total {
                a href={ (base) (sep) "offset=" (end) } { "older" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pager_of;

    fn pager(offset: i64, total: i64) -> String {
        pager_of("/p", offset, 50, total, false).into_string()
    }

    #[test]
    fn the_pager_counts_rows_from_one_and_never_links_past_the_rows() {
        let first = pager(0, 119);
        assert!(first.contains("Rows 1–50 of 119"), "{first}");
        assert!(first.contains("/p?offset=50") && !first.contains("newer"));
        let last = pager(100, 119);
        assert!(last.contains("Rows 101–119 of 119"), "{last}");
        assert!(last.contains("/p?offset=50") && !last.contains("older"));
        let beyond = pager(500, 119);
        assert!(beyond.contains("No rows this far (119 in all)"), "{beyond}");
        assert!(beyond.contains("/p?offset=100\">newer"), "{beyond}");
        let empty = pager(50, 0);
        assert!(
            empty.contains("No rows") && !empty.contains("href"),
            "{empty}"
        );
    }
}
