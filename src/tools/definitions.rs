//! The definitions provider: the account's tool definitions (`/tools/definitions`,
//! whatever their `source`) offered to its sessions and run through the script
//! sandbox. The contract calls their provider type `preset`, so that word stays
//! on the wire (`provider_type`, `provider_id`) and only there.

use std::sync::{Arc, Mutex, Weak};

use serde_json::Value;

use futures::future::BoxFuture;

use crate::call::ToolOutcome;
use crate::catalog::{CallContext, CatalogEntry, EntryKey, ToolHandler, ToolProvider};
use crate::domain::definition::ToolDefinition;
use crate::domain::tool::{ProviderType, ToolMetadata, ToolSpec};
use crate::error::Result;
use crate::fast_map::FastMap;
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

/// Accounts whose built entries are kept before the memo starts over (the
/// store's definitions cache keeps as many accounts).
const MAX_BUILT_ACCOUNTS: usize = 10_000;
/// Past this many accounts, a new one first drops the entries of reads the
/// store no longer caches: they would only be built again.
const PRUNE_BUILT_FROM: usize = 1_024;

/// The definitions provider: the account's enabled definitions, run through
/// the script sandbox. Script tools stay visible while the switch is off, but
/// unavailable, so that an operator can see why they are not called.
pub struct DefinitionProvider {
    store: Store,
    scripts: ScriptRunner,
    scripts_enabled: bool,
    /// Each account's entries, built once per read of its enabled
    /// definitions: their specs' addresses are the keys by which the live
    /// sessions of one catalog change share one verdict
    /// ([`ToolProvider::entry_keys`]). Built anew for each session, a
    /// definition write made every live session of the account build and
    /// check its whole catalog under the mutation lock.
    built: Mutex<FastMap<String, BuiltEntries>>,
}

/// An account's entries and the read of its definitions they were built
/// from.
struct BuiltEntries {
    /// Compared by address only; held weakly, which still keeps the address
    /// from being reused by another read.
    from: Weak<Vec<ToolDefinition>>,
    entries: Arc<[CatalogEntry]>,
}

impl DefinitionProvider {
    pub fn new(store: Store, scripts: ScriptRunner, scripts_enabled: bool) -> Self {
        Self {
            store,
            scripts,
            scripts_enabled,
            built: Mutex::default(),
        }
    }

    fn built(&self) -> std::sync::MutexGuard<'_, FastMap<String, BuiltEntries>> {
        self.built.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entries built from `definitions` (the account's enabled ones, as
    /// read), if they were built.
    fn built_from(
        &self,
        account_id: &str,
        definitions: &Arc<Vec<ToolDefinition>>,
    ) -> Option<Arc<[CatalogEntry]>> {
        self.built()
            .get(account_id)
            .filter(|built| std::ptr::eq(built.from.as_ptr(), Arc::as_ptr(definitions)))
            .map(|built| built.entries.clone())
    }

    /// The entries of `definitions`, built once per read of them.
    fn entries_of(
        &self,
        account_id: &str,
        definitions: &Arc<Vec<ToolDefinition>>,
    ) -> Arc<[CatalogEntry]> {
        if let Some(entries) = self.built_from(account_id, definitions) {
            return entries;
        }
        let entries: Arc<[CatalogEntry]> = definitions
            .iter()
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
            .collect();
        let mut built = self.built();
        if built.len() >= PRUNE_BUILT_FROM && !built.contains_key(account_id) {
            built.retain(|_, built| built.from.strong_count() > 0);
        }
        if built.len() >= MAX_BUILT_ACCOUNTS && !built.contains_key(account_id) {
            built.clear();
        }
        built.insert(
            account_id.to_owned(),
            BuiltEntries {
                from: Arc::downgrade(definitions),
                entries: entries.clone(),
            },
        );
        entries
    }
}

impl ToolProvider for DefinitionProvider {
    fn kind(&self) -> &'static str {
        "preset"
    }

    fn entries<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(self.entries_where(session, |_| true))
    }

    fn entry_keys(&self, session: &Session, keys: &mut Vec<EntryKey>) -> bool {
        // Keys only from the cached read the entries were built from: a read
        // not cached yet, or not built from yet, may differ.
        let Some(definitions) = self.store.cached_enabled_definitions(&session.account_id) else {
            return false;
        };
        if definitions.is_empty() {
            return true;
        }
        match self.built_from(&session.account_id, &definitions) {
            Some(entries) => {
                keys.extend(entries.iter().map(EntryKey::of));
                true
            }
            None => false,
        }
    }

    fn entries_named<'a>(
        &'a self,
        session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(self.entries_where(session, move |spec| spec.name == name))
    }
}

impl DefinitionProvider {
    /// The entries of the account's enabled definitions whose spec `keep`
    /// keeps.
    async fn entries_where(
        &self,
        session: &Session,
        keep: impl Fn(&ToolSpec) -> bool,
    ) -> Result<Vec<CatalogEntry>> {
        let definitions = self.store.enabled_definitions(&session.account_id).await?;
        Ok(self
            .entries_of(&session.account_id, &definitions)
            .iter()
            .filter(|entry| keep(&entry.spec))
            .cloned()
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

    fn session_of(account_id: &str, id: &str) -> Session {
        Session {
            id: id.into(),
            account_id: account_id.into(),
            character_id: "char_x".into(),
            character: "x".into(),
            title: String::new(),
            metadata: serde_json::json!({}),
            created_at: 0,
            updated_at: 0,
        }
    }

    fn keys_of(provider: &DefinitionProvider, session: &Session) -> Option<Vec<EntryKey>> {
        let mut keys = Vec::new();
        provider.entry_keys(session, &mut keys).then_some(keys)
    }

    /// The live sessions of an account share one verdict by these keys, so
    /// a definition write builds one catalog, not one per session: the keys
    /// are exactly the entries' keys, the same for every session of the
    /// account until its definitions change, and new after a change.
    #[tokio::test]
    async fn entry_keys_are_the_entries_keys_until_the_definitions_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let account = store
            .create_account("a", false, None)
            .await
            .unwrap()
            .account
            .id;
        let provider = DefinitionProvider::new(
            store.clone(),
            ScriptRunner::new(ScriptLimits::default(), 1),
            true,
        );
        let (one, two) = (
            session_of(&account, "sess_1"),
            session_of(&account, "sess_2"),
        );
        // No definition: no entry, a key for that.
        assert!(provider.entries(&one).await.unwrap().is_empty());
        assert_eq!(keys_of(&provider, &one), Some(Vec::new()));

        store
            .create_definition(&account, script_definition())
            .await
            .unwrap();
        // The write forgot the cached read: no key until entries are built.
        assert_eq!(keys_of(&provider, &one), None);
        let entries = provider.entries(&one).await.unwrap();
        assert_eq!(entries.len(), 1);
        let expected: Vec<EntryKey> = entries.iter().map(EntryKey::of).collect();
        assert_eq!(keys_of(&provider, &one).as_ref(), Some(&expected));
        assert_eq!(keys_of(&provider, &two).as_ref(), Some(&expected));
        let again = provider.entries(&two).await.unwrap();
        assert!(Arc::ptr_eq(&again[0].spec, &entries[0].spec), "built once");
        assert_eq!(
            provider
                .entries_named(&two, "lookup_npc")
                .await
                .unwrap()
                .len(),
            1
        );
        assert!(
            provider
                .entries_named(&two, "other")
                .await
                .unwrap()
                .is_empty()
        );

        let mut second = script_definition();
        second.name = "roll_npc".into();
        store.create_definition(&account, second).await.unwrap();
        assert_eq!(keys_of(&provider, &one), None);
        let changed = provider.entries(&one).await.unwrap();
        let changed_keys: Vec<EntryKey> = changed.iter().map(EntryKey::of).collect();
        assert_eq!(changed.len(), 2);
        assert_eq!(keys_of(&provider, &two).as_ref(), Some(&changed_keys));
        assert!(!changed_keys.contains(&expected[0]), "entries built anew");
    }

    /// The memo keeps the entries of reads the store still caches: past its
    /// prune bound, a new account drops the others'.
    #[tokio::test]
    async fn entries_of_reads_no_longer_cached_are_dropped_past_the_prune_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let provider =
            DefinitionProvider::new(store, ScriptRunner::new(ScriptLimits::default(), 1), true);
        let reads: Vec<Arc<Vec<ToolDefinition>>> = (0..PRUNE_BUILT_FROM)
            .map(|_| Arc::new(vec![script_definition()]))
            .collect();
        for (n, read) in reads.iter().enumerate() {
            provider.entries_of(&format!("acct_{n}"), read);
        }
        let still_cached = reads[7].clone();
        drop(reads);
        assert_eq!(provider.built().len(), PRUNE_BUILT_FROM);
        provider.entries_of("acct_new", &Arc::new(Vec::new()));
        let mut kept: Vec<String> = provider.built().keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["acct_7", "acct_new"]);
        assert!(provider.built_from("acct_7", &still_cached).is_some());
    }
}
