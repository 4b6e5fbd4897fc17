//! From an MCP server's tool list to catalog specs: names with the server's
//! prefix, input schemas projected into `parameters`, and governance metadata
//! decided by the account's overrides, trusted annotations, the server's
//! defaults or the platform default, each with its basis.

use std::sync::Arc;

use rmcp::model::Tool;
use serde_json::{Map, Value, json};

use crate::domain::mcp::{McpServer, ToolOverride};
use crate::domain::tool::{
    AsyncCapability, Basis, DeliveryMode, ProviderType, ReplaySafety, SideEffectLevel,
    ToolMetadata, ToolSpec,
};

/// The `source` of every MCP catalog entry.
pub const SOURCE: &str = "mcp";

/// Longest catalog name a model accepts (OpenAI's function-name rule).
const MAX_NAME_CHARS: usize = 64;

/// Deepest `$ref` chain inlined into `parameters`; deeper (or recursive)
/// references become an open schema.
const MAX_REF_DEPTH: usize = 8;

/// The provider id of a server's tools.
pub fn provider_id(server_id: &str) -> String {
    format!("mcp:{server_id}")
}

/// One server tool as the catalog offers it.
#[derive(Debug, Clone)]
pub struct CatalogTool {
    /// The server's own name (what `tools/call` is sent with).
    pub remote_name: String,
    /// Shared with every catalog that offers it (one per call).
    pub spec: Arc<ToolSpec>,
}

/// Why a listed tool is left out of the catalog.
#[derive(Debug, Clone, PartialEq)]
pub enum Skipped {
    /// Hidden by an override (`enabled: false`).
    Disabled,
    /// Its catalog name would not be a valid tool name.
    BadName(String),
    /// Its input schema is too large, too costly or not a usable schema.
    BadSchema(String),
    /// An earlier tool of the same listing has its catalog name.
    Duplicate,
}

/// Builds the catalog tools of `server` from its listed tools. CPU work (schemas
/// are checked): run it off the async workers.
pub fn catalog_tools(
    server: &McpServer,
    listed: &[Tool],
    max_schema_bytes: usize,
) -> (Vec<CatalogTool>, Vec<(String, Skipped)>) {
    let mut tools = Vec::new();
    let mut skipped = Vec::new();
    // One server listing a name many times would otherwise put a conflict
    // of that many entries, each naming all the others, into every catalog.
    let mut names = std::collections::HashSet::new();
    for tool in listed {
        if !names.insert(tool.name.as_ref()) {
            skipped.push((tool.name.to_string(), Skipped::Duplicate));
            continue;
        }
        match catalog_tool(server, tool, max_schema_bytes) {
            Ok(entry) => tools.push(entry),
            Err(why) => skipped.push((tool.name.to_string(), why)),
        }
    }
    (tools, skipped)
}

fn catalog_tool(
    server: &McpServer,
    tool: &Tool,
    max_schema_bytes: usize,
) -> Result<CatalogTool, Skipped> {
    let config = &server.config;
    let overrides = config.tool_overrides.get(tool.name.as_ref());
    if overrides.and_then(|o| o.enabled) == Some(false) {
        return Err(Skipped::Disabled);
    }
    let name = config.catalog_name(&tool.name);
    if !valid_catalog_name(&name) {
        return Err(Skipped::BadName(format!(
            "the catalog name {name:?} is not 1-{MAX_NAME_CHARS} of a-z A-Z 0-9 _ -"
        )));
    }
    let description = tool.description.as_deref().unwrap_or_default().to_owned();
    if description.len() > max_schema_bytes {
        return Err(Skipped::BadSchema(format!(
            "its description takes {} bytes, more than max_tool_schema_bytes = {max_schema_bytes}",
            description.len()
        )));
    }
    let budget = Budget {
        nodes: crate::schema::MAX_EXPANDED_NODES,
        bytes: max_schema_bytes.saturating_sub(description.len()),
    };
    let (parameters, parameter_schema_basis) = project_schema(&tool.input_schema, budget)
        .map_err(|exceeded| Skipped::BadSchema(exceeded.to_string()))?;
    let size = parameters.to_string().len() + description.len();
    if size > max_schema_bytes {
        return Err(Skipped::BadSchema(format!(
            "its schema and description take {size} bytes, more than max_tool_schema_bytes = {max_schema_bytes}"
        )));
    }
    crate::schema::check_schema_validity(&parameters).map_err(Skipped::BadSchema)?;
    let mut metadata = metadata(server, tool, overrides);
    metadata.parameter_schema_basis = parameter_schema_basis;
    Ok(CatalogTool {
        remote_name: tool.name.to_string(),
        spec: Arc::new(ToolSpec {
            name,
            description,
            parameters: Arc::new(parameters),
            validator: Default::default(),
            provider_id: provider_id(&server.id),
            provider_type: ProviderType::Mcp,
            source: SOURCE.to_owned(),
            metadata,
        }),
    })
}

fn valid_catalog_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Governance metadata of one server tool (the rules of issue 14, "Metadata").
fn metadata(server: &McpServer, tool: &Tool, overrides: Option<&ToolOverride>) -> ToolMetadata {
    let config = &server.config;
    let annotations = tool
        .annotations
        .as_ref()
        .filter(|_| config.trust_annotations);
    let (side_effect_level, side_effect_level_basis) =
        if let Some(level) = overrides.and_then(|o| o.side_effect_level) {
            (level, Basis::AccountOverride)
        } else if let Some(annotations) = annotations {
            // The contract has no "writes but can be repeated" level: only a
            // read-only tool is safe without review.
            let level = if annotations.read_only_hint == Some(true) {
                SideEffectLevel::None
            } else {
                SideEffectLevel::Irreversible
            };
            (level, Basis::ToolDeclared)
        } else if let Some(level) = config.default_side_effect_level {
            (level, Basis::ServerDefault)
        } else {
            (SideEffectLevel::Irreversible, Basis::PlatformDefault)
        };
    let (replay_safety, replay_safety_basis) =
        if let Some(safety) = overrides.and_then(|o| o.replay_safety) {
            (safety, Basis::AccountOverride)
        } else if side_effect_level == SideEffectLevel::Irreversible
            && annotations.is_some_and(|a| a.idempotent_hint == Some(true))
        {
            (ReplaySafety::ConfirmOnReplay, Basis::ToolDeclared)
        } else {
            (
                ReplaySafety::inferred_from(side_effect_level),
                Basis::InferredFromExecutionPolicy,
            )
        };
    let (allowed_slots, allowed_slots_basis) =
        if let Some(slots) = overrides.and_then(|o| o.allowed_slots.clone()) {
            (slots, Basis::AccountOverride)
        } else if let Some(slots) = config.default_allowed_slots.clone() {
            (slots, Basis::ServerDefault)
        } else {
            (Vec::new(), Basis::PlatformDefault)
        };
    let async_capability = overrides
        .and_then(|o| o.async_capability)
        .or(config.default_async_capability)
        .unwrap_or(AsyncCapability::InlineOnly);
    let default_delivery_mode = match overrides.and_then(|o| o.default_delivery_mode) {
        Some(mode) if async_capability == AsyncCapability::DeferredOk => mode,
        _ => DeliveryMode::Inline,
    };
    ToolMetadata {
        side_effect_level,
        side_effect_level_basis,
        allowed_slots,
        allowed_slots_basis,
        parameter_schema_basis: Basis::ToolDeclared,
        replay_safety,
        replay_safety_basis,
        async_capability,
        default_delivery_mode,
    }
}

/// What a projected schema may still take. The projection is built value by
/// value against it, so a schema of a few kilobytes whose references fan out
/// (eight definitions, each a choice of eight references to the next) is
/// refused as it grows, not after it has expanded to gigabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// JSON values.
    pub nodes: usize,
    /// Bytes of keys and strings.
    pub bytes: usize,
}

/// Why a projection stopped: it would have been larger than its [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded(Budget);

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its input schema, with its $refs inlined, would take more than {} values or {} bytes of text",
            self.0.nodes, self.0.bytes
        )
    }
}

impl Budget {
    fn take(&mut self, limits: Budget, bytes: usize) -> Result<(), Exceeded> {
        match (self.nodes.checked_sub(1), self.bytes.checked_sub(bytes)) {
            (Some(nodes), Some(bytes)) => {
                *self = Budget { nodes, bytes };
                Ok(())
            }
            _ => Err(Exceeded(limits)),
        }
    }
}

/// The server's input schema as `parameters`: local `$ref`s inlined (models
/// and validators of the peers do not all resolve them) and an object type
/// ensured, within `budget`. The basis says whether anything had to change.
pub fn project_schema(
    input: &Map<String, Value>,
    budget: Budget,
) -> Result<(Value, Basis), Exceeded> {
    let root = Value::Object(input.clone());
    let mut changed = false;
    let mut projection = Projection {
        root: &root,
        limits: budget,
        left: budget,
        changed: &mut changed,
    };
    let mut projected = projection.inline_refs(&root, 0)?;
    if let Value::Object(map) = &mut projected {
        for key in ["$defs", "definitions"] {
            changed |= map.remove(key).is_some();
        }
        if map.get("type").is_none() {
            map.insert("type".into(), json!("object"));
            changed = true;
        }
    }
    let basis = if changed {
        Basis::ShallowSchemaProjection
    } else {
        Basis::ToolDeclared
    };
    Ok((projected, basis))
}

/// One projection under way: the schema it reads references in, and what it
/// may still produce.
struct Projection<'a> {
    root: &'a Value,
    limits: Budget,
    left: Budget,
    changed: &'a mut bool,
}

impl Projection<'_> {
    fn inline_refs(&mut self, value: &Value, depth: usize) -> Result<Value, Exceeded> {
        let text = match value {
            Value::String(text) => text.len(),
            _ => 0,
        };
        self.left.take(self.limits, text)?;
        Ok(match value {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    *self.changed = true;
                    let target = (depth < MAX_REF_DEPTH)
                        .then(|| resolve_local(self.root, reference))
                        .flatten();
                    return match target {
                        Some(target) => self.inline_refs(target, depth + 1),
                        // Unresolvable or too deep (recursive): accept anything here.
                        None => Ok(json!({})),
                    };
                }
                let mut projected = Map::with_capacity(map.len());
                for (key, child) in map {
                    self.left.take(self.limits, key.len())?;
                    projected.insert(key.clone(), self.inline_refs(child, depth)?);
                }
                Value::Object(projected)
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.inline_refs(item, depth))
                    .collect::<Result<_, _>>()?,
            ),
            other => other.clone(),
        })
    }
}

/// The target of a `#/…` JSON pointer reference inside `root`.
fn resolve_local<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::mcp::{McpServerConfig, McpTransport, StdioConfig};
    use rmcp::model::ToolAnnotations;

    fn server(trust: bool, default: Option<SideEffectLevel>) -> McpServer {
        McpServer {
            id: "mcp_1".into(),
            account_id: "acct".into(),
            config: McpServerConfig {
                name: "s".into(),
                transport: McpTransport::Stdio(StdioConfig {
                    command: "x".into(),
                    args: vec![],
                    env: Default::default(),
                    cwd: None,
                }),
                tool_prefix: Some("p".into()),
                enabled: true,
                connect_timeout_ms: 1,
                call_timeout_ms: 1,
                tool_refresh_interval_ms: 0,
                default_side_effect_level: default,
                default_allowed_slots: None,
                trust_annotations: trust,
                default_async_capability: None,
                tool_overrides: Default::default(),
            },
            created_at: 0,
            updated_at: 0,
            secrets_error: None,
        }
    }

    fn tool(read_only: Option<bool>, idempotent: Option<bool>) -> Tool {
        let mut annotations = ToolAnnotations::default();
        annotations.read_only_hint = read_only;
        annotations.idempotent_hint = idempotent;
        let schema = json!({"type": "object", "properties": {}});
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let mut tool = Tool::new("t", "d", Arc::new(schema));
        tool.annotations = Some(annotations);
        tool
    }

    #[test]
    fn annotations_count_only_when_trusted() {
        let meta = metadata(&server(false, None), &tool(Some(true), None), None);
        assert_eq!(meta.side_effect_level, SideEffectLevel::Irreversible);
        assert_eq!(meta.side_effect_level_basis, Basis::PlatformDefault);
        assert_eq!(meta.replay_safety, ReplaySafety::NeverAutoReplay);
        let meta = metadata(&server(true, None), &tool(Some(true), None), None);
        assert_eq!(meta.side_effect_level, SideEffectLevel::None);
        assert_eq!(meta.side_effect_level_basis, Basis::ToolDeclared);
    }

    #[test]
    fn idempotent_lowers_replay_safety_only_when_trusted() {
        let meta = metadata(&server(true, None), &tool(Some(false), Some(true)), None);
        assert_eq!(meta.side_effect_level, SideEffectLevel::Irreversible);
        assert_eq!(meta.replay_safety, ReplaySafety::ConfirmOnReplay);
        let meta = metadata(
            &server(false, Some(SideEffectLevel::Irreversible)),
            &tool(Some(false), Some(true)),
            None,
        );
        assert_eq!(meta.side_effect_level_basis, Basis::ServerDefault);
        assert_eq!(meta.replay_safety, ReplaySafety::NeverAutoReplay);
    }

    #[test]
    fn overrides_win() {
        let overrides = ToolOverride {
            side_effect_level: Some(SideEffectLevel::Sandbox),
            allowed_slots: Some(vec![crate::domain::tool::Slot::Memory]),
            ..Default::default()
        };
        let meta = metadata(
            &server(true, None),
            &tool(Some(true), None),
            Some(&overrides),
        );
        assert_eq!(meta.side_effect_level, SideEffectLevel::Sandbox);
        assert_eq!(meta.side_effect_level_basis, Basis::AccountOverride);
        assert_eq!(meta.allowed_slots_basis, Basis::AccountOverride);
        assert_eq!(meta.replay_safety_basis, Basis::InferredFromExecutionPolicy);
    }

    #[test]
    fn refs_are_inlined_and_recursion_is_bounded() {
        let schema = json!({
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}, "node": {"$ref": "#/$defs/Node"}},
            "$defs": {
                "Item": {"type": "object", "properties": {"id": {"type": "integer"}}},
                "Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}},
            },
        });
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        let (projected, basis) = project_schema(&schema, ROOMY).unwrap();
        assert_eq!(basis, Basis::ShallowSchemaProjection);
        assert_eq!(
            projected["properties"]["item"]["properties"]["id"]["type"],
            "integer"
        );
        assert!(projected.get("$defs").is_none());
        assert!(!projected.to_string().contains("$ref"));
    }

    #[test]
    fn a_name_listed_twice_is_offered_once() {
        let listed = [tool(None, None), tool(Some(true), None), tool(None, None)];
        let (tools, skipped) = catalog_tools(&server(false, None), &listed, 1 << 16);
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].spec.name, "p_t");
        assert_eq!(
            skipped,
            [
                ("t".to_owned(), Skipped::Duplicate),
                ("t".to_owned(), Skipped::Duplicate)
            ]
        );
    }

    #[test]
    fn a_description_over_the_size_is_named_as_the_reason() {
        let mut long = tool(None, None);
        long.description = Some("d".repeat(5000).into());
        let (tools, skipped) = catalog_tools(&server(false, None), &[long], 4096);
        assert!(tools.is_empty());
        assert_eq!(
            skipped,
            [(
                "t".to_owned(),
                Skipped::BadSchema(
                    "its description takes 5000 bytes, more than max_tool_schema_bytes = 4096"
                        .to_owned()
                )
            )]
        );
    }

    #[test]
    fn plain_schemas_stay_declared() {
        let Value::Object(schema) =
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        else {
            unreachable!()
        };
        assert_eq!(
            project_schema(&schema, ROOMY).unwrap().1,
            Basis::ToolDeclared
        );
    }

    const ROOMY: Budget = Budget {
        nodes: 100_000,
        bytes: 1 << 20,
    };

    #[test]
    fn references_that_fan_out_are_refused_while_they_expand() {
        // Eight definitions, each a choice of eight references to the next:
        // a few hundred bytes that would expand to 8^8 values.
        let mut defs = Map::new();
        for level in 0..8 {
            let next = json!({"$ref": format!("#/$defs/d{}", level + 1)});
            defs.insert(format!("d{level}"), json!({"anyOf": vec![next; 8]}));
        }
        defs.insert("d8".into(), json!({"type": "string"}));
        let Value::Object(schema) = json!({
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/d0"}},
            "$defs": defs,
        }) else {
            unreachable!()
        };
        let refused = project_schema(&schema, ROOMY).unwrap_err();
        assert!(refused.to_string().contains("100000 values"), "{refused}");

        // Long text counts too, however few the values.
        let Value::Object(wordy) = json!({"type": "object", "description": "x".repeat(2 << 20)})
        else {
            unreachable!()
        };
        assert!(project_schema(&wordy, ROOMY).is_err());
    }
}
