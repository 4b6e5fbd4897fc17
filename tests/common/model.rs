//! A stand-in for an OpenAI-compatible chat-completions endpoint: scripted
//! answers (streamed, whole JSON, or an error status), and every request body
//! it received, for the generation-loop tests. toolgate's client is the real one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::events::Events;
use super::{SpawnOptions, TestServer, spawn_with};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `text/event-stream` chunks (each a `chat.completion.chunk` object).
    Stream(Vec<Value>),
    /// A whole `application/json` completion.
    Json(Value),
    /// An error status with an optional Retry-After (seconds) and a message.
    Status(u16, Option<u64>, String),
    /// No answer at all: the request is held until the client goes away.
    Hang,
}

#[derive(Default)]
struct Script {
    answers: VecDeque<Answer>,
    /// Answered when the script is empty (a model that keeps calling tools).
    repeat: Option<Answer>,
    requests: Vec<Value>,
    /// Held (`Hang`) requests whose client went away.
    abandoned: usize,
}

/// Counts a held request as abandoned when its handler is dropped (axum
/// drops it when the client closes the connection).
struct Held(Arc<Mutex<Script>>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut script) = self.0.lock() {
            script.abandoned += 1;
        }
    }
}

/// The running stand-in.
#[derive(Clone)]
pub struct StandIn {
    pub base_url: String,
    script: Arc<Mutex<Script>>,
}

impl StandIn {
    pub async fn start(answers: Vec<Answer>) -> Self {
        let script = Arc::new(Mutex::new(Script {
            answers: answers.into(),
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(complete))
            // A real endpoint takes requests of megabytes (long conversations).
            .layer(axum::extract::DefaultBodyLimit::disable())
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base_url: format!("http://{addr}/v1"),
            script,
        }
    }

    /// Answers `answer` whenever the script has run out.
    pub fn repeat(&self, answer: Answer) {
        self.script.lock().unwrap().repeat = Some(answer);
    }

    /// Waits until `n` requests have arrived.
    pub async fn wait_for_requests(&self, n: usize) {
        crate::common::wait_until(Duration::from_secs(30), "the model requests", || {
            let asked = self.requests().len();
            async move { asked >= n }
        })
        .await;
    }

    /// Waits until the client has given up on `n` held requests.
    pub async fn wait_for_abandoned(&self, n: usize) {
        crate::common::wait_until(
            Duration::from_secs(30),
            "held model requests to be dropped",
            || {
                let abandoned = self.abandoned();
                async move { abandoned >= n }
            },
        )
        .await;
    }

    /// How many held (`Hang`) requests their client gave up on.
    pub fn abandoned(&self) -> usize {
        self.script.lock().unwrap().abandoned
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.script.lock().unwrap().requests.clone()
    }

    /// The environment that points toolgate at this stand-in.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("TOOLGATE_LLM_BASE_URL".into(), self.base_url.clone()),
            ("TOOLGATE_LLM_MODEL".into(), "stand-in".into()),
            ("TOOLGATE_LLM_API_KEY".into(), "sk-test-stand-in-key".into()),
        ]
    }
}

async fn complete(
    State(script): State<Arc<Mutex<Script>>>,
    _headers: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let answer = {
        let mut script = script.lock().unwrap();
        script.requests.push(body.0);
        script
            .answers
            .pop_front()
            .or_else(|| script.repeat.clone())
            .unwrap_or_else(|| Answer::Status(500, None, "the script ran out".into()))
    };
    match answer {
        Answer::Hang => {
            let _held = Held(script.clone());
            std::future::pending().await
        }
        Answer::Json(value) => axum::Json(value).into_response(),
        Answer::Status(status, retry_after, message) => {
            let mut response = (
                StatusCode::from_u16(status).unwrap(),
                axum::Json(json!({"error": {"message": message, "type": "test"}})),
            )
                .into_response();
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", seconds.to_string().parse().unwrap());
            }
            response
        }
        Answer::Stream(chunks) => {
            let mut body = String::new();
            for chunk in chunks {
                body.push_str(&format!("data: {chunk}\n\n"));
            }
            body.push_str("data: [DONE]\n\n");
            ([("content-type", "text/event-stream")], body).into_response()
        }
    }
}

/// A chunk carrying a text delta.
pub fn text_chunk(text: &str) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

/// A streamed text answer, one chunk per piece.
pub fn text_answer(pieces: &[&str]) -> Answer {
    let mut chunks: Vec<Value> = pieces.iter().map(|p| text_chunk(p)).collect();
    chunks.push(finish("stop"));
    Answer::Stream(chunks)
}

/// The last chunk of an answer.
pub fn finish(reason: &str) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

/// A chunk of tool call `index`: its id and name (first chunk) and a piece of
/// its arguments.
pub fn tool_chunk(index: u32, id_and_name: Option<(&str, &str)>, arguments: &str) -> Value {
    let mut call = json!({"index": index, "function": {"arguments": arguments}});
    if let Some((id, name)) = id_and_name {
        call["id"] = json!(id);
        call["type"] = json!("function");
        call["function"]["name"] = json!(name);
    }
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
}

/// A streamed answer calling each `(id, name, arguments)` once, every
/// argument split into 3-byte pieces and the calls interleaved.
pub fn calls_answer(calls: &[(&str, &str, &str)]) -> Answer {
    let mut chunks = Vec::new();
    for (index, (id, name, _)) in calls.iter().enumerate() {
        chunks.push(tool_chunk(index as u32, Some((id, name)), ""));
    }
    let pieces: Vec<Vec<String>> = calls
        .iter()
        .map(|(_, _, args)| {
            args.as_bytes()
                .chunks(3)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect()
        })
        .collect();
    let longest = pieces.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..longest {
        for (index, call_pieces) in pieces.iter().enumerate() {
            if let Some(piece) = call_pieces.get(round) {
                chunks.push(tool_chunk(index as u32, None, piece));
            }
        }
    }
    chunks.push(finish("tool_calls"));
    Answer::Stream(chunks)
}

pub async fn with_model(stand_in: &StandIn) -> TestServer {
    spawn_with(SpawnOptions {
        env: stand_in.env(),
        ..Default::default()
    })
    .await
}

/// Posts a floor and answers the 202's data.
pub async fn turn(server: &TestServer, session: &str, content: &str) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": content}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    reply.body["data"].clone()
}

/// Events of the stream until `run_finished` or `run_failed` (that one last).
pub async fn until_run_ends(events: &mut Events) -> Vec<(String, Value)> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(40), events.next())
            .await
            .expect("the run did not end within 40 s");
        let end = event.kind == "run_finished" || event.kind == "run_failed";
        seen.push((event.kind, event.data));
        if end {
            return seen;
        }
    }
}

pub fn kinds(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(kind, _)| kind.as_str()).collect()
}
