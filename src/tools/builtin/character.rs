//! `get_character_info`: who the session's character is.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::SideEffectLevel;

/// `get_character_info` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// Reads the session's character.
pub struct GetCharacterInfo;

impl Builtin for GetCharacterInfo {
    type Params = NoParams;
    const NAME: &'static str = "get_character_info";
    const DESCRIPTION: &'static str =
        "Get the name, description and persona of the character you are playing in this chat.";
    const PROVIDER: Provider = Provider::ContextFree;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, ctx: &Context<'_>, _params: NoParams) -> Result<Value, ToolError> {
        let character = ctx
            .store
            .character(&ctx.session.account_id, &ctx.session.character)
            .await?;
        Ok(json!({
            "name": character.name,
            "description": character.description,
            "persona": character.persona,
        }))
    }
}
