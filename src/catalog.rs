//! A session's runtime catalog: every tool visible to it, with availability and
//! the metadata basis of each governance value, and name conflicts between providers.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::call::{JobInvocation, ToolCall, ToolOutcome};
use crate::domain::tool::ToolSpec;
use crate::error::Result;
use crate::store::{Run, Session};

/// Whether a catalog entry can be called now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Availability {
    Available,
    Unavailable,
    Conflict,
}

impl Availability {
    pub fn as_str(self) -> &'static str {
        match self {
            Availability::Available => "available",
            Availability::Unavailable => "unavailable",
            Availability::Conflict => "conflict",
        }
    }
}

/// Where an MCP server's tool list came from; `None` for non-MCP tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogSource {
    Live,
    Cached,
    Unavailable,
}

impl CatalogSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CatalogSource::Live => "live",
            CatalogSource::Cached => "cached",
            CatalogSource::Unavailable => "unavailable",
        }
    }
}

/// Runs calls of one catalog entry; each provider supplies its own.
pub trait ToolHandler: Send + Sync + fmt::Debug {
    /// Runs one call whose arguments already passed the tool's schema.
    fn invoke<'a>(&'a self, cx: &'a CallContext<'a>, args: &'a Value)
    -> BoxFuture<'a, ToolOutcome>;

    /// A snapshot to run the call later as a runtime job; `None` when this tool
    /// only runs inline.
    fn snapshot(&self, _call: &ToolCall, _args: &Value) -> Option<JobInvocation> {
        None
    }
}

/// One kind of tool provider (builtin, remote callback, script definition, …):
/// it offers catalog entries and, for deferred calls, rebuilds a tool from its
/// job snapshot. The dispatcher owns everything common to all of them.
pub trait ToolProvider: Send + Sync {
    /// The name job snapshots carry as `kind`.
    fn kind(&self) -> &'static str;

    /// This provider's entries in `session`'s catalog.
    fn entries<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>>;

    /// This provider's entries named `name` in `session`'s catalog: what a
    /// call of `name` is decided on. A provider that can find a name without
    /// building every entry says so here; the default filters `entries`.
    fn entries_named<'a>(
        &'a self,
        session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        Box::pin(async move {
            let mut entries = self.entries(session).await?;
            entries.retain(|entry| entry.spec.name == name);
            Ok(entries)
        })
    }

    /// Appends the key of each of this provider's entries for `session` to
    /// `keys`, in the order of `entries`, and returns true; or returns false,
    /// with `keys` as it was, when it cannot say without building them (the
    /// default). A live model session whose keys, permissions, slot and model
    /// provider equal those of a catalog already decided in one mutation takes
    /// that decision without its entries being built (`model_sessions`).
    fn entry_keys(&self, _session: &Session, _keys: &mut Vec<EntryKey>) -> bool {
        false
    }

    /// The handler that runs a deferred call of this provider.
    fn restore(
        &self,
        invocation: &JobInvocation,
    ) -> std::result::Result<Arc<dyn ToolHandler>, String> {
        Err(format!(
            "the {} provider does not run deferred calls ({:?})",
            self.kind(),
            invocation.call_id
        ))
    }
}

/// What of a catalog entry decides what a model session takes: its spec, by
/// address, and its availability. Two keys are equal only for the very same
/// spec while the spec lives, so a key compared with one whose spec is held
/// alive names that spec, never another at a reused address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    spec: usize,
    availability: Availability,
}

impl EntryKey {
    /// The key of `spec` offered with `availability`.
    pub fn new(spec: &Arc<ToolSpec>, availability: Availability) -> Self {
        Self {
            spec: Arc::as_ptr(spec) as usize,
            availability,
        }
    }

    /// The key of `entry`.
    pub fn of(entry: &CatalogEntry) -> Self {
        Self::new(&entry.spec, entry.availability)
    }
}

/// What a handler may reach while it runs a call.
pub struct CallContext<'a> {
    pub session: &'a Session,
    /// The open run the call belongs to; sandbox writes are buffered in it.
    pub run: Option<&'a Run>,
    pub call: &'a ToolCall,
    /// Which execution this is and how often it has been handed to a
    /// provider: what callbacks and MCP servers receive as the idempotency key.
    pub attempt: crate::call::Attempt<'a>,
    /// Where a provider reports catalog changes it makes while running a call
    /// (a plugin evicted after repeated connection failures).
    pub catalog_events: &'a dyn CatalogEvents,
}

/// Which sessions a catalog change concerns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum CatalogScope {
    /// Every session of a character (runtime registrations are per role).
    Character(String),
    /// Every session of an account (its tool definitions).
    Account(String),
    /// One session (its permissions).
    Session(String),
}

/// A change to the catalogs of one scope, as the provider saw it (and as
/// instances sharing a database tell each other about it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CatalogChange {
    pub scope: CatalogScope,
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
}

impl CatalogChange {
    /// A change of `scope` naming no tool yet (a permission change affects
    /// every tool without adding or removing one).
    pub fn new(scope: CatalogScope) -> Self {
        Self {
            scope,
            added: Vec::new(),
            updated: Vec::new(),
            removed: Vec::new(),
        }
    }
}

/// A catalog mutation: runs (is first polled) under the catalog mutation lock
/// and says which catalogs it changed.
pub type CatalogMutation<'a> = BoxFuture<'a, Vec<CatalogChange>>;

/// Synchronises live model sessions with catalog changes.
pub trait CatalogEvents: Send + Sync {
    /// Runs `mutation` under the catalog mutation lock, then offers each changed
    /// catalog to the live model sessions concerned before returning: one result
    /// per change, in order, `Err` naming the sessions that refused it.
    fn mutate<'a>(
        &'a self,
        mutation: CatalogMutation<'a>,
    ) -> BoxFuture<'a, Vec<std::result::Result<(), String>>>;
}

/// Runs a mutation that also answers a value of its own (what it removed, a
/// stored row), as one catalog mutation: the value, and one sync result per
/// change.
pub async fn mutate_with<T: Send>(
    events: &dyn CatalogEvents,
    mutation: impl Future<Output = (T, Vec<CatalogChange>)> + Send,
) -> (T, Vec<std::result::Result<(), String>>) {
    let mut answer = None;
    let slot = &mut answer;
    let results = events
        .mutate(Box::pin(async move {
            let (value, changes) = mutation.await;
            *slot = Some(value);
            changes
        }))
        .await;
    let value = answer.expect("a catalog mutation runs before its changes are synced");
    (value, results)
}

/// One tool in a catalog.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    /// Shared with the provider's copy: a call's catalog is assembled per call
    /// and must not copy every tool's strings and metadata.
    pub spec: Arc<ToolSpec>,
    pub handler: Arc<dyn ToolHandler>,
    pub availability: Availability,
    pub availability_reason: Option<String>,
    pub catalog_source: Option<CatalogSource>,
}

impl CatalogEntry {
    pub fn available(spec: impl Into<Arc<ToolSpec>>, handler: Arc<dyn ToolHandler>) -> Self {
        Self {
            spec: spec.into(),
            handler,
            availability: Availability::Available,
            availability_reason: None,
            catalog_source: None,
        }
    }

    /// Marks the entry as not callable, with the reason shown in the catalog.
    pub fn unavailable(mut self, reason: impl Into<String>) -> Self {
        self.availability = Availability::Unavailable;
        self.availability_reason = Some(reason.into());
        self
    }

    /// The entry as the seed's runtime-catalog JSON shows it.
    pub fn to_json(&self) -> Value {
        entry_json(
            &self.spec,
            self.availability,
            self.availability_reason.as_deref(),
            self.catalog_source,
        )
    }
}

/// A catalog entry as the seed's runtime-catalog JSON shows it, written
/// straight from the entry: the schema is serialised from the spec's shared
/// copy, never copied into a new JSON value (a catalog of 256 tools with
/// 64 KiB schemas cost a gigabyte a request that way, probe I). Fields in
/// the order [`entry_json`] writes them (its object's keys are sorted), so
/// both give the same text.
#[derive(serde::Serialize)]
pub struct EntryView<'a> {
    allowed_slots: &'a [crate::domain::tool::Slot],
    allowed_slots_basis: crate::domain::tool::Basis,
    async_capability: crate::domain::tool::AsyncCapability,
    availability: &'static str,
    availability_reason: Option<&'a str>,
    catalog_source: Option<&'static str>,
    default_delivery_mode: crate::domain::tool::DeliveryMode,
    description: &'a str,
    metadata_basis_detail: BasisDetails,
    name: &'a str,
    parameter_schema_basis: crate::domain::tool::Basis,
    parameters: &'a Value,
    provider_id: &'a str,
    provider_type: crate::domain::tool::ProviderType,
    replay_safety: crate::domain::tool::ReplaySafety,
    replay_safety_basis: crate::domain::tool::Basis,
    result_visibility: crate::domain::tool::ResultVisibility,
    side_effect_level: crate::domain::tool::SideEffectLevel,
    side_effect_level_basis: crate::domain::tool::Basis,
    source: &'a str,
}

impl<'a> EntryView<'a> {
    /// The view of an entry's parts (an MCP server's tool is shown before it
    /// is an entry).
    pub fn of(
        spec: &'a ToolSpec,
        availability: Availability,
        availability_reason: Option<&'a str>,
        catalog_source: Option<CatalogSource>,
    ) -> Self {
        let meta = &spec.metadata;
        EntryView {
            allowed_slots: &meta.allowed_slots,
            allowed_slots_basis: meta.allowed_slots_basis,
            async_capability: meta.async_capability,
            availability: availability.as_str(),
            availability_reason,
            catalog_source: catalog_source.map(CatalogSource::as_str),
            default_delivery_mode: meta.default_delivery_mode,
            description: &spec.description,
            metadata_basis_detail: BasisDetails {
                allowed_slots: meta.allowed_slots_basis.into(),
                parameter_schema: meta.parameter_schema_basis.into(),
                replay_safety: meta.replay_safety_basis.into(),
                side_effect_level: meta.side_effect_level_basis.into(),
            },
            name: &spec.name,
            parameter_schema_basis: meta.parameter_schema_basis,
            parameters: &spec.parameters,
            provider_id: &spec.provider_id,
            provider_type: spec.provider_type,
            replay_safety: meta.replay_safety,
            replay_safety_basis: meta.replay_safety_basis,
            result_visibility: meta.result_visibility(),
            side_effect_level: meta.side_effect_level,
            side_effect_level_basis: meta.side_effect_level_basis,
            source: &spec.source,
        }
    }
}

/// `metadata_basis_detail` of an [`EntryView`].
#[derive(serde::Serialize)]
struct BasisDetails {
    allowed_slots: BasisDetail,
    parameter_schema: BasisDetail,
    replay_safety: BasisDetail,
    side_effect_level: BasisDetail,
}

#[derive(serde::Serialize)]
struct BasisDetail {
    basis: crate::domain::tool::Basis,
    scope: &'static str,
}

impl From<crate::domain::tool::Basis> for BasisDetail {
    fn from(basis: crate::domain::tool::Basis) -> Self {
        Self {
            basis,
            scope: basis.scope(),
        }
    }
}

/// One element of an OpenAI chat-completions `tools` array, written straight
/// from the entry (see [`EntryView`]).
#[derive(serde::Serialize)]
pub struct OpenAiToolView<'a> {
    function: OpenAiFunction<'a>,
    r#type: &'static str,
}

#[derive(serde::Serialize)]
struct OpenAiFunction<'a> {
    description: &'a str,
    name: &'a str,
    parameters: &'a Value,
}

impl CatalogEntry {
    /// The entry as the runtime catalog shows it, to serialise.
    pub fn view(&self) -> EntryView<'_> {
        EntryView::of(
            &self.spec,
            self.availability,
            self.availability_reason.as_deref(),
            self.catalog_source,
        )
    }

    /// The entry's JSON without its schema (`parameters` null): what the
    /// console's catalog tables show, without copying every schema.
    pub fn summary_json(&self) -> Value {
        static NO_SCHEMA: Value = Value::Null;
        let mut view = self.view();
        view.parameters = &NO_SCHEMA;
        serde_json::to_value(view).unwrap_or(Value::Null)
    }

    /// The entry as an OpenAI `tools` element, to serialise.
    pub fn openai_view(&self) -> OpenAiToolView<'_> {
        OpenAiToolView {
            function: OpenAiFunction {
                description: &self.spec.description,
                name: &self.spec.name,
                parameters: &self.spec.parameters,
            },
            r#type: "function",
        }
    }
}

/// A catalog entry's JSON (the seed's runtime-catalog shape) from its parts,
/// as a value: for answers that hold a few entries; a whole catalog is
/// written from [`EntryView`]s without one.
pub fn entry_json(
    spec: &ToolSpec,
    availability: Availability,
    availability_reason: Option<&str>,
    catalog_source: Option<CatalogSource>,
) -> Value {
    let view = EntryView::of(spec, availability, availability_reason, catalog_source);
    serde_json::to_value(view).unwrap_or(Value::Null)
}

impl CatalogEntry {
    /// The entry as one element of an OpenAI chat-completions `tools` array.
    pub fn to_openai_tool(&self) -> Value {
        serde_json::to_value(self.openai_view()).unwrap_or(Value::Null)
    }
}

/// Two or more providers offering the same tool name.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Conflict {
    pub name: String,
    pub provider_ids: Vec<String>,
}

/// What a session can see right now.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub session_id: String,
    pub generated_at: i64,
    pub entries: Vec<CatalogEntry>,
    pub conflicts: Vec<Conflict>,
}

/// Why a called name cannot be run from a catalog.
#[derive(Debug)]
pub enum NotCallable<'a> {
    Unknown,
    Conflict(&'a Conflict),
    Unavailable(&'a CatalogEntry),
}

/// Every name more than one entry offers, with the providers offering it, in
/// name order.
fn conflicts_of(entries: &[CatalogEntry]) -> Vec<Conflict> {
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for entry in entries {
        by_name
            .entry(&entry.spec.name)
            .or_default()
            .push(&entry.spec.provider_id);
    }
    by_name
        .into_iter()
        .filter(|(_, providers)| providers.len() > 1)
        .map(|(name, provider_ids)| Conflict {
            name: name.to_owned(),
            provider_ids: provider_ids.into_iter().map(str::to_owned).collect(),
        })
        .collect()
}

/// The conflict of `name`, found by halving: `conflicts_of` answers them in
/// name order, and a catalog with many conflicts must not compare every
/// entry with every conflict.
fn conflict_named<'a>(conflicts: &'a [Conflict], name: &str) -> Option<&'a Conflict> {
    conflicts
        .binary_search_by(|conflict| conflict.name.as_str().cmp(name))
        .ok()
        .map(|at| &conflicts[at])
}

/// Most providers a conflict's reason names; `conflicts` lists them all.
const NAMED_PROVIDERS: usize = 5;

/// The providers of a conflict, for its entries' reason: a few of them, and
/// how many more, so that each of N entries does not carry all N.
fn named_providers(provider_ids: &[String]) -> String {
    let named = provider_ids
        .iter()
        .take(NAMED_PROVIDERS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match provider_ids.len().checked_sub(NAMED_PROVIDERS) {
        Some(more) if more > 0 => format!("{named} and {more} more"),
        _ => named,
    }
}

impl Catalog {
    /// The catalog of `session` right now: every provider's entries, in the
    /// providers' order.
    pub async fn build(session: &Session, providers: &[Arc<dyn ToolProvider>]) -> Result<Self> {
        let entries = Self::entries_of(session, providers).await?;
        Ok(Self::assemble(&session.id, entries))
    }

    /// What a call of `name` on `session` is decided on: every provider's
    /// entries of that name, in the providers' order. Its `lookup(name)` is
    /// the full catalog's, conflicts included (a conflict is entries of one
    /// name), without building the entries of every other tool per call.
    pub async fn for_call(
        session: &Session,
        providers: &[Arc<dyn ToolProvider>],
        name: &str,
    ) -> Result<Self> {
        let mut entries = Vec::new();
        for provider in providers {
            entries.extend(provider.entries_named(session, name).await?);
        }
        Ok(Self::assemble(&session.id, entries))
    }

    /// Every provider's entries for `session`, in the providers' order.
    pub async fn entries_of(
        session: &Session,
        providers: &[Arc<dyn ToolProvider>],
    ) -> Result<Vec<CatalogEntry>> {
        // Room for the builtins and a few more without growing.
        let mut entries = Vec::with_capacity(32);
        for provider in providers {
            entries.extend(provider.entries(session).await?);
        }
        Ok(entries)
    }

    /// Builds a catalog from every provider's entries, marking shared names as conflicts.
    pub fn assemble(session_id: &str, mut entries: Vec<CatalogEntry>) -> Self {
        // This runs for every call and every live model session's sync, and
        // conflicts are rare: the names' hashes, sorted as integers, show
        // whether any name may repeat before anything is grouped (sorting the
        // names themselves cost more than the rest of the assembly). Equal
        // hashes only send the catalog to the exact grouping below.
        let hasher = foldhash::fast::FixedState::default();
        let mut hashes: Vec<u64> = entries
            .iter()
            .map(|entry| hasher.hash_one(entry.spec.name.as_str()))
            .collect();
        hashes.sort_unstable();
        let may_repeat = hashes.windows(2).any(|pair| pair[0] == pair[1]);
        let conflicts = if may_repeat {
            conflicts_of(&entries)
        } else {
            Vec::new()
        };
        for entry in &mut entries {
            if let Some(conflict) = conflict_named(&conflicts, &entry.spec.name) {
                entry.availability = Availability::Conflict;
                entry.availability_reason = Some(format!(
                    "the name {:?} is offered by several providers ({}); calls to it are refused until only one offers it",
                    conflict.name,
                    named_providers(&conflict.provider_ids)
                ));
            }
        }
        Self {
            session_id: session_id.to_owned(),
            generated_at: crate::ids::now_ms(),
            entries,
            conflicts,
        }
    }

    /// The entry a call of `name` runs, or why there is none.
    pub fn lookup(&self, name: &str) -> std::result::Result<&CatalogEntry, NotCallable<'_>> {
        if let Some(conflict) = conflict_named(&self.conflicts, name) {
            return Err(NotCallable::Conflict(conflict));
        }
        match self.entries.iter().find(|e| e.spec.name == name) {
            None => Err(NotCallable::Unknown),
            Some(entry) if entry.availability == Availability::Available => Ok(entry),
            Some(entry) => Err(NotCallable::Unavailable(entry)),
        }
    }
}

/// Catalog entries for unit tests that build catalogs but never call a tool.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::domain::tool::{ProviderType, ToolMetadata};

    /// A handler these tests never run.
    #[derive(Debug)]
    pub struct NeverRun;

    impl ToolHandler for NeverRun {
        fn invoke<'a>(
            &'a self,
            _cx: &'a CallContext<'a>,
            _args: &'a Value,
        ) -> BoxFuture<'a, ToolOutcome> {
            unreachable!("catalog tests never call a tool")
        }
    }

    /// An available remote tool `name` of `provider_id` with `metadata`.
    pub fn entry(name: &str, provider_id: &str, metadata: ToolMetadata) -> CatalogEntry {
        CatalogEntry::available(
            ToolSpec {
                name: name.into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object", "properties": {}}).into(),
                validator: Default::default(),
                provider_id: provider_id.into(),
                provider_type: ProviderType::Remote,
                source: "plugin:test".into(),
                metadata,
            },
            Arc::new(NeverRun),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::entry;
    use super::*;
    use serde_json::json;

    #[test]
    fn an_entry_is_written_in_the_seeds_shape_with_sorted_keys() {
        use crate::domain::tool::{
            AsyncCapability, DeliveryMode, SideEffectLevel, Slot, ToolMetadata,
        };
        let mut metadata = ToolMetadata::declared(
            SideEffectLevel::Irreversible,
            vec![Slot::Director, Slot::Narrator],
            None,
        );
        metadata.async_capability = AsyncCapability::DeferredOk;
        metadata.default_delivery_mode = DeliveryMode::AsyncJob;
        let plain = entry("post", "remote:a", metadata.clone());
        let mut described = entry("gift", "mcp:b", metadata).unavailable("the server is down");
        described.catalog_source = Some(CatalogSource::Cached);
        let spec = Arc::make_mut(&mut described.spec);
        spec.description = "Sends a \"gift\" ✨".into();
        spec.parameters = json!({"type": "object", "required": ["to"],
            "properties": {"to": {"type": "string", "maxLength": 40}}})
        .into();
        // The text the runtime catalog answered when it was built with
        // `json!` (keys sorted), byte for byte.
        let expected = r#"{"allowed_slots":["director","narrator"],"allowed_slots_basis":"tool_declared","async_capability":"deferred_ok","availability":"unavailable","availability_reason":"the server is down","catalog_source":"cached","default_delivery_mode":"async_job","description":"Sends a \"gift\" ✨","metadata_basis_detail":{"allowed_slots":{"basis":"tool_declared","scope":"tool"},"parameter_schema":{"basis":"tool_declared","scope":"tool"},"replay_safety":{"basis":"inferred_from_execution_policy","scope":"inference"},"side_effect_level":{"basis":"tool_declared","scope":"tool"}},"name":"gift","parameter_schema_basis":"tool_declared","parameters":{"properties":{"to":{"maxLength":40,"type":"string"}},"required":["to"],"type":"object"},"provider_id":"mcp:b","provider_type":"remote","replay_safety":"never_auto_replay","replay_safety_basis":"inferred_from_execution_policy","result_visibility":"deferred_receipt","side_effect_level":"irreversible","side_effect_level_basis":"tool_declared","source":"plugin:test"}"#;
        assert_eq!(serde_json::to_string(&described.view()).unwrap(), expected);
        assert_eq!(described.to_json().to_string(), expected);
        let mut summary = described.to_json();
        summary["parameters"] = Value::Null;
        assert_eq!(described.summary_json(), summary);
        assert_eq!(
            plain.to_openai_tool(),
            json!({"function": {"description": "", "name": "post",
                "parameters": {"type": "object", "properties": {}}}, "type": "function"})
        );
    }

    /// A provider of fixed entries, deciding calls by the default
    /// `entries_named`.
    struct Fixed(Vec<CatalogEntry>);

    impl ToolProvider for Fixed {
        fn kind(&self) -> &'static str {
            "fixed"
        }

        fn entries<'a>(&'a self, _: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
            Box::pin(std::future::ready(Ok(self.0.clone())))
        }
    }

    fn session() -> Session {
        Session {
            id: "sess_1".into(),
            account_id: "acct_1".into(),
            character_id: "char_1".into(),
            character: "Lanlan".into(),
            title: String::new(),
            metadata: Value::Null,
            created_at: 0,
            updated_at: 0,
        }
    }

    /// What `lookup(name)` decides, in comparable terms.
    fn decided(catalog: &Catalog, name: &str) -> String {
        match catalog.lookup(name) {
            Ok(entry) => format!("run {}", entry.spec.provider_id),
            Err(NotCallable::Unknown) => "unknown".into(),
            Err(NotCallable::Conflict(conflict)) => {
                format!("conflict {}", conflict.provider_ids.join(","))
            }
            Err(NotCallable::Unavailable(entry)) => {
                format!("unavailable {}", entry.spec.provider_id)
            }
        }
    }

    #[tokio::test]
    async fn a_calls_catalog_decides_its_name_as_the_whole_catalog_does() {
        use crate::domain::tool::{SideEffectLevel, ToolMetadata};
        let metadata = ToolMetadata::declared(SideEffectLevel::None, Vec::new(), None);
        let one = Fixed(vec![
            entry("look", "one", metadata.clone()),
            entry("shared", "one", metadata.clone()),
            entry("broken", "one", metadata.clone()).unavailable("server down"),
        ]);
        let two = Fixed(vec![
            entry("shared", "two", metadata.clone()),
            entry("write", "two", metadata.clone()),
        ]);
        let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(one), Arc::new(two)];
        let session = session();
        let whole = Catalog::build(&session, &providers).await.unwrap();
        for name in ["look", "write", "shared", "broken", "missing"] {
            let call = Catalog::for_call(&session, &providers, name).await.unwrap();
            assert_eq!(decided(&call, name), decided(&whole, name), "{name}");
            assert!(call.entries.iter().all(|entry| entry.spec.name == name));
        }
        assert_eq!(decided(&whole, "shared"), "conflict one,two");
        assert_eq!(decided(&whole, "broken"), "unavailable one");
    }

    #[test]
    fn many_conflicts_are_each_found_and_say_how_many_share_them() {
        use crate::domain::tool::{SideEffectLevel, ToolMetadata};
        let metadata = ToolMetadata::declared(SideEffectLevel::None, Vec::new(), None);
        let mut entries = Vec::new();
        for name in ["b", "a", "d", "c"] {
            for provider in 0..8 {
                entries.push(entry(name, &format!("mcp:{provider}"), metadata.clone()));
            }
        }
        entries.push(entry("alone", "builtin", metadata.clone()));
        let catalog = Catalog::assemble("sess_1", entries);
        assert_eq!(catalog.conflicts.len(), 4);
        for name in ["a", "b", "c", "d"] {
            assert!(
                decided(&catalog, name).starts_with("conflict mcp:0,"),
                "{name}"
            );
        }
        assert_eq!(decided(&catalog, "alone"), "run builtin");
        let reason = catalog.entries[0].availability_reason.as_deref().unwrap();
        assert!(
            reason.contains("(mcp:0, mcp:1, mcp:2, mcp:3, mcp:4 and 3 more)"),
            "{reason}"
        );
    }
}
