//! Custom tool definitions: the list, the create/edit form (schema and
//! script), the enable/disable button and the "try it" call into a session.

use maud::{Markup, html};

use super::{Nav, csrf_input, layout, pager, pretty, time};
use crate::console::forms::Fields;
use crate::domain::definition::ToolDefinition;
use crate::domain::tool::{SideEffectLevel, Slot};
use crate::store::Session;

/// The definitions list, newest change first.
pub fn definitions_page(
    nav: &Nav,
    definitions: &[ToolDefinition],
    offset: i64,
    limit: i64,
    total: i64,
) -> String {
    layout(
        "Definitions",
        Some(nav),
        html! {
            p { a.button href="/console/definitions/new" { "New definition" } }
            table.list.definitions {
                thead { tr {
                    th { "Name" } th { "Enabled" } th { "Side effects" } th { "Allowed slots" }
                    th { "Handler" } th { "Source" } th { "Updated" }
                } }
                tbody {
                    @for definition in definitions {
                        tr data-definition=(definition.name) {
                            td { a href={ "/console/definitions/" (definition.id) } { code { (definition.name) } } }
                            td.enabled { @if definition.enabled { "enabled" } @else { "disabled" } }
                            td { (definition.side_effect_level.as_str()) }
                            td { (slots_text(&definition.allowed_slots)) }
                            td { @if definition.script().is_some() { "script" } @else { "—" } }
                            td { (definition.source.as_str()) }
                            td { (time(definition.updated_at)) }
                        }
                    }
                }
            }
            @if definitions.is_empty() { p { "No definitions yet." } }
            (pager("/console/definitions", offset, limit, total))
        },
    )
}

fn slots_text(slots: &[Slot]) -> String {
    if slots.is_empty() {
        return "any".into();
    }
    slots
        .iter()
        .map(|slot| slot.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the form's inputs hold: a stored definition, or what was just posted
/// (shown again with the reason it was not accepted).
#[derive(Debug, Clone, Default)]
pub struct FormValues {
    pub name: String,
    pub description: String,
    pub parameters: String,
    pub side_effect_level: String,
    pub allowed_slots: Vec<String>,
    pub enabled: bool,
    pub script: String,
}

impl FormValues {
    /// The empty form of a new definition.
    pub fn new_definition() -> Self {
        Self {
            parameters: "{\n  \"type\": \"object\",\n  \"properties\": {}\n}".into(),
            side_effect_level: "none".into(),
            enabled: true,
            ..Default::default()
        }
    }

    pub fn of(definition: &ToolDefinition) -> Self {
        Self {
            name: definition.name.clone(),
            description: definition.description.clone(),
            parameters: pretty(&definition.parameters),
            side_effect_level: definition.side_effect_level.as_str().into(),
            allowed_slots: definition
                .allowed_slots
                .iter()
                .map(|slot| slot.as_str().to_owned())
                .collect(),
            enabled: definition.enabled,
            script: definition.script().unwrap_or("").to_owned(),
        }
    }

    pub fn posted(fields: &Fields) -> Self {
        let text = |name: &str| fields.get(name).unwrap_or("").to_owned();
        Self {
            name: text("name"),
            description: text("description"),
            parameters: text("parameters"),
            side_effect_level: text("side_effect_level"),
            allowed_slots: fields
                .all("allowed_slots")
                .into_iter()
                .map(str::to_owned)
                .collect(),
            enabled: fields.checked("enabled"),
            script: text("script"),
        }
    }
}

/// The create or edit form; `action` is where it posts.
fn definition_form(action: &str, values: &FormValues, creating: bool, csrf: &str) -> Markup {
    html! {
        form.definition #definition-form method="post" action=(action) {
            (csrf_input(csrf))
            p { label { "Name " input type="text" name="name" required maxlength="64" value=(values.name); } }
            p { label { "Description" br; textarea name="description" rows="2" { (values.description) } } }
            p { label { "Parameters (JSON Schema)" br; textarea name="parameters" rows="8" { (values.parameters) } } }
            p { "Side effects "
                select name="side_effect_level" {
                    @for level in SideEffectLevel::ALL {
                        option value=(level.as_str()) selected[values.side_effect_level == level.as_str()] { (level.as_str()) }
                    }
                }
            }
            p { "Allowed slots (none ticked: any) "
                @for slot in Slot::ALL {
                    label { input type="checkbox" name="allowed_slots" value=(slot.as_str()) checked[values.allowed_slots.iter().any(|s| s == slot.as_str())]; " " (slot.as_str()) } " "
                }
            }
            @if creating {
                p { label { input type="checkbox" name="enabled" checked[values.enabled]; " enabled" } }
            }
            p { label { "Script (JavaScript run in the sandbox; empty: keep the handler as it is)" br;
                textarea name="script" rows="10" { (values.script) } } }
            button type="submit" { @if creating { "Create definition" } @else { "Save definition" } }
        }
    }
}

/// The page of a new definition's form.
pub fn new_definition_page(nav: &Nav, values: &FormValues, error: Option<&str>) -> String {
    layout(
        "New definition",
        Some(nav),
        html! {
            p.meta { a href="/console/definitions" { "Back to the definitions" } }
            @if let Some(error) = error { p.error role="alert" { (error) } }
            (definition_form("/console/definitions", values, true, &nav.csrf))
        },
    )
}

/// Everything a definition's page shows.
/// What the "try it" form shows: what was posted when a try was refused,
/// else the first session, the narrator and `{}`.
#[derive(Debug, Clone)]
pub struct TryValues {
    pub session_id: Option<String>,
    pub caller_slot: String,
    pub arguments: String,
}

impl Default for TryValues {
    fn default() -> Self {
        Self {
            session_id: None,
            caller_slot: Slot::Narrator.as_str().to_owned(),
            arguments: "{}".to_owned(),
        }
    }
}

impl TryValues {
    /// The fields of a posted "try it" form, kept as typed.
    pub fn posted(fields: &crate::console::forms::Fields) -> Self {
        let default = Self::default();
        Self {
            session_id: fields.get("session_id").map(str::to_owned),
            caller_slot: fields
                .get("caller_slot")
                .map_or(default.caller_slot, str::to_owned),
            arguments: fields
                .get("arguments")
                .map_or(default.arguments, str::to_owned),
        }
    }
}

pub struct DefinitionView<'a> {
    pub definition: &'a ToolDefinition,
    pub values: &'a FormValues,
    /// The "try it" form's values.
    pub tried: &'a TryValues,
    /// The sessions offered to "try it" (the newest of the account).
    pub sessions: &'a [Session],
    pub error: Option<&'a str>,
    pub notice: Option<&'a str>,
}

fn toggle_form(definition: &ToolDefinition, csrf: &str) -> Markup {
    let (value, label) = if definition.enabled {
        ("false", "Disable")
    } else {
        ("true", "Enable")
    };
    html! {
        form.inline #toggle method="post" action={ "/console/definitions/" (definition.id) "/toggle" } {
            (csrf_input(csrf))
            input type="hidden" name="enabled" value=(value);
            button type="submit" { (label) }
        }
    }
}

fn try_form(
    definition: &ToolDefinition,
    sessions: &[Session],
    tried: &TryValues,
    csrf: &str,
) -> Markup {
    let session_id = tried
        .session_id
        .as_deref()
        .or_else(|| sessions.first().map(|s| s.id.as_str()));
    html! {
        form.try #try-it method="post" action={ "/console/definitions/" (definition.id) "/try" } {
            (csrf_input(csrf))
            p {
                label { "Session " input type="text" name="session_id" list="try-sessions" required
                    value=[session_id]; }
                datalist #try-sessions {
                    @for session in sessions { option value=(session.id) { (session.character) " · " (session.title) } }
                }
                " as slot "
                select name="caller_slot" {
                    @for slot in Slot::ALL { option value=(slot.as_str()) selected[slot.as_str() == tried.caller_slot] { (slot.as_str()) } }
                }
            }
            p { label { "Arguments (JSON object)" br; textarea name="arguments" rows="4" { (tried.arguments) } } }
            button type="submit" { "Call " (definition.name) }
            p.muted { "The call goes through the session's permissions, budgets and journal exactly as its model's would; its execution opens when it is done." }
        }
    }
}

/// A stored definition's page.
pub fn definition_page(nav: &Nav, view: &DefinitionView<'_>) -> String {
    let definition = view.definition;
    let action = format!("/console/definitions/{}", definition.id);
    layout(
        &format!("Definition {}", definition.name),
        Some(nav),
        html! {
            p.meta { a href="/console/definitions" { "Back to the definitions" } " · "
                span.enabled { @if definition.enabled { "enabled" } @else { "disabled" } } " "
                (toggle_form(definition, &nav.csrf))
                " · updated " (time(definition.updated_at)) }
            @if let Some(notice) = view.notice { p.notice role="status" { (notice) } }
            @if let Some(error) = view.error { p.error role="alert" { (error) } }
            section { h2 { "Edit" } (definition_form(&action, view.values, false, &nav.csrf)) }
            section { h2 { "Try it" } (try_form(definition, view.sessions, view.tried, &nav.csrf)) }
        },
    )
}
