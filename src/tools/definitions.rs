//! The definitions provider: the account's tool definitions (`/tools/definitions`,
//! whatever their `source`) offered to its sessions and run through the script
//! sandbox. The contract calls their provider type `preset`, so that word stays
//! on the wire (`provider_type`, `provider_id`) and only there.

use std::sync::Arc;

use serde_json::Value;

use futures::future::BoxFuture;

use crate::call::ToolOutcome;
use crate::catalog::{CallContext, CatalogEntry, EntryKey, ToolHandler, ToolProvider};
use crate::domain::definition::ToolDefinition;
use crate::domain::tool::{ProviderType, ToolMetadata, ToolSpec};
use crate::error::Result;
use crate::reason::ReasonCode;
use crate::store::{Session, Store};
use crate::tools::script::{ScriptError, ScriptRunner};

/// Why a stored script tool cannot be called while the switch is off.
pub const SCRIPT_DISABLED_REASON: &str = "the script handler is disabled on this server (ENABLE_UNSAFE_SCRIPT_HANDLER is not true); calls to script tools are refused";

/// Runs one definition.
#[derive(Debug)]
struct DefinitionHandler {
    definition_id: String,
    /// Whose script it is: the sandbox's slots are shared fairly by account.
    account_id: String,
    /// The script body, when the definition has a script handler.
    script: Option<Arc<str>>,
    scripts: ScriptRunner,
    scripts_enabled: bool,
}

/// The provider id of a definition in catalogs and the journal.
pub fn provider_id(definition: &ToolDefinition) -> String {
    format!("preset:{}", definition.id)
}

/// The definitions provider: the account's enabled definitions, run through
/// the script sandbox. Script tools stay visible while the switch is off, but
/// unavailable, so that an operator can see why they are not called.
pub struct DefinitionProvider {
    store: Store,
    scripts: ScriptRunner,
    scripts_enabled: bool,
}

impl DefinitionProvider {
    pub fn new(store: Store, scripts: ScriptRunner, scripts_enabled: bool) -> Self {
        Self {
            store,
            scripts,
            scripts_enabled,
        }
    }
}

impl ToolProvider for DefinitionProvider {
    fn kind(&self) -> &'static str {
        "preset"
    }

    fn entries<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(self.entries_where(session, |_| true))
    }

    fn entry_keys(&self, session: &Session, _keys: &mut Vec<EntryKey>) -> bool {
        // Each build of a definition's entry makes its spec anew, so keys are
        // given only for an account known to have no enabled definition.
        self.store
            .cached_enabled_definitions(&session.account_id)
            .is_some_and(|definitions| definitions.is_empty())
    }

    fn entries_named<'a>(
        &'a self,
        session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(self.entries_where(session, move |definition| definition.name == name))
    }
}

impl DefinitionProvider {
    /// The entries of the account's enabled definitions that `keep` keeps.
    async fn entries_where(
        &self,
        session: &Session,
        keep: impl Fn(&ToolDefinition) -> bool,
    ) -> Result<Vec<CatalogEntry>> {
        let definitions = self.store.enabled_definitions(&session.account_id).await?;
        Ok(definitions
            .iter()
            .filter(|definition| keep(definition))
            .map(|definition| {
                let handler = DefinitionHandler {
                    definition_id: definition.id.clone(),
                    account_id: definition.account_id.clone(),
                    script: definition.script().map(Arc::from),
                    scripts: self.scripts.clone(),
                    scripts_enabled: self.scripts_enabled,
                };
                entry(definition.clone(), handler)
            })
            .collect())
    }
}

fn entry(definition: ToolDefinition, tool: DefinitionHandler) -> CatalogEntry {
    let unavailable = if definition.has_script_handler() && !tool.scripts_enabled {
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
        validator: definition.validator,
    };
    let entry = CatalogEntry::available(spec, Arc::new(tool));
    match unavailable {
        Some(reason) => entry.unavailable(reason),
        None => entry,
    }
}

impl ToolHandler for DefinitionHandler {
    fn invoke<'a>(
        &'a self,
        _cx: &'a CallContext<'a>,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(self.run(args))
    }
}

impl DefinitionHandler {
    async fn run(&self, args: &Value) -> ToolOutcome {
        // The catalog already marks these unavailable; checking again here keeps
        // the switch authoritative even for a caller holding an older catalog.
        if !self.scripts_enabled {
            return ToolOutcome::not_started(
                ReasonCode::ScriptHandlerDisabled,
                SCRIPT_DISABLED_REASON,
            );
        }
        let Some(script) = &self.script else {
            return ToolOutcome::not_started(
                ReasonCode::ScriptHandlerMissing,
                format!("tool definition {} has no handler", self.definition_id),
            );
        };
        match self
            .scripts
            .run(&self.account_id, script.clone(), args.clone())
            .await
        {
            Ok(output) => ToolOutcome::Success(output),
            Err(err @ ScriptError::TimeLimit(_)) => {
                ToolOutcome::timeout(err.reason_code(), err.to_string())
            }
            Err(err @ ScriptError::Busy(_)) => ToolOutcome::NotStarted {
                reason: err.reason_code(),
                message: err.to_string(),
                retry_after_ms: Some(self.scripts.limits().time.as_millis() as u64),
            },
            Err(err) => ToolOutcome::error(err.reason_code(), err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Availability;
    use crate::domain::definition::{self, DefinitionChanges, ScriptHandler};
    use crate::domain::tool::{Basis, SideEffectLevel, Slot};
    use crate::tools::script::ScriptLimits;

    fn handler(scripts_enabled: bool) -> DefinitionHandler {
        DefinitionHandler {
            definition_id: "tooldef_x".into(),
            account_id: "acc".to_owned(),
            script: Some(Arc::from("return 1;")),
            scripts: ScriptRunner::new(ScriptLimits::default(), 1),
            scripts_enabled,
        }
    }

    fn script_definition() -> ToolDefinition {
        let mut def = definition::create(DefinitionChanges {
            name: Some("lookup_npc".into()),
            side_effect_level: Some(SideEffectLevel::Sandbox),
            allowed_slots: Some(vec![Slot::Narrator]),
            handler: Some(ScriptHandler {
                script: Some("return 1;".into()),
            }),
            ..Default::default()
        })
        .unwrap();
        def.id = "tooldef_x".into();
        def
    }

    #[test]
    fn entries_declare_their_metadata() {
        let entry = entry(script_definition(), handler(true));
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
    fn entries_share_the_definitions_schema_instead_of_copying_it() {
        let definition = script_definition();
        let stored = definition.parameters.clone();
        let entry = entry(definition, handler(true));
        // Every catalog built from the cached definitions holds this one
        // copy: a catalog of 256 tools with 64 KiB schemas cost a gigabyte a
        // request when each entry copied its own (probe I).
        assert!(Arc::ptr_eq(&stored, &entry.spec.parameters));
    }

    #[test]
    fn script_tools_are_unavailable_while_the_switch_is_off() {
        let entry = entry(script_definition(), handler(false));
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
