//! One execution's detail: arguments, result or error, timings, where it ran.

use maud::{Markup, html};

use super::{Nav, layout, or_dash, pretty, time};
use crate::journal::ExecutionRecord;

fn link(prefix: &str, id: Option<&str>) -> Markup {
    html! {
        @match id {
            Some(id) => a href={ (prefix) (id) } { code { (id) } },
            None => "—",
        }
    }
}

/// The execution page.
pub fn execution_page(nav: &Nav, record: &ExecutionRecord) -> String {
    let reason = record.execution_reason_code.map(|code| code.as_str());
    layout(
        &format!("Execution {}", record.id),
        Some(nav),
        html! {
            dl.detail {
                dt { "Tool" } dd { code { (record.tool_name) } " from " (record.provider_id) " (" (record.provider_type) ")" }
                dt { "Status" } dd class={ "status-" (record.status.as_str()) } #status { (record.status.as_str()) }
                dt { "Reason" } dd { (or_dash(reason)) }
                dt { "Lifecycle / commit" } dd { (record.lifecycle_state.as_str()) " / " (record.commit_outcome.as_str()) }
                dt { "Provider started" } dd { (record.provider_started) }
                dt { "Started" } dd { (time(record.started_at)) }
                dt { "Finished" } dd { (record.finished_at.map(time).unwrap_or_else(|| "—".into())) }
                dt { "Duration" } dd { (record.duration_ms) " ms" }
                dt { "Session" } dd { (link("/console/sessions/", Some(&record.session_id))) }
                dt { "Floor" } dd { (link("/console/floors/", record.floor_id.as_deref())) }
                dt { "Run / page" } dd { code { (or_dash(record.run_id.as_deref())) } " / " code { (or_dash(record.page_id.as_deref())) } }
                dt { "Slot / call id" } dd { (record.caller_slot) " / " code { (record.call_id) } }
                dt { "Attempt / replay parent" } dd { (record.attempt_no) " / " (link("/console/executions/", record.replay_parent_execution_id.as_deref())) }
                dt { "Delivery" } dd { (record.delivery_mode) " (" (record.result_visibility) ")" }
                dt { "Runtime job" } dd { code { (or_dash(record.runtime_job_id.as_deref())) } }
                dt { "Side effects / replay" } dd { (record.side_effect_level) " / " (record.replay_safety) }
            }
            h2 { "Arguments" }
            pre.json #arguments { (pretty(&record.args.to_value())) }
            @if let Some(error) = &record.error_message {
                h2 { "Error" }
                pre.error #error { (error) }
            }
            h2 { "Result" }
            pre.json #result { (pretty(&record.result.to_value())) }
        },
    )
}
