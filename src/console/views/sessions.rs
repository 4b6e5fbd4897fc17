//! The sessions list with its search.

use maud::html;

use super::{Nav, layout, pager, time};
use crate::store::Session;

/// Sessions matching `query` (all when empty), newest first.
pub fn sessions_page(
    nav: &Nav,
    query: &str,
    sessions: &[Session],
    offset: i64,
    limit: i64,
    total: i64,
) -> String {
    let base = format!(
        "/console/sessions?q={}",
        form_urlencoded::byte_serialize(query.as_bytes()).collect::<String>()
    );
    layout(
        "Sessions",
        Some(nav),
        html! {
            form.search method="get" action="/console/sessions" {
                input type="search" name="q" value=(query) placeholder="id, title or character";
                button type="submit" { "Search" }
            }
            table.list {
                thead { tr { th { "Session" } th { "Character" } th { "Title" } th { "Updated" } } }
                tbody {
                    @for session in sessions {
                        tr {
                            td { a href={ "/console/sessions/" (session.id) } { code { (session.id) } } }
                            td { (session.character) }
                            td { (session.title) }
                            td { (time(session.updated_at)) }
                        }
                    }
                }
            }
            @if sessions.is_empty() { p { "No session matches." } }
            (pager(&base, offset, limit, total))
        },
    )
}
