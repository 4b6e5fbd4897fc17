//! One slot's exchange with the model inside a turn: each request offers the
//! slot's tools as they are at that moment (so a registration lands in the
//! very next request), the answer's tool calls run concurrently through the
//! call path with the run's ids, the slot and the step number, and their
//! results go back in call order; it ends on a text answer, or after
//! `max_steps_per_generation` answers with calls and one last request
//! without tools.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use serde_json::{Value, json};

use super::ToolRuntime;
use super::generation::Turn;
use crate::call::{CallArguments, ToolCall, ToolCallResult};
use crate::catalog::Availability;
use crate::domain::model_overrides::ModelOverrides;
use crate::domain::tool::Slot;
use crate::error::Result;
use crate::llm::{ChatMessage, ChatRequest, LlmClient, ModelToolCall};
use crate::store::Session;

/// What every slot of one turn shares.
pub(super) struct TurnContext<'a> {
    pub llm: &'a LlmClient,
    pub turn: &'a Turn,
    pub session: Session,
    pub overrides: ModelOverrides,
    pub max_steps: u32,
    /// Steps taken so far over every slot of the turn (journalled per call).
    steps: AtomicU32,
    /// The configured first-step `tool_choice` is sent once per turn, on the
    /// narrator's first request.
    first_choice_pending: AtomicBool,
}

/// The model endpoint failed (or the turn was stopped): the message and the
/// provider's HTTP status when it gave one.
#[derive(Debug)]
pub(super) struct ModelFailure {
    pub message: String,
    pub status: Option<u16>,
}

impl ModelFailure {
    fn stopped(message: &str) -> Self {
        Self {
            message: message.to_owned(),
            status: None,
        }
    }
}

impl<'a> TurnContext<'a> {
    pub fn new(
        llm: &'a LlmClient,
        turn: &'a Turn,
        session: Session,
        overrides: ModelOverrides,
        max_steps: u32,
    ) -> Self {
        Self {
            llm,
            turn,
            session,
            overrides,
            max_steps,
            steps: AtomicU32::new(0),
            first_choice_pending: AtomicBool::new(true),
        }
    }

    fn next_step(&self) -> u32 {
        self.steps.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl ToolRuntime {
    /// Talks with the model as `slot` until it answers with text; `messages`
    /// grows by the exchange. Only the narrator's text streams as `token`.
    pub(super) async fn converse(
        &self,
        ctx: &TurnContext<'_>,
        slot: Slot,
        messages: &mut Vec<ChatMessage>,
    ) -> Result<std::result::Result<String, ModelFailure>> {
        for round in 1..=ctx.max_steps + 1 {
            if let Some(stopped) = self.stop_reason(ctx) {
                return Ok(Err(stopped));
            }
            let last = round > ctx.max_steps;
            let tools = if last {
                None
            } else {
                Some(self.offered_tools(&ctx.session, slot).await?)
            };
            let step = ctx.next_step();
            // Lent to the request and taken back below: a conversation may
            // be megabytes, and is not copied per step.
            let request = ChatRequest {
                model: ctx.overrides.model.clone(),
                messages: std::mem::take(messages),
                tool_choice: first_tool_choice(ctx, slot, tools.as_deref()),
                tools,
                temperature: ctx.overrides.temperature,
            };
            let mut on_token = |text: &str| {
                if slot == Slot::Narrator {
                    self.emit(
                        ctx.turn,
                        crate::model_sessions::TOKEN_EVENT,
                        json!({"text": text, "step": step}),
                    );
                }
            };
            // A cancel or shutdown stops the request in flight, not only the
            // next one: a provider may take minutes (or stall) on this one.
            let completed = tokio::select! {
                biased;
                stopped = self.stopped(ctx) => Err(stopped),
                completed = ctx.llm.complete(&request, &mut on_token) => Ok(completed),
            };
            *messages = request.messages;
            let answer = match completed {
                Err(stopped) => return Ok(Err(stopped)),
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    let status = error.status;
                    return Ok(Err(ModelFailure {
                        message: error.to_string(),
                        status,
                    }));
                }
            };
            if answer.tool_calls.is_empty() || last {
                return Ok(Ok(answer.content));
            }
            messages.push(assistant_message(&answer.content, &answer.tool_calls).into());
            let results = self
                .run_step(ctx.turn, slot, step, &answer.tool_calls)
                .await;
            for (call, result) in answer.tool_calls.iter().zip(results) {
                messages.push(
                    json!({"role": "tool", "tool_call_id": call.id, "content": result}).into(),
                );
            }
        }
        Ok(Ok(String::new()))
    }

    /// Why the turn must stop now (a shutdown, then a cancel), if it must.
    fn stop_reason(&self, ctx: &TurnContext<'_>) -> Option<ModelFailure> {
        if self.stopping.is_cancelled() {
            Some(ModelFailure::stopped("the server is shutting down"))
        } else if ctx.turn.cancel.is_cancelled() {
            Some(ModelFailure::stopped("the run was cancelled"))
        } else {
            None
        }
    }

    /// Resolves once the turn must stop, with [`Self::stop_reason`]'s reason.
    async fn stopped(&self, ctx: &TurnContext<'_>) -> ModelFailure {
        tokio::select! {
            () = self.stopping.cancelled() => {}
            () = ctx.turn.cancel.cancelled() => {}
        }
        // A cancelled token stays cancelled, so a reason is always found.
        self.stop_reason(ctx)
            .unwrap_or_else(|| ModelFailure::stopped("the run was cancelled"))
    }

    /// The slot's tools as the model is offered them now.
    async fn offered_tools(&self, session: &Session, slot: Slot) -> Result<Vec<Value>> {
        let current = self.store.session(&session.account_id, &session.id).await?;
        let catalog = self.offered_catalog(&current, Some(slot)).await?;
        Ok(catalog
            .entries
            .iter()
            .filter(|entry| entry.availability == Availability::Available)
            .map(|entry| entry.to_openai_tool())
            .collect())
    }

    /// Runs one answer's tool calls concurrently; answers each call's tool
    /// message content, in call order.
    async fn run_step(
        &self,
        turn: &Turn,
        slot: Slot,
        step: u32,
        calls: &[ModelToolCall],
    ) -> Vec<String> {
        let runs = calls.iter().map(|model_call| {
            let call = ToolCall {
                name: model_call.name.clone(),
                arguments: CallArguments::from_json(Some(Value::String(model_call.arguments.clone()))),
                call_id: model_call.id.clone(),
                caller_slot: slot,
                floor_id: Some(turn.run.floor_id.clone()),
                run_id: Some(turn.run.id.clone()),
                step: Some(step),
            };
            self.emit(turn, "tool_call_started", json!({"call_id": call.call_id, "name": call.name, "slot": slot, "step": step}));
            async move {
                let outcome = self.call(&turn.account_id, &turn.session_id, call).await;
                let content = tool_message(&model_call.name, &outcome);
                let finished = match &outcome {
                    Ok(result) => json!({"call_id": result.call_id, "name": result.name, "status": result.status, "is_error": result.is_error, "execution_id": result.execution_id, "slot": slot, "step": step}),
                    Err(error) => json!({"call_id": model_call.id, "name": model_call.name, "status": "refused", "is_error": true, "error": error.to_string(), "slot": slot, "step": step}),
                };
                self.emit(turn, "tool_call_finished", finished);
                content
            }
        });
        futures::future::join_all(runs).await
    }
}

/// The configured `tool_choice` on the narrator's first request of the turn,
/// when it offers tools (forcing a call makes no sense without one).
fn first_tool_choice(ctx: &TurnContext<'_>, slot: Slot, tools: Option<&[Value]>) -> Option<Value> {
    let offers_tools = tools.is_some_and(|tools| !tools.is_empty());
    if slot != Slot::Narrator || !offers_tools {
        return None;
    }
    if ctx.first_choice_pending.swap(false, Ordering::Relaxed) {
        ctx.llm.first_tool_choice()
    } else {
        None
    }
}

/// The assistant message that asked for `calls`, as the model must see it again.
pub(super) fn assistant_message(content: &str, calls: &[ModelToolCall]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|call| {
            json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
        })
        .collect();
    json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }, "tool_calls": tool_calls})
}

/// A call's result as the tool message the model reads: the output (JSON text
/// unless it is a string), or why it was refused or failed.
fn tool_message(name: &str, outcome: &Result<ToolCallResult>) -> String {
    match outcome {
        Ok(result) => {
            let output = match &result.output {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            if result.is_error {
                format!("error ({}): {output}", result.status.as_str())
            } else {
                output
            }
        }
        Err(error) => format!("the call of {name:?} was refused: {error}"),
    }
}
