//! The definition form: its fields translated into the changes
//! `POST /tools/definitions` and `PATCH /tools/definitions/{id}` take, and the
//! "try it" form into a tool call.

use serde_json::Value;

use super::forms::Fields;
use crate::domain::definition::{DefinitionChanges, HandlerType, ScriptHandler};
use crate::domain::tool::{SideEffectLevel, Slot};
use crate::error::{Error, Result};

/// The changes a posted definition form asks for. Every field of the form is
/// sent, so an edit replaces each of them; an empty `parameters` keeps the
/// default (create) or the stored schema (edit), and an empty `script` keeps
/// the handler as it is.
pub fn definition_changes(fields: &Fields, creating: bool) -> Result<DefinitionChanges> {
    let slots = fields
        .all("allowed_slots")
        .into_iter()
        .map(Slot::parse)
        .collect::<Result<Vec<_>>>()?;
    let script = fields.get("script").unwrap_or("").trim();
    let (handler_type, handler) = if script.is_empty() {
        (None, None)
    } else {
        (
            Some(HandlerType::Script),
            Some(ScriptHandler {
                script: Some(script.to_owned()),
            }),
        )
    };
    Ok(DefinitionChanges {
        name: Some(fields.required("name")?.trim().to_owned()),
        description: Some(fields.get("description").unwrap_or("").to_owned()),
        parameters: json_field(fields, "parameters")?,
        side_effect_level: Some(SideEffectLevel::parse(
            fields.get("side_effect_level").unwrap_or("none"),
        )?),
        allowed_slots: Some(slots),
        enabled: creating.then(|| fields.checked("enabled")),
        handler_type,
        handler,
        ..Default::default()
    })
}

/// The JSON text of `name`, or None when the field is empty.
pub fn json_field(fields: &Fields, name: &str) -> Result<Option<Value>> {
    let text = fields.get(name).unwrap_or("").trim();
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|err| Error::validation(format!("{name} is not valid JSON: {err}")))
}

/// What the "try it" form asks to run: the session, the slot calling, the
/// arguments (an object; empty means `{}`).
#[derive(Debug, Clone)]
pub struct TryCall {
    pub session_id: String,
    pub caller_slot: Slot,
    pub arguments: Value,
}

/// Reads the "try it" form.
pub fn try_call(fields: &Fields) -> Result<TryCall> {
    let session_id = fields.required("session_id")?.trim().to_owned();
    if session_id.is_empty() {
        return Err(Error::validation("choose the session to call the tool in"));
    }
    let arguments = json_field(fields, "arguments")?.unwrap_or_else(|| serde_json::json!({}));
    if !arguments.is_object() {
        return Err(Error::validation("arguments must be a JSON object"));
    }
    Ok(TryCall {
        session_id,
        caller_slot: Slot::parse(fields.get("caller_slot").unwrap_or("narrator"))?,
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        Fields::parse(serde_urlencoded::to_string(pairs).unwrap().as_bytes()).unwrap()
    }

    #[test]
    fn a_create_form_becomes_the_apis_changes() {
        let changes = definition_changes(
            &fields(&[
                ("name", " shout "),
                ("description", "d"),
                ("parameters", r#"{"type":"object"}"#),
                ("side_effect_level", "sandbox"),
                ("allowed_slots", "narrator"),
                ("allowed_slots", "memory"),
                ("enabled", "on"),
                ("script", "return 1;"),
            ]),
            true,
        )
        .unwrap();
        assert_eq!(changes.name.as_deref(), Some("shout"));
        assert_eq!(
            changes.parameters,
            Some(serde_json::json!({"type": "object"}))
        );
        assert_eq!(changes.side_effect_level, Some(SideEffectLevel::Sandbox));
        assert_eq!(
            changes.allowed_slots,
            Some(vec![Slot::Narrator, Slot::Memory])
        );
        assert_eq!(changes.enabled, Some(true));
        assert_eq!(changes.handler_type, Some(HandlerType::Script));
    }

    #[test]
    fn an_edit_leaves_enabled_and_empty_fields_alone() {
        let changes =
            definition_changes(&fields(&[("name", "x"), ("script", " ")]), false).unwrap();
        assert_eq!(changes.enabled, None);
        assert_eq!(changes.parameters, None);
        assert_eq!(changes.handler, None);
    }

    #[test]
    fn bad_json_and_unknown_levels_are_validation_errors() {
        for form in [
            fields(&[("name", "x"), ("parameters", "{")]),
            fields(&[("name", "x"), ("side_effect_level", "maybe")]),
            fields(&[("name", "x"), ("allowed_slots", "judge")]),
        ] {
            let err = definition_changes(&form, true).unwrap_err();
            assert_eq!(err.code(), crate::error::ErrorCode::ValidationError);
        }
        let err = try_call(&fields(&[("session_id", "s"), ("arguments", "[1]")])).unwrap_err();
        assert_eq!(err.code(), crate::error::ErrorCode::ValidationError);
    }
}
