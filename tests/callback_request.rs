//! The callback request as a plugin receives it: the contract's body, its
//! headers, the registered path and query (the fragment is never sent), and a
//! callback registered under the name `localhost`, which the server resolves
//! to loopback itself. The callback client is hyper-util's (issue 20); these
//! are what it must keep from the reqwest client it replaced.

mod common;

use common::callbacks::RecordingCallbacks;
use common::spawn_app;
use serde_json::{Value, json};

#[tokio::test]
async fn a_callback_named_localhost_gets_the_contract_request_without_the_fragment() {
    let server = spawn_app().await;
    let callbacks = RecordingCallbacks::start().await;
    let port = callbacks.port;
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

    let received = callbacks.received();
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
    assert_eq!(callbacks.received().len(), 2);
}
