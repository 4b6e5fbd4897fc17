//! What the generation loop hands the client and what it gets back.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// One OpenAI message object, shared by every copy of a message list: a
/// turn's history (up to 6 MiB) goes into the request of each of its slots
/// (narrator, director, verifier, memory) without being copied.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct ChatMessage(Arc<Value>);

impl ChatMessage {
    /// Whether the two are one message, not equal copies.
    pub fn is_shared_with(&self, other: &ChatMessage) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl From<Value> for ChatMessage {
    fn from(message: Value) -> Self {
        Self(Arc::new(message))
    }
}

impl std::ops::Deref for ChatMessage {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0
    }
}

/// One chat-completions request, in the OpenAI shape.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// Overrides the configured model (a character's own model).
    pub model: Option<String>,
    /// OpenAI message objects, sent as given.
    pub messages: Vec<ChatMessage>,
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
    /// The provider's id; `call_<n>` (its position) when the provider sent
    /// none or one an earlier call of the answer has ([`distinct_call_ids`]).
    pub id: String,
    pub name: String,
    /// Raw JSON text as the model sent it; it may be invalid JSON.
    pub arguments: String,
}

/// Longest tool name or call id of a model's answer kept whole, in bytes (the
/// API's own limit on both): a longer one is cut, since no tool has such a
/// name and the id only has to be told apart.
pub const MAX_MODEL_NAME_BYTES: usize = 256;

impl ChatAnswer {
    /// The answer as toolgate keeps it: U+0000 in text, names and arguments
    /// becomes U+FFFD (PostgreSQL cannot store it, and a reply or a call
    /// that could not be stored was lost), a name over
    /// [`MAX_MODEL_NAME_BYTES`] is cut to it, an id that is over it or holds
    /// U+0000 is replaced, and every call gets an id of its own.
    pub(super) fn new(
        content: String,
        mut tool_calls: Vec<ModelToolCall>,
        finish_reason: Option<String>,
    ) -> Self {
        for call in &mut tool_calls {
            if call.id.len() > MAX_MODEL_NAME_BYTES || call.id.contains('\0') {
                call.id.clear();
            }
            without_nul(&mut call.name);
            crate::text::truncate_to_bytes(&mut call.name, MAX_MODEL_NAME_BYTES);
            without_nul(&mut call.arguments);
        }
        distinct_call_ids(&mut tool_calls);
        let mut content = content;
        without_nul(&mut content);
        Self {
            content,
            tool_calls,
            finish_reason,
        }
    }
}

fn without_nul(text: &mut String) {
    if let std::borrow::Cow::Owned(replaced) = crate::text::without_nul(text) {
        *text = replaced;
    }
}

/// Gives each call an id no other call of the same answer has: the provider's
/// own where it sent one not used before, else `call_<n>` (its position, with a
/// suffix if a provider's id already is that). Results go back to the model
/// under these ids, so two calls with one id would get answers it cannot tell
/// apart (and some providers refuse such a request).
fn distinct_call_ids(calls: &mut [ModelToolCall]) {
    let mut used: HashSet<String> = calls
        .iter()
        .filter(|call| !call.id.is_empty())
        .map(|call| call.id.clone())
        .collect();
    let mut claimed = HashSet::with_capacity(calls.len());
    for (n, call) in calls.iter_mut().enumerate() {
        if !call.id.is_empty() && claimed.insert(call.id.clone()) {
            continue;
        }
        let mut id = format!("call_{n}");
        let mut suffix = 1;
        while used.contains(&id) {
            id = format!("call_{n}_{suffix}");
            suffix += 1;
        }
        used.insert(id.clone());
        claimed.insert(id.clone());
        call.id = id;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(ids: &[&str]) -> Vec<ModelToolCall> {
        ids.iter()
            .map(|id| ModelToolCall {
                id: (*id).to_owned(),
                name: "f".to_owned(),
                arguments: "{}".to_owned(),
            })
            .collect()
    }

    fn ids_of(calls: &[ModelToolCall]) -> Vec<&str> {
        calls.iter().map(|call| call.id.as_str()).collect()
    }

    #[test]
    fn every_call_of_an_answer_gets_an_id_of_its_own() {
        let mut answer = calls(&["a", "b"]);
        distinct_call_ids(&mut answer);
        assert_eq!(ids_of(&answer), ["a", "b"], "distinct ids are kept");

        let mut answer = calls(&["", ""]);
        distinct_call_ids(&mut answer);
        assert_eq!(ids_of(&answer), ["call_0", "call_1"]);

        let mut answer = calls(&["x", "x", "x"]);
        distinct_call_ids(&mut answer);
        assert_eq!(ids_of(&answer), ["x", "call_1", "call_2"]);

        // A made-up id never takes one the provider gave a later call.
        let mut answer = calls(&["", "call_0", "call_0"]);
        distinct_call_ids(&mut answer);
        assert_eq!(ids_of(&answer), ["call_0_1", "call_0", "call_2"]);
    }
}
