//! A streamed answer: Server-Sent Events of chat-completion chunks, text
//! deltas passed on as they come and tool-call deltas assembled by index.

use std::collections::BTreeMap;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::failure::{Failure, chain};
use super::wire::{error_text, too_large, too_many_calls};
use super::{ChatAnswer, ModelToolCall, Tuning};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u64,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<CallDelta>>,
    /// A reasoning model's thinking (`reasoning_content` or `reasoning`,
    /// by provider): not part of the answer, but a sign of progress.
    #[serde(alias = "reasoning")]
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct CallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

/// The answer so far.
struct Assembler<'t> {
    tuning: &'t Tuning,
    status: u16,
    content: String,
    calls: BTreeMap<u64, ModelToolCall>,
    last_index: Option<u64>,
    finish_reason: Option<String>,
    size: usize,
}

impl<'t> Assembler<'t> {
    fn new(tuning: &'t Tuning, status: u16) -> Self {
        Self {
            tuning,
            status,
            content: String::new(),
            calls: BTreeMap::new(),
            last_index: None,
            finish_reason: None,
            size: 0,
        }
    }

    /// Applies one event's data; answers whether it carried anything (text,
    /// a tool call, reasoning, a finish), as a keep-alive does not.
    fn apply(
        &mut self,
        data: &str,
        on_token: &mut (dyn FnMut(&str) + Send),
    ) -> Result<bool, Failure> {
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            Failure::answer(
                self.status,
                format!("a stream chunk is not chat-completions JSON: {e}"),
            )
        })?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            let text = error_text(&json!({ "error": error })).unwrap_or_else(|| error.to_string());
            return Err(Failure::answer(
                self.status,
                format!("error in the stream: {text}"),
            ));
        }
        let mut progress = false;
        // Only the first choice is asked for (no `n`); others are ignored.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    self.grow(text.len())?;
                    self.content.push_str(&text);
                    on_token(&text);
                    progress = true;
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.apply_call(call)?;
                    progress = true;
                }
                progress |= delta.reasoning_content.is_some_and(|t| !t.is_empty());
            }
            if choice.finish_reason.is_some() {
                self.finish_reason = choice.finish_reason;
                progress = true;
            }
        }
        Ok(progress)
    }

    fn apply_call(&mut self, delta: CallDelta) -> Result<(), Failure> {
        let index = delta
            .index
            .unwrap_or_else(|| self.index_without_one(&delta));
        if !self.calls.contains_key(&index) && self.calls.len() >= self.tuning.max_tool_calls {
            return Err(too_many_calls(self.status, self.tuning));
        }
        self.last_index = Some(index);
        let function = delta.function.unwrap_or(FunctionDelta {
            name: None,
            arguments: None,
        });
        let added = function.name.as_ref().map_or(0, String::len)
            + function.arguments.as_ref().map_or(0, String::len);
        self.grow(added)?;
        let call = self.calls.entry(index).or_default();
        if call.id.is_empty()
            && let Some(id) = delta.id
        {
            call.id = id;
        }
        // Some servers repeat the whole name in every chunk of a call, others
        // could split it: a repeat is dropped, a new piece appended.
        if let Some(name) = function.name.filter(|n| *n != call.name) {
            call.name.push_str(&name);
        }
        if let Some(arguments) = function.arguments {
            call.arguments.push_str(&arguments);
        }
        Ok(())
    }

    /// Servers that leave out `index` start a call with its `id`: a new id is
    /// the next call, anything else continues the last one.
    fn index_without_one(&self, delta: &CallDelta) -> u64 {
        let last = self
            .last_index
            .and_then(|i| self.calls.get(&i).map(|c| (i, c)));
        match (last, delta.id.as_deref()) {
            (Some((i, call)), Some(id)) if call.id == id => i,
            (Some((i, _)), None) => i,
            _ => self.calls.keys().next_back().map_or(0, |i| i + 1),
        }
    }

    fn grow(&mut self, bytes: usize) -> Result<(), Failure> {
        self.size += bytes;
        if self.size > self.tuning.max_answer_bytes {
            return Err(too_large(self.status, self.tuning));
        }
        Ok(())
    }

    fn finish(self) -> ChatAnswer {
        let tool_calls: Vec<ModelToolCall> = self.calls.into_values().collect();
        ChatAnswer::new(self.content, tool_calls, self.finish_reason)
    }
}

/// Counts the bytes of the event being received, so that a provider sending
/// one endless event cannot fill memory (the parser buffers a whole event).
struct EventGuard {
    limit: usize,
    event: usize,
    line: usize,
    previous: u8,
}

impl EventGuard {
    fn check(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if b == b'\n' || b == b'\r' {
                // A line ending on an empty line ends the event; `\r\n` is one ending.
                let pair = b == b'\n' && self.previous == b'\r';
                if self.line == 0 && !pair {
                    self.event = 0;
                }
                self.line = 0;
            } else {
                self.line += 1;
                self.event += 1;
            }
            self.previous = b;
        }
        self.event <= self.limit
    }
}

/// Why the body stream stopped.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("{}", chain(.0))]
    Transport(reqwest::Error),
    #[error("one event passed {0} bytes")]
    EventTooLarge(usize),
}

/// Reads a `text/event-stream` answer until `data: [DONE]`.
pub(super) async fn read_stream(
    response: reqwest::Response,
    tuning: &Tuning,
    on_token: &mut (dyn FnMut(&str) + Send),
) -> Result<ChatAnswer, Failure> {
    let status = response.status().as_u16();
    let event_limit = tuning.max_answer_bytes.saturating_add(64 * 1024);
    let mut guard = EventGuard {
        limit: event_limit,
        event: 0,
        line: 0,
        previous: 0,
    };
    let bytes = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| BodyError::Transport(e.without_url()))?;
        if guard.check(&chunk) {
            Ok(chunk)
        } else {
            Err(BodyError::EventTooLarge(event_limit))
        }
    });
    let mut events = std::pin::pin!(bytes.eventsource());
    let mut answer = Assembler::new(tuning, status);
    // Silence is counted from the last event that carried something, so a
    // provider sending empty keep-alives for ever still stalls.
    let mut stalls_at = tokio::time::Instant::now() + tuning.idle_timeout;
    loop {
        let next = tokio::time::timeout_at(stalls_at, events.next())
            .await
            .map_err(|_| Failure::stream(status, "the stream stalled"))?;
        match next {
            Some(Ok(event)) if event.data.trim() == "[DONE]" => return Ok(answer.finish()),
            Some(Ok(event)) if event.data.trim().is_empty() => {}
            Some(Ok(event)) => {
                if answer.apply(&event.data, on_token)? {
                    stalls_at = tokio::time::Instant::now() + tuning.idle_timeout;
                }
            }
            Some(Err(eventsource_stream::EventStreamError::Transport(
                BodyError::EventTooLarge(_),
            ))) => {
                return Err(too_large(status, tuning));
            }
            Some(Err(error)) => {
                return Err(Failure::stream(
                    status,
                    format!("the stream broke: {error}"),
                ));
            }
            // Some servers close without [DONE]; a finish reason says the answer is whole.
            None if answer.finish_reason.is_some() => return Ok(answer.finish()),
            None => return Err(Failure::stream(status, "the stream ended before [DONE]")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> EventGuard {
        EventGuard {
            limit: 10,
            event: 0,
            line: 0,
            previous: 0,
        }
    }

    #[test]
    fn the_event_guard_counts_one_event_and_resets_on_a_blank_line() {
        let mut g = guard();
        assert!(g.check(b"data: 1234\n\n"));
        assert!(g.check(b"data: 1234\r\n\r\ndata: 1234\r\n"));
        assert_eq!(g.event, 10);
        assert!(
            !g.check(b"data: 1\n"),
            "two lines of one event pass 10 bytes"
        );
        let mut g = guard();
        assert!(!g.check(b"data: 0123456789"));
    }

    #[test]
    fn calls_without_index_are_told_apart_by_id() {
        let tuning = Tuning::default();
        let mut a = Assembler::new(&tuning, 200);
        let mut none = |_: &str| {};
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"[]"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g"}}]},"finish_reason":"tool_calls"}]}"#,
        ] {
            a.apply(data, &mut none).unwrap();
        }
        let answer = a.finish();
        let calls: Vec<_> = answer
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(calls, [("a", "f", "{}"), ("b", "g", "[]")]);
    }
}
