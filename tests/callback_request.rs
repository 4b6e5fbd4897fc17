//! The callback request as a plugin receives it: the contract's body, its
//! headers, the registered path and query (the fragment is never sent), and a
//! callback registered under the name `localhost`, which the server resolves
//! to loopback itself. The callback client is hyper-util's (issue 20); these
//! are what it must keep from the reqwest client it replaced.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::routing::post;
use common::spawn_app;
use serde_json::{Value, json};

/// One callback request as the plugin saw it.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

type Log = Arc<Mutex<Vec<Received>>>;

/// A callback on an ephemeral loopback port that keeps every request and
/// answers each with `{"output": {"ok": true}}`; its port.
async fn recording_callback() -> (u16, Log) {
    let log: Log = Arc::default();
    let app = axum::Router::new()
        .fallback(post(
            |State(log): State<Log>, request: Request| async move {
                let (parts, body) = request.into_parts();
                let bytes: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                log.lock().unwrap().push(Received {
                    method: parts.method.to_string(),
                    target: parts.uri.to_string(),
                    headers: parts
                        .headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
                        .collect(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                });
                axum::Json(json!({"output": {"ok": true}}))
            },
        ))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, log)
}

#[tokio::test]
async fn a_callback_named_localhost_gets_the_contract_request_without_the_fragment() {
    let server = spawn_app().await;
    let (port, log) = recording_callback().await;
    common::register_remote(
        &server,
        json!({"name": "lookup", "callback_url": format!("http://LocalHost:{port}/hooks/lookup?plugin=p1#part")}),
    )
    .await;
    let session = server.create_session().await;
    let data = server
        .tool_call(
            &session,
            json!({"name": "lookup", "arguments": {"q": "tea \"green\""}, "call_id": "call_cb_1"}),
        )
        .await;
    assert_eq!(data["status"], "success", "{data}");
    assert_eq!(data["output"], json!({"ok": true}), "{data}");
    let execution_id = data["execution_id"].as_str().unwrap();

    let received = log.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "{received:?}");
    let request = &received[0];
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.target, "/hooks/lookup?plugin=p1",
        "the fragment stays here"
    );
    assert_eq!(
        request.header("host"),
        Some(format!("localhost:{port}").as_str())
    );
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert!(
        request
            .header("user-agent")
            .is_some_and(|agent| agent.starts_with("toolgate/")),
        "{request:?}"
    );
    assert_eq!(request.header("idempotency-key"), Some(execution_id));
    assert_eq!(request.header("x-toolgate-attempt"), Some("1"));
    assert!(request.header("traceparent").is_some(), "{request:?}");
    let raw = request.body["raw_arguments"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(raw).unwrap(),
        json!({"q": "tea \"green\""})
    );
    assert_eq!(
        request.body,
        json!({"name": "lookup", "arguments": {"q": "tea \"green\""},
               "call_id": "call_cb_1", "raw_arguments": raw}),
    );

    // The pooled connection is reused: a second call reaches the same callback.
    let again = server
        .tool_call(&session, json!({"name": "lookup", "arguments": {}}))
        .await;
    assert_eq!(again["status"], "success", "{again}");
    assert_eq!(log.lock().unwrap().len(), 2);
}
