//! Resource tools: list, read, write and delete the session's named text and
//! JSON documents.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::{SideEffectLevel, Slot};
use crate::store::ResourceContent;

/// Slots that may change resources: not the verifier, which only checks replies.
const WRITERS: &[Slot] = &[Slot::Director, Slot::Memory, Slot::Narrator];

/// `list_resources` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {}

/// Arguments naming one resource.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    /// Resource name
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
}

/// The kind of a resource.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Text,
    Json,
}

/// Arguments of `write_resource`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// Resource name
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// The content: a string for a text resource, any JSON value for a json resource
    pub content: Value,
    /// "text" or "json" (default: "text" when content is a string, otherwise "json")
    pub kind: Option<Kind>,
}

fn missing(name: &str) -> ToolError {
    ToolError::new(format!(
        "there is no resource named {name:?}; call list_resources to see which exist"
    ))
}

/// Lists the session's resources.
pub struct ListResources;

impl Builtin for ListResources {
    type Params = ListParams;
    const NAME: &'static str = "list_resources";
    const DESCRIPTION: &'static str =
        "List the named text and JSON resources of this chat session (names, kinds and sizes).";
    const PROVIDER: Provider = Provider::Resource;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, ctx: &Context<'_>, _params: ListParams) -> Result<Value, ToolError> {
        let resources = ctx.state.list_resources().await?;
        Ok(json!({ "count": resources.len(), "resources": resources }))
    }
}

/// Reads one resource.
pub struct ReadResource;

impl Builtin for ReadResource {
    type Params = NameParams;
    const NAME: &'static str = "read_resource";
    const DESCRIPTION: &'static str = "Read a named resource of this chat session: text comes back as a string, JSON as its value.";
    const PROVIDER: Provider = Provider::Resource;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, ctx: &Context<'_>, params: NameParams) -> Result<Value, ToolError> {
        let resource = ctx
            .state
            .resource(&params.name)
            .await?
            .ok_or_else(|| missing(&params.name))?;
        Ok(json!({
            "name": resource.summary.name,
            "kind": resource.summary.kind,
            "content": resource.content.to_value(),
            "bytes": resource.summary.bytes,
            "updated_at": resource.summary.updated_at,
        }))
    }
}

/// Creates or replaces one resource (a sandbox effect).
pub struct WriteResource;

impl Builtin for WriteResource {
    type Params = WriteParams;
    const NAME: &'static str = "write_resource";
    const DESCRIPTION: &'static str = "Create or replace a named text or JSON resource of this chat session. Example: name=\"quest_log\", content=\"Find the lost ring.\".";
    const PROVIDER: Provider = Provider::Resource;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::Sandbox;
    const ALLOWED_SLOTS: &'static [Slot] = WRITERS;

    async fn run(&self, ctx: &Context<'_>, params: WriteParams) -> Result<Value, ToolError> {
        let content = match (params.kind, params.content) {
            (Some(Kind::Text) | None, Value::String(text)) => ResourceContent::Text(text),
            (Some(Kind::Text), other) => {
                return Err(ToolError::new(format!(
                    "a text resource needs a string as content, got {}; use kind \"json\" for other values",
                    crate::schema::json_kind(&other)
                )));
            }
            (Some(Kind::Json) | None, value) => ResourceContent::Json(value),
        };
        let created = ctx.state.write_resource(&params.name, &content).await?;
        Ok(json!({
            "name": params.name,
            "kind": content.kind(),
            "created": created,
        }))
    }
}

/// Deletes one resource (a sandbox effect).
pub struct DeleteResource;

impl Builtin for DeleteResource {
    type Params = NameParams;
    const NAME: &'static str = "delete_resource";
    const DESCRIPTION: &'static str = "Delete a named resource of this chat session.";
    const PROVIDER: Provider = Provider::Resource;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::Sandbox;
    const ALLOWED_SLOTS: &'static [Slot] = WRITERS;

    async fn run(&self, ctx: &Context<'_>, params: NameParams) -> Result<Value, ToolError> {
        if !ctx.state.delete_resource(&params.name).await? {
            return Err(missing(&params.name));
        }
        Ok(json!({ "name": params.name, "deleted": true }))
    }
}
