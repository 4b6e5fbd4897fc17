//! One turn through the character's slots: the `director` (when enabled)
//! writes notes for the narrator, the `narrator` answers (with tools), the
//! `verifier` (when enabled) may reject that answer once and have the
//! narrator try again, and the `memory` slot (when enabled) lists facts to
//! remember, buffered in the run until it is committed. Each slot sees only
//! the tools its permissions and `allowed_slots` allow.

use serde_json::json;

use super::ToolRuntime;
use super::conversation::{ModelFailure, TurnContext};
use super::generation::{Ending, Turn};
use super::history::character_prompt;
use super::slot_prompts::{self, Verdict};
use crate::domain::tool::Slot;
use crate::error::Result;
use crate::llm::{ChatMessage, LlmClient};
use crate::permissions::ToolPermissions;

/// The turn as every slot sees it: the system prompt of the character and
/// the transcript up to and including the new user message.
struct Transcript {
    character: Option<String>,
    /// Committed history, then the new user message (shared by every slot's
    /// messages, never copied).
    messages: Vec<ChatMessage>,
}

impl Transcript {
    /// `slot`'s messages: its system prompt, the transcript, `reply` as the
    /// assistant's answer when given, and the slot's closing question.
    fn for_slot(&self, slot: Slot, reply: Option<&str>) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        if let Some(prompt) = slot_prompts::system_prompt(slot, self.character.as_deref()) {
            messages.push(json!({"role": "system", "content": prompt}).into());
        }
        messages.extend(self.messages.iter().cloned());
        if let Some(reply) = reply {
            messages.push(json!({"role": "assistant", "content": reply}).into());
        }
        messages.push(json!({"role": "user", "content": slot_prompts::ask(slot)}).into());
        messages
    }
}

impl ToolRuntime {
    /// Runs the turn's slots and answers how it ended.
    pub(super) async fn generate(&self, llm: &LlmClient, turn: &Turn) -> Result<Ending> {
        let session = self
            .store
            .session(&turn.account_id, &turn.session_id)
            .await?;
        let max_steps = ToolPermissions::from_metadata(&session.metadata)?.max_steps_per_generation;
        let character = self.character_of(&turn.account_id, &session).await?;
        let overrides = character
            .as_ref()
            .map(|c| c.overrides.clone())
            .unwrap_or_default();
        let mut history = self.history(&session, &turn.run).await?;
        history.push(json!({"role": "user", "content": turn.content}).into());
        let transcript = Transcript {
            character: character_prompt(character.as_ref()),
            messages: history,
        };
        let ctx = TurnContext::new(llm, turn, session, overrides, max_steps);
        let reply = match self.reply(&ctx, &transcript).await? {
            Ok(reply) => reply,
            Err(failure) => return Ok(Ending::Failed(failure.message, failure.status)),
        };
        if ctx.overrides.enables(Slot::Memory) {
            self.remember(&ctx, &transcript, &reply).await?;
        }
        Ok(Ending::Answered(reply))
    }

    /// The narrator's reply, directed and verified when those slots are on.
    async fn reply(
        &self,
        ctx: &TurnContext<'_>,
        transcript: &Transcript,
    ) -> Result<std::result::Result<String, ModelFailure>> {
        let turn = ctx.turn;
        let mut narrator = Vec::new();
        if let Some(prompt) = &transcript.character {
            narrator.push(json!({"role": "system", "content": prompt}).into());
        }
        let (history, new_turn) = transcript.messages.split_at(transcript.messages.len() - 1);
        narrator.extend(history.iter().cloned());
        let deferred = self
            .deferred_results(&turn.account_id, &ctx.session, &mut narrator)
            .await?;
        narrator.extend(new_turn.iter().cloned());
        if ctx.overrides.enables(Slot::Director) {
            let notes = match self.ask_slot(ctx, Slot::Director, transcript, None).await? {
                Ok(notes) => notes,
                Err(failure) => return Ok(Err(failure)),
            };
            if !notes.trim().is_empty() {
                let content = slot_prompts::director_notes(&notes);
                narrator.push(json!({"role": "system", "content": content}).into());
            }
        }
        let mut reply = match self.converse(ctx, Slot::Narrator, &mut narrator).await? {
            Ok(reply) => reply,
            Err(failure) => return Ok(Err(failure)),
        };
        if ctx.overrides.enables(Slot::Verifier) {
            let verdict = match self
                .ask_slot(ctx, Slot::Verifier, transcript, Some(&reply))
                .await?
            {
                Ok(answer) => slot_prompts::verdict(&answer),
                Err(failure) => return Ok(Err(failure)),
            };
            if let Verdict::Reject(reason) = verdict {
                tracing::info!(run_id = %turn.run.id, reason = ?reason, "the verifier rejected the reply; the narrator tries once more");
                self.emit(
                    turn,
                    "reply_rejected",
                    json!({"reason": reason, "content": reply}),
                );
                narrator.push(json!({"role": "assistant", "content": reply}).into());
                narrator.push(
                    json!({"role": "user", "content": slot_prompts::retry_request(&reason)}).into(),
                );
                reply = match self.converse(ctx, Slot::Narrator, &mut narrator).await? {
                    Ok(reply) => reply,
                    Err(failure) => return Ok(Err(failure)),
                };
            }
        }
        // Given to the model only once it has answered with them.
        self.store.consume_deliveries(&deferred).await?;
        Ok(Ok(reply))
    }

    /// One optional slot's answer to its question; `slot_finished` carries it.
    async fn ask_slot(
        &self,
        ctx: &TurnContext<'_>,
        slot: Slot,
        transcript: &Transcript,
        reply: Option<&str>,
    ) -> Result<std::result::Result<String, ModelFailure>> {
        let mut messages = transcript.for_slot(slot, reply);
        let answer = self.converse(ctx, slot, &mut messages).await?;
        if let Ok(content) = &answer {
            self.emit(
                ctx.turn,
                "slot_finished",
                json!({"slot": slot, "content": content}),
            );
        }
        Ok(answer)
    }

    /// The memory slot's facts, buffered in the run (they reach the session's
    /// memory when the run is committed). A failure here does not undo the
    /// reply: it is logged and reported as `slot_failed`.
    async fn remember(
        &self,
        ctx: &TurnContext<'_>,
        transcript: &Transcript,
        reply: &str,
    ) -> Result<()> {
        let turn = ctx.turn;
        let answer = self
            .ask_slot(ctx, Slot::Memory, transcript, Some(reply))
            .await?;
        let written = match answer {
            Ok(answer) => {
                let notes = slot_prompts::memory_notes(&answer);
                self.store.add_run_memories(&turn.run, &notes).await
            }
            Err(failure) => {
                tracing::warn!(run_id = %turn.run.id, status = failure.status, error = ?failure.message, "the memory slot failed; the reply stands");
                self.emit(turn, "slot_failed", json!({"slot": Slot::Memory, "error": {"message": failure.message, "status": failure.status}}));
                return Ok(());
            }
        };
        match written {
            Ok(count) => self.emit(turn, "memories_buffered", json!({"count": count})),
            Err(error) => {
                tracing::warn!(run_id = %turn.run.id, %error, "could not buffer the memory slot's notes")
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot's messages hold the transcript's own messages, not copies:
    /// a history of up to 6 MiB went into up to four requests per turn.
    #[test]
    fn each_slots_messages_share_the_transcript() {
        let transcript = Transcript {
            character: Some("a character".into()),
            messages: vec![
                json!({"role": "user", "content": "x".repeat(1000)}).into(),
                json!({"role": "assistant", "content": "y".repeat(1000)}).into(),
                json!({"role": "user", "content": "now"}).into(),
            ],
        };
        for slot in [Slot::Director, Slot::Verifier, Slot::Memory] {
            let messages = transcript.for_slot(slot, Some("the reply"));
            for message in &transcript.messages {
                assert!(
                    messages.iter().any(|m| m.is_shared_with(message)),
                    "{slot:?}: {message:?} was copied"
                );
            }
        }
    }
}
