//! What the generation loop hands the client and what it gets back.

use std::fmt;

use serde_json::Value;

/// One chat-completions request, in the OpenAI shape.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// Overrides the configured model (a character's own model).
    pub model: Option<String>,
    /// OpenAI message objects, sent as given.
    pub messages: Vec<Value>,
    /// The OpenAI `tools` array; None or empty: the field is not sent, since
    /// some servers refuse an empty array.
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub temperature: Option<f64>,
}

/// The model's whole answer to one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatAnswer {
    /// Every text delta joined, in order.
    pub content: String,
    /// Tool calls in the order of their `index`.
    pub tool_calls: Vec<ModelToolCall>,
    /// As the provider sent it (`stop`, `tool_calls`, `length`…).
    pub finish_reason: Option<String>,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelToolCall {
    /// The provider's id; `call_<n>` (its position) when the provider sent none.
    pub id: String,
    pub name: String,
    /// Raw JSON text as the model sent it; it may be invalid JSON.
    pub arguments: String,
}

/// A request that did not give an answer: the provider refused it, failed, or
/// could not be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmError {
    /// The provider's HTTP status; None when no answer arrived.
    pub status: Option<u16>,
    /// The provider's own message, or what went wrong on the way.
    pub message: String,
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(status) => write!(f, "the model provider answered {status}: {}", self.message),
            None => write!(f, "could not reach the model provider: {}", self.message),
        }
    }
}

impl std::error::Error for LlmError {}
