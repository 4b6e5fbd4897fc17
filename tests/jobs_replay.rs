//! Issue 5: the replay guard and attempt numbering, durable async jobs (outbox at
//! commit, never after discard, delivered as `tool_result`), and crash recovery:
//! a call hanging at SIGKILL is `uncertain` after restart, a queued job still runs.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use common::{SpawnOptions, TestServer, read_reply, spawn_app, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// A loopback callback server counting its calls; `/hang` never answers.
#[derive(Clone, Default)]
struct Callbacks {
    hits: Arc<AtomicUsize>,
    hanging: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Callbacks {
    /// Waits until the `/hang` callback has been called (once).
    async fn wait_for_hanging_call(&self) {
        let hanging = self.hanging.clone();
        common::wait_until(
            Duration::from_secs(20),
            "the hanging callback to be called",
            || {
                let hanging = hanging.clone();
                async move { hanging.load(Ordering::SeqCst) == 1 }
            },
        )
        .await;
    }
}

async fn start_callbacks() -> (String, Callbacks) {
    let state = Callbacks::default();
    let app = axum::Router::new()
        .route(
            "/ok",
            post(|State(s): State<Callbacks>, Json(body): Json<Value>| async move {
                s.hits.fetch_add(1, Ordering::SeqCst);
                Json(json!({"output": {"done": true, "echo": body["arguments"]}, "is_error": false}))
            }),
        )
        .route(
            "/hang",
            post(|State(s): State<Callbacks>| async move {
                s.hanging.fetch_add(1, Ordering::SeqCst);
                s.release.notified().await;
                Json(json!({"output": "late", "is_error": false}))
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, state)
}

async fn register(server: &TestServer, body: Value) {
    common::register_remote(server, body).await;
}

async fn floor(server: &TestServer, session: &str) -> String {
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hello"}),
        )
        .await;
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

async fn open_run(server: &TestServer, floor: &str, confirmed: Value) -> common::Reply {
    server
        .post(
            &format!("/floors/{floor}/runs"),
            json!({"confirmed_execution_ids": confirmed}),
        )
        .await
}

async fn call(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn execution(server: &TestServer, id: &str) -> Value {
    let reply = server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

#[tokio::test]
async fn regenerating_never_repeats_a_side_effect_silently() {
    let server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "send_gift", "callback_url": format!("{base}/ok"), "side_effect_level": "irreversible"}),
    )
    .await;
    register(
        &server,
        json!({"name": "look", "callback_url": format!("{base}/ok")}),
    )
    .await;
    let session = server.create_session().await;
    let patched = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"allow_irreversible": true}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let floor_id = floor(&server, &session).await;

    let first = open_run(&server, &floor_id, json!([])).await;
    let run1 = first.body["data"]["run_id"].as_str().unwrap().to_owned();
    let gift = call(
        &server,
        &session,
        json!({"name": "send_gift", "arguments": {"to": "mio"}, "run_id": run1}),
    )
    .await;
    assert_eq!(gift["status"], "success", "{gift}");
    let gift_id = gift["execution_id"].as_str().unwrap().to_owned();
    let look = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {"at": "sky"}, "run_id": run1}),
    )
    .await;
    assert_eq!(look["status"], "success");
    assert_eq!(
        server
            .post(&format!("/runs/{run1}/discard"), json!({}))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(callbacks.hits.load(Ordering::SeqCst), 2);

    // The irreversible call blocks the regenerate until it is confirmed; the
    // replay-safe one does not.
    let refused = open_run(&server, &floor_id, json!([])).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(refused.code(), "tool_replay_confirmation_required");
    let blocking = refused.body["error"]["blocking_executions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(blocking.len(), 1, "{blocking:?}");
    assert_eq!(blocking[0]["id"], gift_id.as_str());
    assert_eq!(blocking[0]["tool_name"], "send_gift");
    assert_eq!(blocking[0]["replay_safety"], "never_auto_replay");
    let partial = open_run(&server, &floor_id, json!(["texec_other"])).await;
    assert_eq!(partial.status, StatusCode::CONFLICT);

    let confirmed = open_run(&server, &floor_id, json!([gift_id])).await;
    assert_eq!(confirmed.status, StatusCode::CREATED, "{confirmed:?}");
    let run2 = confirmed.body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Same tool, same arguments in another key order: a replay of the parent.
    let again = call(
        &server,
        &session,
        json!({"name": "send_gift", "arguments": "{ \"to\" : \"mio\" }", "run_id": run2}),
    )
    .await;
    assert_eq!(again["status"], "success");
    let row = execution(&server, again["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["attempt_no"], 2);
    assert_eq!(row["replay_parent_execution_id"], gift_id.as_str());
    let look_again = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {"at": "sky"}, "run_id": run2}),
    )
    .await;
    let row = execution(&server, look_again["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["attempt_no"], 2, "a safe repeat is numbered too: {row}");
    let other_args = call(
        &server,
        &session,
        json!({"name": "send_gift", "arguments": {"to": "aoi"}, "run_id": run2}),
    )
    .await;
    let row = execution(&server, other_args["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["attempt_no"], 1);
    assert!(row["replay_parent_execution_id"].is_null());
    assert_eq!(callbacks.hits.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn an_unconfirmed_repeat_is_blocked_and_journalled() {
    let server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "post_tweet", "callback_url": format!("{base}/ok"), "side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;
    let floor_id = floor(&server, &session).await;
    // Two attempts opened side by side, before either ran anything.
    let run_a = open_run(&server, &floor_id, json!([])).await.body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let run_b = open_run(&server, &floor_id, json!([])).await.body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first = call(
        &server,
        &session,
        json!({"name": "post_tweet", "arguments": {"text": "hi"}, "run_id": run_a}),
    )
    .await;
    assert_eq!(first["status"], "success");
    let repeat = call(
        &server,
        &session,
        json!({"name": "post_tweet", "arguments": {"text": "hi"}, "run_id": run_b}),
    )
    .await;
    assert_eq!(repeat["status"], "blocked", "{repeat}");
    assert_eq!(repeat["is_error"], true);
    assert_eq!(
        repeat["execution_reason_code"], "tool_replay_confirmation_required",
        "{repeat}"
    );
    assert_eq!(
        callbacks.hits.load(Ordering::SeqCst),
        1,
        "the repeat must not run"
    );
    let row = execution(&server, repeat["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["status"], "blocked");
    assert_eq!(row["commit_outcome"], "replay_blocked");
    assert_eq!(
        row["execution_reason_code"],
        "tool_replay_confirmation_required"
    );
    assert_eq!(row["attempt_no"], 2);
    assert_eq!(row["replay_parent_execution_id"], first["execution_id"]);
    let records = server
        .get(&format!(
            "/tools/call-records?floor_id={floor_id}&status=denied"
        ))
        .await;
    assert_eq!(
        records.body["meta"]["total"], 1,
        "blocked folds into denied: {records:?}"
    );
}

/// Opens the session's event stream and reads its `ready`; the stream and
/// what was read past it.
async fn open_events(server: &TestServer, session: &str) -> (reqwest::Response, String) {
    let mut events = server
        .client
        .get(server.url(&format!("/sessions/{session}/events")))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    let mut buffer = String::new();
    next_event(&mut events, &mut buffer, "ready").await;
    (events, buffer)
}

/// Reads `tool_result` events from the session's event stream.
async fn next_event(response: &mut reqwest::Response, buffer: &mut String, kind: &str) -> Value {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let event = block
                    .lines()
                    .find_map(|l| l.strip_prefix("event:"))
                    .map(str::trim);
                let data: String = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if event == Some(kind) {
                    return serde_json::from_str(&data).unwrap();
                }
            }
            let chunk = response.chunk().await.unwrap().expect("stream open");
            buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .expect("event in time")
}

#[tokio::test]
async fn deferred_calls_run_as_jobs_after_commit_and_never_after_discard() {
    let server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "render_song", "callback_url": format!("{base}/ok"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    let catalog = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    let entry = catalog.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "render_song")
        .unwrap()
        .clone();
    assert_eq!(entry["async_capability"], "deferred_ok");
    assert_eq!(entry["default_delivery_mode"], "async_job");
    assert_eq!(entry["result_visibility"], "deferred_receipt");

    let (mut events, mut buffer) = open_events(&server, &session).await;

    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id, json!([])).await.body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let receipt = call(&server, &session, json!({"name": "render_song", "arguments": {"key": "C"}, "run_id": run, "call_id": "call_song"})).await;
    assert_eq!(receipt["is_error"], false);
    assert_eq!(receipt["execution_reason_code"], Value::Null, "{receipt}");
    let output = &receipt["output"];
    assert_eq!(output["accepted"], true);
    assert_eq!(output["status"], "queued");
    let job = output["runtime_job_id"].as_str().unwrap().to_owned();
    let execution_id = output["execution_id"].as_str().unwrap().to_owned();
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "queued");
    assert_eq!(row["execution_reason_code"], Value::Null);
    assert_eq!(row["delivery_mode"], "async_job");
    assert_eq!(row["result_visibility"], "deferred_receipt");
    assert_eq!(row["runtime_job_id"], job.as_str());
    assert_eq!(server.job_state(&job).await, "staged");
    assert_eq!(
        callbacks.hits.load(Ordering::SeqCst),
        0,
        "nothing runs before commit"
    );

    assert_eq!(
        server
            .post(&format!("/runs/{run}/commit"), json!({}))
            .await
            .status,
        StatusCode::OK
    );
    let delivered = next_event(&mut events, &mut buffer, "tool_result").await;
    assert_eq!(delivered["execution_id"], execution_id.as_str());
    assert_eq!(delivered["call_id"], "call_song");
    assert_eq!(delivered["output"]["done"], true);
    assert_eq!(
        delivered["execution_reason_code"],
        Value::Null,
        "{delivered}"
    );
    assert_eq!(server.job_state(&job).await, "succeeded");
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "success");
    assert_eq!(row["execution_reason_code"], Value::Null, "{row}");
    assert_eq!(row["lifecycle_state"], "finished");
    assert_eq!(row["commit_outcome"], "committed");
    let results = server
        .get(&format!("/sessions/{session}/tool-results"))
        .await;
    assert_eq!(results.body["data"][0]["output"]["echo"]["key"], "C");

    // A discarded attempt never starts its job.
    let run2 = open_run(&server, &floor_id, json!([])).await.body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let receipt2 = call(
        &server,
        &session,
        json!({"name": "render_song", "arguments": {"key": "D"}, "run_id": run2}),
    )
    .await;
    let job2 = receipt2["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        server
            .post(&format!("/runs/{run2}/discard"), json!({}))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(server.job_state(&job2).await, "cancelled");
    let row2 = execution(
        &server,
        receipt2["output"]["execution_id"].as_str().unwrap(),
    )
    .await;
    assert_eq!(row2["status"], "blocked");
    assert_eq!(row2["execution_reason_code"], "job_run_discarded", "{row2}");
    assert_eq!(row2["commit_outcome"], "discarded");
    assert_eq!(row2["lifecycle_state"], "finished");
    assert_eq!(callbacks.hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        server.get("/runtime-jobs/runtime_job_missing").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_call_hanging_at_sigkill_is_uncertain_after_restart() {
    let mut server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "slow", "callback_url": format!("{base}/hang"), "timeout_seconds": 300}),
    )
    .await;
    let session = server.create_session().await;
    let url = server.url(&format!("/sessions/{session}/tool-calls"));
    let client = server.client.clone();
    let token = server.token.clone();
    let pending = tokio::spawn(async move {
        client
            .post(url)
            .bearer_auth(token)
            .json(&json!({"name": "slow", "arguments": {}}))
            .send()
            .await
    });
    callbacks.wait_for_hanging_call().await;
    let running = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(running.body["data"][0]["status"], "running");
    assert_eq!(running.body["data"][0]["lifecycle_state"], "opened");
    assert_eq!(
        running.body["data"][0]["execution_reason_code"],
        Value::Null,
        "an open row has no reason yet"
    );

    server.kill().await;
    assert!(
        pending.await.unwrap().is_err(),
        "the killed server never answered"
    );
    server.restart().await;
    let after = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    let row = &after.body["data"][0];
    assert_eq!(row["status"], "uncertain", "{row}");
    assert_eq!(row["lifecycle_state"], "finished");
    assert_eq!(row["commit_outcome"], "uncertain");
    assert_eq!(
        row["execution_reason_code"], "interrupted_by_restart",
        "{row}"
    );
    assert!(row["finished_at"].as_i64().is_some());
    callbacks.release.notify_waiters();
}

#[tokio::test]
async fn a_queued_job_survives_sigkill_and_runs_after_restart() {
    let mut server = spawn_with(SpawnOptions {
        env: vec![("TOOLGATE_JOB_WORKERS".into(), "0".into())],
        ..Default::default()
    })
    .await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "archive", "callback_url": format!("{base}/ok"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    // Outside a run the job is queued at once; this instance runs no workers.
    let receipt = call(
        &server,
        &session,
        json!({"name": "archive", "arguments": {"n": 1}}),
    )
    .await;
    let job = receipt["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(server.job_state(&job).await, "queued");
    server.kill().await;

    server.restart_with_env(Vec::new()).await;
    let server = &server;
    common::wait_until(
        Duration::from_secs(30),
        "the queued job to finish",
        || async { server.job_state(&job).await == "succeeded" },
    )
    .await;
    assert_eq!(callbacks.hits.load(Ordering::SeqCst), 1);
    let row = execution(server, receipt["output"]["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["status"], "success");
    assert_eq!(row["execution_reason_code"], Value::Null, "{row}");
    assert_eq!(row["result"]["echo"]["n"], 1);
}

/// Calls `tool` (no arguments) in the session from a task of its own, whose
/// result is the call's reply.
fn call_in_background(
    server: &TestServer,
    session: &str,
    tool: &'static str,
) -> tokio::task::JoinHandle<common::Reply> {
    let url = server.url(&format!("/sessions/{session}/tool-calls"));
    let (client, token) = (server.client.clone(), server.token.clone());
    tokio::spawn(async move {
        let response = client
            .post(url)
            .bearer_auth(token)
            .json(&json!({"name": tool, "arguments": {}}))
            .send()
            .await
            .expect("the in-flight call is answered");
        read_reply(response).await
    })
}

/// Sends the server SIGTERM (a graceful stop).
fn sigterm(server: &TestServer) {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(server.pid().to_string())
        .status();
}

/// Releases every held `/hang` call, again and again, until aborted.
fn keep_releasing(release: &Arc<Notify>) -> tokio::task::JoinHandle<()> {
    let release = release.clone();
    tokio::spawn(async move {
        loop {
            release.notify_waiters();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

#[tokio::test]
async fn sigterm_lets_an_in_flight_call_finish() {
    let mut server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "slow", "callback_url": format!("{base}/hang"), "timeout_seconds": 60}),
    )
    .await;
    let session = server.create_session().await;
    let pending = call_in_background(&server, &session, "slow");
    callbacks.wait_for_hanging_call().await;
    sigterm(&server);
    // The server keeps serving the in-flight call; release the callback now.
    let releaser = keep_releasing(&callbacks.release);
    let reply = pending.await.unwrap();
    releaser.abort();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["data"]["status"], "success");
    assert_eq!(reply.body["data"]["output"], "late");
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_job_running_at_sigkill_becomes_uncertain_and_is_not_rerun() {
    let mut server = spawn_app().await;
    let (base, callbacks) = start_callbacks().await;
    register(
        &server,
        json!({"name": "publish", "callback_url": format!("{base}/hang"), "timeout_seconds": 300,
               // Not replay-safe: a replay-safe job would be handed over
               // again (tests/idempotency.rs).
               "replay_safety": "confirm_on_replay",
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    let receipt = call(
        &server,
        &session,
        json!({"name": "publish", "arguments": {}}),
    )
    .await;
    let job = receipt["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let execution_id = receipt["output"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    callbacks.wait_for_hanging_call().await;
    assert_eq!(server.job_state(&job).await, "running");
    server.kill().await;

    server.restart().await;
    assert_eq!(server.job_state(&job).await, "uncertain");
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "uncertain", "{row}");
    assert_eq!(row["lifecycle_state"], "finished");
    assert_eq!(row["execution_reason_code"], "job_lease_lost", "{row}");
    // The session, given a receipt for the call, is told how it ended.
    let results = server
        .get(&format!("/sessions/{session}/tool-results"))
        .await;
    let delivered: Vec<&serde_json::Value> = results.body["data"]
        .as_array()
        .expect("the session's results")
        .iter()
        .filter(|d| d["execution_id"] == execution_id.as_str())
        .collect();
    assert_eq!(delivered.len(), 1, "exactly one result: {results:?}");
    assert_eq!(delivered[0]["is_error"], true, "{results:?}");
    assert_eq!(
        delivered[0]["execution_reason_code"], "job_lease_lost",
        "{results:?}"
    );
    assert_eq!(delivered[0]["runtime_job_id"], job.as_str(), "{results:?}");
    assert_eq!(
        delivered[0]["call_id"], receipt["call_id"],
        "the call's id, as the model knows it: {results:?}"
    );
    // The restarted server's worker polls the queue; the lost job must not be
    // picked up again. A later job runs, so the worker is alive.
    register(
        &server,
        json!({"name": "ping", "callback_url": format!("{base}/ok"),
        "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let later = call(&server, &session, json!({"name": "ping", "arguments": {}})).await;
    let later_job = later["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let server_ref = &server;
    common::wait_until(
        Duration::from_secs(30),
        "the later job to finish",
        || async { server_ref.job_state(&later_job).await == "succeeded" },
    )
    .await;
    assert_eq!(
        callbacks.hanging.load(Ordering::SeqCst),
        1,
        "the lost job was re-run"
    );
    assert_eq!(server.job_state(&job).await, "uncertain");
    callbacks.release.notify_waiters();
}

/// A callback that holds each call until opened, counting calls begun and
/// answered.
#[derive(Clone, Default)]
struct Gate {
    begun: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    open: Arc<Notify>,
}

async fn start_gate() -> (String, Gate) {
    let gate = Gate::default();
    let app = axum::Router::new()
        .route(
            "/hold",
            post(|State(g): State<Gate>| async move {
                g.begun.fetch_add(1, Ordering::SeqCst);
                g.open.notified().await;
                g.answered.fetch_add(1, Ordering::SeqCst);
                Json(json!({"output": "done", "is_error": false}))
            }),
        )
        .with_state(gate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, gate)
}

#[tokio::test]
async fn sigterm_stops_claiming_queued_jobs_while_requests_drain() {
    let mut server = spawn_with(SpawnOptions {
        env: vec![("TOOLGATE_JOB_WORKERS".into(), "1".into())],
        ..Default::default()
    })
    .await;
    let (jobs_base, jobs) = start_gate().await;
    let (sync_base, sync) = start_callbacks().await;
    register(
        &server,
        json!({"name": "archive", "callback_url": format!("{jobs_base}/hold"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    register(
        &server,
        json!({"name": "slow", "callback_url": format!("{sync_base}/hang"), "timeout_seconds": 60}),
    )
    .await;
    let session = server.create_session().await;
    let mut queued = Vec::new();
    for n in 0..3 {
        let receipt = call(
            &server,
            &session,
            json!({"name": "archive", "arguments": {"n": n}}),
        )
        .await;
        queued.push(
            receipt["output"]["runtime_job_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // One worker: the first job holds it, the other two wait in the queue.
    let begun = jobs.begun.clone();
    common::wait_until(Duration::from_secs(20), "the first job to start", || {
        let begun = begun.clone();
        async move { begun.load(Ordering::SeqCst) == 1 }
    })
    .await;
    // An in-flight request keeps the server draining after the signal.
    let pending = call_in_background(&server, &session, "slow");
    sync.wait_for_hanging_call().await;
    sigterm(&server);
    let addr = server.addr;
    common::wait_until(
        Duration::from_secs(20),
        "the server to stop accepting",
        || async move { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    // The running job ends while the server drains; the worker must not take
    // the next one.
    let (answered, open) = (jobs.answered.clone(), jobs.open.clone());
    common::wait_until(
        Duration::from_secs(20),
        "the first job to be answered",
        || {
            let (answered, open) = (answered.clone(), open.clone());
            async move {
                open.notify_waiters();
                answered.load(Ordering::SeqCst) == 1
            }
        },
    )
    .await;
    let releaser = keep_releasing(&sync.release);
    let reply = pending.await.unwrap();
    releaser.abort();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(server.stop().await.success());
    assert_eq!(
        jobs.begun.load(Ordering::SeqCst),
        1,
        "a job was claimed after the stop began"
    );
    server
        .restart_with_env(vec![("TOOLGATE_JOB_WORKERS".into(), "0".into())])
        .await;
    assert_eq!(server.job_state(&queued[0]).await, "succeeded");
    for job in &queued[1..] {
        assert_eq!(server.job_state(job).await, "queued", "{job}");
    }
}

/// An event stream nobody reads holds at most 32 MiB of event bodies, not
/// only 1,024 events: deferred results of a megabyte each close it long
/// before its places run out (it held 1.26 GB of them, probe I), as a stream
/// whose queue is full is closed.
#[tokio::test]
async fn an_unread_event_stream_is_closed_once_its_results_pass_the_byte_budget() {
    let server = spawn_app().await;
    let app = axum::Router::new().route(
        "/big",
        post(|| async { Json(json!({"output": "x".repeat(1_000_000), "is_error": false})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    register(
        &server,
        json!({"name": "render_big", "callback_url": format!("{base}/big"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    let (mut events, _) = open_events(&server, &session).await;
    // 80 results of 1 MB: under the 1,024 places, over the 32 MiB and
    // whatever the sockets between the two hold.
    for n in 0..80 {
        let receipt = call(
            &server,
            &session,
            json!({"name": "render_big", "arguments": {"n": n}}),
        )
        .await;
        assert_eq!(receipt["status"], "queued", "{receipt}");
    }
    let log = server.data_dir.join("..").join("server.log");
    common::wait_until(
        Duration::from_secs(120),
        "the unread stream to be closed",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("an event stream is not being read and was closed") }
        },
    )
    .await;
    // What the stream held is still sent, then it ends.
    let mut read = 0usize;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), events.chunk())
        .await
        .expect("the closed stream ends")
        .unwrap()
    {
        read += chunk.len();
    }
    assert!(
        read > 32 << 20,
        "the queued results were sent first ({read} bytes)"
    );
}
