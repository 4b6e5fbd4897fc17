//! `get_variable` / `set_variable`: the session's named JSON values.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::{SideEffectLevel, Slot};

/// Arguments of `get_variable`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetVariableParams {
    /// Variable name
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
}

/// Arguments of `set_variable`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetVariableParams {
    /// Variable name
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
    /// The new value: any JSON value (string, number, boolean, object, array or null)
    pub value: Value,
}

/// Reads a session variable.
pub struct GetVariable;

impl Builtin for GetVariable {
    type Params = GetVariableParams;
    const NAME: &'static str = "get_variable";
    const DESCRIPTION: &'static str = "Read a variable of this chat session. Answers exists=false and value=null when it was never set.";
    const PROVIDER: Provider = Provider::SessionContext;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, ctx: &Context<'_>, params: GetVariableParams) -> Result<Value, ToolError> {
        let value = ctx.state.variable(&params.name).await?;
        Ok(json!({
            "name": params.name,
            "exists": value.is_some(),
            "value": value.unwrap_or(Value::Null),
        }))
    }
}

/// Writes a session variable (a sandbox effect).
pub struct SetVariable;

impl Builtin for SetVariable {
    type Params = SetVariableParams;
    const NAME: &'static str = "set_variable";
    const DESCRIPTION: &'static str = "Set a variable of this chat session to a JSON value; it is kept for later turns. Example: name=\"affection\", value=42.";
    const PROVIDER: Provider = Provider::SessionContext;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::Sandbox;
    /// The verifier checks a reply; it has no business changing session state.
    const ALLOWED_SLOTS: &'static [Slot] = &[Slot::Director, Slot::Memory, Slot::Narrator];

    async fn run(&self, ctx: &Context<'_>, params: SetVariableParams) -> Result<Value, ToolError> {
        ctx.state.set_variable(&params.name, &params.value).await?;
        Ok(json!({ "name": params.name, "value": params.value, "saved": true }))
    }
}
