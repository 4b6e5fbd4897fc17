//! The generation loop: one chat turn run end to end against the configured
//! OpenAI-compatible model. Each step offers the narrator slot's tools as they
//! are at that moment (so a registration lands in the very next request), runs
//! the answer's tool calls concurrently through the call path with the run's
//! ids and the step number, and feeds their results back in call order; the
//! loop ends on a text answer or after `max_steps_per_generation` steps, with
//! one last request without tools.

use serde_json::{Value, json};

use super::ToolRuntime;
use crate::call::{CallArguments, ToolCall, ToolCallResult};
use crate::catalog::Availability;
use crate::domain::tool::Slot;
use crate::error::Result;
use crate::llm::{ChatRequest, LlmClient, ModelToolCall};
use crate::model_sessions::ModelSessionEvent;
use crate::permissions::ToolPermissions;
use crate::store::{Run, Session};

/// A run the loop is driving, as the floor route started it.
#[derive(Debug, Clone)]
pub struct Turn {
    pub account_id: String,
    pub session_id: String,
    pub run: Run,
    pub content: String,
    /// Cancelled by `POST /runs/{id}/cancel`: the loop stops before its next step.
    pub cancel: tokio_util::sync::CancellationToken,
}

/// A session's latest generation.
#[derive(Debug, Clone)]
pub(super) enum TurnState {
    /// Generating; the token stops it between steps.
    Running(String, tokio_util::sync::CancellationToken),
    /// Finished with an answer; committed when the next floor arrives.
    Finished(String),
}

/// How a turn ended.
enum Ending {
    Answered(String),
    Failed(String, Option<u16>),
}

impl ToolRuntime {
    /// Commits the session's finished generation (its page becomes the floor's
    /// reply) before a new floor is appended; refused while one still runs.
    pub async fn commit_finished_turn(&self, account_id: &str, session_id: &str) -> Result<()> {
        let previous = self
            .turns
            .lock()
            .expect("turns lock")
            .get(session_id)
            .cloned();
        match previous {
            Some(TurnState::Running(run_id, _)) => Err(still_generating(&run_id)),
            Some(TurnState::Finished(run_id)) => {
                self.turns.lock().expect("turns lock").remove(session_id);
                let run = self.store.run(account_id, &run_id).await?;
                if run.state == "open" {
                    self.commit_run(account_id, &run_id, None).await?;
                }
                self.discard_other_runs(account_id, &run).await
            }
            None => Ok(()),
        }
    }

    /// Discards the open runs of `chosen`'s floor other than `chosen`.
    pub(super) async fn discard_other_runs(&self, account_id: &str, chosen: &Run) -> Result<()> {
        for other in self
            .store
            .open_runs_of_floor(account_id, &chosen.floor_id)
            .await?
        {
            if other.id != chosen.id {
                self.discard_run(account_id, &other.id).await?;
            }
        }
        Ok(())
    }

    /// Refuses while the session is generating.
    pub(super) fn ensure_idle(&self, session_id: &str) -> Result<()> {
        match self.turns.lock().expect("turns lock").get(session_id) {
            Some(TurnState::Running(run_id, _)) => Err(still_generating(run_id)),
            _ => Ok(()),
        }
    }

    /// Starts a generation for a just-appended floor; None when no model is
    /// configured (the floor is stored all the same).
    pub async fn start_turn(
        &self,
        account_id: &str,
        session_id: &str,
        floor_id: &str,
        content: &str,
    ) -> Result<Option<Run>> {
        let Some(llm) = self.llm.clone() else {
            return Ok(None);
        };
        let run = self.open_run(account_id, floor_id, Vec::new()).await?;
        self.begin(llm, account_id, session_id, run.clone(), content);
        Ok(Some(run))
    }

    /// Runs the generation of an opened run in a task of its own (tracked:
    /// shutdown waits for it, and stops it between steps).
    pub(super) fn begin(
        &self,
        llm: LlmClient,
        account_id: &str,
        session_id: &str,
        run: Run,
        content: &str,
    ) {
        let cancel = tokio_util::sync::CancellationToken::new();
        self.turns.lock().expect("turns lock").insert(
            session_id.to_owned(),
            TurnState::Running(run.id.clone(), cancel.clone()),
        );
        let turn = Turn {
            account_id: account_id.to_owned(),
            session_id: session_id.to_owned(),
            run,
            content: content.to_owned(),
            cancel,
        };
        let runtime = self.clone();
        self.calls
            .spawn(async move { runtime.run_turn(&llm, turn).await });
    }

    async fn run_turn(&self, llm: &LlmClient, turn: Turn) {
        let run = &turn.run;
        self.emit(
            &turn,
            "run_started",
            json!({"floor_id": run.floor_id, "page_id": run.page_id}),
        );
        tracing::info!(run_id = %run.id, session_id = %turn.session_id, "generation started");
        let ending = match self.generate(llm, &turn).await {
            Ok(ending) => ending,
            Err(error) => Ending::Failed(error.to_string(), None),
        };
        match ending {
            Ending::Answered(text) => {
                if let Err(error) = self.store.set_page_content(&run.page_id, &text).await {
                    tracing::warn!(run_id = %run.id, %error, "could not store the answer");
                }
                tracing::info!(run_id = %run.id, "generation finished");
                self.turns
                    .lock()
                    .expect("turns lock")
                    .insert(turn.session_id.clone(), TurnState::Finished(run.id.clone()));
                self.emit(
                    &turn,
                    "run_finished",
                    json!({"content": text, "page_id": run.page_id}),
                );
            }
            Ending::Failed(message, status) => {
                self.turns
                    .lock()
                    .expect("turns lock")
                    .remove(&turn.session_id);
                tracing::warn!(run_id = %run.id, status, error = ?message, "generation failed");
                if let Err(error) = self.discard_run(&turn.account_id, &run.id).await {
                    tracing::warn!(run_id = %run.id, %error, "could not discard the failed run");
                }
                self.emit(
                    &turn,
                    "run_failed",
                    json!({"error": {"message": message, "status": status}}),
                );
            }
        }
    }

    async fn generate(&self, llm: &LlmClient, turn: &Turn) -> Result<Ending> {
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
        let mut messages = self
            .history(&turn.account_id, &session, character.as_ref(), &turn.run)
            .await?;
        let deferred = self
            .deferred_results(&turn.account_id, &session, &mut messages)
            .await?;
        messages.push(json!({"role": "user", "content": turn.content}));
        for step in 1..=max_steps + 1 {
            if self.stopping.is_cancelled() {
                return Ok(Ending::Failed("the server is shutting down".into(), None));
            }
            if turn.cancel.is_cancelled() {
                return Ok(Ending::Failed("the run was cancelled".into(), None));
            }
            let last = step > max_steps;
            let tools = if last {
                None
            } else {
                Some(self.offered_tools(&session).await?)
            };
            // Forcing a call only makes sense when there is a tool to call.
            let tool_choice = match &tools {
                Some(offered) if step == 1 && !offered.is_empty() => llm.first_tool_choice(),
                _ => None,
            };
            let request = ChatRequest {
                model: overrides.model.clone(),
                messages: messages.clone(),
                tools,
                tool_choice,
                temperature: overrides.temperature,
            };
            let mut on_token =
                |text: &str| self.emit(turn, "token", json!({"text": text, "step": step}));
            let answer = match llm.complete(&request, &mut on_token).await {
                Ok(answer) => answer,
                Err(error) => return Ok(Ending::Failed(error.to_string(), error.status)),
            };
            if answer.tool_calls.is_empty() || last {
                // Given to the model only once it has answered with them.
                self.store.consume_deliveries(&deferred).await?;
                return Ok(Ending::Answered(answer.content));
            }
            messages.push(assistant_message(&answer.content, &answer.tool_calls));
            let results = self.run_step(turn, step, &answer.tool_calls).await;
            for (call, result) in answer.tool_calls.iter().zip(results) {
                messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
            }
        }
        Ok(Ending::Answered(String::new()))
    }

    /// Appends the deferred results delivered since the model last saw them,
    /// as the call and its result; answers their delivery ids.
    async fn deferred_results(
        &self,
        account_id: &str,
        session: &Session,
        messages: &mut Vec<Value>,
    ) -> Result<Vec<String>> {
        let deliveries = self
            .store
            .unconsumed_deliveries(account_id, &session.id)
            .await?;
        for delivery in &deliveries {
            let arguments = match self
                .store
                .execution(account_id, &delivery.execution_id)
                .await?
            {
                Some(row) => row.args.to_string(),
                None => "{}".to_owned(),
            };
            let call = ModelToolCall {
                id: delivery.call_id.clone(),
                name: delivery.tool_name.clone(),
                arguments,
            };
            messages.push(assistant_message("", std::slice::from_ref(&call)));
            let content = match &delivery.output {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
        }
        Ok(deliveries.into_iter().map(|d| d.id).collect())
    }

    /// The session's character (from the cached character list).
    async fn character_of(
        &self,
        account_id: &str,
        session: &Session,
    ) -> Result<Option<crate::store::Character>> {
        let characters = self.store.all_characters().await?;
        Ok(characters
            .iter()
            .find(|c| c.id == session.character_id && c.account_id == account_id)
            .cloned())
    }

    /// The narrator's tools as the model is offered them now.
    async fn offered_tools(&self, session: &Session) -> Result<Vec<Value>> {
        let current = self.store.session(&session.account_id, &session.id).await?;
        let catalog = self.offered_catalog(&current, Some(Slot::Narrator)).await?;
        Ok(catalog
            .entries
            .iter()
            .filter(|entry| entry.availability == Availability::Available)
            .map(|entry| entry.to_openai_tool())
            .collect())
    }

    /// Runs one answer's tool calls concurrently; answers each call's tool
    /// message content, in call order.
    async fn run_step(&self, turn: &Turn, step: u32, calls: &[ModelToolCall]) -> Vec<String> {
        let runs = calls.iter().map(|model_call| {
            let call = ToolCall {
                name: model_call.name.clone(),
                arguments: CallArguments::from_json(Some(Value::String(model_call.arguments.clone()))),
                call_id: model_call.id.clone(),
                caller_slot: Slot::Narrator,
                floor_id: Some(turn.run.floor_id.clone()),
                run_id: Some(turn.run.id.clone()),
                step: Some(step),
            };
            self.emit(turn, "tool_call_started", json!({"call_id": call.call_id, "name": call.name, "step": step}));
            async move {
                let outcome = self.call(&turn.account_id, &turn.session_id, call).await;
                let content = tool_message(&model_call.name, &outcome);
                let finished = match &outcome {
                    Ok(result) => json!({"call_id": result.call_id, "name": result.name, "status": result.status, "is_error": result.is_error, "execution_id": result.execution_id, "step": step}),
                    Err(error) => json!({"call_id": model_call.id, "name": model_call.name, "status": "refused", "is_error": true, "error": error.to_string(), "step": step}),
                };
                self.emit(turn, "tool_call_finished", finished);
                content
            }
        });
        futures::future::join_all(runs).await
    }

    /// The committed history of the session before this run's floor.
    async fn history(
        &self,
        account_id: &str,
        session: &Session,
        character: Option<&crate::store::Character>,
        run: &Run,
    ) -> Result<Vec<Value>> {
        let mut messages = Vec::new();
        // The character's system prompt, else its persona.
        let prompt = character.and_then(|c| {
            c.overrides
                .system_prompt
                .clone()
                .or_else(|| Some(c.persona.trim().to_owned()))
        });
        if let Some(prompt) = prompt.filter(|p| !p.trim().is_empty()) {
            messages.push(json!({"role": "system", "content": prompt}));
        }
        for floor in self.store.list_floors(account_id, &session.id).await? {
            if floor.id == run.floor_id {
                break;
            }
            let Some(active) = floor.active_page_id.as_deref() else {
                continue;
            };
            messages.push(json!({"role": "user", "content": floor.content}));
            if let Some(page) = floor.pages.iter().find(|page| page.id == active) {
                messages.push(json!({"role": "assistant", "content": page.content}));
            }
        }
        Ok(messages)
    }

    fn emit(&self, turn: &Turn, kind: &'static str, mut data: Value) {
        if let Some(fields) = data.as_object_mut() {
            fields.insert("run_id".into(), json!(turn.run.id));
        }
        let event = ModelSessionEvent { kind, data };
        self.model_sessions
            .publish_to_session(&turn.session_id, event);
    }
}

fn still_generating(run_id: &str) -> crate::error::Error {
    crate::error::Error::refused(
        crate::error::ErrorCode::GenerationInProgress,
        format!("run {run_id} is still generating; wait for run_finished or cancel it"),
    )
}

/// The assistant message that asked for `calls`, as the model must see it again.
fn assistant_message(content: &str, calls: &[ModelToolCall]) -> Value {
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
