//! The vocabulary of tools: governance metadata, where a tool comes from, and the
//! validated name a model may call it by.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What running a tool may change in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SideEffectLevel {
    /// Reads or computes only.
    None,
    /// Changes session state only (variables, resources); buffered per attempt.
    Sandbox,
    /// Changes something outside toolgate that cannot be undone.
    Irreversible,
}

impl SideEffectLevel {
    pub const ALL: [SideEffectLevel; 3] = [
        SideEffectLevel::None,
        SideEffectLevel::Sandbox,
        SideEffectLevel::Irreversible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SideEffectLevel::None => "none",
            SideEffectLevel::Sandbox => "sandbox",
            SideEffectLevel::Irreversible => "irreversible",
        }
    }

    pub fn parse(raw: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|level| level.as_str() == raw)
            .ok_or_else(|| {
                Error::validation(format!(
                    "unknown side_effect_level {raw:?}; levels are none, sandbox, irreversible"
                ))
            })
    }
}

/// Whether an execution may be repeated when a floor is regenerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplaySafety {
    Safe,
    ConfirmOnReplay,
    NeverAutoReplay,
    Uncertain,
}

impl ReplaySafety {
    /// The replay policy implied by a side-effect level (DESIGN.md, "Metadata and basis").
    pub fn inferred_from(level: SideEffectLevel) -> Self {
        match level {
            SideEffectLevel::None | SideEffectLevel::Sandbox => ReplaySafety::Safe,
            SideEffectLevel::Irreversible => ReplaySafety::NeverAutoReplay,
        }
    }
}

/// Whether a tool can answer later through a runtime job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AsyncCapability {
    InlineOnly,
    DeferredOk,
}

/// How a call's result reaches the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryMode {
    Inline,
    AsyncJob,
}

/// What the model sees when the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultVisibility {
    Immediate,
    DeferredReceipt,
}

/// A generation slot (instance) that may call tools.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    Director,
    Memory,
    Narrator,
    Verifier,
}

impl Slot {
    pub const ALL: [Slot; 4] = [Slot::Director, Slot::Memory, Slot::Narrator, Slot::Verifier];

    pub fn parse(raw: &str) -> Result<Self> {
        match raw {
            "director" => Ok(Slot::Director),
            "memory" => Ok(Slot::Memory),
            "narrator" => Ok(Slot::Narrator),
            "verifier" => Ok(Slot::Verifier),
            other => Err(Error::validation(format!(
                "unknown slot {other:?}; slots are director, memory, narrator, verifier"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Slot::Director => "director",
            Slot::Memory => "memory",
            Slot::Narrator => "narrator",
            Slot::Verifier => "verifier",
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a governance value came from (the seed's basis enum). Not a trust score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    ToolDeclared,
    AccountOverride,
    ServerDefault,
    PlatformDefault,
    InferredFromExecutionPolicy,
    ShallowSchemaProjection,
}

impl Basis {
    /// The scope word shown beside the basis in `metadata_basis_detail`.
    pub fn scope(self) -> &'static str {
        match self {
            Basis::ToolDeclared => "tool",
            Basis::AccountOverride => "account",
            Basis::ServerDefault => "server",
            Basis::PlatformDefault => "platform",
            Basis::InferredFromExecutionPolicy => "inference",
            Basis::ShallowSchemaProjection => "projection",
        }
    }
}

/// The kind of provider a tool comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderType {
    Builtin,
    Preset,
    Remote,
    Mcp,
    Unknown,
}

impl ProviderType {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Builtin => "builtin",
            ProviderType::Preset => "preset",
            ProviderType::Remote => "remote",
            ProviderType::Mcp => "mcp",
            ProviderType::Unknown => "unknown",
        }
    }
}

/// Governance metadata of a tool, each value with the basis it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolMetadata {
    pub side_effect_level: SideEffectLevel,
    pub side_effect_level_basis: Basis,
    pub allowed_slots: Vec<Slot>,
    pub allowed_slots_basis: Basis,
    pub parameter_schema_basis: Basis,
    pub replay_safety: ReplaySafety,
    pub replay_safety_basis: Basis,
    pub async_capability: AsyncCapability,
    pub default_delivery_mode: DeliveryMode,
}

impl ToolMetadata {
    /// Metadata a tool declares about itself; replay safety is inferred unless given.
    pub fn declared(
        side_effect_level: SideEffectLevel,
        allowed_slots: Vec<Slot>,
        replay_safety: Option<ReplaySafety>,
    ) -> Self {
        let (replay_safety, replay_safety_basis) = match replay_safety {
            Some(value) => (value, Basis::ToolDeclared),
            None => (
                ReplaySafety::inferred_from(side_effect_level),
                Basis::InferredFromExecutionPolicy,
            ),
        };
        Self {
            side_effect_level,
            side_effect_level_basis: Basis::ToolDeclared,
            allowed_slots,
            allowed_slots_basis: Basis::ToolDeclared,
            parameter_schema_basis: Basis::ToolDeclared,
            replay_safety,
            replay_safety_basis,
            async_capability: AsyncCapability::InlineOnly,
            default_delivery_mode: DeliveryMode::Inline,
        }
    }

    /// The result visibility implied by the delivery mode.
    pub fn result_visibility(&self) -> ResultVisibility {
        if self.async_capability == AsyncCapability::DeferredOk
            && self.default_delivery_mode == DeliveryMode::AsyncJob
        {
            ResultVisibility::DeferredReceipt
        } else {
            ResultVisibility::Immediate
        }
    }
}

/// Everything the runtime knows about one tool offered by one provider.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments, shared with the provider's copy (a remote
    /// tool's schema may be large; building a catalog must not copy it).
    pub parameters: std::sync::Arc<serde_json::Value>,
    /// `parameters` compiled, shared by every copy of this tool's spec.
    pub validator: crate::schema::SchemaValidator,
    pub provider_id: String,
    pub provider_type: ProviderType,
    pub source: String,
    pub metadata: ToolMetadata,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_safety_follows_side_effects() {
        assert_eq!(
            ReplaySafety::inferred_from(SideEffectLevel::None),
            ReplaySafety::Safe
        );
        assert_eq!(
            ReplaySafety::inferred_from(SideEffectLevel::Sandbox),
            ReplaySafety::Safe
        );
        assert_eq!(
            ReplaySafety::inferred_from(SideEffectLevel::Irreversible),
            ReplaySafety::NeverAutoReplay
        );
        let declared = ToolMetadata::declared(SideEffectLevel::Irreversible, vec![], None);
        assert_eq!(
            declared.replay_safety_basis,
            Basis::InferredFromExecutionPolicy
        );
        let declared = ToolMetadata::declared(
            SideEffectLevel::Irreversible,
            vec![],
            Some(ReplaySafety::ConfirmOnReplay),
        );
        assert_eq!(declared.replay_safety_basis, Basis::ToolDeclared);
    }

    #[test]
    fn slots_parse_closed_set() {
        assert_eq!(Slot::parse("narrator").unwrap(), Slot::Narrator);
        assert!(Slot::parse("writer").is_err());
    }
}
