//! Remote tools: HTTP callbacks registered over `/api/tools`, held per character
//! (each character's "session manager"), and the client that calls them.
//!
//! Registrations are runtime state only: nothing here touches the database, so a
//! restart starts with empty registries, as the contract says.

mod client;
mod eviction;
mod listing_cache;
mod manager;
mod provider;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

use crate::catalog::{Availability, EntryKey};
use crate::config::Settings;
use crate::domain::CallbackUrl;
use crate::domain::tool::{
    AsyncCapability, Basis, DeliveryMode, ProviderType, ReplaySafety, SideEffectLevel, Slot,
    ToolMetadata, ToolSpec,
};
use crate::error::{Error, ErrorCode, Result};
use crate::fast_map::FastMap;

pub use client::{CallbackClient, Exchange, FailureEffect};
pub use eviction::{EVICTION_THRESHOLD, FailureCounter};
pub use listing_cache::{ListingCache, ListingKey};
pub use manager::{FailedRole, MutationReport, Role, Target};
pub use provider::RemoteProvider;

/// Sources with this prefix belong to plugins and fall under the eviction rule.
pub const PLUGIN_SOURCE_PREFIX: &str = "plugin:";

/// A registration, validated, before it is bound to any role.
#[derive(Debug, Clone)]
pub struct NewRemoteTool {
    pub name: String,
    pub callback_url: CallbackUrl,
    pub source: String,
    pub timeout_seconds: f64,
    pub declaration: Arc<Declaration>,
}

/// The heavy part of a registration: what the model is shown and the
/// governance metadata. One allocation, shared by every role the tool is
/// registered for (and by the catalog entries built from it), so memory follows
/// tools, not tools × roles.
#[derive(Debug, PartialEq)]
pub struct Declaration {
    pub description: String,
    /// Its own `Arc` so that catalog specs share it instead of copying it.
    pub parameters: Arc<Value>,
    /// `parameters` compiled once, shared like the rest of the declaration.
    pub validator: crate::schema::SchemaValidator,
    pub metadata: ToolMetadata,
}

/// The limits on what the runtime registries hold (`--max-runtime-tools`,
/// `--max-runtime-tools-per-source`, `--max-tool-schema-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationLimits {
    /// Distinct tools over all sources; a tool is a (source, name) pair, however
    /// many roles hold it.
    pub max_tools: usize,
    /// Distinct tools of one source.
    pub max_tools_per_source: usize,
    /// Parameters schema (compact JSON) plus description of one tool, in bytes.
    pub max_schema_bytes: usize,
}

impl RegistrationLimits {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            max_tools: settings.max_runtime_tools,
            max_tools_per_source: settings.max_runtime_tools_per_source,
            max_schema_bytes: settings.max_tool_schema_bytes,
        }
    }
}

impl Default for RegistrationLimits {
    fn default() -> Self {
        Self {
            max_tools: Settings::DEFAULT_MAX_RUNTIME_TOOLS,
            max_tools_per_source: Settings::DEFAULT_MAX_RUNTIME_TOOLS_PER_SOURCE,
            max_schema_bytes: Settings::DEFAULT_MAX_TOOL_SCHEMA_BYTES,
        }
    }
}

/// Counts the bytes written to it; sizes a value's JSON without building it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Length of `value` serialized as compact JSON.
fn json_len(value: &Value) -> usize {
    let mut count = ByteCount(0);
    serde_json::to_writer(&mut count, value).expect("a Value always serializes");
    count.0
}

/// The optional governance fields a plugin may declare at registration.
#[derive(Debug, Clone, Default)]
pub struct DeclaredMetadata {
    pub side_effect_level: Option<SideEffectLevel>,
    /// The slots that may call the tool; empty or absent: every slot.
    pub allowed_slots: Option<Vec<Slot>>,
    pub replay_safety: Option<ReplaySafety>,
    pub async_capability: Option<AsyncCapability>,
    pub default_delivery_mode: Option<DeliveryMode>,
}

/// Raw registration fields as a client sends them; `None` means "use the default".
#[derive(Debug, Clone, Default)]
pub struct RegistrationInput {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub callback_url: String,
    pub source: Option<String>,
    pub timeout_seconds: Option<f64>,
    pub declared: DeclaredMetadata,
}

impl RegistrationInput {
    /// [`NewRemoteTool::validate_within`] `max_schema_bytes`.
    pub fn validate(self, max_schema_bytes: usize) -> Result<NewRemoteTool> {
        NewRemoteTool::validate_within(self, max_schema_bytes)
    }
}

impl NewRemoteTool {
    pub const MAX_NAME_CHARS: usize = 64;
    pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
    pub const MAX_SOURCE_CHARS: usize = 128;
    pub const DEFAULT_SOURCE: &'static str = "external";
    pub const DEFAULT_TIMEOUT_SECONDS: f64 = 30.0;
    pub const MAX_TIMEOUT_SECONDS: f64 = 300.0;

    /// [`Self::validate_within`] the default size limit.
    pub fn validate(input: RegistrationInput) -> Result<Self> {
        Self::validate_within(input, Settings::DEFAULT_MAX_TOOL_SCHEMA_BYTES)
    }

    /// Checks every field against the contract, and the parameters schema plus
    /// description against `max_schema_bytes` (before the schema is compiled),
    /// and fills in the defaults.
    pub fn validate_within(input: RegistrationInput, max_schema_bytes: usize) -> Result<Self> {
        if input.declared.default_delivery_mode == Some(DeliveryMode::AsyncJob)
            && input.declared.async_capability != Some(AsyncCapability::DeferredOk)
        {
            return Err(Error::validation(
                "default_delivery_mode: async_job needs async_capability: deferred_ok",
            ));
        }
        let name_chars = input.name.chars().count();
        if name_chars == 0 || name_chars > Self::MAX_NAME_CHARS {
            return Err(Error::validation(format!(
                "name must be 1-{} characters, got {name_chars}",
                Self::MAX_NAME_CHARS
            )));
        }
        let description = input.description.unwrap_or_default();
        if description.len() > Self::MAX_DESCRIPTION_BYTES {
            return Err(Error::validation(format!(
                "description must be at most {} bytes",
                Self::MAX_DESCRIPTION_BYTES
            )));
        }
        let declared_schema = input.parameters.is_some();
        let parameters = input
            .parameters
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        // Measured before the schema is compiled, which costs far more.
        let size = json_len(&parameters) + description.len();
        if size > max_schema_bytes {
            return Err(Error::validation(format!(
                "parameters and description take {size} bytes; a runtime tool may take at most max_tool_schema_bytes = {max_schema_bytes} (--max-tool-schema-bytes)"
            )));
        }
        let parameter_schema_basis = if declared_schema {
            // The compiled form is dropped: a validator can take several times
            // its schema's memory, so it is kept only for tools that are called.
            crate::schema::check_schema_validity(&parameters).map_err(Error::validation)?;
            Basis::ToolDeclared
        } else {
            Basis::PlatformDefault
        };
        let callback_url = CallbackUrl::parse(&input.callback_url)?;
        let source = input
            .source
            .unwrap_or_else(|| Self::DEFAULT_SOURCE.to_owned());
        let source_chars = source.chars().count();
        if source_chars == 0 || source_chars > Self::MAX_SOURCE_CHARS {
            return Err(Error::validation(format!(
                "source must be 1-{} characters, got {source_chars}",
                Self::MAX_SOURCE_CHARS
            )));
        }
        let timeout_seconds = input
            .timeout_seconds
            .unwrap_or(Self::DEFAULT_TIMEOUT_SECONDS);
        if !(timeout_seconds > 0.0 && timeout_seconds <= Self::MAX_TIMEOUT_SECONDS) {
            return Err(Error::validation(format!(
                "timeout_seconds must be greater than 0 and at most {}, got {timeout_seconds}",
                Self::MAX_TIMEOUT_SECONDS
            )));
        }
        Ok(Self {
            name: input.name,
            callback_url,
            source,
            timeout_seconds,
            declaration: Arc::new(Declaration {
                description,
                parameters: Arc::new(parameters),
                validator: Default::default(),
                metadata: metadata_for(input.declared, parameter_schema_basis),
            }),
        })
    }
}

/// DESIGN.md "Metadata and basis": declared values are `tool_declared`; otherwise
/// platform defaults (`none`, `inline_only`, no slot restriction) apply, and replay
/// safety is inferred from the side-effect level.
fn metadata_for(declared: DeclaredMetadata, parameter_schema_basis: Basis) -> ToolMetadata {
    let (side_effect_level, side_effect_level_basis) = match declared.side_effect_level {
        Some(level) => (level, Basis::ToolDeclared),
        None => (SideEffectLevel::None, Basis::PlatformDefault),
    };
    let (replay_safety, replay_safety_basis) = match declared.replay_safety {
        Some(value) => (value, Basis::ToolDeclared),
        None => (
            ReplaySafety::inferred_from(side_effect_level),
            Basis::InferredFromExecutionPolicy,
        ),
    };
    let (allowed_slots, allowed_slots_basis) = match declared.allowed_slots {
        Some(slots) => (slots, Basis::ToolDeclared),
        None => (Vec::new(), Basis::PlatformDefault),
    };
    ToolMetadata {
        side_effect_level,
        side_effect_level_basis,
        allowed_slots,
        allowed_slots_basis,
        parameter_schema_basis,
        replay_safety,
        replay_safety_basis,
        async_capability: declared
            .async_capability
            .unwrap_or(AsyncCapability::InlineOnly),
        default_delivery_mode: declared
            .default_delivery_mode
            .unwrap_or(DeliveryMode::Inline),
    }
}

/// One registration as every role it was registered for holds it: a
/// registration into every role is one of these, shared, not a copy of its
/// strings per role (BENCHMARKS.md, issue 20, nineteenth pass).
#[derive(Debug)]
pub struct Registration {
    pub name: String,
    pub callback_url: CallbackUrl,
    pub source: String,
    pub timeout_seconds: f64,
    pub declaration: Arc<Declaration>,
    /// This registration as `GET /api/tools` lists it (which names no role),
    /// serialised the first time it is listed: a registration never changes
    /// (a new one replaces it), so the listing is written once per registry
    /// change, not per request nor per role.
    pub listing: std::sync::OnceLock<Box<[u8]>>,
    /// This registration as a catalog entry's spec, built the first time a
    /// catalog holds it. A spec names no role, so the live sessions of every
    /// role are offered the very same spec, and what they take is decided
    /// once (model_sessions::verdicts).
    pub spec: std::sync::OnceLock<Arc<ToolSpec>>,
}

impl Registration {
    /// `tool` as registered, with the declaration the registries hold.
    pub fn new(tool: &NewRemoteTool, declaration: Arc<Declaration>) -> Self {
        Self {
            name: tool.name.clone(),
            callback_url: tool.callback_url.clone(),
            source: tool.source.clone(),
            timeout_seconds: tool.timeout_seconds,
            declaration,
            listing: std::sync::OnceLock::new(),
            spec: std::sync::OnceLock::new(),
        }
    }

    pub fn description(&self) -> &str {
        &self.declaration.description
    }

    pub fn parameters(&self) -> &Arc<Value> {
        &self.declaration.parameters
    }

    pub fn metadata(&self) -> &ToolMetadata {
        &self.declaration.metadata
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_seconds)
    }

    pub fn is_plugin(&self) -> bool {
        self.source.starts_with(PLUGIN_SOURCE_PREFIX)
    }

    /// `remote:<source>`: one provider per source tag.
    pub fn provider_id(&self) -> String {
        format!("remote:{}", self.source)
    }

    pub fn spec(&self) -> Arc<ToolSpec> {
        self.shared_spec().clone()
    }

    /// The spec every catalog entry of this registration shares.
    fn shared_spec(&self) -> &Arc<ToolSpec> {
        self.spec.get_or_init(|| Arc::new(self.build_spec()))
    }

    fn build_spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.declaration.description.clone(),
            parameters: self.declaration.parameters.clone(),
            validator: self.declaration.validator.clone(),
            provider_id: self.provider_id(),
            provider_type: ProviderType::Remote,
            source: self.source.clone(),
            metadata: self.declaration.metadata.clone(),
        }
    }
}

/// A callback registered for one role: the role's name, and the shared
/// [`Registration`] (whose fields it reads as its own).
#[derive(Debug, Clone)]
pub struct RemoteTool {
    /// Name of the character (role) it was registered for.
    pub role: String,
    pub registration: Arc<Registration>,
}

impl RemoteTool {
    /// `tool` registered for `role` alone, with its own declaration (the
    /// registry shares one registration between roles instead).
    #[cfg(test)]
    pub fn new(tool: &NewRemoteTool, role: &str) -> Self {
        let registration = Registration::new(tool, tool.declaration.clone());
        Self {
            role: role.to_owned(),
            registration: Arc::new(registration),
        }
    }
}

impl std::ops::Deref for RemoteTool {
    type Target = Registration;

    fn deref(&self) -> &Registration {
        &self.registration
    }
}

/// What a registration did to one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    Added,
    Replaced,
}

type ToolsByName = BTreeMap<String, Arc<RemoteTool>>;

/// The registries and the count of distinct declarations the limits are held
/// to, always changed together under one lock.
#[derive(Debug, Default)]
struct Registries {
    by_character: FastMap<String, ToolsByName>,
    /// Per source and tool name, each distinct declaration held and how many
    /// registries hold it: a tool registered for N roles with one declaration
    /// is one declaration here, held N times.
    holders: FastMap<String, FastMap<String, Vec<Holding>>>,
    /// Distinct declarations held, over every source and name: what memory
    /// follows, and what `max_runtime_tools` bounds.
    tools: usize,
}

/// One declaration of a tool and how many registries hold it.
#[derive(Debug)]
struct Holding {
    declaration: Arc<Declaration>,
    registries: usize,
}

impl Registries {
    fn holders_of(&self, source: &str, name: &str) -> usize {
        self.holders
            .get(source)
            .and_then(|names| names.get(name))
            .map_or(0, |held| {
                held.iter().map(|holding| holding.registries).sum()
            })
    }

    /// How many registries hold this very `declaration` of `name` of `source`.
    fn holders_of_declaration(
        &self,
        source: &str,
        name: &str,
        declaration: &Arc<Declaration>,
    ) -> usize {
        self.holders
            .get(source)
            .and_then(|names| names.get(name))
            .and_then(|held| {
                held.iter()
                    .find(|holding| Arc::ptr_eq(&holding.declaration, declaration))
            })
            .map_or(0, |holding| holding.registries)
    }

    /// Counts one more registry holding `declaration` of `name` of `source`.
    /// A registration into every role holds the same declaration once per
    /// role: only the first allocates its keys.
    fn hold(&mut self, source: &str, name: &str, declaration: &Arc<Declaration>) {
        if let Some(held) = self
            .holders
            .get_mut(source)
            .and_then(|names| names.get_mut(name))
        {
            match held
                .iter_mut()
                .find(|holding| Arc::ptr_eq(&holding.declaration, declaration))
            {
                Some(holding) => holding.registries += 1,
                None => {
                    held.push(Holding {
                        declaration: declaration.clone(),
                        registries: 1,
                    });
                    self.tools += 1;
                }
            }
            return;
        }
        self.holders.entry(source.to_owned()).or_default().insert(
            name.to_owned(),
            vec![Holding {
                declaration: declaration.clone(),
                registries: 1,
            }],
        );
        self.tools += 1;
    }

    fn release(&mut self, source: &str, name: &str, declaration: &Arc<Declaration>) {
        let Some(names) = self.holders.get_mut(source) else {
            return;
        };
        if let Some(held) = names.get_mut(name)
            && let Some(at) = held
                .iter()
                .position(|holding| Arc::ptr_eq(&holding.declaration, declaration))
        {
            held[at].registries -= 1;
            if held[at].registries == 0 {
                held.swap_remove(at);
                self.tools -= 1;
            }
            if held.is_empty() {
                names.remove(name);
            }
        }
        if names.is_empty() {
            self.holders.remove(source);
        }
    }

    fn insert(&mut self, character_id: &str, tool: RemoteTool) -> Registered {
        // Held before the previous registration is released, so a replacement
        // by the same source keeps its holder keys instead of freeing and
        // making them again.
        self.hold(&tool.source, &tool.name, &tool.declaration);
        // The character's registry is there after its first registration;
        // its id is copied only to make it.
        let tools = match self.by_character.get_mut(character_id) {
            Some(tools) => tools,
            None => self
                .by_character
                .entry(character_id.to_owned())
                .or_default(),
        };
        let previous = tools.insert(tool.name.clone(), Arc::new(tool));
        if let Some(previous) = &previous {
            self.release(&previous.source, &previous.name, &previous.declaration);
        }
        match previous {
            Some(_) => Registered::Replaced,
            None => Registered::Added,
        }
    }

    fn remove(&mut self, character_id: &str, name: &str) -> Option<Arc<RemoteTool>> {
        let removed = self.by_character.get_mut(character_id)?.remove(name)?;
        self.release(&removed.source, &removed.name, &removed.declaration);
        Some(removed)
    }

    /// Removes the tools of one registry that `pick` selects; returns their names.
    fn remove_where(
        &mut self,
        character_id: &str,
        pick: impl Fn(&RemoteTool) -> bool,
    ) -> Vec<String> {
        let Some(tools) = self.by_character.get(character_id) else {
            return Vec::new();
        };
        let names: Vec<String> = tools
            .values()
            .filter(|tool| pick(tool))
            .map(|tool| tool.name.clone())
            .collect();
        for name in &names {
            self.remove(character_id, name);
        }
        names
    }

    /// Refuses `tool` for `roles` when holding it would pass a limit: a new
    /// name past its source's limit, or a new declaration (`shared` is `None`:
    /// no registry holds an equal one) past the total. Accounts for the
    /// declarations it displaces, which disappear when every registry holding
    /// them is one of `roles`.
    fn admit(
        &self,
        limits: &RegistrationLimits,
        roles: &[Role],
        tool: &NewRemoteTool,
        shared: Option<&Arc<Declaration>>,
    ) -> Result<()> {
        if roles.is_empty() || shared.is_some() {
            return Ok(());
        }
        let source_tools = self.holders.get(&tool.source);
        if !source_tools.is_some_and(|names| names.contains_key(&tool.name)) {
            let in_source = source_tools.map_or(0, FastMap::len);
            if in_source >= limits.max_tools_per_source {
                return Err(Error::refused(
                    ErrorCode::LimitExceeded,
                    format!(
                        "this source already holds {in_source} runtime tools, the limit max_runtime_tools_per_source = {} (--max-runtime-tools-per-source); unregister or clear some first",
                        limits.max_tools_per_source
                    ),
                ));
            }
        }
        let mut displaced: Vec<(&RemoteTool, usize)> = Vec::new();
        for role in roles {
            let Some(old) = self
                .by_character
                .get(&role.character_id)
                .and_then(|tools| tools.get(&tool.name))
            else {
                continue;
            };
            match displaced.iter_mut().find(|(held, _)| {
                held.source == old.source && Arc::ptr_eq(&held.declaration, &old.declaration)
            }) {
                Some((_, count)) => *count += 1,
                None => displaced.push((old, 1)),
            }
        }
        let vanishing = displaced
            .iter()
            .filter(|(old, count)| {
                self.holders_of_declaration(&old.source, &old.name, &old.declaration) == *count
            })
            .count();
        if self.tools + 1 - vanishing > limits.max_tools {
            return Err(Error::refused(
                ErrorCode::LimitExceeded,
                format!(
                    "the server already holds {} runtime tool declarations (one per tool, or more where roles hold it with different content), the limit max_runtime_tools = {} (--max-runtime-tools); unregister or clear some first",
                    self.tools, limits.max_tools
                ),
            ));
        }
        Ok(())
    }

    /// The declaration another registry already holds for this tool when it is
    /// the same, so that registering it role by role does not copy it per role.
    fn same_declaration(&self, tool: &NewRemoteTool) -> Option<Arc<Declaration>> {
        if self.holders_of(&tool.source, &tool.name) == 0 {
            return None;
        }
        self.by_character
            .values()
            .filter_map(|tools| tools.get(&tool.name))
            .find(|held| held.source == tool.source && held.declaration == tool.declaration)
            .map(|held| held.declaration.clone())
    }
}

/// Per-character registries of remote tools, keyed by character id so that a
/// renamed character keeps its tools and a deleted one cannot pass them on to a
/// later character of the same name. Also owns the shared callback client and the
/// eviction counters.
#[derive(Debug)]
pub struct RemoteRegistry {
    registries: Mutex<Registries>,
    limits: RegistrationLimits,
    client: CallbackClient,
    failures: FailureCounter,
    listing: ListingCache,
}

impl RemoteRegistry {
    pub fn new(settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            registries: Mutex::new(Registries::default()),
            limits: RegistrationLimits::from_settings(settings),
            client: CallbackClient::new(settings.callback_response_limit_bytes)?,
            failures: FailureCounter::default(),
            listing: ListingCache::default(),
        })
    }

    // A poisoned lock only means another request panicked mid-update; every
    // update checks before it changes anything, and each change keeps the
    // registries and their counts in step.
    fn lock(&self) -> MutexGuard<'_, Registries> {
        self.registries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn limits(&self) -> &RegistrationLimits {
        &self.limits
    }

    /// Registers `tool` in every role's registry, replacing a same-named tool,
    /// or refuses it (`limit_exceeded`) when it would pass a limit. The check and
    /// the inserts hold one lock, so concurrent registrations cannot overshoot.
    pub fn register(&self, roles: &[Role], tool: &NewRemoteTool) -> Result<Vec<Registered>> {
        let mut registries = self.lock();
        let shared = registries.same_declaration(tool);
        registries.admit(&self.limits, roles, tool, shared.as_ref())?;
        let declaration = shared.unwrap_or_else(|| tool.declaration.clone());
        let registration = Arc::new(Registration::new(tool, declaration));
        Ok(roles
            .iter()
            .map(|role| {
                let held = RemoteTool {
                    role: role.name.clone(),
                    registration: registration.clone(),
                };
                registries.insert(&role.character_id, held)
            })
            .collect())
    }

    /// Removes one name from one character's registry; true when it was there.
    pub fn unregister(&self, character_id: &str, name: &str) -> bool {
        self.lock().remove(character_id, name).is_some()
    }

    /// Removes every tool carrying `source` from one registry; returns their names.
    pub fn clear_source(&self, character_id: &str, source: &str) -> Vec<String> {
        self.lock()
            .remove_where(character_id, |tool| tool.source == source)
    }

    /// Removes the tools of `source` whose callback lives at `origin`, from every
    /// registry; returns the removed names per character id.
    pub fn evict_origin(&self, origin: &str, source: &str) -> Vec<(String, Vec<String>)> {
        let mut registries = self.lock();
        let character_ids: Vec<String> = registries.by_character.keys().cloned().collect();
        character_ids
            .into_iter()
            .filter_map(|character_id| {
                let names = registries.remove_where(&character_id, |tool| {
                    tool.source == source && tool.callback_url.origin() == origin
                });
                (!names.is_empty()).then_some((character_id, names))
            })
            .collect()
    }

    /// Drops the registries of characters not in `existing`; returns how many.
    /// Sound only when `existing` was read from the store inside the same
    /// catalog mutation (see the ordering argument in `manager`), so it is
    /// reachable from this module only.
    fn retain_characters(&self, existing: &crate::fast_map::FastSet<&str>) -> usize {
        let mut registries = self.lock();
        let gone: Vec<String> = registries
            .by_character
            .keys()
            .filter(|id| !existing.contains(id.as_str()))
            .cloned()
            .collect();
        for character_id in &gone {
            registries.remove_where(character_id, |_| true);
            registries.by_character.remove(character_id);
        }
        gone.len()
    }

    /// The last whole `GET /api/tools` answer, kept while what it lists is
    /// unchanged.
    pub fn listing_cache(&self) -> &ListingCache {
        &self.listing
    }

    /// One character's tools, by name.
    pub fn list(&self, character_id: &str) -> Vec<Arc<RemoteTool>> {
        self.lock()
            .by_character
            .get(character_id)
            .map(|tools| tools.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Appends the catalog entry key of each of one character's tools, in
    /// the order of `list`.
    pub fn entry_keys(&self, character_id: &str, keys: &mut Vec<EntryKey>) {
        if let Some(tools) = self.lock().by_character.get(character_id) {
            keys.extend(
                tools
                    .values()
                    .map(|tool| EntryKey::new(tool.shared_spec(), Availability::Available)),
            );
        }
    }

    /// One character's tool called `name`, if it has one.
    pub fn named(&self, character_id: &str, name: &str) -> Option<Arc<RemoteTool>> {
        self.lock()
            .by_character
            .get(character_id)
            .and_then(|tools| tools.get(name).cloned())
    }

    pub fn client(&self) -> &CallbackClient {
        &self.client
    }

    pub fn failures(&self) -> &FailureCounter {
        &self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str) -> RegistrationInput {
        RegistrationInput {
            name: name.to_owned(),
            callback_url: "http://127.0.0.1:9333/cb".to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_follow_the_contract() {
        let tool = NewRemoteTool::validate(input("get_weather")).unwrap();
        assert_eq!(tool.declaration.description, "");
        assert_eq!(tool.source, "external");
        assert_eq!(tool.timeout_seconds, 30.0);
        assert_eq!(
            *tool.declaration.parameters,
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(
            tool.declaration.metadata.side_effect_level,
            SideEffectLevel::None
        );
        assert_eq!(
            tool.declaration.metadata.side_effect_level_basis,
            Basis::PlatformDefault
        );
        assert_eq!(tool.declaration.metadata.replay_safety, ReplaySafety::Safe);
        assert_eq!(
            tool.declaration.metadata.replay_safety_basis,
            Basis::InferredFromExecutionPolicy
        );
        assert_eq!(
            tool.declaration.metadata.async_capability,
            AsyncCapability::InlineOnly
        );
    }

    #[test]
    fn declared_metadata_is_tool_declared() {
        let mut raw = input("launch");
        raw.declared.side_effect_level = Some(SideEffectLevel::Irreversible);
        let tool = NewRemoteTool::validate(raw).unwrap();
        assert_eq!(
            tool.declaration.metadata.side_effect_level_basis,
            Basis::ToolDeclared
        );
        assert_eq!(
            tool.declaration.metadata.replay_safety,
            ReplaySafety::NeverAutoReplay
        );
    }

    #[test]
    fn timeout_bounds() {
        for bad in [0.0, -1.0, 300.01, 1000.0] {
            let mut raw = input("t");
            raw.timeout_seconds = Some(bad);
            assert!(NewRemoteTool::validate(raw).is_err(), "{bad}");
        }
        for good in [0.001, 1.0, 300.0] {
            let mut raw = input("t");
            raw.timeout_seconds = Some(good);
            assert!(NewRemoteTool::validate(raw).is_ok(), "{good}");
        }
    }

    #[test]
    fn names_are_1_to_64_characters() {
        assert!(NewRemoteTool::validate(input("")).is_err());
        assert!(NewRemoteTool::validate(input(&"a".repeat(65))).is_err());
        assert!(NewRemoteTool::validate(input(&"天".repeat(64))).is_ok());
        assert!(NewRemoteTool::validate(input("get.weather")).is_ok());
    }

    fn registry(limits: RegistrationLimits) -> RemoteRegistry {
        let settings = Settings::for_data_dir(std::path::Path::new("/nonexistent"));
        let mut registry = RemoteRegistry::new(&settings).unwrap();
        registry.limits = limits;
        registry
    }

    fn roles(ids: &[&str]) -> Vec<Role> {
        ids.iter()
            .map(|id| Role {
                character_id: (*id).to_owned(),
                name: format!("role {id}"),
            })
            .collect()
    }

    fn tool(name: &str, source: &str) -> NewRemoteTool {
        let mut raw = input(name);
        raw.source = Some(source.to_owned());
        NewRemoteTool::validate(raw).unwrap()
    }

    fn limited(max_tools: usize, max_tools_per_source: usize) -> RemoteRegistry {
        registry(RegistrationLimits {
            max_tools,
            max_tools_per_source,
            ..Default::default()
        })
    }

    #[test]
    fn eviction_only_touches_that_origin_and_source() {
        let registry = registry(RegistrationLimits::default());
        let make = |name: &str, url: &str, source: &str| {
            let mut raw = input(name);
            raw.callback_url = url.to_owned();
            raw.source = Some(source.to_owned());
            NewRemoteTool::validate(raw).unwrap()
        };
        let register = |id: &str, tool: NewRemoteTool| {
            registry.register(&roles(&[id]), &tool).unwrap();
        };
        register("c1", make("a", "http://127.0.0.1:1/x", "plugin:p"));
        register("c2", make("a", "http://127.0.0.1:1/y", "plugin:p"));
        register("c1", make("b", "http://127.0.0.1:2/x", "plugin:p"));
        register("c1", make("c", "http://127.0.0.1:1/x", "external"));
        let mut evicted = registry.evict_origin("http://127.0.0.1:1", "plugin:p");
        evicted.sort();
        assert_eq!(
            evicted,
            vec![
                ("c1".to_owned(), vec!["a".to_owned()]),
                ("c2".to_owned(), vec!["a".to_owned()])
            ]
        );
        let left: Vec<String> = registry.list("c1").iter().map(|t| t.name.clone()).collect();
        assert_eq!(left, ["b", "c"]);
        assert_eq!(registry.lock().tools, 2);
    }

    #[test]
    fn the_roles_of_one_registration_share_its_spec_and_the_next_brings_its_own() {
        let registry = registry(RegistrationLimits::default());
        let both = roles(&["c1", "c2"]);
        registry.register(&both, &tool("a", "s")).unwrap();
        let spec = |id: &str| registry.list(id)[0].spec();
        assert!(
            Arc::ptr_eq(&spec("c1"), &spec("c2")),
            "one spec for both roles"
        );
        assert_eq!(spec("c1").name, "a");
        let (c1, c2) = (&registry.list("c1")[0], &registry.list("c2")[0]);
        assert!(
            Arc::ptr_eq(&c1.registration, &c2.registration),
            "one registration, listed once, for both roles"
        );
        assert_eq!((c1.role.as_str(), c2.role.as_str()), ("role c1", "role c2"));
        // A replacement is a new registration: its spec is built anew, once.
        let before = spec("c1");
        registry.register(&both, &tool("a", "s")).unwrap();
        assert!(!Arc::ptr_eq(&before, &spec("c1")));
        assert!(Arc::ptr_eq(&spec("c1"), &spec("c2")));
    }

    #[test]
    fn a_tool_of_many_roles_counts_once_and_replacing_never_counts() {
        let registry = limited(2, 2);
        let all = roles(&["c1", "c2", "c3"]);
        registry.register(&all, &tool("a", "s")).unwrap();
        registry.register(&all, &tool("b", "s")).unwrap();
        assert_eq!(registry.lock().tools, 2);
        // Same source and name: a replacement, for all roles or for one.
        registry.register(&all, &tool("a", "s")).unwrap();
        registry.register(&roles(&["c2"]), &tool("b", "s")).unwrap();
        let err = registry.register(&all, &tool("c", "s")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::LimitExceeded);
        assert!(
            err.to_string().contains("max_runtime_tools_per_source = 2"),
            "{err}"
        );
        // Removing the tool from every role frees its place.
        for id in ["c1", "c2", "c3"] {
            registry.unregister(id, "a");
        }
        registry.register(&all, &tool("c", "s")).unwrap();
        assert_eq!(registry.lock().tools, 2);
    }

    #[test]
    fn the_total_counts_every_source_and_displaced_tools_free_their_place() {
        let registry = limited(2, 10);
        registry
            .register(&roles(&["c1", "c2"]), &tool("a", "s1"))
            .unwrap();
        registry
            .register(&roles(&["c1"]), &tool("b", "s2"))
            .unwrap();
        let err = registry
            .register(&roles(&["c1"]), &tool("c", "s3"))
            .unwrap_err();
        assert!(err.to_string().contains("max_runtime_tools = 2"), "{err}");
        // s3's "b" replaces s2's only "b": still two tools.
        registry
            .register(&roles(&["c1"]), &tool("b", "s3"))
            .unwrap();
        // s3's "a" in c1 only leaves s1's "a" in c2: that would be three.
        assert!(
            registry
                .register(&roles(&["c1"]), &tool("a", "s3"))
                .is_err()
        );
        registry.clear_source("c1", "s1");
        registry.clear_source("c2", "s1");
        registry.clear_source("c1", "s3");
        assert_eq!(registry.lock().tools, 0);
        assert!(registry.lock().holders.is_empty());
        // Registering for no role at all holds nothing and is never refused.
        registry.register(&[], &tool("z", "s9")).unwrap();
    }

    /// `name` of `source` with `description`: another declaration per text.
    fn described(name: &str, source: &str, description: &str) -> NewRemoteTool {
        let mut raw = input(name);
        raw.source = Some(source.to_owned());
        raw.description = Some(description.to_owned());
        NewRemoteTool::validate(raw).unwrap()
    }

    #[test]
    fn a_tool_held_with_different_content_per_role_counts_once_per_content() {
        let registry = limited(2, 10);
        registry
            .register(&roles(&["c1"]), &described("a", "s", "one"))
            .unwrap();
        registry
            .register(&roles(&["c2"]), &described("a", "s", "two"))
            .unwrap();
        assert_eq!(registry.lock().tools, 2);
        // A third content would be a third declaration held in memory.
        let err = registry
            .register(&roles(&["c3"]), &described("a", "s", "three"))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::LimitExceeded);
        assert!(err.to_string().contains("max_runtime_tools = 2"), "{err}");
        // Content already held is shared, never refused.
        registry
            .register(&roles(&["c3"]), &described("a", "s", "one"))
            .unwrap();
        assert_eq!(registry.lock().tools, 2);
        // New content for every role holding the old ones replaces them all.
        registry
            .register(&roles(&["c1", "c2", "c3"]), &described("a", "s", "four"))
            .unwrap();
        assert_eq!(registry.lock().tools, 1);
        for id in ["c1", "c2", "c3"] {
            registry.unregister(id, "a");
        }
        assert_eq!(registry.lock().tools, 0);
        assert!(registry.lock().holders.is_empty());
    }

    #[test]
    fn roles_share_one_declaration() {
        let registry = registry(RegistrationLimits::default());
        registry
            .register(&roles(&["c1", "c2"]), &tool("a", "s"))
            .unwrap();
        // Registered again role by role, with the same content: still shared.
        registry.register(&roles(&["c3"]), &tool("a", "s")).unwrap();
        let held: Vec<Arc<RemoteTool>> = ["c1", "c2", "c3"]
            .iter()
            .map(|id| registry.list(id).remove(0))
            .collect();
        assert!(Arc::ptr_eq(&held[0].declaration, &held[1].declaration));
        assert!(Arc::ptr_eq(&held[0].declaration, &held[2].declaration));
        assert_eq!(held[2].role, "role c3");
        // Retaining no character releases everything.
        drop(held);
        registry.retain_characters(&Default::default());
        let registries = registry.lock();
        assert_eq!((registries.tools, registries.by_character.len()), (0, 0));
    }

    #[test]
    fn the_size_limit_counts_schema_and_description() {
        let schema = json!({"type": "object", "properties": {"x": {"type": "string"}}});
        let schema_len = schema.to_string().len();
        let mut raw = input("t");
        raw.parameters = Some(schema);
        raw.description = Some("d".repeat(10));
        assert!(NewRemoteTool::validate_within(raw.clone(), schema_len + 10).is_ok());
        let err = NewRemoteTool::validate_within(raw, schema_len + 9).unwrap_err();
        assert!(err.to_string().contains("max_tool_schema_bytes"), "{err}");
    }
}
