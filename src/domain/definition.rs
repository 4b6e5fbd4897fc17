//! Custom tool definitions (`/tools/definitions`): what a definition is, how its
//! fields are validated and defaulted, how a partial update applies, and when the
//! server's script-handler switch refuses a change.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::domain::tool::{SideEffectLevel, Slot};
use crate::error::{Error, Result};

/// Largest description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
/// Largest script body, in bytes.
pub const MAX_SCRIPT_BYTES: usize = 64 * 1024;
/// Largest `source_id`, in bytes.
pub const MAX_SOURCE_ID_BYTES: usize = 256;
/// Longest tool name; model providers accept names of `[a-zA-Z0-9_-]{1,64}`.
pub const MAX_NAME_CHARS: usize = 64;

/// Where a definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DefinitionSource {
    Preset,
    Character,
    Custom,
}

impl DefinitionSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionSource::Preset => "preset",
            DefinitionSource::Character => "character",
            DefinitionSource::Custom => "custom",
        }
    }

    pub fn parse(raw: &str) -> Result<Self> {
        match raw {
            "preset" => Ok(DefinitionSource::Preset),
            "character" => Ok(DefinitionSource::Character),
            "custom" => Ok(DefinitionSource::Custom),
            other => Err(Error::validation(format!(
                "source must be one of preset, character, custom; got {other:?}"
            ))),
        }
    }
}

/// How a definition's calls are handled. Only `script` is public.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HandlerType {
    Script,
}

impl HandlerType {
    pub fn as_str(self) -> &'static str {
        match self {
            HandlerType::Script => "script",
        }
    }
}

/// Configuration of the `script` handler: the body of `function (args) { ... }`.
/// The script is optional, as in TavernHeadless (whose own smoke run posts
/// `"handler": {}`): a definition without one is listed, and calling it is a
/// tool error that says there is nothing to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScriptHandler {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
}

/// A stored custom tool definition, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ToolDefinition {
    pub id: String,
    #[serde(skip)]
    pub account_id: String,
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments, shared: every catalog built from the
    /// definition holds this one copy (a schema may be 64 KiB and a catalog
    /// hundreds of tools).
    #[schema(value_type = Object)]
    pub parameters: std::sync::Arc<Value>,
    /// `parameters` compiled once per stored version (the definition cache
    /// keeps it between calls).
    #[serde(skip)]
    pub validator: crate::schema::SchemaValidator,
    pub side_effect_level: SideEffectLevel,
    pub allowed_slots: Vec<Slot>,
    pub source: DefinitionSource,
    pub source_id: Option<String>,
    pub enabled: bool,
    pub handler_type: Option<HandlerType>,
    pub handler: Option<ScriptHandler>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl ToolDefinition {
    /// The script to run, when this definition has a script handler.
    pub fn script(&self) -> Option<&str> {
        match (self.handler_type, &self.handler) {
            (Some(HandlerType::Script), Some(handler)) => handler.script.as_deref(),
            _ => None,
        }
    }

    pub fn has_script_handler(&self) -> bool {
        self.handler_type == Some(HandlerType::Script)
    }
}

/// The client-settable fields of a definition, each optional: a create request with
/// defaults still to apply, or a partial update. `source_id` is doubly optional so
/// that an update can set it to null.
#[derive(Debug, Clone, Default)]
pub struct DefinitionChanges {
    pub name: Option<String>,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub side_effect_level: Option<SideEffectLevel>,
    pub allowed_slots: Option<Vec<Slot>>,
    pub source: Option<DefinitionSource>,
    pub source_id: Option<Option<String>>,
    pub enabled: Option<bool>,
    pub handler_type: Option<HandlerType>,
    pub handler: Option<ScriptHandler>,
}

impl DefinitionChanges {
    pub fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.description.is_none()
            && self.parameters.is_none()
            && self.side_effect_level.is_none()
            && self.allowed_slots.is_none()
            && self.source.is_none()
            && self.source_id.is_none()
            && self.enabled.is_none()
            && self.handler_type.is_none()
            && self.handler.is_none()
    }

    /// A partial update must change at least one field.
    pub fn check_not_empty(&self) -> Result<()> {
        if self.is_empty() {
            return Err(Error::validation(
                "PATCH needs at least one field: name, description, parameters, side_effect_level, allowed_slots, source, source_id, enabled, handler_type, handler",
            ));
        }
        Ok(())
    }

    /// True when the change does nothing but disable the definition, which is
    /// always allowed: it only makes the server safer.
    fn only_disables(&self) -> bool {
        self.enabled == Some(false)
            && DefinitionChanges {
                enabled: None,
                ..self.clone()
            }
            .is_empty()
    }
}

/// The parameter schema of a definition that does not declare one.
pub fn default_parameters() -> Value {
    json!({"type": "object", "properties": {}})
}

/// A new definition from a create request: defaults applied, every field checked.
/// `id`, `account_id` and the timestamps are the store's to fill.
pub fn create(changes: DefinitionChanges) -> Result<ToolDefinition> {
    let name = changes
        .name
        .clone()
        .ok_or_else(|| Error::validation("name is required"))?;
    let mut definition = ToolDefinition {
        id: String::new(),
        account_id: String::new(),
        name,
        description: String::new(),
        parameters: default_parameters().into(),
        validator: Default::default(),
        side_effect_level: SideEffectLevel::None,
        allowed_slots: Vec::new(),
        source: DefinitionSource::Custom,
        source_id: None,
        enabled: true,
        handler_type: None,
        handler: None,
        created_at: 0,
        updated_at: 0,
    };
    apply(&mut definition, changes)?;
    Ok(definition)
}

/// Applies a partial update to `definition` and checks the result.
pub fn update(definition: &ToolDefinition, changes: DefinitionChanges) -> Result<ToolDefinition> {
    changes.check_not_empty()?;
    let mut updated = definition.clone();
    apply(&mut updated, changes)?;
    Ok(updated)
}

fn apply(definition: &mut ToolDefinition, changes: DefinitionChanges) -> Result<()> {
    if let Some(name) = changes.name {
        check_name(&name)?;
        definition.name = name;
    }
    if let Some(description) = changes.description {
        if description.len() > MAX_DESCRIPTION_BYTES {
            return Err(Error::validation(format!(
                "description must be at most {MAX_DESCRIPTION_BYTES} bytes"
            )));
        }
        definition.description = description;
    }
    if let Some(parameters) = changes.parameters {
        check_parameters(&parameters)?;
        definition.parameters = parameters.into();
        // The compiled form belongs to the schema it was compiled from.
        definition.validator = Default::default();
    }
    if let Some(level) = changes.side_effect_level {
        definition.side_effect_level = level;
    }
    if let Some(slots) = changes.allowed_slots {
        definition.allowed_slots = dedupe(slots);
    }
    if let Some(source) = changes.source {
        definition.source = source;
    }
    if let Some(source_id) = changes.source_id {
        if let Some(id) = &source_id {
            check_source_id(id)?;
        }
        definition.source_id = source_id;
    }
    if let Some(enabled) = changes.enabled {
        definition.enabled = enabled;
    }
    match (changes.handler_type, changes.handler) {
        (None, None) => {}
        // `script` is the only handler type, so a handler alone implies it.
        (Some(HandlerType::Script) | None, Some(handler)) => {
            if let Some(script) = &handler.script {
                check_script(script)?;
            }
            definition.handler_type = Some(HandlerType::Script);
            definition.handler = Some(handler);
        }
        (Some(HandlerType::Script), None) => {
            if definition.handler.is_none() {
                return Err(Error::validation(
                    "handler_type script needs a handler: {\"script\": \"...\"}",
                ));
            }
            definition.handler_type = Some(HandlerType::Script);
        }
    }
    Ok(())
}

/// Checks a tool name against what model providers accept.
pub fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(Error::validation(format!(
            "name must be 1-{MAX_NAME_CHARS} characters of a-z, A-Z, 0-9, _ or - (what model providers accept); got {name:?}"
        )))
    }
}

fn check_parameters(parameters: &Value) -> Result<()> {
    crate::schema::check_parameter_schema(parameters).map_err(Error::validation)
}

fn check_source_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_SOURCE_ID_BYTES || id.chars().any(char::is_control) {
        return Err(Error::validation(format!(
            "source_id must be null or 1-{MAX_SOURCE_ID_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

fn check_script(script: &str) -> Result<()> {
    if script.trim().is_empty() {
        return Err(Error::validation("handler.script must not be empty"));
    }
    if script.contains('\0') {
        return Err(Error::validation(
            "handler.script must not contain NUL characters",
        ));
    }
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(Error::validation(format!(
            "handler.script must be at most {MAX_SCRIPT_BYTES} bytes, got {}",
            script.len()
        )));
    }
    Ok(())
}

fn dedupe(slots: Vec<Slot>) -> Vec<Slot> {
    let mut seen = Vec::with_capacity(slots.len());
    for slot in slots {
        if !seen.contains(&slot) {
            seen.push(slot);
        }
    }
    seen
}

fn script_disabled(action: &str) -> Error {
    Error::Refused {
        code: crate::error::ErrorCode::ToolScriptHandlerDisabled,
        message: format!(
            "script handlers are disabled on this server, so a definition with a script handler cannot be {action}; the operator can allow them with ENABLE_UNSAFE_SCRIPT_HANDLER=true"
        ),
    }
}

impl DefinitionChanges {
    /// Whether the request asks for a script handler (a type or a handler).
    pub fn asks_for_script(&self) -> bool {
        self.handler_type == Some(HandlerType::Script) || self.handler.is_some()
    }
}

/// The script switch decides before anything else: a request that asks for a
/// script handler while the switch is off is refused whatever else it holds.
pub fn check_script_switch(changes: &DefinitionChanges, scripts_enabled: bool) -> Result<()> {
    if changes.asks_for_script() && !scripts_enabled {
        return Err(script_disabled("written"));
    }
    Ok(())
}

/// The script switch on create: a script handler needs the switch on.
pub fn check_create_allowed(definition: &ToolDefinition, scripts_enabled: bool) -> Result<()> {
    if definition.has_script_handler() && !scripts_enabled {
        return Err(script_disabled("created"));
    }
    Ok(())
}

/// The script switch on update: any change to a definition that has (or would get)
/// a script handler needs the switch on, except one that only disables it.
/// Judged on the definition before the change, so the switch decides before
/// the change's own checks (a `handler_type` without a handler is 403 here,
/// not 400).
pub fn check_update_allowed(
    existing: &ToolDefinition,
    changes: &DefinitionChanges,
    scripts_enabled: bool,
) -> Result<()> {
    // `script` is the only handler type: naming one asks for a script.
    let asks_for_script = changes.handler_type.is_some() || changes.handler.is_some();
    if (existing.has_script_handler() || asks_for_script)
        && !scripts_enabled
        && !changes.only_disables()
    {
        return Err(script_disabled("updated"));
    }
    Ok(())
}

/// The script switch on toggle: enabling a script definition needs the switch on;
/// disabling is always allowed.
pub fn check_toggle_allowed(
    definition: &ToolDefinition,
    enabled: bool,
    scripts_enabled: bool,
) -> Result<()> {
    if enabled && definition.has_script_handler() && !scripts_enabled {
        return Err(script_disabled("enabled"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_changes() -> DefinitionChanges {
        DefinitionChanges {
            name: Some("lookup_npc".into()),
            handler: Some(ScriptHandler {
                script: Some("return 1;".into()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn create_applies_defaults() {
        let def = create(DefinitionChanges {
            name: Some("t".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(def.description, "");
        assert_eq!(*def.parameters, default_parameters());
        assert_eq!(def.side_effect_level, SideEffectLevel::None);
        assert!(def.allowed_slots.is_empty());
        assert_eq!(def.source, DefinitionSource::Custom);
        assert_eq!(def.source_id, None);
        assert!(def.enabled);
        assert_eq!(def.handler_type, None);
        let def = create(script_changes()).unwrap();
        assert_eq!(def.handler_type, Some(HandlerType::Script));
        assert_eq!(def.script(), Some("return 1;"));
    }

    #[test]
    fn names_follow_provider_rules() {
        for good in ["a", "lookup_npc", "A-b_9", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "has space", "dot.name", "名字", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_bad_fields() {
        let bad = [
            DefinitionChanges {
                parameters: Some(json!({"type": "string"})),
                ..script_changes()
            },
            DefinitionChanges {
                parameters: Some(json!({"type": "object", "required": "x"})),
                ..script_changes()
            },
            DefinitionChanges {
                source_id: Some(Some(String::new())),
                ..script_changes()
            },
            DefinitionChanges {
                handler: Some(ScriptHandler {
                    script: Some("x".repeat(MAX_SCRIPT_BYTES + 1)),
                }),
                ..script_changes()
            },
            DefinitionChanges {
                handler: None,
                handler_type: Some(HandlerType::Script),
                ..script_changes()
            },
        ];
        for changes in bad {
            assert!(create(changes.clone()).is_err(), "{changes:?}");
        }
    }

    #[test]
    fn script_switch() {
        let def = create(script_changes()).unwrap();
        assert_eq!(
            check_create_allowed(&def, false).unwrap_err().code(),
            crate::error::ErrorCode::ToolScriptHandlerDisabled
        );
        assert!(check_create_allowed(&def, true).is_ok());
        let rename = DefinitionChanges {
            description: Some("x".into()),
            ..Default::default()
        };
        assert!(check_update_allowed(&def, &rename, false).is_err());
        let disable = DefinitionChanges {
            enabled: Some(false),
            ..Default::default()
        };
        assert!(check_update_allowed(&def, &disable, false).is_ok());
        let plain = create(DefinitionChanges {
            handler_type: None,
            handler: None,
            ..script_changes()
        })
        .unwrap();
        let to_script = DefinitionChanges {
            handler_type: Some(HandlerType::Script),
            ..Default::default()
        };
        assert_eq!(
            check_update_allowed(&plain, &to_script, false)
                .unwrap_err()
                .code(),
            crate::error::ErrorCode::ToolScriptHandlerDisabled,
            "the switch decides before the missing handler is noticed"
        );
        assert!(check_update_allowed(&plain, &rename, false).is_ok());
        assert!(check_toggle_allowed(&def, false, false).is_ok());
        assert!(check_toggle_allowed(&def, true, false).is_err());
        assert!(check_toggle_allowed(&def, true, true).is_ok());
        assert!(update(&def, DefinitionChanges::default()).is_err());
    }
}
