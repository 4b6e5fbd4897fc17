//! A session's runtime catalog: every tool visible to it, with availability and
//! the metadata basis of each governance value, and name conflicts between providers.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::domain::tool::ToolSpec;

/// Whether a catalog entry can be called now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// How to run a tool: a closed set, one variant per provider kind.
#[derive(Debug, Clone)]
pub enum Invoker {
    /// A builtin, by name (context-free, session-context or resource tool).
    Builtin(&'static str),
    /// A callback registered through `/api/tools`.
    Remote(Arc<crate::tools::remote::RemoteTool>),
    /// A custom definition of the account (`/tools/definitions`).
    Preset(Arc<crate::tools::preset::PresetTool>),
}

/// One tool in a catalog.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub spec: ToolSpec,
    pub invoker: Invoker,
    pub availability: Availability,
    pub availability_reason: Option<String>,
    pub catalog_source: Option<CatalogSource>,
}

impl CatalogEntry {
    pub fn available(spec: ToolSpec, invoker: Invoker) -> Self {
        Self {
            spec,
            invoker,
            availability: Availability::Available,
            availability_reason: None,
            catalog_source: None,
        }
    }

    /// The entry as the seed's runtime-catalog JSON shows it.
    pub fn to_json(&self) -> Value {
        let meta = &self.spec.metadata;
        let detail =
            |basis: crate::domain::tool::Basis| json!({"basis": basis, "scope": basis.scope()});
        json!({
            "name": self.spec.name,
            "description": self.spec.description,
            "parameters": self.spec.parameters,
            "provider_id": self.spec.provider_id,
            "provider_type": self.spec.provider_type,
            "source": self.spec.source,
            "side_effect_level": meta.side_effect_level,
            "allowed_slots": meta.allowed_slots,
            "availability": self.availability.as_str(),
            "availability_reason": self.availability_reason,
            "async_capability": meta.async_capability,
            "default_delivery_mode": meta.default_delivery_mode,
            "catalog_source": self.catalog_source.map(CatalogSource::as_str),
            "replay_safety": meta.replay_safety,
            "result_visibility": meta.result_visibility(),
            "side_effect_level_basis": meta.side_effect_level_basis,
            "allowed_slots_basis": meta.allowed_slots_basis,
            "parameter_schema_basis": meta.parameter_schema_basis,
            "replay_safety_basis": meta.replay_safety_basis,
            "metadata_basis_detail": {
                "side_effect_level": detail(meta.side_effect_level_basis),
                "allowed_slots": detail(meta.allowed_slots_basis),
                "parameter_schema": detail(meta.parameter_schema_basis),
                "replay_safety": detail(meta.replay_safety_basis),
            },
        })
    }
}

impl CatalogEntry {
    /// The entry as one element of an OpenAI chat-completions `tools` array.
    pub fn to_openai_tool(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.spec.name,
                "description": self.spec.description,
                "parameters": self.spec.parameters,
            },
        })
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

/// The result of looking a called name up in a catalog.
#[derive(Debug)]
pub enum Lookup<'a> {
    Found(&'a CatalogEntry),
    Unknown,
    Conflict(&'a Conflict),
    Unavailable(&'a CatalogEntry),
}

impl Catalog {
    /// Builds a catalog from every provider's entries, marking shared names as conflicts.
    pub fn assemble(session_id: &str, mut entries: Vec<CatalogEntry>) -> Self {
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for entry in &entries {
            by_name
                .entry(entry.spec.name.clone())
                .or_default()
                .push(entry.spec.provider_id.clone());
        }
        let conflicts: Vec<Conflict> = by_name
            .into_iter()
            .filter(|(_, providers)| providers.len() > 1)
            .map(|(name, provider_ids)| Conflict { name, provider_ids })
            .collect();
        for entry in &mut entries {
            if let Some(conflict) = conflicts.iter().find(|c| c.name == entry.spec.name) {
                entry.availability = Availability::Conflict;
                entry.availability_reason = Some(format!(
                    "the name {:?} is offered by several providers ({}); calls to it are refused until only one offers it",
                    conflict.name,
                    conflict.provider_ids.join(", ")
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

    pub fn lookup(&self, name: &str) -> Lookup<'_> {
        if let Some(conflict) = self.conflicts.iter().find(|c| c.name == name) {
            return Lookup::Conflict(conflict);
        }
        match self.entries.iter().find(|e| e.spec.name == name) {
            None => Lookup::Unknown,
            Some(entry) if entry.availability == Availability::Available => Lookup::Found(entry),
            Some(entry) => Lookup::Unavailable(entry),
        }
    }
}
