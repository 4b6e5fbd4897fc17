//! What the model is told about the session before the new turn: the
//! character's system prompt, the committed history (committed pages only),
//! and the deferred results delivered since it last saw them.

use serde_json::{Value, json};

use super::ToolRuntime;
use super::conversation::assistant_message;
use crate::error::Result;
use crate::llm::{ChatMessage, ModelToolCall};
use crate::store::{Character, Run, Session};

/// Most deferred results one turn gives the model; the rest wait for the
/// next turns.
pub const MAX_DEFERRED_RESULTS_PER_TURN: i64 = 32;
/// Bytes of deferred results (their arguments and outputs) past which a turn
/// takes no more: a quarter of the model request's 16 MiB cap.
pub const DEFERRED_RESULTS_BUDGET_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of committed history (user messages and replies) a turn sends,
/// newest first: with the deferred results' budget, the system prompt and
/// the new message, it leaves a third of the request's cap to the tools and
/// the turn's own calls.
pub const HISTORY_BUDGET_BYTES: usize = 6 * 1024 * 1024;

impl ToolRuntime {
    /// The session's character.
    pub(super) async fn character_of(
        &self,
        account_id: &str,
        session: &Session,
    ) -> Result<Option<Character>> {
        self.store
            .character_by_id(account_id, &session.character_id)
            .await
    }

    /// The committed floors before this run's floor, as user and assistant
    /// messages.
    pub(super) async fn history(&self, session: &Session, run: &Run) -> Result<Vec<ChatMessage>> {
        let mut messages = Vec::new();
        // The newest turns that fit the budget: every committed reply kept
        // whole would one day make every request of the session too large.
        let (turns, left_out) = self
            .store
            .committed_turns_within(&session.id, &run.floor_id, HISTORY_BUDGET_BYTES)
            .await?;
        if left_out {
            tracing::debug!(run_id = %run.id, "the oldest turns do not fit the history's budget");
        }
        for (user, reply) in turns {
            messages.push(json!({"role": "user", "content": user}).into());
            if let Some(reply) = reply {
                messages.push(json!({"role": "assistant", "content": reply}).into());
            }
        }
        Ok(messages)
    }

    /// Appends the deferred results delivered since the model last saw them,
    /// oldest first, as the call and its result; answers their delivery ids.
    /// A turn takes at most [`MAX_DEFERRED_RESULTS_PER_TURN`] of them and no
    /// more once their arguments and outputs pass
    /// [`DEFERRED_RESULTS_BUDGET_BYTES`]; the first is always taken, cut to
    /// the budget if it is larger. The rest wait for the next turns: a
    /// backlog never makes the model request too large to send (then none
    /// would ever be consumed).
    pub(super) async fn deferred_results(
        &self,
        account_id: &str,
        session: &Session,
        messages: &mut Vec<ChatMessage>,
    ) -> Result<Vec<String>> {
        let mut deliveries = self
            .store
            .unconsumed_deliveries(account_id, &session.id, MAX_DEFERRED_RESULTS_PER_TURN)
            .await?;
        let execution_ids: Vec<String> = deliveries
            .iter()
            .map(|delivery| delivery.execution_id.clone())
            .collect();
        let arguments_of = self
            .store
            .execution_arguments(account_id, &execution_ids)
            .await?;
        let mut taken_bytes = 0;
        let mut taken = 0;
        for delivery in &deliveries {
            let mut content = match &delivery.output {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let mut arguments = match arguments_of.get(&delivery.execution_id) {
                Some(args) => args.to_value().to_string(),
                None => "{}".to_owned(),
            };
            let size = arguments.len() + content.len();
            if taken > 0 && taken_bytes + size > DEFERRED_RESULTS_BUDGET_BYTES {
                break;
            }
            if size > DEFERRED_RESULTS_BUDGET_BYTES {
                (arguments, content) = cut_to_budget(arguments, content);
            }
            taken_bytes += arguments.len() + content.len();
            taken += 1;
            let call = ModelToolCall {
                id: delivery.call_id.clone(),
                name: delivery.tool_name.clone(),
                arguments,
            };
            messages.push(assistant_message("", std::slice::from_ref(&call)).into());
            messages
                .push(json!({"role": "tool", "tool_call_id": call.id, "content": content}).into());
        }
        deliveries.truncate(taken);
        Ok(deliveries.into_iter().map(|d| d.id).collect())
    }
}

/// A deferred result larger than the whole budget, made to fit it: its
/// arguments kept if they take at most half (else `{}`), its output cut,
/// with a note of how much was left out.
fn cut_to_budget(arguments: String, content: String) -> (String, String) {
    let arguments = if arguments.len() > DEFERRED_RESULTS_BUDGET_BYTES / 2 {
        "{}".to_owned()
    } else {
        arguments
    };
    let room = DEFERRED_RESULTS_BUDGET_BYTES - arguments.len() - 100;
    if content.len() <= room {
        return (arguments, content);
    }
    let kept = crate::text::prefix_within(&content, room);
    let note = format!("… [{} more bytes left out]", content.len() - kept.len());
    (arguments, format!("{kept}{note}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_over_the_whole_budget_is_cut_to_it_with_a_note() {
        let content = "é".repeat(DEFERRED_RESULTS_BUDGET_BYTES);
        let (arguments, cut) = cut_to_budget(r#"{"a":1}"#.to_owned(), content);
        assert_eq!(arguments, r#"{"a":1}"#);
        assert!(
            arguments.len() + cut.len() <= DEFERRED_RESULTS_BUDGET_BYTES,
            "{}",
            cut.len()
        );
        assert!(
            cut.ends_with("more bytes left out]"),
            "{}",
            &cut[cut.len() - 40..]
        );
        let (arguments, cut) = cut_to_budget("x".repeat(3_000_000), "small".to_owned());
        assert_eq!((arguments.as_str(), cut.as_str()), ("{}", "small"));
    }
}
