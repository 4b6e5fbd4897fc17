//! What the model is told about the session before the new turn: the
//! character's system prompt, the committed history (committed pages only),
//! and the deferred results delivered since it last saw them.

use serde_json::{Value, json};

use super::ToolRuntime;
use super::conversation::assistant_message;
use crate::error::Result;
use crate::llm::ModelToolCall;
use crate::store::{Character, Run, Session};

/// Most deferred results one turn gives the model; the rest wait for the
/// next turns.
pub const MAX_DEFERRED_RESULTS_PER_TURN: i64 = 32;
/// Output bytes of deferred results past which a turn takes no more (a
/// quarter of the model request's cap, which the history and the turn's own
/// calls share).
pub const DEFERRED_RESULTS_BUDGET_BYTES: usize = 4 * 1024 * 1024;

impl ToolRuntime {
    /// The session's character (from the cached character list).
    pub(super) async fn character_of(
        &self,
        account_id: &str,
        session: &Session,
    ) -> Result<Option<Character>> {
        let characters = self.store.all_characters().await?;
        Ok(characters
            .iter()
            .find(|c| c.id == session.character_id && c.account_id == account_id)
            .cloned())
    }

    /// The committed floors before this run's floor, as user and assistant
    /// messages.
    pub(super) async fn history(&self, session: &Session, run: &Run) -> Result<Vec<Value>> {
        let mut messages = Vec::new();
        let turns = self
            .store
            .committed_turns_before(&session.id, &run.floor_id)
            .await?;
        for (user, reply) in turns {
            messages.push(json!({"role": "user", "content": user}));
            if let Some(reply) = reply {
                messages.push(json!({"role": "assistant", "content": reply}));
            }
        }
        Ok(messages)
    }

    /// Appends the deferred results delivered since the model last saw them,
    /// oldest first, as the call and its result; answers their delivery ids.
    /// A turn takes at most [`MAX_DEFERRED_RESULTS_PER_TURN`] of them and
    /// stops past [`DEFERRED_RESULTS_BUDGET_BYTES`] of their outputs (always
    /// taking one): the rest wait for the next turns, rather than a backlog
    /// making every model request too large to send, so that none would ever
    /// be consumed.
    pub(super) async fn deferred_results(
        &self,
        account_id: &str,
        session: &Session,
        messages: &mut Vec<Value>,
    ) -> Result<Vec<String>> {
        let mut deliveries = self
            .store
            .unconsumed_deliveries(account_id, &session.id, MAX_DEFERRED_RESULTS_PER_TURN)
            .await?;
        let mut taken_bytes = 0;
        let mut taken = 0;
        for delivery in &deliveries {
            let content = match &delivery.output {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            taken_bytes += content.len();
            if taken > 0 && taken_bytes > DEFERRED_RESULTS_BUDGET_BYTES {
                break;
            }
            taken += 1;
            let arguments = match self
                .store
                .execution(account_id, &delivery.execution_id)
                .await?
            {
                Some(row) => row.args.to_value().to_string(),
                None => "{}".to_owned(),
            };
            let call = ModelToolCall {
                id: delivery.call_id.clone(),
                name: delivery.tool_name.clone(),
                arguments,
            };
            messages.push(assistant_message("", std::slice::from_ref(&call)));
            messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
        }
        deliveries.truncate(taken);
        Ok(deliveries.into_iter().map(|d| d.id).collect())
    }
}

/// The character's system prompt, else its persona; None when both are blank.
pub(super) fn character_prompt(character: Option<&Character>) -> Option<String> {
    let character = character?;
    let prompt = character
        .overrides
        .system_prompt
        .clone()
        .unwrap_or_else(|| character.persona.trim().to_owned());
    (!prompt.trim().is_empty()).then_some(prompt)
}
