//! Preset tools: the account's custom definitions (`/tools/definitions`) offered
//! to its sessions, run through the script sandbox.

use std::sync::Arc;

use serde_json::Value;

use crate::catalog::{Availability, CatalogEntry, Invoker};
use crate::dispatch::ToolOutcome;
use crate::domain::definition::ToolDefinition;
use crate::domain::tool::{ProviderType, ToolMetadata, ToolSpec};
use crate::error::Result;
use crate::runtime::ToolRuntime;
use crate::store::Session;
use crate::tools::script::ScriptError;

/// Why a stored script tool cannot be called while the switch is off.
pub const SCRIPT_DISABLED_REASON: &str = "the script handler is disabled on this server (ENABLE_UNSAFE_SCRIPT_HANDLER is not true); calls to script tools are refused";

/// What a catalog entry needs to run one definition.
#[derive(Debug)]
pub struct PresetTool {
    pub definition_id: String,
    /// The script body, when the definition has a script handler.
    pub script: Option<Arc<str>>,
}

/// The provider id of a definition in catalogs and the journal.
pub fn provider_id(definition: &ToolDefinition) -> String {
    format!("preset:{}", definition.id)
}

/// One catalog entry per enabled definition of the session's account. Script tools
/// stay visible while the switch is off, but unavailable, so that an operator can
/// see why they are not called.
pub async fn catalog_entries(
    runtime: &ToolRuntime,
    session: &Session,
) -> Result<Vec<CatalogEntry>> {
    let definitions = runtime
        .store
        .enabled_definitions(&session.account_id)
        .await?;
    let scripts_enabled = runtime.settings.enable_unsafe_script_handler;
    Ok(definitions
        .iter()
        .map(|definition| entry(definition.clone(), scripts_enabled))
        .collect())
}

fn entry(definition: ToolDefinition, scripts_enabled: bool) -> CatalogEntry {
    let tool = PresetTool {
        definition_id: definition.id.clone(),
        script: definition.script().map(Arc::from),
    };
    let unavailable = if definition.has_script_handler() && !scripts_enabled {
        Some(SCRIPT_DISABLED_REASON.to_owned())
    } else if tool.script.is_none() {
        Some("this definition has no handler, so there is nothing to run".to_owned())
    } else {
        None
    };
    let spec = ToolSpec {
        provider_id: provider_id(&definition),
        provider_type: ProviderType::Preset,
        source: definition.source.as_str().to_owned(),
        metadata: ToolMetadata::declared(
            definition.side_effect_level,
            definition.allowed_slots.clone(),
            None,
        ),
        name: definition.name,
        description: definition.description,
        parameters: definition.parameters,
    };
    let mut entry = CatalogEntry::available(spec, Invoker::Preset(Arc::new(tool)));
    if let Some(reason) = unavailable {
        entry.availability = Availability::Unavailable;
        entry.availability_reason = Some(reason);
    }
    entry
}

/// Runs one call of a preset tool.
pub async fn call(runtime: &ToolRuntime, tool: &PresetTool, args: &Value) -> ToolOutcome {
    // The catalog already marks these unavailable; checking again here keeps the
    // switch authoritative even for a caller holding an older catalog.
    if !runtime.settings.enable_unsafe_script_handler {
        return ToolOutcome::Error(SCRIPT_DISABLED_REASON.to_owned());
    }
    let Some(script) = &tool.script else {
        return ToolOutcome::Error(format!(
            "tool definition {} has no handler",
            tool.definition_id
        ));
    };
    match runtime.scripts.run(script.clone(), args.clone()).await {
        Ok(output) => ToolOutcome::Success(output),
        Err(err @ ScriptError::TimeLimit(_)) => ToolOutcome::Timeout(err.to_string()),
        Err(err) => ToolOutcome::Error(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::definition::{self, DefinitionChanges, ScriptHandler};
    use crate::domain::tool::{Basis, SideEffectLevel, Slot};

    fn script_definition() -> ToolDefinition {
        let mut def = definition::create(DefinitionChanges {
            name: Some("lookup_npc".into()),
            side_effect_level: Some(SideEffectLevel::Sandbox),
            allowed_slots: Some(vec![Slot::Narrator]),
            handler: Some(ScriptHandler {
                script: "return 1;".into(),
            }),
            ..Default::default()
        })
        .unwrap();
        def.id = "tooldef_x".into();
        def
    }

    #[test]
    fn entries_declare_their_metadata() {
        let entry = entry(script_definition(), true);
        assert_eq!(entry.availability, Availability::Available);
        let json = entry.to_json();
        assert_eq!(json["provider_type"], "preset");
        assert_eq!(json["provider_id"], "preset:tooldef_x");
        assert_eq!(json["source"], "custom");
        assert_eq!(json["side_effect_level"], "sandbox");
        assert_eq!(json["allowed_slots"], serde_json::json!(["narrator"]));
        assert_eq!(
            entry.spec.metadata.side_effect_level_basis,
            Basis::ToolDeclared
        );
        assert_eq!(json["catalog_source"], Value::Null);
    }

    #[test]
    fn script_tools_are_unavailable_while_the_switch_is_off() {
        let entry = entry(script_definition(), false);
        assert_eq!(entry.availability, Availability::Unavailable);
        assert_eq!(entry.to_json()["availability"], "unavailable");
        assert!(
            entry
                .availability_reason
                .unwrap()
                .contains("ENABLE_UNSAFE_SCRIPT_HANDLER")
        );
    }
}
