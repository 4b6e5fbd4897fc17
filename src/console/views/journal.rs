//! Journal rows, as the session page lists them and as the live stream sends
//! them: one field list, so a row added live looks like one rendered whole.

use maud::{Markup, html};
use serde_json::{Value, json};

use super::{or_dash, time};
use crate::journal::ExecutionRecord;

/// The cells of a journal row, in column order: (class, text, link).
fn cells(record: &ExecutionRecord) -> Vec<(&'static str, String, Option<String>)> {
    let reason = record
        .execution_reason_code
        .map(|code| code.as_str().to_owned());
    vec![
        ("time", time(record.started_at), None),
        (
            "tool",
            record.tool_name.clone(),
            Some(format!("/console/executions/{}", record.id)),
        ),
        ("status", record.status.as_str().to_owned(), None),
        ("reason", or_dash(reason.as_deref()).to_owned(), None),
        ("duration", format!("{} ms", record.duration_ms), None),
        ("slot", record.caller_slot.clone(), None),
        ("provider", record.provider_id.clone(), None),
        (
            "run",
            or_dash(record.run_id.as_deref()).to_owned(),
            record
                .floor_id
                .as_ref()
                .map(|floor| format!("/console/floors/{floor}")),
        ),
    ]
}

/// The header of the journal table.
pub fn journal_head() -> Markup {
    html! {
        thead { tr {
            th { "Started" } th { "Tool" } th { "Status" } th { "Reason" }
            th { "Duration" } th { "Slot" } th { "Provider" } th { "Run" }
        } }
    }
}

/// One row of the journal table.
pub fn journal_row(record: &ExecutionRecord) -> Markup {
    html! {
        tr id={ "exec-" (record.id) } class={ "status-" (record.status.as_str()) } data-status=(record.status.as_str()) {
            @for (class, text, link) in cells(record) {
                td class=(class) {
                    @if let Some(link) = link { a href=(link) { (text) } } @else { (text) }
                }
            }
        }
    }
}

/// The same row as the live stream sends it to `console.js`.
pub fn journal_row_json(record: &ExecutionRecord) -> Value {
    let cells: Vec<Value> = cells(record)
        .into_iter()
        .map(|(class, text, link)| json!({"class": class, "text": text, "link": link}))
        .collect();
    json!({
        "id": record.id,
        "row_id": format!("exec-{}", record.id),
        "status": record.status.as_str(),
        "cells": cells,
    })
}
