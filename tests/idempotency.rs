//! Issue 21 §3: every hand-over of a call to a provider names the execution
//! it delivers. Callbacks get `Idempotency-Key: <execution id>` and
//! `X-Toolgate-Attempt: <n>`; MCP `tools/call` gets the same in `_meta`. A
//! replay-safe tool's job lost at SIGKILL is handed over again under the same
//! key with the next attempt number; its journal keeps one row.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The delivery headers of one callback request.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    key: Option<String>,
    attempt: Option<String>,
}

/// A callback server that keeps each request's delivery headers. `/ok`
/// answers at once; `/hang-once` hangs on its first request (until the test
/// ends) and answers every later one.
#[derive(Clone, Default)]
struct Callbacks {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Callbacks {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn record(&self, headers: &HeaderMap) -> usize {
        let text = |name: &str| {
            headers
                .get(name)
                .map(|value| value.to_str().unwrap().to_owned())
        };
        let mut seen = self.seen.lock().unwrap();
        seen.push(Seen {
            key: text("idempotency-key"),
            attempt: text("x-toolgate-attempt"),
        });
        seen.len()
    }
}

async fn start_callbacks() -> (String, Callbacks) {
    let state = Callbacks::default();
    let app = axum::Router::new()
        .route(
            "/ok",
            post(
                |State(s): State<Callbacks>, headers: HeaderMap| async move {
                    s.record(&headers);
                    axum::Json(json!({"output": "done", "is_error": false}))
                },
            ),
        )
        .route(
            "/hang-once",
            post(
                |State(s): State<Callbacks>, headers: HeaderMap| async move {
                    if s.record(&headers) == 1 {
                        std::future::pending::<()>().await;
                    }
                    axum::Json(json!({"output": "applied", "is_error": false}))
                },
            ),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, state)
}

async fn call(server: &TestServer, session: &str, name: &str) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": {}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

/// Calls a deferred tool whose callback hangs on its first request, and
/// waits until that request arrived: (execution id, job id).
async fn start_hanging_job(
    server: &TestServer,
    session: &str,
    name: &str,
    callbacks: &Callbacks,
) -> (String, String) {
    let receipt = call(server, session, name).await;
    let execution_id = receipt["execution_id"].as_str().unwrap().to_owned();
    let job = receipt["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    common::wait_until(Duration::from_secs(30), "the first hand-over", || async {
        !callbacks.seen().is_empty()
    })
    .await;
    (execution_id, job)
}

fn first_attempt(execution_id: &str) -> Seen {
    Seen {
        key: Some(execution_id.to_owned()),
        attempt: Some("1".to_owned()),
    }
}

#[tokio::test]
async fn callbacks_carry_the_execution_id_as_idempotency_key() {
    let server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    common::register_remote(
        &server,
        json!({"name": "inline_tool", "callback_url": format!("{base}/ok")}),
    )
    .await;
    common::register_remote(
        &server,
        json!({"name": "deferred_tool", "callback_url": format!("{base}/ok"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;

    let inline = call(&server, &session, "inline_tool").await;
    assert_eq!(inline["status"], "success", "{inline}");
    let inline_id = inline["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(callbacks.seen(), vec![first_attempt(&inline_id)]);

    let receipt = call(&server, &session, "deferred_tool").await;
    let deferred_id = receipt["execution_id"].as_str().unwrap().to_owned();
    assert_ne!(deferred_id, inline_id);
    common::wait_until(Duration::from_secs(30), "the job's callback", || async {
        callbacks.seen().len() == 2
    })
    .await;
    assert_eq!(callbacks.seen()[1], first_attempt(&deferred_id));

    // A second call of the same tool is another execution, with its own key.
    let again = call(&server, &session, "inline_tool").await;
    let again_id = again["execution_id"].as_str().unwrap();
    assert_ne!(again_id, inline_id);
    assert_eq!(callbacks.seen()[2], first_attempt(again_id));
}

#[tokio::test]
async fn a_replay_safe_job_lost_at_sigkill_is_redelivered_with_the_same_key() {
    let mut server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    // No side effect declared: replay-safe, so a lost job may be handed over
    // again (a plugin that honours the key applies it once either way).
    let registration = json!({"name": "sync_profile", "callback_url": format!("{base}/hang-once"),
               "timeout_seconds": 300,
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"});
    common::register_remote(&server, registration.clone()).await;
    let session = server.create_session().await;
    let (execution_id, job) =
        start_hanging_job(&server, &session, "sync_profile", &callbacks).await;
    assert_eq!(server.job_state(&job).await, "running");
    server.kill().await;

    server.restart().await;
    // Registrations are runtime state: the plugin registers again, as it
    // does after any restart; the job runs from its snapshot regardless.
    common::register_remote(&server, registration).await;
    common::wait_until(Duration::from_secs(60), "the job to succeed", || async {
        server.job_state(&job).await == "succeeded"
    })
    .await;
    assert_eq!(
        callbacks.seen(),
        vec![
            first_attempt(&execution_id),
            Seen {
                key: Some(execution_id.clone()),
                attempt: Some("2".to_owned()),
            },
        ],
        "the second hand-over keeps the key and counts the attempt"
    );
    let row = server
        .get(&format!("/tool-executions/{execution_id}"))
        .await;
    assert_eq!(row.body["data"]["status"], "success", "{row:?}");
    assert_eq!(row.body["data"]["lifecycle_state"], "finished", "{row:?}");
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    let rows = rows.body["data"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "one row for the one call: {rows:#?}");
    let results = server
        .get(&format!("/sessions/{session}/tool-results"))
        .await;
    let results = results.body["data"].as_array().unwrap().clone();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0]["output"], "applied");
}

#[tokio::test]
async fn a_lost_job_of_a_tool_that_is_not_replay_safe_is_never_handed_over_again() {
    let mut server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    common::register_remote(
        &server,
        json!({"name": "charge_card", "callback_url": format!("{base}/hang-once"),
               "timeout_seconds": 300, "replay_safety": "confirm_on_replay",
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    let (execution_id, job) = start_hanging_job(&server, &session, "charge_card", &callbacks).await;
    server.kill().await;
    server.restart().await;
    assert_eq!(server.job_state(&job).await, "uncertain");
    let row = server
        .get(&format!("/tool-executions/{execution_id}"))
        .await;
    assert_eq!(row.body["data"]["status"], "uncertain", "{row:?}");
    assert_eq!(
        row.body["data"]["execution_reason_code"], "job_lease_lost",
        "{row:?}"
    );
    // A later job runs, so the worker is alive and had its chance.
    common::register_remote(
        &server,
        json!({"name": "ping", "callback_url": format!("{base}/ok"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let ping = call(&server, &session, "ping").await;
    let ping_job = ping["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    common::wait_until(Duration::from_secs(30), "the later job", || async {
        server.job_state(&ping_job).await == "succeeded"
    })
    .await;
    let keys: Vec<Option<String>> = callbacks.seen().into_iter().map(|s| s.key).collect();
    assert_eq!(
        keys.iter()
            .filter(|key| key.as_deref() == Some(execution_id.as_str()))
            .count(),
        1,
        "handed over once: {keys:?}"
    );
}

#[tokio::test]
async fn mcp_tool_calls_carry_the_key_in_meta() {
    let server = spawn_app().await;
    let body = json!({
        "name": "meta-server",
        "transport": "stdio",
        "stdio": {"command": common::mcp::test_server_bin(), "args": ["--tools", "meta", "stdio"]},
        // Annotations are not trusted by default; without them a tool is irreversible.
        "default_side_effect_level": "none",
    });
    let server_id = common::mcp::create_server(&server, body).await;
    let session = server.create_session().await;
    let catalog = common::mcp::wait_for_source(
        &server,
        &session,
        &server_id,
        "live",
        Duration::from_secs(30),
    )
    .await;
    let name = common::mcp::tool(&catalog, "meta")
        .and_then(|tool| tool["name"].as_str())
        .unwrap_or_else(|| panic!("no meta tool: {catalog:#}"))
        .to_owned();
    let data = common::mcp::call(&server, &session, &name, json!({})).await;
    assert_eq!(data["status"], "success", "{data}");
    let meta = &data["output"]["meta"];
    assert_eq!(
        meta["toolgate/idempotency_key"], data["execution_id"],
        "{data}"
    );
    assert_eq!(meta["toolgate/attempt"], 1, "{data}");
}
