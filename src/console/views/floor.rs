//! A floor's runs and pages: commit or discard an open run, open a new one,
//! and confirm the executions a replay would repeat.

use maud::{Markup, html};
use serde_json::Value;

use super::journal::{journal_head, journal_row};
use super::{Nav, csrf_input, layout, pager_of, time};
use crate::journal::ExecutionRecord;
use crate::store::{Floor, Run};

/// Everything the floor page shows.
pub struct FloorView<'a> {
    pub floor: &'a Floor,
    /// Every run of the floor, oldest first; a page made outside runs has
    /// none, a discarded run no page any more.
    pub runs: &'a [Run],
    pub executions: &'a [ExecutionRecord],
    pub journal_offset: i64,
    pub journal_limit: i64,
    pub journal_total: i64,
    /// Whether `journal_total` is a lower bound (the journal's count stopped).
    pub journal_total_is_estimate: bool,
    /// The executions a new run would repeat, when the replay guard refused one.
    pub blocking: Option<&'a Value>,
    pub notice: Option<&'a str>,
}

fn run_actions(run: &Run, csrf: &str) -> Markup {
    html! {
        @if run.state == "open" {
            form.inline method="post" action={ "/console/runs/" (run.id) "/commit" } {
                (csrf_input(csrf)) button type="submit" name="action" value="commit" { "Commit" }
            }
            form.inline method="post" action={ "/console/runs/" (run.id) "/discard" } {
                (csrf_input(csrf)) button type="submit" name="action" value="discard" { "Discard" }
            }
        }
    }
}

fn confirmation(floor_id: &str, blocking: &Value, csrf: &str) -> Markup {
    html! {
        section.confirm #replay-confirmation {
            h2 { "Replay confirmation required" }
            p { "A new run would repeat these executions, which are not safe to repeat. Tick the ones you confirm." }
            form method="post" action={ "/console/floors/" (floor_id) "/runs" } {
                (csrf_input(csrf))
                ul {
                    @for execution in blocking.as_array().into_iter().flatten() {
                        @let id = execution["id"].as_str().unwrap_or("");
                        li { label {
                            input type="checkbox" name="confirmed_execution_ids" value=(id) checked;
                            " " a href={ "/console/executions/" (id) } { code { (id) } }
                            " " (execution["tool_name"].as_str().unwrap_or("")) " — " (execution["replay_safety"].as_str().unwrap_or(""))
                        } }
                    }
                }
                button type="submit" { "Confirm and open the run" }
            }
        }
    }
}

fn pages_table(view: &FloorView<'_>, csrf: &str) -> Markup {
    let run_of = |page_id: &str| view.runs.iter().find(|run| run.page_id == page_id);
    html! {
        table.list.runs {
            thead { tr { th { "Page" } th { "Run" } th { "State" } th { "Content" } th { "Actions" } } }
            tbody {
                @for page in &view.floor.pages {
                    @let run = run_of(&page.id);
                    tr data-page=(page.id) data-run=[run.map(|r| r.id.as_str())] {
                        td { (page.page_no) @if view.floor.active_page_id.as_deref() == Some(page.id.as_str()) { " (active)" } }
                        td { @if let Some(run) = run { code { (run.id) } } @else { "—" } }
                        td.state { @if let Some(run) = run { (run.state) } @else { "—" } }
                        td { (page.content) }
                        td { @if let Some(run) = run { (run_actions(run, csrf)) } }
                    }
                }
            }
        }
    }
}

/// Discarded runs: their pages were dropped, so only the runs tell of them.
fn discarded_runs(runs: &[Run]) -> Markup {
    let discarded: Vec<&Run> = runs.iter().filter(|run| run.state == "discarded").collect();
    html! {
        @if !discarded.is_empty() {
            h3 { "Discarded runs" }
            table.list.discarded {
                thead { tr { th { "Run" } th { "State" } th { "Opened" } th { "Discarded" } } }
                tbody {
                    @for run in discarded {
                        tr data-run=(run.id) {
                            td { code { (run.id) } }
                            td.state { (run.state) }
                            td { (time(run.created_at)) }
                            td { @if let Some(at) = run.finished_at { (time(at)) } @else { "—" } }
                        }
                    }
                }
            }
            p.muted { "A discarded run's page and buffered effects are dropped; its executions stay in the journal below." }
        }
    }
}

/// The floor page.
pub fn floor_page(nav: &Nav, view: &FloorView<'_>) -> String {
    let floor = view.floor;
    layout(
        &format!("Floor {} of session {}", floor.seq, floor.session_id),
        Some(nav),
        html! {
            p.meta { a href={ "/console/sessions/" (floor.session_id) } { "Back to the session" } " · created " (time(floor.created_at)) }
            @if let Some(notice) = view.notice { p.notice role="status" { (notice) } }
            blockquote.user { (floor.content) }
            @if let Some(blocking) = view.blocking { (confirmation(&floor.id, blocking, &nav.csrf)) }
            section { h2 { "Runs and pages" } (pages_table(view, &nav.csrf)) (discarded_runs(view.runs))
                form method="post" action={ "/console/floors/" (floor.id) "/runs" } {
                    (csrf_input(&nav.csrf)) button type="submit" { "Open a new run" }
                }
            }
            section { h2 { "Executions" }
                table.list.journal { (journal_head()) tbody { @for record in view.executions { (journal_row(record)) } } }
                (pager_of(&format!("/console/floors/{}", view.floor.id), view.journal_offset, view.journal_limit, view.journal_total, view.journal_total_is_estimate))
            }
        },
    )
}
