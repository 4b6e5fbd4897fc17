//! A character's own settings for the generation loop: the model, the sampling
//! temperature, the system prompt (else the endpoint's model, the model's
//! default temperature, and the persona) and the slots its turns pass through
//! besides the narrator (none by default).

use serde::{Deserialize, Serialize};

use super::tool::Slot;
use crate::error::{Error, Result};

/// Longest model name accepted.
const MAX_MODEL_CHARS: usize = 256;
/// Longest system prompt accepted, in bytes.
const MAX_SYSTEM_PROMPT_BYTES: usize = 64 * 1024;

/// What a character overrides; `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelOverrides {
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub system_prompt: Option<String>,
    /// The slots a turn passes through, always with `narrator`; `director`,
    /// `verifier` and `memory` only when enabled. Kept without the narrator,
    /// in the order a turn runs them, without repeats.
    #[serde(
        default,
        serialize_with = "serialize_slots",
        deserialize_with = "deserialize_slots"
    )]
    #[schema(value_type = Vec<Slot>)]
    pub slots: Vec<Slot>,
}

/// The order a turn runs the optional slots in: the director before the
/// narrator, the verifier after it, the memory after the answer is final.
const SLOT_ORDER: [Slot; 3] = [Slot::Director, Slot::Verifier, Slot::Memory];

/// The enabled optional slots, in turn order, without the narrator or repeats.
pub fn normalize_slots(slots: &[Slot]) -> Vec<Slot> {
    SLOT_ORDER
        .into_iter()
        .filter(|slot| slots.contains(slot))
        .collect()
}

fn serialize_slots<S: serde::Serializer>(
    slots: &[Slot],
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = serializer.serialize_seq(Some(slots.len() + 1))?;
    seq.serialize_element(&Slot::Narrator)?;
    for slot in normalize_slots(slots) {
        seq.serialize_element(&slot)?;
    }
    seq.end()
}

fn deserialize_slots<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Vec<Slot>, D::Error> {
    let slots = Vec::<Slot>::deserialize(deserializer)?;
    Ok(normalize_slots(&slots))
}

impl ModelOverrides {
    /// Whether a turn of this character runs `slot`.
    pub fn enables(&self, slot: Slot) -> bool {
        slot == Slot::Narrator || self.slots.contains(&slot)
    }

    /// Checks every value, naming the field of the first bad one.
    pub fn check(&self) -> Result<()> {
        if let Some(model) = &self.model {
            let chars = model.chars().count();
            if chars == 0 || chars > MAX_MODEL_CHARS || model.chars().any(char::is_control) {
                return Err(Error::validation(format!(
                    "model must be 1-{MAX_MODEL_CHARS} characters without control characters"
                )));
            }
        }
        if let Some(temperature) = self.temperature
            && !(0.0..=2.0).contains(&temperature)
        {
            return Err(Error::validation(format!(
                "temperature must be between 0 and 2, got {temperature}"
            )));
        }
        if self
            .system_prompt
            .as_ref()
            .is_some_and(|p| p.len() > MAX_SYSTEM_PROMPT_BYTES)
        {
            return Err(Error::validation(format!(
                "system_prompt must be at most {MAX_SYSTEM_PROMPT_BYTES} bytes"
            )));
        }
        Ok(())
    }
}
