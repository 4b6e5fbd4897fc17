//! The chat-completions wire format: the request body, a provider's error
//! message, and the whole (non-streamed) JSON answer.

use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::failure::Failure;
use super::{ChatAnswer, ChatRequest, ModelToolCall, Tuning};

/// Most of an error body read to find the provider's message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// Most of a body without a JSON message quoted in an error.
const SNIPPET_CHARS: usize = 300;

/// The JSON body sent for `request`, always asking for a stream: serialized
/// once from the request as it is (retries resend the same bytes).
pub(super) fn request_body(request: &ChatRequest, default_model: &str) -> bytes::Bytes {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        model: &'a str,
        messages: &'a [super::ChatMessage],
        // Not sent when empty: some servers refuse an empty array.
        #[serde(skip_serializing_if = "Option::is_none")]
        tools: Option<&'a [Value]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_choice: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        temperature: Option<f64>,
        stream: bool,
    }
    let body = Body {
        model: request.model.as_deref().unwrap_or(default_model),
        messages: &request.messages,
        tools: request.tools.as_deref().filter(|tools| !tools.is_empty()),
        tool_choice: request.tool_choice.as_ref(),
        temperature: request.temperature,
        stream: true,
    };
    // Values and plain fields only: serializing cannot fail.
    serde_json::to_vec(&body)
        .expect("a chat request serializes")
        .into()
}

/// Reads at most `limit` bytes of the body; None when it is longer.
pub(super) async fn read_bounded(
    response: reqwest::Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// The message of a refusal: the JSON `error.message` (or the like) when the
/// body has one, else a bounded snippet of the body, else the status's reason.
pub(super) async fn error_message(response: reqwest::Response, idle: Duration) -> String {
    let status = response.status();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    // An error body that stalls is read as far as it came: the status alone
    // already decides the failure.
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout(idle, chunks.next()).await {
        let room = ERROR_BODY_LIMIT.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= ERROR_BODY_LIMIT {
            break;
        }
    }
    message_of(&body).unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&body);
        let snippet: String = text.trim().chars().take(SNIPPET_CHARS).collect();
        if snippet.is_empty() {
            status.canonical_reason().unwrap_or("no message").to_owned()
        } else {
            snippet
        }
    })
}

/// The message in an error object: `{"error":{"message"}}`, `{"error":"…"}`,
/// `{"message"}` or `{"detail"}`, the shapes providers use.
pub(super) fn message_of(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    error_text(&value)
}

/// The text of a JSON error value, if it is one.
pub(super) fn error_text(value: &Value) -> Option<String> {
    let candidates = [
        value.pointer("/error/message"),
        value.get("error"),
        value.get("message"),
        value.get("detail"),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|v| v.as_str().map(str::to_owned))
}

#[derive(Deserialize)]
struct Whole {
    #[serde(default)]
    choices: Vec<WholeChoice>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WholeChoice {
    #[serde(default)]
    index: u64,
    message: Option<WholeMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WholeMessage {
    content: Option<String>,
    tool_calls: Option<Vec<WholeCall>>,
}

#[derive(Deserialize)]
struct WholeCall {
    id: Option<String>,
    function: WholeFunction,
}

#[derive(Deserialize)]
struct WholeFunction {
    #[serde(default)]
    name: String,
    /// A string per the spec; some servers send an object.
    #[serde(default)]
    arguments: Value,
}

/// Reads a whole JSON answer (an endpoint that does not stream); its content
/// goes to `on_token` once.
pub(super) async fn read_whole(
    response: reqwest::Response,
    tuning: &Tuning,
    on_token: &mut (dyn FnMut(&str) + Send),
) -> Result<ChatAnswer, Failure> {
    let status = response.status().as_u16();
    // The JSON around the text and arguments is small next to them.
    let limit = tuning
        .max_answer_bytes
        .saturating_mul(2)
        .saturating_add(64 * 1024);
    let body = match tokio::time::timeout(tuning.idle_timeout, read_bounded(response, limit)).await
    {
        Err(_) => return Err(Failure::stream(status, "the answer stalled")),
        Ok(Err(error)) => return Err(Failure::stream(status, super::failure::chain(&error))),
        Ok(Ok(None)) => return Err(too_large(status, tuning)),
        Ok(Ok(Some(body))) => body,
    };
    let whole: Whole = serde_json::from_slice(&body).map_err(|e| {
        Failure::answer(
            status,
            format!("the answer is not chat-completions JSON: {e}"),
        )
    })?;
    if let Some(error) = whole.error.as_ref().filter(|e| !e.is_null()) {
        let text = error_text(&json!({ "error": error })).unwrap_or_else(|| error.to_string());
        return Err(Failure::answer(status, text));
    }
    let answer = answer_of(whole, status, tuning)?;
    if !answer.content.is_empty() {
        on_token(&answer.content);
    }
    Ok(answer)
}

fn answer_of(whole: Whole, status: u16, tuning: &Tuning) -> Result<ChatAnswer, Failure> {
    let choice = whole
        .choices
        .into_iter()
        .find(|c| c.index == 0)
        .ok_or_else(|| Failure::answer(status, "the answer has no choices"))?;
    let message = choice
        .message
        .ok_or_else(|| Failure::answer(status, "the answer's choice has no message"))?;
    let calls = message.tool_calls.unwrap_or_default();
    if calls.len() > tuning.max_tool_calls {
        return Err(too_many_calls(status, tuning));
    }
    let tool_calls: Vec<ModelToolCall> = calls
        .into_iter()
        .map(|call| ModelToolCall {
            id: call.id.unwrap_or_default(),
            name: call.function.name,
            arguments: match call.function.arguments {
                Value::String(text) => text,
                Value::Null => String::new(),
                other => other.to_string(),
            },
        })
        .collect();
    let answer = ChatAnswer::new(
        message.content.unwrap_or_default(),
        tool_calls,
        choice.finish_reason,
    );
    if answer_bytes(&answer) > tuning.max_answer_bytes {
        return Err(too_large(status, tuning));
    }
    Ok(answer)
}

/// The size the answer cap counts: text, names and arguments.
pub(super) fn answer_bytes(answer: &ChatAnswer) -> usize {
    answer.content.len()
        + answer
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum::<usize>()
}

pub(super) fn too_large(status: u16, tuning: &Tuning) -> Failure {
    Failure::answer(
        status,
        format!(
            "the answer passed the limit of {} bytes of text and arguments",
            tuning.max_answer_bytes
        ),
    )
}

pub(super) fn too_many_calls(status: u16, tuning: &Tuning) -> Failure {
    Failure::answer(
        status,
        format!(
            "the answer has more than {} tool calls",
            tuning.max_tool_calls
        ),
    )
}
