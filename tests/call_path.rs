//! The call path, through the real binary: a call runs to its end and is
//! journalled whatever its client does (and shutdown waits for it); a call that
//! never reached its provider is neither a replay parent nor a step; a run that
//! closes while calls are being made leaves no staged job and no pending row;
//! steps and the call budget are admitted atomically, per run; a side-effecting
//! async job that times out is `uncertain`; and a live model session is offered
//! exactly what its calls may use.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use common::events::Events;
use common::{Reply, TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::watch;

// ---------------------------------------------------------------------------
// A loopback callback server.
//
// `/ok` answers at once; `/hold` blocks until the test releases it and records
// whether the caller abandoned it (dropped the request) before that; `/hang`
// never answers.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Callbacks {
    base: String,
    ok_hits: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    abandoned: Arc<AtomicUsize>,
    release: Arc<watch::Sender<bool>>,
}

/// Counts a `/hold` request whose caller went away before it was released.
struct AbandonGuard(Option<Arc<AtomicUsize>>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(counter) = self.0.take() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Callbacks {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Waits until `n` `/hold` requests have arrived.
    async fn wait_held(&self, n: usize) {
        let held = self.held.clone();
        common::wait_until(
            Duration::from_secs(20),
            "the held callback to be called",
            || {
                let held = held.clone();
                async move { held.load(Ordering::SeqCst) >= n }
            },
        )
        .await;
    }

    /// Lets every held (and every future) `/hold` request answer.
    fn release(&self) {
        self.release.send_replace(true);
    }

    /// The held callback must stay wanted after its client hung up. A negative
    /// can only be watched for a while: the abandonment, when it happens, follows
    /// the hang-up within milliseconds on loopback, so half a second is ample.
    async fn assert_not_abandoned(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while tokio::time::Instant::now() < deadline {
            assert_eq!(
                self.abandoned.load(Ordering::SeqCst),
                0,
                "the server dropped the tool's callback request when the client hung up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn start_callbacks() -> Callbacks {
    let (release, _) = watch::channel(false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let state = Callbacks {
        base: format!("http://{}", listener.local_addr().unwrap()),
        ok_hits: Arc::default(),
        held: Arc::default(),
        abandoned: Arc::default(),
        release: Arc::new(release),
    };
    let app = axum::Router::new()
        .route(
            "/ok",
            post(
                |State(s): State<Callbacks>, Json(body): Json<Value>| async move {
                    s.ok_hits.fetch_add(1, Ordering::SeqCst);
                    Json(json!({"output": {"echo": body["arguments"]}, "is_error": false}))
                },
            ),
        )
        .route(
            "/hold",
            post(|State(s): State<Callbacks>| async move {
                let mut released = s.release.subscribe();
                let mut guard = AbandonGuard(Some(s.abandoned.clone()));
                s.held.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|released| *released).await;
                guard.0 = None;
                Json(json!({"output": "released", "is_error": false}))
            }),
        )
        .route(
            "/hang",
            post(|| async {
                std::future::pending::<()>().await;
                Json(json!({"output": "never"}))
            }),
        )
        .with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    state
}

// ---------------------------------------------------------------------------
// API helpers.
// ---------------------------------------------------------------------------

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
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

async fn try_open_run(server: &TestServer, floor: &str) -> Reply {
    server
        .post(
            &format!("/floors/{floor}/runs"),
            json!({"confirmed_execution_ids": []}),
        )
        .await
}

async fn open_run(server: &TestServer, floor: &str) -> String {
    let reply = try_open_run(server, floor).await;
    assert_eq!(
        reply.status,
        StatusCode::CREATED,
        "{reply:?}\n{}",
        server_log_errors(server)
    );
    reply.body["data"]["run_id"].as_str().unwrap().to_owned()
}

async fn close_run(server: &TestServer, run: &str, how: &str) {
    let reply = server.post(&format!("/runs/{run}/{how}"), json!({})).await;
    assert_eq!(reply.status, StatusCode::OK, "{how} {run}: {reply:?}");
}

async fn call_reply(server: &TestServer, session: &str, body: Value) -> Reply {
    server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await
}

async fn call(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = call_reply(server, session, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn execution(server: &TestServer, id: &str) -> Value {
    let reply = server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn job_state(server: &TestServer, job: &str) -> String {
    let reply = server.get(&format!("/runtime-jobs/{job}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"]["state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn assert_status(result: &Value, status: &str) {
    assert_eq!(result["status"], status, "{result}");
}

/// Starts a tool call on its own connection, so that aborting the task hangs up.
fn call_on_own_connection(
    server: &TestServer,
    session: &str,
    body: Value,
) -> tokio::task::JoinHandle<()> {
    let url = server.url(&format!("/sessions/{session}/tool-calls"));
    let token = server.token.clone();
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let response = client.post(url).bearer_auth(token).json(&body).send().await;
        panic!("the call answered although the test hung up first: {response:?}");
    })
}

/// The one journal row of a session that has exactly one.
async fn only_row(server: &TestServer, session: &str) -> Value {
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(rows.status, StatusCode::OK, "{rows:?}");
    assert_eq!(rows.body["meta"]["total"], 1, "{rows:?}");
    rows.body["data"][0].clone()
}

/// The lines around each error in the server's log (beside its data
/// directory), for failure messages.
fn server_log_errors(server: &TestServer) -> String {
    let log =
        std::fs::read_to_string(server.data_dir.join("..").join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.contains("ERROR") {
            out.extend_from_slice(&lines[i.saturating_sub(15)..(i + 3).min(lines.len())]);
        }
    }
    out.join("\n")
}

/// Whether the process runs (exists and is not a zombie).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// 1. A call whose client hangs up still runs to its end; shutdown waits for it.
// ---------------------------------------------------------------------------

/// Registers the held tool, starts a call to it from a client that then hangs
/// up, and returns the call's execution id.
async fn start_and_abandon_a_held_call(
    server: &TestServer,
    callbacks: &Callbacks,
    session: &str,
) -> String {
    register(
        server,
        json!({"name": "slow_write", "callback_url": callbacks.url("/hold"), "timeout_seconds": 60}),
    )
    .await;
    let client = call_on_own_connection(
        server,
        session,
        json!({"name": "slow_write", "arguments": {"n": 1}}),
    );
    callbacks.wait_held(1).await;
    let row = only_row(server, session).await;
    assert_eq!(row["status"], "running", "{row}");
    assert_eq!(row["lifecycle_state"], "opened", "{row}");
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    callbacks.assert_not_abandoned().await;
    row["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_call_whose_client_hung_up_is_finished_in_the_journal() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    let execution_id = start_and_abandon_a_held_call(&server, &callbacks, &session).await;

    callbacks.release();
    let server_ref = &server;
    let id = execution_id.as_str();
    common::wait_until(
        Duration::from_secs(10),
        "the abandoned call's row to finish",
        || async move { execution(server_ref, id).await["lifecycle_state"] == "finished" },
    )
    .await;
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "success", "{row}");
    assert_eq!(row["result"], "released", "{row}");
    assert_eq!(callbacks.abandoned.load(Ordering::SeqCst), 0);
}

/// Sends SIGTERM and waits for the listener to close (shutdown has begun);
/// the process must then still be there, waiting for the started `call`.
async fn assert_stays_for_a_started_call_after_sigterm(server: &TestServer, call: &str) {
    let pid = server.pid();
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    let addr = server.addr;
    common::wait_until(
        Duration::from_secs(10),
        "the server to stop listening after SIGTERM",
        || async move { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    assert!(
        process_alive(pid),
        "the server exited while {call} was still running"
    );
}

#[tokio::test]
async fn sigterm_waits_for_a_call_whose_client_hung_up() {
    let mut server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    let execution_id = start_and_abandon_a_held_call(&server, &callbacks, &session).await;

    assert_stays_for_a_started_call_after_sigterm(&server, "a call whose client hung up").await;
    assert_eq!(callbacks.abandoned.load(Ordering::SeqCst), 0);
    callbacks.release();
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");

    // What the journal holds after the restart is what the stopped server wrote:
    // a row it had left open would now be `uncertain`.
    server.restart().await;
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "success", "{row}");
    assert_eq!(row["lifecycle_state"], "finished", "{row}");
    assert_eq!(row["result"], "released", "{row}");
}

#[tokio::test]
async fn sigterm_waits_for_a_call_made_through_the_mcp_endpoint() {
    let mut server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    register(
        &server,
        json!({"name": "slow_write", "callback_url": callbacks.url("/hold"), "timeout_seconds": 60}),
    )
    .await;
    let mcp_session = common::mcp::open_mcp_session(&server, &session).await;
    let call = {
        let server_url = server.url(&format!("/mcp/sessions/{session}"));
        let token = server.token.clone();
        tokio::spawn(async move {
            let _ = reqwest::Client::new()
                .post(server_url)
                .bearer_auth(token)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-session-id", mcp_session)
                .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow_write","arguments":{"n":1}}}"#)
                .send()
                .await
                .map(|response| response.text());
        })
    };
    callbacks.wait_held(1).await;
    let row = only_row(&server, &session).await;
    let execution_id = row["id"].as_str().unwrap().to_owned();
    // rmcp's own task for the request is neither dropped nor awaited at
    // shutdown: the process must stay for the call all the same.
    assert_stays_for_a_started_call_after_sigterm(&server, "an MCP call").await;
    callbacks.release();
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
    call.abort();
    server.restart().await;
    let row = execution(&server, &execution_id).await;
    assert_eq!(row["status"], "success", "{row}");
    assert_eq!(row["result"], "released", "{row}");
}

// ---------------------------------------------------------------------------
// 2. A call that never reached its provider is no replay parent and no step.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_irreversible_call_refused_for_its_arguments_is_no_replay_parent_nor_step() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    register(
        &server,
        json!({"name": "send_gift", "callback_url": callbacks.url("/ok"), "side_effect_level": "irreversible",
               "parameters": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}}),
    )
    .await;
    register(
        &server,
        json!({"name": "look", "callback_url": callbacks.url("/ok")}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(
            &session,
            json!({"allow_irreversible": true, "max_steps_per_generation": 1}),
        )
        .await;
    let floor_id = floor(&server, &session).await;

    let run1 = open_run(&server, &floor_id).await;
    let bad = call(
        &server,
        &session,
        json!({"name": "send_gift", "arguments": {"to": 7}, "run_id": run1, "step": 1}),
    )
    .await;
    assert_status(&bad, "error");
    assert!(
        bad["output"]
            .as_str()
            .unwrap()
            .contains("invalid arguments"),
        "{bad}"
    );
    assert_eq!(callbacks.ok_hits.load(Ordering::SeqCst), 0);
    close_run(&server, &run1, "commit").await;

    // Regenerating needs no confirmation: nothing irreversible happened.
    let run2 = try_open_run(&server, &floor_id).await;
    assert_eq!(run2.status, StatusCode::CREATED, "{run2:?}");
    let run2 = run2.body["data"]["run_id"].as_str().unwrap().to_owned();
    let again = call(
        &server,
        &session,
        json!({"name": "send_gift", "arguments": {"to": 7}, "run_id": run2, "step": 1}),
    )
    .await;
    assert_status(&again, "error");
    let row = execution(&server, again["execution_id"].as_str().unwrap()).await;
    assert_eq!(row["execution_reason_code"], "validation_error", "{row}");
    assert!(row["replay_parent_execution_id"].is_null(), "{row}");
    assert_eq!(row["attempt_no"], 1, "{row}");
    // Step 1 held only a refused call, so step 2 is this generation's one step.
    let look = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {}, "run_id": run2, "step": 2}),
    )
    .await;
    assert_status(&look, "success");
    let third = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {}, "run_id": run2, "step": 3}),
    )
    .await;
    assert_status(&third, "blocked");
    assert_eq!(callbacks.ok_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_irreversible_call_whose_connection_is_refused_is_no_replay_parent_nor_step() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let refused = common::ports::dead_port();
    let port = refused.port;
    register(
        &server,
        json!({"name": "post_tweet", "callback_url": format!("http://127.0.0.1:{port}/tweet"),
               "side_effect_level": "irreversible"}),
    )
    .await;
    register(
        &server,
        json!({"name": "look", "callback_url": callbacks.url("/ok")}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(
            &session,
            json!({"allow_irreversible": true, "max_steps_per_generation": 1}),
        )
        .await;
    let floor_id = floor(&server, &session).await;

    let run1 = open_run(&server, &floor_id).await;
    let refused = call(
        &server,
        &session,
        json!({"name": "post_tweet", "arguments": {"text": "hi"}, "run_id": run1, "step": 1}),
    )
    .await;
    assert_status(&refused, "error");
    assert_eq!(
        refused["execution_reason_code"], "remote_connection_failed",
        "{refused}"
    );
    assert!(
        refused["output"].as_str().unwrap().contains("connect"),
        "{refused}"
    );
    let look = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {}, "run_id": run1, "step": 2}),
    )
    .await;
    assert_status(&look, "success");
    assert_eq!(look["execution_reason_code"], Value::Null, "{look}");
    let third = call(
        &server,
        &session,
        json!({"name": "look", "arguments": {}, "run_id": run1, "step": 3}),
    )
    .await;
    assert_status(&third, "blocked");
    assert_eq!(
        third["execution_reason_code"], "permission_max_steps_per_generation_exceeded",
        "{third}"
    );
    let row = execution(&server, third["execution_id"].as_str().unwrap()).await;
    assert_eq!(
        row["execution_reason_code"],
        "permission_max_steps_per_generation_exceeded"
    );
    close_run(&server, &run1, "discard").await;

    let run2 = try_open_run(&server, &floor_id).await;
    assert_eq!(run2.status, StatusCode::CREATED, "{run2:?}");
    let run2 = run2.body["data"]["run_id"].as_str().unwrap().to_owned();
    let again = call(
        &server,
        &session,
        json!({"name": "post_tweet", "arguments": {"text": "hi"}, "run_id": run2}),
    )
    .await;
    assert_status(&again, "error");
    let row = execution(&server, again["execution_id"].as_str().unwrap()).await;
    assert_eq!(
        row["execution_reason_code"], "remote_connection_failed",
        "{row}"
    );
    assert!(row["replay_parent_execution_id"].is_null(), "{row}");
    assert_eq!(row["attempt_no"], 1, "{row}");
}

// ---------------------------------------------------------------------------
// 3. A run that closes while calls are being made.
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Accepted {
    job: String,
    execution: String,
    committed: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_racing_their_runs_close_leave_no_staged_job_and_no_pending_row() {
    // No job workers: a released job stays `queued`, so every job's state is
    // final when its run's close has answered, and nothing else writes meanwhile.
    let server = Arc::new(
        common::spawn_with(common::SpawnOptions {
            env: vec![("TOOLGATE_JOB_WORKERS".into(), "0".into())],
            ..Default::default()
        })
        .await,
    );
    let callbacks = start_callbacks().await;
    register(
        &server,
        json!({"name": "render_song", "callback_url": callbacks.url("/ok"),
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"max_calls_per_turn": 1000}))
        .await;
    let floor_id = floor(&server, &session).await;

    let (mut total_accepted, mut lost) = (0, 0);
    for round in 0..8 {
        let run = open_run(&server, &floor_id).await;
        let how = if round % 2 == 0 { "commit" } else { "discard" };
        // Calls before and after the close, all in flight at once.
        let tasks: Vec<_> = (0..14)
            .map(|i| {
                let server = server.clone();
                let (session, run) = (session.clone(), run.clone());
                tokio::spawn(async move {
                    if i == 5 {
                        let reply = server.post(&format!("/runs/{run}/{how}"), json!({})).await;
                        return ("close", reply);
                    }
                    let body = if i % 4 == 3 {
                        json!({"name": "roll_dice", "arguments": {}, "run_id": run})
                    } else {
                        json!({"name": "render_song", "arguments": {"round": round, "i": i}, "run_id": run})
                    };
                    ("call", call_reply(&server, &session, body).await)
                })
            })
            .collect();
        let mut accepted = Vec::new();
        for task in tasks {
            let (kind, reply) = task.await.unwrap();
            if kind == "close" {
                assert_eq!(reply.status, StatusCode::OK, "{how}: {reply:?}");
                continue;
            }
            if reply.status == StatusCode::CONFLICT {
                assert_eq!(reply.code(), "run_not_open", "{reply:?}");
                lost += 1;
                continue;
            }
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
            let data = &reply.body["data"];
            if data["name"] == "render_song" {
                assert_eq!(data["output"]["accepted"], true, "{data}");
                accepted.push(Accepted {
                    job: data["output"]["runtime_job_id"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    execution: data["execution_id"].as_str().unwrap().to_owned(),
                    committed: how == "commit",
                });
            } else {
                assert_status(data, "success");
            }
        }

        let pending = server
            .get(&format!(
                "/tool-executions?run_id={run}&commit_outcome=pending"
            ))
            .await;
        assert_eq!(pending.status, StatusCode::OK, "{pending:?}");
        assert_eq!(
            pending.body["meta"]["total"], 0,
            "rows of {how} run {run} are still pending: {}",
            pending.body["data"]
        );
        // A committed run's jobs are released to the queue, a discarded run's
        // are cancelled; none stays staged.
        for job in &accepted {
            let (state, status, outcome, lifecycle) = if job.committed {
                ("queued", "queued", "committed", "opened")
            } else {
                ("cancelled", "blocked", "discarded", "finished")
            };
            assert_eq!(job_state(&server, &job.job).await, state, "{how}: {job:?}");
            let row = execution(&server, &job.execution).await;
            assert_eq!(row["status"], status, "{row}");
            assert_eq!(row["commit_outcome"], outcome, "{row}");
            assert_eq!(row["lifecycle_state"], lifecycle, "{row}");
        }
        total_accepted += accepted.len();
    }
    assert!(total_accepted > 0, "no deferred call was accepted");
    eprintln!("{total_accepted} deferred calls accepted, {lost} calls lost the race");
}

// ---------------------------------------------------------------------------
// 4. Parallel calls cannot both take the last step.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_calls_of_two_steps_cannot_both_take_the_last_step() {
    let server = Arc::new(spawn_app().await);
    let session = server.create_session().await;
    server
        .set_permissions(
            &session,
            json!({"max_steps_per_generation": 1, "max_calls_per_turn": 1000}),
        )
        .await;
    let floor_id = floor(&server, &session).await;
    for round in 0..6 {
        let run = open_run(&server, &floor_id).await;
        let tasks: Vec<_> = (0..20u32)
            .map(|i| {
                let server = server.clone();
                let (session, run) = (session.clone(), run.clone());
                let step = 1 + i % 2;
                tokio::spawn(async move {
                    let body = json!({"name": "roll_dice", "arguments": {"sides": 6}, "run_id": run, "step": step});
                    (step, call(&server, &session, body).await)
                })
            })
            .collect();
        let mut ran = BTreeSet::new();
        let mut outcomes = Vec::new();
        for task in tasks {
            let (step, result) = task.await.unwrap();
            let status = result["status"].as_str().unwrap().to_owned();
            assert!(
                status == "success" || status == "blocked",
                "round {round}: {result}"
            );
            if status == "success" {
                ran.insert(step);
            }
            outcomes.push((step, status));
        }
        assert_eq!(
            ran.len(),
            1,
            "round {round}: exactly one step may run: {outcomes:?}"
        );
        let winner = *ran.first().unwrap();
        for (step, status) in &outcomes {
            let expected = if *step == winner {
                "success"
            } else {
                "blocked"
            };
            assert_eq!(status, expected, "round {round}: {outcomes:?}");
        }
        close_run(&server, &run, "discard").await;
    }
}

// ---------------------------------------------------------------------------
// 5. The call budget (max_calls_per_turn).
// ---------------------------------------------------------------------------

fn dice(run: Option<&str>, floor: Option<&str>, arguments: Value) -> Value {
    json!({"name": "roll_dice", "arguments": arguments, "run_id": run, "floor_id": floor})
}

fn assert_budget_refusal(result: &Value) {
    assert_status(result, "denied");
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("max_calls_per_turn"),
        "{result}"
    );
}

async fn budget_session(server: &TestServer) -> String {
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"max_calls_per_turn": 2}))
        .await;
    session
}

#[tokio::test]
async fn calls_refused_for_their_arguments_do_not_use_the_call_budget() {
    let server = spawn_app().await;
    let session = budget_session(&server).await;
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    for invalid in [json!({"sides": "many"}), json!("{not json")] {
        let result = call(&server, &session, dice(Some(&run), None, invalid)).await;
        assert_status(&result, "error");
    }
    for _ in 0..2 {
        let result = call(&server, &session, dice(Some(&run), None, json!({}))).await;
        assert_status(&result, "success");
    }
    let over = call(&server, &session, dice(Some(&run), None, json!({}))).await;
    assert_budget_refusal(&over);
}

#[tokio::test]
async fn each_run_has_its_own_call_budget() {
    let server = spawn_app().await;
    let session = budget_session(&server).await;
    let floor_id = floor(&server, &session).await;
    let run1 = open_run(&server, &floor_id).await;
    for _ in 0..2 {
        let result = call(&server, &session, dice(Some(&run1), None, json!({}))).await;
        assert_status(&result, "success");
    }
    let over = call(&server, &session, dice(Some(&run1), None, json!({}))).await;
    assert_budget_refusal(&over);
    close_run(&server, &run1, "discard").await;

    let run2 = open_run(&server, &floor_id).await;
    for _ in 0..2 {
        let result = call(&server, &session, dice(Some(&run2), None, json!({}))).await;
        assert_status(&result, "success");
    }
    let over = call(&server, &session, dice(Some(&run2), None, json!({}))).await;
    assert_budget_refusal(&over);
}

#[tokio::test]
async fn calls_outside_runs_have_a_call_budget_per_floor() {
    let server = spawn_app().await;
    let session = budget_session(&server).await;
    let floor_a = floor(&server, &session).await;
    let floor_b = floor(&server, &session).await;
    // A run on floor A uses its own budget up.
    let run = open_run(&server, &floor_a).await;
    for _ in 0..2 {
        let result = call(&server, &session, dice(Some(&run), None, json!({}))).await;
        assert_status(&result, "success");
    }
    close_run(&server, &run, "commit").await;

    // Calls outside runs are counted per floor, apart from the floor's runs.
    for _ in 0..2 {
        let result = call(&server, &session, dice(None, Some(&floor_a), json!({}))).await;
        assert_status(&result, "success");
    }
    let over = call(&server, &session, dice(None, Some(&floor_a), json!({}))).await;
    assert_budget_refusal(&over);
    for _ in 0..2 {
        let result = call(&server, &session, dice(None, Some(&floor_b), json!({}))).await;
        assert_status(&result, "success");
    }
    let over = call(&server, &session, dice(None, Some(&floor_b), json!({}))).await;
    assert_budget_refusal(&over);
}

// ---------------------------------------------------------------------------
// 10. A side-effecting async job that times out is `uncertain`.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_side_effecting_async_job_that_times_out_is_uncertain() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;
    let mut receipts = Vec::new();
    for (name, level, expected, code) in [
        (
            "publish_post",
            "irreversible",
            "uncertain",
            "remote_timeout_uncertain",
        ),
        (
            "stage_draft",
            "sandbox",
            "uncertain",
            "remote_timeout_uncertain",
        ),
        ("probe_feed", "none", "timeout", "remote_timeout"),
    ] {
        register(
            &server,
            json!({"name": name, "callback_url": callbacks.url("/hang"), "timeout_seconds": 0.5,
                   "side_effect_level": level,
                   "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
        )
        .await;
        let receipt = call(&server, &session, json!({"name": name, "arguments": {}})).await;
        assert_eq!(receipt["output"]["accepted"], true, "{receipt}");
        let id = receipt["output"]["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        receipts.push((name, id, expected, code));
    }
    let server_ref = &server;
    let ids: Vec<String> = receipts.iter().map(|(_, id, _, _)| id.clone()).collect();
    let ids = &ids;
    common::wait_until(
        Duration::from_secs(20),
        "the timed-out jobs to finish",
        || async move {
            for id in ids {
                if execution(server_ref, id).await["lifecycle_state"] != "finished" {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let delivered = server
        .get(&format!("/sessions/{session}/tool-results"))
        .await;
    assert_eq!(delivered.status, StatusCode::OK, "{delivered:?}");
    for (name, id, expected, code) in &receipts {
        let row = execution(&server, id).await;
        assert_eq!(row["status"], *expected, "{name}: {row}");
        assert_eq!(row["execution_reason_code"], *code, "{name}: {row}");
        let delivery = delivered.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["execution_id"] == id.as_str())
            .unwrap_or_else(|| panic!("{name} was not delivered: {delivered:?}"));
        assert_eq!(delivery["is_error"], true, "{name}: {delivery}");
        assert_eq!(
            delivery["execution_reason_code"], *code,
            "{name}: {delivery}"
        );
        assert_eq!(row["delivery_mode"], "async_job", "{name}: {row}");
        if *expected == "uncertain" {
            // As for an inline call: the outcome rule is one.
            assert_eq!(row["commit_outcome"], "uncertain", "{name}: {row}");
        }
    }
}

// ---------------------------------------------------------------------------
// 10a. A live model session is offered exactly what its calls allow.
// ---------------------------------------------------------------------------

fn string_set(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

async fn catalog_names(server: &TestServer, session: &str, query: &str) -> BTreeSet<String> {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime{query}"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_live_model_session_is_offered_exactly_what_its_calls_allow() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    register(
        &server,
        json!({"name": "launch_rocket", "callback_url": callbacks.url("/ok"), "side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(
            &session,
            json!({"allow_irreversible": false, "slot_deny_list": {"narrator": ["roll_dice"]}}),
        )
        .await;
    let everything = catalog_names(&server, &session, "").await;
    for name in ["launch_rocket", "roll_dice", "get_time"] {
        assert!(everything.contains(name), "{name} missing: {everything:?}");
    }
    let narrator = catalog_names(&server, &session, "?slot=narrator").await;
    assert!(!narrator.contains("launch_rocket"), "{narrator:?}");
    assert!(!narrator.contains("roll_dice"), "{narrator:?}");
    assert!(narrator.contains("get_time"), "{narrator:?}");

    let mut events = Events::open(&server, &session).await;
    let ready = events.ready.clone();
    assert_eq!(
        string_set(&ready["tools"]),
        narrator,
        "the model session is offered what the narrator may call: {ready}"
    );
    for denied in ["launch_rocket", "roll_dice"] {
        let result = call(&server, &session, json!({"name": denied, "arguments": {}})).await;
        assert_status(&result, "denied");
    }

    // A catalog change offers the new catalog under the same rules.
    register(
        &server,
        json!({"name": "launch_probe", "callback_url": callbacks.url("/ok"), "side_effect_level": "irreversible"}),
    )
    .await;
    let changed = events.changed().await;
    assert_eq!(
        string_set(&changed["added"]),
        BTreeSet::from(["launch_probe".to_owned()])
    );
    assert_eq!(
        string_set(&changed["tools"]),
        catalog_names(&server, &session, "?slot=narrator").await,
        "{changed}"
    );
    assert!(
        !string_set(&changed["tools"]).contains("launch_probe"),
        "{changed}"
    );
    assert_eq!(callbacks.ok_hits.load(Ordering::SeqCst), 0);
}
