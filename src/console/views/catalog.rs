//! A session's runtime catalog, as the session page renders it and as the
//! live stream resends it after `catalog_changed`: one field list, so a table
//! rebuilt live looks like one rendered whole.

use maud::{Markup, html};
use serde_json::{Value, json};

/// A catalog value as text: lists joined (empty: `any`), null as a dash.
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

/// One cell: its class, its text, and a line under it (the availability's
/// reason, verbatim).
struct Cell {
    class: &'static str,
    text: String,
    detail: Option<String>,
}

fn cells(tool: &Value) -> Vec<Cell> {
    let cell = |class, text| Cell {
        class,
        text,
        detail: None,
    };
    vec![
        cell("tool", text(&tool["name"])),
        cell(
            "provider",
            format!(
                "{} ({})",
                text(&tool["provider_id"]),
                text(&tool["provider_type"])
            ),
        ),
        Cell {
            class: "availability",
            text: text(&tool["availability"]),
            detail: tool["availability_reason"].as_str().map(str::to_owned),
        },
        cell(
            "side-effects",
            format!(
                "{} ({})",
                text(&tool["side_effect_level"]),
                text(&tool["side_effect_level_basis"])
            ),
        ),
        cell("slots", text(&tool["allowed_slots"])),
        cell("source", text(&tool["catalog_source"])),
    ]
}

/// The catalog table; each entry as the API's runtime catalog answers it.
pub fn catalog_table(tools: &[Value]) -> Markup {
    html! {
        table.list.catalog #catalog {
            thead { tr {
                th { "Tool" } th { "Provider" } th { "Availability" } th { "Side effects (basis)" }
                th { "Allowed slots" } th { "Catalog source" }
            } }
            tbody {
                @for tool in tools {
                    tr class={ "availability-" (text(&tool["availability"])) } data-tool=(text(&tool["name"])) {
                        @for cell in cells(tool) {
                            td class=(cell.class) {
                                @if cell.class == "tool" { code { (cell.text) } }
                                @else if cell.class == "availability" { span.availability { (cell.text) } }
                                @else { (cell.text) }
                                @if let Some(detail) = &cell.detail { div.reason { (detail) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The same table as the live stream sends it to `console.js`.
pub fn catalog_json(tools: &[Value]) -> Value {
    let rows: Vec<Value> = tools
        .iter()
        .map(|tool| {
            let cells: Vec<Value> = cells(tool)
                .into_iter()
                .map(|cell| json!({"class": cell.class, "text": cell.text, "detail": cell.detail}))
                .collect();
            json!({
                "tool": text(&tool["name"]),
                "availability": text(&tool["availability"]),
                "cells": cells,
            })
        })
        .collect();
    json!({ "rows": rows })
}
