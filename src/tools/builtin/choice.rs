//! `random_choice`: pick among options.

use rand::seq::IndexedRandom;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::SideEffectLevel;

/// Arguments of `random_choice`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RandomChoiceParams {
    /// The options to choose from
    #[schemars(length(min = 1, max = 100), inner(length(min = 1, max = 1000)))]
    pub options: Vec<String>,
    /// How many different options to pick (default: 1); at most the number of options
    #[serde(default = "default_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: u32,
}

fn default_count() -> u32 {
    1
}

/// Picks options uniformly at random, without repeats.
pub struct RandomChoice;

impl Builtin for RandomChoice {
    type Params = RandomChoiceParams;
    const NAME: &'static str = "random_choice";
    const DESCRIPTION: &'static str = "Pick one or more different options at random from a list. Example: options=[\"tea\", \"coffee\", \"juice\"] picks one of the three.";
    const PROVIDER: Provider = Provider::ContextFree;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(
        &self,
        _ctx: &Context<'_>,
        params: RandomChoiceParams,
    ) -> Result<Value, ToolError> {
        // The schema cannot relate `count` to the length of `options`.
        let count = params.count as usize;
        if count > params.options.len() {
            return Err(ToolError::new(format!(
                "count is {count} but there are only {} options; pick at most as many as there are options",
                params.options.len()
            )));
        }
        let choices: Vec<&String> = params
            .options
            .choose_multiple(&mut rand::rng(), count)
            .collect();
        Ok(json!({ "choice": choices[0], "choices": choices }))
    }
}
