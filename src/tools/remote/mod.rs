//! Remote tools: HTTP callbacks registered over `/api/tools`, held per character
//! (each character's "session manager"), and the client that calls them.
//!
//! Registrations are runtime state only: nothing here touches the database, so a
//! restart starts with empty registries, as the contract says.

mod client;
mod eviction;
mod manager;
mod provider;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::Settings;
use crate::domain::CallbackUrl;
use crate::domain::tool::{
    AsyncCapability, Basis, DeliveryMode, ProviderType, ReplaySafety, SideEffectLevel,
    ToolMetadata, ToolSpec,
};
use crate::error::{Error, Result};

pub use client::{CallbackClient, Exchange, FailureEffect};
pub use eviction::{EVICTION_THRESHOLD, FailureCounter};
pub use manager::{FailedRole, MutationReport, Role, Target};
pub use provider::RemoteProvider;

/// Sources with this prefix belong to plugins and fall under the eviction rule.
pub const PLUGIN_SOURCE_PREFIX: &str = "plugin:";

/// A registration, validated, before it is bound to any role.
#[derive(Debug, Clone)]
pub struct NewRemoteTool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    /// `parameters` compiled once, shared by the tool's copy in every role.
    pub validator: crate::schema::SchemaValidator,
    pub callback_url: CallbackUrl,
    pub source: String,
    pub timeout_seconds: f64,
    pub metadata: ToolMetadata,
}

/// The optional governance fields a plugin may declare at registration.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeclaredMetadata {
    pub side_effect_level: Option<SideEffectLevel>,
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

impl NewRemoteTool {
    pub const MAX_NAME_CHARS: usize = 64;
    pub const MAX_DESCRIPTION_BYTES: usize = 16 * 1024;
    pub const MAX_SOURCE_CHARS: usize = 128;
    pub const DEFAULT_SOURCE: &'static str = "external";
    pub const DEFAULT_TIMEOUT_SECONDS: f64 = 30.0;
    pub const MAX_TIMEOUT_SECONDS: f64 = 300.0;

    /// Checks every field against the contract and fills in the defaults.
    pub fn validate(input: RegistrationInput) -> Result<Self> {
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
        let (parameters, parameter_schema_basis) = match input.parameters {
            Some(schema) => {
                crate::schema::check_parameter_schema(&schema).map_err(Error::validation)?;
                (schema, Basis::ToolDeclared)
            }
            None => (
                json!({"type": "object", "properties": {}}),
                Basis::PlatformDefault,
            ),
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
            description,
            parameters,
            validator: Default::default(),
            callback_url,
            source,
            timeout_seconds,
            metadata: metadata_for(input.declared, parameter_schema_basis),
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
    ToolMetadata {
        side_effect_level,
        side_effect_level_basis,
        allowed_slots: Vec::new(),
        allowed_slots_basis: Basis::PlatformDefault,
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

/// A callback registered for one role.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub validator: crate::schema::SchemaValidator,
    pub callback_url: CallbackUrl,
    pub source: String,
    pub timeout_seconds: f64,
    /// Name of the character (role) it was registered for.
    pub role: String,
    pub metadata: ToolMetadata,
}

impl RemoteTool {
    pub fn new(tool: &NewRemoteTool, role: &str) -> Self {
        Self {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
            validator: tool.validator.clone(),
            callback_url: tool.callback_url.clone(),
            source: tool.source.clone(),
            timeout_seconds: tool.timeout_seconds,
            role: role.to_owned(),
            metadata: tool.metadata.clone(),
        }
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

    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
            validator: self.validator.clone(),
            provider_id: self.provider_id(),
            provider_type: ProviderType::Remote,
            source: self.source.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// What a registration did to one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    Added,
    Replaced,
}

type ToolsByName = BTreeMap<String, Arc<RemoteTool>>;

/// Per-character registries of remote tools, keyed by character id so that a
/// renamed character keeps its tools and a deleted one cannot pass them on to a
/// later character of the same name. Also owns the shared callback client and the
/// eviction counters.
#[derive(Debug)]
pub struct RemoteRegistry {
    registries: Mutex<HashMap<String, ToolsByName>>,
    client: CallbackClient,
    failures: FailureCounter,
}

impl RemoteRegistry {
    pub fn new(settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            registries: Mutex::new(HashMap::new()),
            client: CallbackClient::new(settings.callback_response_limit_bytes)?,
            failures: FailureCounter::default(),
        })
    }

    // A poisoned lock only means another request panicked mid-update of a map
    // whose every update is a single insert/remove; the data is still consistent.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, ToolsByName>> {
        self.registries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers or replaces a same-named tool in one character's registry.
    pub fn register(&self, character_id: &str, tool: RemoteTool) -> Registered {
        let mut registries = self.lock();
        let tools = registries.entry(character_id.to_owned()).or_default();
        match tools.insert(tool.name.clone(), Arc::new(tool)) {
            Some(_) => Registered::Replaced,
            None => Registered::Added,
        }
    }

    /// Removes one name from one character's registry; true when it was there.
    pub fn unregister(&self, character_id: &str, name: &str) -> bool {
        let mut registries = self.lock();
        registries
            .get_mut(character_id)
            .is_some_and(|tools| tools.remove(name).is_some())
    }

    /// Removes every tool carrying `source` from one registry; returns their names.
    pub fn clear_source(&self, character_id: &str, source: &str) -> Vec<String> {
        let mut registries = self.lock();
        let Some(tools) = registries.get_mut(character_id) else {
            return Vec::new();
        };
        let names: Vec<String> = tools
            .values()
            .filter(|tool| tool.source == source)
            .map(|tool| tool.name.clone())
            .collect();
        for name in &names {
            tools.remove(name);
        }
        names
    }

    /// Removes the tools of `source` whose callback lives at `origin`, from every
    /// registry; returns the removed names per character id.
    pub fn evict_origin(&self, origin: &str, source: &str) -> Vec<(String, Vec<String>)> {
        let mut registries = self.lock();
        let mut evicted = Vec::new();
        for (character_id, tools) in registries.iter_mut() {
            let names: Vec<String> = tools
                .values()
                .filter(|tool| tool.source == source && tool.callback_url.origin() == origin)
                .map(|tool| tool.name.clone())
                .collect();
            if names.is_empty() {
                continue;
            }
            for name in &names {
                tools.remove(name);
            }
            evicted.push((character_id.clone(), names));
        }
        evicted
    }

    /// Drops the registries of characters not in `existing`; returns how many.
    /// Sound only when `existing` was read from the store inside the same
    /// catalog mutation (see the ordering argument in `manager`), so it is
    /// reachable from this module only.
    fn retain_characters(&self, existing: &HashSet<String>) -> usize {
        let mut registries = self.lock();
        let before = registries.len();
        registries.retain(|id, _| existing.contains(id));
        before - registries.len()
    }

    /// One character's tools, by name.
    pub fn list(&self, character_id: &str) -> Vec<Arc<RemoteTool>> {
        self.lock()
            .get(character_id)
            .map(|tools| tools.values().cloned().collect())
            .unwrap_or_default()
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
        assert_eq!(tool.description, "");
        assert_eq!(tool.source, "external");
        assert_eq!(tool.timeout_seconds, 30.0);
        assert_eq!(tool.parameters, json!({"type": "object", "properties": {}}));
        assert_eq!(tool.metadata.side_effect_level, SideEffectLevel::None);
        assert_eq!(
            tool.metadata.side_effect_level_basis,
            Basis::PlatformDefault
        );
        assert_eq!(tool.metadata.replay_safety, ReplaySafety::Safe);
        assert_eq!(
            tool.metadata.replay_safety_basis,
            Basis::InferredFromExecutionPolicy
        );
        assert_eq!(tool.metadata.async_capability, AsyncCapability::InlineOnly);
    }

    #[test]
    fn declared_metadata_is_tool_declared() {
        let mut raw = input("launch");
        raw.declared.side_effect_level = Some(SideEffectLevel::Irreversible);
        let tool = NewRemoteTool::validate(raw).unwrap();
        assert_eq!(tool.metadata.side_effect_level_basis, Basis::ToolDeclared);
        assert_eq!(tool.metadata.replay_safety, ReplaySafety::NeverAutoReplay);
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

    #[test]
    fn eviction_only_touches_that_origin_and_source() {
        let settings = Settings::for_data_dir(std::path::Path::new("/nonexistent"));
        let registry = RemoteRegistry::new(&settings).unwrap();
        let make = |name: &str, url: &str, source: &str| {
            let mut raw = input(name);
            raw.callback_url = url.to_owned();
            raw.source = Some(source.to_owned());
            RemoteTool::new(&NewRemoteTool::validate(raw).unwrap(), "r")
        };
        registry.register("c1", make("a", "http://127.0.0.1:1/x", "plugin:p"));
        registry.register("c2", make("a", "http://127.0.0.1:1/y", "plugin:p"));
        registry.register("c1", make("b", "http://127.0.0.1:2/x", "plugin:p"));
        registry.register("c1", make("c", "http://127.0.0.1:1/x", "external"));
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
    }
}
