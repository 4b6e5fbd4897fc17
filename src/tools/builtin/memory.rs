//! `query_memory`: full-text search over the session's turns and memories.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::SideEffectLevel;

/// Arguments of `query_memory`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryMemoryParams {
    /// Words to look for; texts matching more and rarer words rank higher
    #[schemars(length(min = 1, max = 500))]
    pub query: String,
    /// Most results to return (default: 5)
    #[serde(default = "default_limit")]
    #[schemars(range(min = 1, max = 20))]
    pub limit: u32,
}

fn default_limit() -> u32 {
    5
}

/// Searches the session's text with the database's full-text index.
pub struct QueryMemory;

impl Builtin for QueryMemory {
    type Params = QueryMemoryParams;
    const NAME: &'static str = "query_memory";
    const DESCRIPTION: &'static str = "Search earlier turns and stored memories of this chat session by words, best match first. Example: query=\"dragon castle\".";
    const PROVIDER: Provider = Provider::SessionContext;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, ctx: &Context<'_>, params: QueryMemoryParams) -> Result<Value, ToolError> {
        let hits = ctx
            .store
            .search_session_text(&ctx.session.id, &params.query, i64::from(params.limit))
            .await?;
        Ok(json!({ "query": params.query, "count": hits.len(), "results": hits }))
    }
}
