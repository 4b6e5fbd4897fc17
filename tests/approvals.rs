//! Issue 21 §2: human approval of risky calls. A call that `approval_required`
//! covers is journalled `awaiting_approval` and answered like a deferred
//! receipt; approving runs it once (as a runtime job, result delivered to the
//! session), rejecting ends it `denied` and it never runs; a second decision is
//! 409 `approval_not_pending`; pending approvals survive a restart; the
//! deadline and a closing run end them.

mod common;

use std::time::Duration;

use common::callbacks::{CountingCallbacks, HoldingCallbacks};
use common::events::Events;
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

async fn register(server: &TestServer, callbacks: &CountingCallbacks, name: &str, extra: Value) {
    let mut body = json!({"name": name, "callback_url": callbacks.url("/ok")});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    common::register_remote(server, body).await;
}

async fn set_permissions(server: &TestServer, session: &str, body: Value) {
    let reply = server
        .put(&format!("/sessions/{session}/tool-permissions"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}

/// An irreversible callback, and a session that holds irreversible calls for
/// approval (without `allow_irreversible`: approval is the gate).
async fn setup(server: &TestServer, callbacks: &CountingCallbacks) -> String {
    register(
        server,
        callbacks,
        "send_email",
        json!({"side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    set_permissions(
        server,
        &session,
        json!({"approval_required": {"side_effect_level": "irreversible"}}),
    )
    .await;
    session
}

async fn call(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

/// Calls `send_email` and checks the receipt; answers the execution id.
async fn held_call(server: &TestServer, session: &str, to: &str) -> String {
    let data = call(
        server,
        session,
        json!({"name": "send_email", "arguments": {"to": to}}),
    )
    .await;
    assert_eq!(data["status"], "awaiting_approval", "{data}");
    assert_eq!(data["is_error"], false, "{data}");
    assert_eq!(data["output"]["status"], "awaiting_approval", "{data}");
    let id = data["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(data["output"]["execution_id"], id);
    id
}

async fn row(server: &TestServer, id: &str) -> Value {
    let reply = server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn wait_for_status(server: &TestServer, id: &str, status: &str) -> Value {
    let mut last = Value::Null;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        last = row(server, id).await;
        if last["status"] == status && last["lifecycle_state"] == "finished" {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} did not become {status}: {last:#}");
}

async fn approve(server: &TestServer, id: &str) -> common::Reply {
    server
        .post(&format!("/tool-executions/{id}/approve"), json!({}))
        .await
}

async fn reject(server: &TestServer, id: &str, reason: &str) -> common::Reply {
    server
        .post(
            &format!("/tool-executions/{id}/reject"),
            json!({"reason": reason}),
        )
        .await
}

#[tokio::test]
async fn an_approval_required_irreversible_callback_runs_only_after_approve_exactly_once() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    let mut events = Events::open(&server, &session).await;
    // The model is offered the tool (approval is its gate).
    assert!(
        events.ready["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("send_email")),
        "{}",
        events.ready
    );

    let id = held_call(&server, &session, "ann@example.com").await;
    let requested = events.next_of("approval_requested", WAIT).await;
    assert_eq!(requested["execution_id"], id);
    assert_eq!(requested["tool_name"], "send_email");
    assert_eq!(requested["arguments"]["to"], "ann@example.com");
    // The default approval_timeout_seconds is 600: shown once a rule is set,
    // and the deadline the event names.
    let permissions = server
        .get(&format!("/sessions/{session}/tool-permissions"))
        .await;
    assert_eq!(permissions.body["data"]["approval_timeout_seconds"], 600);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let left_s = (requested["approval_deadline_at"].as_i64().unwrap() - now_ms) / 1000;
    assert!(
        (570..=600).contains(&left_s),
        "{left_s} s left: {requested}"
    );
    let held = row(&server, &id).await;
    assert_eq!(held["status"], "awaiting_approval", "{held}");
    assert_eq!(held["lifecycle_state"], "opened", "{held}");
    assert_eq!(callbacks.hits(), 0, "not run before approval");

    let approved = approve(&server, &id).await;
    assert_eq!(approved.status, StatusCode::ACCEPTED, "{approved:?}");
    assert_eq!(approved.body["data"]["status"], "queued");
    let result = events.next_of("tool_result", WAIT).await;
    assert_eq!(result["execution_id"], id, "{result}");
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["output"]["echo"]["to"], "ann@example.com");
    let done = wait_for_status(&server, &id, "success").await;
    assert_eq!(done["provider_started"], true, "{done}");
    assert_eq!(callbacks.hits(), 1, "run exactly once");

    for second in [
        approve(&server, &id).await,
        reject(&server, &id, "late").await,
    ] {
        assert_eq!(second.status, StatusCode::CONFLICT, "{second:?}");
        assert_eq!(second.code(), "approval_not_pending");
    }
    assert_eq!(callbacks.hits(), 1);
    let missing = approve(&server, "texec_missing").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
    // Another account cannot decide it.
    let other = server.create_account("other").await;
    let foreign = server
        .send_as(
            &other,
            reqwest::Method::POST,
            &format!("/tool-executions/{id}/approve"),
            None,
        )
        .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{foreign:?}");
}

#[tokio::test]
async fn a_rejected_call_ends_denied_at_once_and_never_runs() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    let mut events = Events::open(&server, &session).await;
    let rejected_id = held_call(&server, &session, "bob@example.com").await;

    let rejected = reject(&server, &rejected_id, "not to Bob").await;
    assert_eq!(rejected.status, StatusCode::OK, "{rejected:?}");
    assert_eq!(rejected.body["data"]["status"], "denied");
    let ended = row(&server, &rejected_id).await;
    assert_eq!(ended["status"], "denied", "{ended}");
    assert_eq!(ended["lifecycle_state"], "finished");
    assert_eq!(ended["execution_reason_code"], "approval_rejected");
    assert_eq!(ended["provider_started"], false);
    assert!(
        ended["error_message"]
            .as_str()
            .unwrap()
            .contains("not to Bob"),
        "{ended}"
    );
    let result = events.next_of("tool_result", WAIT).await;
    assert_eq!(result["execution_id"], rejected_id);
    assert_eq!(result["is_error"], true);
    assert_eq!(result["execution_reason_code"], "approval_rejected");

    // A later approved call runs, so the worker had its chance at the
    // rejected one: only the approved one reached the callback.
    let approved_id = held_call(&server, &session, "cat@example.com").await;
    assert_eq!(
        approve(&server, &approved_id).await.status,
        StatusCode::ACCEPTED
    );
    wait_for_status(&server, &approved_id, "success").await;
    assert_eq!(callbacks.hits(), 1);
    let again = approve(&server, &rejected_id).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
}

#[tokio::test]
async fn a_pending_approval_survives_a_restart_and_is_decided_after_it() {
    let mut server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    let first = held_call(&server, &session, "dan@example.com").await;
    let second = held_call(&server, &session, "eve@example.com").await;
    server.kill().await;
    server.restart().await;

    for id in [&first, &second] {
        let held = row(&server, id).await;
        assert_eq!(held["status"], "awaiting_approval", "{held}");
        assert_eq!(held["lifecycle_state"], "opened", "{held}");
    }
    assert_eq!(approve(&server, &first).await.status, StatusCode::ACCEPTED);
    assert_eq!(
        reject(&server, &second, "changed my mind").await.status,
        StatusCode::OK
    );
    wait_for_status(&server, &first, "success").await;
    wait_for_status(&server, &second, "denied").await;
    assert_eq!(callbacks.hits(), 1);
}

#[tokio::test]
async fn batch_decisions_are_each_taken_on_their_own() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    let a = held_call(&server, &session, "a@example.com").await;
    let b = held_call(&server, &session, "b@example.com").await;
    let c = held_call(&server, &session, "c@example.com").await;

    let reply = server
        .post(
            "/tool-executions/approvals",
            json!({"decisions": [
                {"execution_id": a, "approve": true},
                {"execution_id": b, "approve": false, "reason": "no"},
                {"execution_id": "texec_missing", "approve": true},
                {"execution_id": a, "approve": false},
            ]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let answers = reply.body["data"].as_array().unwrap();
    let outcomes: Vec<&str> = answers
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["approved", "rejected", "failed", "failed"]);
    assert_eq!(answers[2]["error"]["code"], "not_found");
    assert_eq!(answers[3]["error"]["code"], "approval_not_pending");
    wait_for_status(&server, &a, "success").await;
    wait_for_status(&server, &b, "denied").await;
    assert_eq!(row(&server, &c).await["status"], "awaiting_approval");
    assert_eq!(callbacks.hits(), 1);

    for bad in [
        json!({"decisions": []}),
        json!({"decisions": [{"execution_id": c}]}),
    ] {
        let reply = server.post("/tool-executions/approvals", bad).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    }
}

#[tokio::test]
async fn an_undecided_approval_times_out_denied() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    set_permissions(
        &server,
        &session,
        json!({"approval_required": ["send_email"], "approval_timeout_seconds": 1, "allow_irreversible": true}),
    )
    .await;
    let permissions = server
        .get(&format!("/sessions/{session}/tool-permissions"))
        .await;
    assert_eq!(
        permissions.body["data"]["approval_required"],
        json!(["send_email"])
    );
    assert_eq!(permissions.body["data"]["approval_timeout_seconds"], 1);
    let id = held_call(&server, &session, "fay@example.com").await;
    let ended = wait_for_status(&server, &id, "denied").await;
    assert_eq!(
        ended["execution_reason_code"], "approval_timeout",
        "{ended}"
    );
    let late = approve(&server, &id).await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
    assert_eq!(callbacks.hits(), 0);
}

#[tokio::test]
async fn a_run_closed_while_a_call_awaits_approval_cancels_it() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    for close in ["discard", "commit"] {
        let (_floor, run) = server.floor_and_run(&session, "hello").await;
        let data = call(
            &server,
            &session,
            json!({"name": "send_email", "arguments": {"to": "gus@example.com"}, "run_id": run}),
        )
        .await;
        assert_eq!(data["status"], "awaiting_approval", "{data}");
        let id = data["execution_id"].as_str().unwrap().to_owned();
        let reply = server
            .post(&format!("/runs/{run}/{close}"), json!({}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{close}: {reply:?}");
        let ended = row(&server, &id).await;
        assert_eq!(ended["status"], "blocked", "{close}: {ended}");
        assert_eq!(ended["execution_reason_code"], "approval_cancelled");
        let late = approve(&server, &id).await;
        assert_eq!(late.status, StatusCode::CONFLICT, "{close}: {late:?}");
    }
    assert_eq!(callbacks.hits(), 0);
}

/// A commit ends both kinds of call a run holds in one statement
/// (`runs::release_run_jobs`): the approved (staged) one is queued and runs,
/// the one still held is cancelled, and neither is mistaken for the other.
/// The approved call's callback holds it, so its row is read while it runs:
/// a commit that finished it `blocked` would show there.
#[tokio::test]
async fn a_commit_queues_the_runs_approved_calls_and_cancels_those_still_held() {
    let server = spawn_app().await;
    let held_callback = HoldingCallbacks::start().await;
    common::register_remote(
        &server,
        json!({"name": "send_email", "callback_url": held_callback.url(), "side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    set_permissions(
        &server,
        &session,
        json!({"approval_required": {"side_effect_level": "irreversible"}}),
    )
    .await;
    let (_floor, run) = server.floor_and_run(&session, "hello").await;
    let mut ids = Vec::new();
    for to in ["approved@example.com", "held@example.com"] {
        let data = call(
            &server,
            &session,
            json!({"name": "send_email", "arguments": {"to": to}, "run_id": run}),
        )
        .await;
        assert_eq!(data["status"], "awaiting_approval", "{data}");
        ids.push(data["execution_id"].as_str().unwrap().to_owned());
    }
    let approved = approve(&server, &ids[0]).await;
    assert_eq!(approved.body["data"]["status"], "staged", "{approved:?}");
    let reply = server.post(&format!("/runs/{run}/commit"), json!({})).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let held = row(&server, &ids[1]).await;
    assert_eq!(held["status"], "blocked", "{held}");
    assert_eq!(held["lifecycle_state"], "finished", "{held}");
    assert_eq!(
        held["execution_reason_code"], "approval_cancelled",
        "{held}"
    );
    let late = approve(&server, &ids[1]).await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
    held_callback.wait_hits(1).await;
    let running = row(&server, &ids[0]).await;
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["lifecycle_state"], "opened", "{running}");
    // The run's page too, read while the call runs and again once it has
    // finished: pages reuse a row's JSON while its revision is unchanged, so
    // the job's finish must show on the second read.
    let on_page = page_row(&server, &run, &ids[0]).await;
    assert_eq!(on_page["status"], "running", "{on_page}");
    held_callback.release();
    wait_for_status(&server, &ids[0], "success").await;
    assert_eq!(held_callback.hits(), 1);
    let on_page = page_row(&server, &run, &ids[0]).await;
    assert_eq!(on_page["status"], "success", "{on_page}");
    assert_eq!(on_page["lifecycle_state"], "finished", "{on_page}");
}

/// Row `id` as the run's journal page shows it.
async fn page_row(server: &common::TestServer, run: &str, id: &str) -> Value {
    let page = server.get(&format!("/tool-executions?run_id={run}")).await;
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
    page.body["data"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("{id} is not on its run's page: {page:?}"))
}

#[tokio::test]
async fn a_call_approved_inside_an_open_run_runs_only_if_the_run_commits() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let session = setup(&server, &callbacks).await;
    let mut ids = Vec::new();
    for close in ["discard", "commit"] {
        let (_floor, run) = server.floor_and_run(&session, "hello").await;
        let data = call(
            &server,
            &session,
            json!({"name": "send_email", "arguments": {"to": close}, "run_id": run}),
        )
        .await;
        let id = data["execution_id"].as_str().unwrap().to_owned();
        let approved = approve(&server, &id).await;
        assert_eq!(approved.status, StatusCode::ACCEPTED, "{approved:?}");
        assert_eq!(approved.body["data"]["status"], "staged", "{approved:?}");
        let reply = server
            .post(&format!("/runs/{run}/{close}"), json!({}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{close}: {reply:?}");
        ids.push(id);
    }
    // The discarded run's approved call never runs; the committed one's does.
    let discarded = row(&server, &ids[0]).await;
    assert_eq!(discarded["status"], "blocked", "{discarded}");
    assert_eq!(discarded["execution_reason_code"], "job_run_discarded");
    wait_for_status(&server, &ids[1], "success").await;
    assert_eq!(callbacks.hits(), 1);
}

#[tokio::test]
async fn a_tool_that_cannot_be_held_is_refused_and_bad_rules_are_400() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    // A run that rolled before the rule, for the dry run below.
    let (_floor, run) = server.floor_and_run(&session, "hello").await;
    let rolled = call(
        &server,
        &session,
        json!({"name": "roll_dice", "arguments": {"sides": 6}, "run_id": run}),
    )
    .await;
    assert_eq!(rolled["status"], "success", "{rolled}");
    set_permissions(
        &server,
        &session,
        json!({"approval_required": ["roll_dice"]}),
    )
    .await;
    let data = call(
        &server,
        &session,
        json!({"name": "roll_dice", "arguments": {"sides": 6}}),
    )
    .await;
    assert_eq!(data["status"], "denied", "{data}");
    assert_eq!(data["execution_reason_code"], "approval_unavailable");
    // The dry run says what the call path does: refused, not held.
    let dry = server
        .post(&format!("/runs/{run}/replay"), json!({"dry_run": true}))
        .await;
    assert_eq!(dry.status, StatusCode::OK, "{dry:?}");
    let verdict = &dry.body["data"]["calls"][0];
    assert_eq!(verdict["verdict"], "would_be_denied", "{verdict}");
    assert!(
        verdict["reason"]
            .as_str()
            .unwrap()
            .contains("cannot be held"),
        "{verdict}"
    );
    for bad in [
        json!({"approval_required": "send_email"}),
        json!({"approval_required": {"side_effect_level": "huge"}}),
        json!({"approval_required": {"tools": ["x"]}}),
        json!({"approval_timeout_seconds": 0}),
    ] {
        let reply = server
            .put(
                &format!("/sessions/{session}/tool-permissions"),
                bad.clone(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}: {reply:?}");
    }
}

/// Deleting a session ends its held calls at once (`blocked`,
/// `job_session_gone`: they could never run for a session that is gone), so
/// deciding one afterwards is refused instead of queueing a job that fails;
/// another session's held call still times out at its deadline.
#[tokio::test]
async fn deleting_the_session_ends_its_held_calls_and_deciding_one_is_refused() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let timed = json!({"approval_required": ["send_email"], "approval_timeout_seconds": 1,
                       "allow_irreversible": true});
    let gone = setup(&server, &callbacks).await;
    set_permissions(&server, &gone, timed.clone()).await;
    let rejected = held_call(&server, &gone, "a@example.com").await;
    let approved = held_call(&server, &gone, "b@example.com").await;
    let deleted = server.delete(&format!("/sessions/{gone}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    for id in [&rejected, &approved] {
        let ended = row(&server, id).await;
        assert_eq!(ended["status"], "blocked", "{ended:#}");
        assert_eq!(ended["lifecycle_state"], "finished", "{ended:#}");
        assert_eq!(
            ended["execution_reason_code"], "job_session_gone",
            "{ended:#}"
        );
        assert_eq!(ended["provider_started"], false, "{ended:#}");
    }
    let reply = reject(&server, &rejected, "the chat is gone").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.code(), "approval_not_pending");
    let reply = approve(&server, &approved).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.code(), "approval_not_pending");

    // Another session's held call, due at the next sweep.
    let live = server.create_session().await;
    set_permissions(&server, &live, timed).await;
    let neighbour = held_call(&server, &live, "d@example.com").await;
    let ended = wait_for_status(&server, &neighbour, "denied").await;
    assert_eq!(
        ended["execution_reason_code"], "approval_timeout",
        "{ended}"
    );
    assert_eq!(callbacks.hits(), 0, "no callback ran");
}
