//! `roll_dice`: roll one or more dice.

use rand::Rng;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Builtin, Context, Provider, ToolError};
use crate::domain::tool::SideEffectLevel;

/// Arguments of `roll_dice`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollDiceParams {
    /// Number of sides per die (default: 6)
    #[serde(default = "default_sides")]
    #[schemars(range(min = 2, max = 1000))]
    pub sides: u32,
    /// Number of dice to roll (default: 1)
    #[serde(default = "default_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: u32,
}

fn default_sides() -> u32 {
    6
}

fn default_count() -> u32 {
    1
}

/// Rolls dice with a fair random generator.
pub struct RollDice;

impl Builtin for RollDice {
    type Params = RollDiceParams;
    const NAME: &'static str = "roll_dice";
    const DESCRIPTION: &'static str = "Roll one or more dice and return the results. Example: sides=6, count=2 rolls two six-sided dice.";
    const PROVIDER: Provider = Provider::ContextFree;
    const SIDE_EFFECT_LEVEL: SideEffectLevel = SideEffectLevel::None;

    async fn run(&self, _ctx: &Context<'_>, params: RollDiceParams) -> Result<Value, ToolError> {
        let results = roll(params.sides, params.count);
        let total: u64 = results.iter().map(|&r| u64::from(r)).sum();
        Ok(json!({
            "results": results,
            "total": total,
            "sides": params.sides,
            "count": params.count,
        }))
    }
}

fn roll(sides: u32, count: u32) -> Vec<u32> {
    let mut rng = rand::rng();
    (0..count).map(|_| rng.random_range(1..=sides)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolls_stay_on_the_die() {
        let results = roll(6, 100);
        assert_eq!(results.len(), 100);
        assert!(results.iter().all(|r| (1..=6).contains(r)));
        // 100 fair d6 rolls all showing one face has probability 6^-99.
        assert!(results.iter().any(|&r| r != results[0]));
    }
}
