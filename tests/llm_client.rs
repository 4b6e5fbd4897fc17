//! The chat-completions client against a scripted OpenAI-compatible stand-in
//! server on 127.0.0.1:0: streaming, tool-call assembly, the non-streaming
//! fallback, retries and the key.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use toolgate::llm::{ChatRequest, LlmClient, LlmConfig, LlmError, ModelToolCall, Tuning};

/// One scripted answer of the stand-in.
enum Reply {
    /// A `text/event-stream` body written in these pieces, one write each.
    Sse(Vec<Vec<u8>>),
    /// Like `Sse`, then silence with the connection open.
    SseThenStall(Vec<Vec<u8>>),
    /// A `text/event-stream` body that writes this piece every 20 ms, for ever.
    SseForever(String),
    /// A plain `application/json` answer.
    Json(Value),
    /// Any status, extra headers and body.
    Status(u16, Vec<(&'static str, String)>, String),
}

/// A request the stand-in received.
struct Received {
    authorization: Option<String>,
    body: Value,
    at: Instant,
}

struct Standin {
    base_url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

type Script = Arc<Mutex<VecDeque<Reply>>>;

async fn standin(replies: Vec<Reply>) -> Standin {
    let script: Script = Arc::new(Mutex::new(replies.into()));
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let script = script.clone();
            let log = log.clone();
            async move {
                log.lock().unwrap().push(Received {
                    authorization: headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    body: serde_json::from_slice(&body).expect("JSON request"),
                    at: Instant::now(),
                });
                let reply = script.lock().unwrap().pop_front();
                answer(reply)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Standin {
        base_url: format!("http://{addr}/v1"),
        received,
    }
}

fn answer(reply: Option<Reply>) -> Response {
    let sse = |pieces: Vec<Vec<u8>>, stall: bool| {
        // A pause between writes so the pieces really arrive apart.
        let pieces = futures::stream::iter(pieces).then(|piece| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Infallible>(Bytes::from(piece))
        });
        let body = if stall {
            Body::from_stream(pieces.chain(futures::stream::pending()))
        } else {
            Body::from_stream(pieces)
        };
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    };
    match reply {
        Some(Reply::Sse(pieces)) => sse(pieces, false),
        Some(Reply::SseThenStall(pieces)) => sse(pieces, true),
        Some(Reply::SseForever(piece)) => {
            let pieces = futures::stream::repeat(piece).then(|piece| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Infallible>(Bytes::from(piece))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(pieces))
                .unwrap()
        }
        Some(Reply::Json(value)) => Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(value.to_string()))
            .unwrap(),
        Some(Reply::Status(status, headers, body)) => {
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response.body(Body::from(body)).unwrap()
        }
        None => Response::builder()
            .status(StatusCode::IM_A_TEAPOT)
            .body(Body::from("the script has no more replies"))
            .unwrap(),
    }
}

/// One SSE event carrying a chunk with this first-choice delta.
fn event(delta: Value, finish_reason: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    });
    format!("data: {chunk}\n\n")
}

/// A whole stream of events cut into pieces of `size` bytes, wherever that falls.
fn cut(events: &[String], size: usize) -> Vec<Vec<u8>> {
    events
        .concat()
        .into_bytes()
        .chunks(size)
        .map(<[u8]>::to_vec)
        .collect()
}

fn text_stream(tokens: &[&str]) -> Vec<String> {
    let mut events = vec![event(json!({"role": "assistant", "content": ""}), None)];
    events.extend(tokens.iter().map(|t| event(json!({"content": t}), None)));
    events.push(event(json!({}), Some("stop")));
    events.push("data: [DONE]\n\n".into());
    events
}

fn client(standin: &Standin, key: Option<&str>) -> LlmClient {
    LlmClient::new(config(&standin.base_url, key)).unwrap()
}

fn config(base_url: &str, key: Option<&str>) -> LlmConfig {
    LlmConfig {
        base_url: base_url.parse().unwrap(),
        api_key: key.map(str::to_owned),
        model: "test-model".into(),
        first_tool_choice: Default::default(),
    }
}

fn hello() -> ChatRequest {
    ChatRequest {
        messages: vec![json!({"role": "user", "content": "hello"}).into()],
        ..ChatRequest::default()
    }
}

async fn run(
    client: &LlmClient,
    request: &ChatRequest,
) -> (Result<toolgate::llm::ChatAnswer, LlmError>, Vec<String>) {
    let mut tokens = Vec::new();
    let result = client
        .complete(request, &mut |t: &str| tokens.push(t.to_owned()))
        .await;
    (result, tokens)
}

#[tokio::test]
async fn tokens_arrive_in_order_and_the_request_is_an_openai_stream_request() {
    let tokens = ["Hel", "lo, ", "wörld", " 世界", "!"];
    let standin = standin(vec![Reply::Sse(cut(&text_stream(&tokens), 5))]).await;
    let (answer, seen) = run(&client(&standin, None), &hello()).await;
    let answer = answer.expect("answer");
    assert_eq!(seen, tokens);
    assert_eq!(answer.content, "Hello, wörld 世界!");
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert!(answer.tool_calls.is_empty());
    let received = standin.received.lock().unwrap();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].body,
        json!({"model": "test-model", "messages": [{"role": "user", "content": "hello"}], "stream": true}),
        "no tools, tool_choice or temperature sent when not given"
    );
    assert_eq!(received[0].authorization, None);
}

#[tokio::test]
async fn the_request_sends_tools_choice_temperature_and_an_overriding_model() {
    let standin = standin(vec![
        Reply::Sse(cut(&text_stream(&["ok"]), 64)),
        Reply::Sse(cut(&text_stream(&["ok"]), 64)),
    ])
    .await;
    let llm = LlmClient::new(config(&format!("{}/", standin.base_url), None)).unwrap();
    let tool =
        json!({"type": "function", "function": {"name": "roll", "parameters": {"type": "object"}}});
    let request = ChatRequest {
        model: Some("other".into()),
        tools: Some(vec![tool.clone()]),
        tool_choice: Some(json!("required")),
        temperature: Some(0.25),
        ..hello()
    };
    run(&llm, &request)
        .await
        .0
        .expect("answer through a base URL with a trailing slash");
    let empty_tools = ChatRequest {
        tools: Some(vec![]),
        ..hello()
    };
    run(&llm, &empty_tools).await.0.expect("answer");
    let received = standin.received.lock().unwrap();
    let body = &received[0].body;
    assert_eq!(body["model"], "other");
    assert_eq!(body["tools"], json!([tool]));
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["temperature"], 0.25);
    assert!(
        received[1].body.get("tools").is_none(),
        "an empty tools array is not sent"
    );
}

/// Three parallel calls whose chunks interleave; each call's id and name come
/// in its first chunk and its arguments in many small pieces.
fn parallel_calls_stream() -> Vec<String> {
    let calls = [
        (
            "call_a",
            "get_weather",
            r#"{"city": "Paris", "unit": "celsius"}"#,
        ),
        ("call_b", "roll_dice", r#"{"sides": 20}"#),
        (
            "call_c",
            "query_memory",
            r#"{"query": "the dragon's name", "limit": 3}"#,
        ),
    ];
    let mut events = vec![event(json!({"role": "assistant", "content": null}), None)];
    for (index, (id, name, _)) in calls.iter().enumerate() {
        events.push(event(json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None));
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
    let longest = pieces.iter().map(Vec::len).max().unwrap();
    for step in 0..longest {
        // Most recent call first, so arrival order differs from index order.
        for index in (0..calls.len()).rev() {
            if let Some(piece) = pieces[index].get(step) {
                events.push(event(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
    }
    events.push(event(json!({}), Some("tool_calls")));
    events.push("data: [DONE]\n\n".into());
    events
}

#[tokio::test]
async fn parallel_tool_calls_interleaved_and_split_are_assembled_in_index_order() {
    let standin = standin(vec![Reply::Sse(cut(&parallel_calls_stream(), 11))]).await;
    let (answer, tokens) = run(&client(&standin, None), &hello()).await;
    let answer = answer.expect("answer");
    assert!(tokens.is_empty(), "{tokens:?}");
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let call = |id: &str, name: &str, arguments: &str| ModelToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    assert_eq!(
        answer.tool_calls,
        [
            call(
                "call_a",
                "get_weather",
                r#"{"city": "Paris", "unit": "celsius"}"#
            ),
            call("call_b", "roll_dice", r#"{"sides": 20}"#),
            call(
                "call_c",
                "query_memory",
                r#"{"query": "the dragon's name", "limit": 3}"#
            ),
        ]
    );
}

#[tokio::test]
async fn a_non_streaming_json_answer_is_read_whole_and_its_text_given_once() {
    let whole = json!({
        "id": "chatcmpl-2", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me roll.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "roll_dice", "arguments": "{\"sides\":6}"}},
                {"id": "c2", "type": "function", "function": {"name": "roll_dice", "arguments": {"sides": 8}}}
            ]}}]
    });
    let standin = standin(vec![Reply::Json(whole)]).await;
    let (answer, tokens) = run(&client(&standin, None), &hello()).await;
    let answer = answer.expect("answer");
    assert_eq!(tokens, ["Let me roll."]);
    assert_eq!(answer.content, "Let me roll.");
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    let calls: Vec<_> = answer
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(calls, [("c1", r#"{"sides":6}"#), ("c2", r#"{"sides":8}"#)]);
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_then_the_answer_comes() {
    let standin = standin(vec![
        Reply::Status(
            429,
            vec![("retry-after", "1".into())],
            r#"{"error":{"message":"slow down"}}"#.into(),
        ),
        Reply::Sse(cut(&text_stream(&["fine"]), 16)),
    ])
    .await;
    let (answer, tokens) = run(&client(&standin, None), &hello()).await;
    assert_eq!(answer.expect("answer after the retry").content, "fine");
    assert_eq!(tokens, ["fine"]);
    let received = standin.received.lock().unwrap();
    assert_eq!(received.len(), 2);
    let waited = received[1].at - received[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "Retry-After 1 s honoured, waited {waited:?}"
    );
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
}

#[tokio::test]
async fn retry_after_is_capped() {
    let standin = standin(vec![
        Reply::Status(429, vec![("retry-after", "3600".into())], String::new()),
        Reply::Sse(cut(&text_stream(&["ok"]), 16)),
    ])
    .await;
    let tuning = Tuning {
        retry_after_cap: Duration::from_millis(200),
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let started = Instant::now();
    run(&llm, &hello()).await.0.expect("answer");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_provider_answering_503_four_times_fails_after_three_retries_with_its_message() {
    let down = || {
        Reply::Status(
            503,
            vec![],
            r#"{"error":{"message":"model overloaded","type":"server_error"}}"#.into(),
        )
    };
    let standin = standin(vec![
        down(),
        down(),
        down(),
        down(),
        Reply::Sse(cut(&text_stream(&["late"]), 16)),
    ])
    .await;
    let (result, tokens) = run(&client(&standin, None), &hello()).await;
    let error = result.expect_err("the provider stays down");
    assert_eq!(
        error,
        LlmError {
            status: Some(503),
            message: "model overloaded".into()
        }
    );
    assert_eq!(
        error.to_string(),
        "the model provider answered 503: model overloaded"
    );
    assert!(tokens.is_empty());
    let received = standin.received.lock().unwrap();
    assert_eq!(received.len(), 4, "one attempt and three retries");
    let waits: Vec<Duration> = received.windows(2).map(|w| w[1].at - w[0].at).collect();
    for (wait, expected) in waits.iter().zip([500, 1000, 2000]) {
        assert!(
            *wait >= Duration::from_millis(expected - 50),
            "backoff {waits:?}"
        );
        assert!(
            *wait < Duration::from_millis(expected * 2 + 500),
            "backoff {waits:?}"
        );
    }
}

#[tokio::test]
async fn a_body_without_a_json_message_is_quoted_in_a_bounded_snippet() {
    let page = format!("<html>Bad Gateway {}</html>", "x".repeat(10_000));
    let standin = standin(vec![Reply::Status(400, vec![], page)]).await;
    let error = run(&client(&standin, None), &hello())
        .await
        .0
        .expect_err("refused");
    assert_eq!(error.status, Some(400));
    assert!(
        error.message.starts_with("<html>Bad Gateway"),
        "{}",
        error.message
    );
    assert!(error.message.len() <= 300, "{}", error.message.len());
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let standin = standin(vec![
        Reply::Status(
            400,
            vec![],
            r#"{"error":{"message":"messages: unknown role 'wizard'"}}"#.into(),
        ),
        Reply::Sse(cut(&text_stream(&["never"]), 16)),
    ])
    .await;
    let error = run(&client(&standin, None), &hello())
        .await
        .0
        .expect_err("refused");
    assert_eq!(error.status, Some(400));
    assert_eq!(error.message, "messages: unknown role 'wizard'");
    assert_eq!(standin.received.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_retried_then_reported_as_unreachable() {
    // A port bound but never listening: nothing listens there, and no server
    // another test starts can be given it while the socket lives.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .unwrap();
    let port = held.local_addr().unwrap().port();
    let tuning = Tuning {
        backoff: Duration::from_millis(50),
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(
        config(&format!("http://127.0.0.1:{port}/v1"), Some("sk-x")),
        tuning,
    )
    .unwrap();
    let started = Instant::now();
    let error = run(&llm, &hello()).await.0.expect_err("nothing listens");
    assert_eq!(error.status, None);
    assert!(
        error
            .to_string()
            .starts_with("could not reach the model provider: "),
        "{error}"
    );
    // Three retries of 50, 100 and 200 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(340),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_key_is_sent_as_bearer_and_never_printed() {
    let standin = standin(vec![Reply::Sse(cut(&text_stream(&["hi"]), 16))]).await;
    let llm = client(&standin, Some("sk-very-secret-42"));
    run(&llm, &hello()).await.0.expect("answer");
    let received = standin.received.lock().unwrap();
    assert_eq!(
        received[0].authorization.as_deref(),
        Some("Bearer sk-very-secret-42")
    );
    let config = config(&standin.base_url, Some("sk-very-secret-42"));
    for text in [format!("{config:?}"), format!("{llm:?}")] {
        assert!(!text.contains("sk-very-secret-42"), "{text}");
    }
}

#[tokio::test]
async fn a_stream_that_breaks_after_a_token_is_not_retried() {
    let first = vec![event(json!({"content": "half"}), None)];
    let standin = standin(vec![
        Reply::SseThenStall(cut(&first, 64)),
        Reply::Sse(cut(&text_stream(&["again"]), 16)),
    ])
    .await;
    let tuning = Tuning {
        idle_timeout: Duration::from_millis(300),
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let (result, tokens) = run(&llm, &hello()).await;
    let error = result.expect_err("stalled");
    assert!(error.message.contains("stalled"), "{error}");
    assert_eq!(tokens, ["half"]);
    assert_eq!(
        standin.received.lock().unwrap().len(),
        1,
        "a token was given: no retry"
    );
}

#[tokio::test]
async fn a_stream_that_stalls_before_any_token_is_retried() {
    let standin = standin(vec![
        Reply::SseThenStall(vec![]),
        Reply::Sse(cut(&text_stream(&["again"]), 16)),
    ])
    .await;
    let tuning = Tuning {
        idle_timeout: Duration::from_millis(300),
        backoff: Duration::from_millis(10),
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let (result, tokens) = run(&llm, &hello()).await;
    assert_eq!(result.expect("answer on the retry").content, "again");
    assert_eq!(tokens, ["again"]);
    assert_eq!(standin.received.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn answers_over_the_caps_are_errors() {
    let big = vec![
        event(json!({"content": "x".repeat(600)}), None),
        event(json!({"content": "y".repeat(600)}), None),
    ];
    let many: Vec<String> = (0..5)
        .map(|i| event(json!({"tool_calls": [{"index": i, "id": format!("c{i}"), "function": {"name": "f", "arguments": "{}"}}]}), None))
        .collect();
    let standin = standin(vec![
        Reply::Sse(cut(&big, 128)),
        Reply::Sse(cut(&many, 128)),
    ])
    .await;
    let tuning = Tuning {
        max_answer_bytes: 1000,
        max_tool_calls: 4,
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let error = run(&llm, &hello()).await.0.expect_err("too large");
    assert!(error.message.contains("limit of 1000 bytes"), "{error}");
    let error = run(&llm, &hello()).await.0.expect_err("too many calls");
    assert!(error.message.contains("more than 4 tool calls"), "{error}");
    assert_eq!(
        standin.received.lock().unwrap().len(),
        2,
        "neither is retried"
    );
}

#[tokio::test]
async fn an_endless_event_is_cut_off() {
    // Over the cap plus the allowance for the JSON around it, and never ended.
    let endless = cut(&[format!("data: {}", "z".repeat(100_000))], 8192);
    let standin = standin(vec![Reply::SseThenStall(endless)]).await;
    // A short idle timeout so that a missing cut-off fails fast instead of waiting.
    let tuning = Tuning {
        max_answer_bytes: 1000,
        idle_timeout: Duration::from_secs(5),
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let error = run(&llm, &hello()).await.0.expect_err("too large");
    assert!(error.message.contains("limit of 1000 bytes"), "{error}");
    assert_eq!(standin.received.lock().unwrap().len(), 1, "not retried");
}

#[tokio::test]
async fn keep_alives_without_content_do_not_keep_a_stalled_stream_alive() {
    // Three kinds of keep-alive: an empty-choices chunk, an empty data line,
    // and a chunk whose delta carries nothing.
    let keep_alives = [
        "data: {\"choices\":[]}\n\n".to_owned(),
        "data: \n\n".to_owned(),
        event(json!({}), None),
    ];
    for keep_alive in keep_alives {
        let keeper = standin(vec![Reply::SseForever(keep_alive.clone())]).await;
        let tuning = Tuning {
            idle_timeout: Duration::from_millis(300),
            max_retries: 0,
            ..Tuning::default()
        };
        let llm = LlmClient::with_tuning(config(&keeper.base_url, None), tuning).unwrap();
        let (result, tokens) = bounded(run(&llm, &hello())).await;
        let error = result.expect_err("a stream of keep-alives stalls");
        assert!(error.message.contains("stalled"), "{keep_alive:?}: {error}");
        assert!(tokens.is_empty());
    }
}

#[tokio::test]
async fn reasoning_is_progress_but_no_answer_runs_past_its_time_limit() {
    // Reasoning every 20 ms is not a stall, whatever the idle timeout ...
    let thinking = event(json!({"reasoning_content": "hmm"}), None);
    let thinker = standin(vec![Reply::SseForever(thinking)]).await;
    let tuning = Tuning {
        idle_timeout: Duration::from_millis(300),
        answer_timeout: Duration::from_millis(1500),
        max_retries: 0,
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&thinker.base_url, None), tuning.clone()).unwrap();
    let (result, _) = bounded(run(&llm, &hello())).await;
    let error = result.expect_err("an endless answer ends");
    assert!(
        error.message.contains("did not finish its answer within"),
        "{error}"
    );
    // ... and neither are tokens, which an endless answer ends on as well.
    let tokens = event(json!({"content": "x"}), None);
    let talker = standin(vec![Reply::SseForever(tokens)]).await;
    let llm = LlmClient::with_tuning(config(&talker.base_url, None), tuning).unwrap();
    let (result, tokens) = bounded(run(&llm, &hello())).await;
    let error = result.expect_err("an endless answer ends");
    assert!(
        error.message.contains("did not finish its answer within"),
        "{error}"
    );
    assert!(tokens.len() > 10, "tokens kept coming: {}", tokens.len());
}

#[tokio::test]
async fn an_error_body_that_stalls_still_fails_the_request() {
    // A 500 that promises a body and stalls after a few bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = vec![0u8; 65536];
                let _ = socket.read(&mut buffer).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 1000\r\ncontent-type: application/json\r\n\r\n{\"error\"")
                    .await;
                std::future::pending::<()>().await;
            });
        }
    });
    let tuning = Tuning {
        idle_timeout: Duration::from_millis(300),
        max_retries: 0,
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&format!("http://{addr}/v1"), None), tuning).unwrap();
    let (result, _) = bounded(run(&llm, &hello())).await;
    let error = result.expect_err("the 400 fails");
    assert_eq!(error.status, Some(400), "{error}");
}

/// `work`, which must end by itself well within 30 s (without its bound it
/// would hang the test).
async fn bounded<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .expect("the request did not end by itself")
}

#[tokio::test]
async fn a_request_over_the_size_limit_is_refused_without_being_sent() {
    let standin = standin(vec![]).await;
    let tuning = Tuning {
        max_request_bytes: 4096,
        ..Tuning::default()
    };
    let llm = LlmClient::with_tuning(config(&standin.base_url, None), tuning).unwrap();
    let long = ChatRequest {
        messages: vec![json!({"role": "user", "content": "x".repeat(5000)}).into()],
        ..ChatRequest::default()
    };
    let error = run(&llm, &long).await.0.expect_err("over the limit");
    assert_eq!(error.status, None);
    assert!(error.message.contains("was not sent"), "{error}");
    assert!(error.message.contains("4096"), "{error}");
    assert!(standin.received.lock().unwrap().is_empty(), "it was sent");
}
