//! A character's own settings for the generation loop: the model, the sampling
//! temperature and the system prompt (else the endpoint's model, the model's
//! default temperature, and the persona).

use serde::{Deserialize, Serialize};

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
}

impl ModelOverrides {
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
