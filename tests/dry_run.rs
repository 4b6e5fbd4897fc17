//! Issue 21, section 4: `POST /runs/{id}/replay {"dry_run": true}` re-evaluates a
//! past run's calls against today's catalog and permissions: it reports what a
//! permission change or a plugin update would break, starts no provider (counted
//! at the callback) and journals nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::callbacks::CountingCallbacks;
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The schema of a tool taking one string `q`, and `extra` more required fields.
fn schema(extra: &[&str]) -> Value {
    let mut properties = json!({"q": {"type": "string"}});
    let mut required = vec!["q"];
    for field in extra {
        properties[*field] = json!({"type": "string"});
        required.push(field);
    }
    json!({"type": "object", "properties": properties, "required": required})
}

/// A call in `run`; its `data`.
async fn call_in(server: &TestServer, session: &str, run: &str, name: &str, args: Value) -> Value {
    server
        .tool_call(
            session,
            json!({"name": name, "arguments": args, "run_id": run}),
        )
        .await
}

/// How many journal rows the session has.
async fn journal_rows(server: &TestServer, session: &str) -> i64 {
    let reply = server
        .get(&format!("/tool-executions?session_id={session}&limit=1"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["meta"]["total_is_estimate"], false, "{reply:?}");
    reply.body["meta"]["total"].as_i64().unwrap()
}

/// The dry run of `run`, which must answer 200; its `data`.
async fn dry_run(server: &TestServer, run: &str) -> Value {
    let reply = server
        .post(&format!("/runs/{run}/replay"), json!({"dry_run": true}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["data"]["run_id"], run, "{reply:?}");
    reply.body["data"].clone()
}

/// The dry run's calls by execution id.
fn by_execution(data: &Value) -> BTreeMap<String, Value> {
    data["calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no calls: {data}"))
        .iter()
        .map(|call| {
            (
                call["execution_id"].as_str().unwrap().to_owned(),
                call.clone(),
            )
        })
        .collect()
}

fn id(result: &Value) -> String {
    result["execution_id"].as_str().unwrap().to_owned()
}

fn assert_verdict(call: &Value, verdict: &str, recorded_status: &str, reason: Option<&str>) {
    assert_eq!(call["verdict"], verdict, "{call}");
    assert_eq!(call["recorded_status"], recorded_status, "{call}");
    match reason {
        None => assert_eq!(call["reason"], Value::Null, "{call}"),
        Some(part) => {
            let text = call["reason"].as_str().unwrap_or_default();
            assert!(
                text.contains(part),
                "expected {part:?} in the reason: {call}"
            );
        }
    }
}

#[tokio::test]
async fn a_dry_run_after_a_permission_change_reports_the_denied_call_and_runs_nothing() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    for (name, level) in [
        ("look", "none"),
        ("search", "none"),
        ("post_tweet", "irreversible"),
    ] {
        common::register_remote(
            &server,
            json!({"name": name, "callback_url": callbacks.url("/ok"),
                   "side_effect_level": level, "parameters": schema(&[])}),
        )
        .await;
    }
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;
    let (_floor, run) = server.floor_and_run(&session, "hello").await;
    let look = call_in(&server, &session, &run, "look", json!({"q": "door"})).await;
    let search = call_in(&server, &session, &run, "search", json!({"q": "key"})).await;
    let tweet = call_in(&server, &session, &run, "post_tweet", json!({"q": "hi"})).await;
    let dice = call_in(&server, &session, &run, "roll_dice", json!({})).await;
    let missing = call_in(&server, &session, &run, "no_such_tool", json!({})).await;
    let bad = call_in(&server, &session, &run, "look", json!({"q": 5})).await;
    for (result, status) in [
        (&look, "success"),
        (&search, "success"),
        (&tweet, "success"),
        (&dice, "success"),
        (&missing, "denied"),
        (&bad, "error"),
    ] {
        assert_eq!(result["status"], status, "{result}");
    }
    let committed = server.post(&format!("/runs/{run}/commit"), json!({})).await;
    assert_eq!(committed.status, StatusCode::OK, "{committed:?}");
    assert_eq!(
        callbacks.hits(),
        3,
        "look, search and post_tweet ran once each"
    );

    // Today: the narrator may no longer call `look`, and `search` (a plugin
    // update) needs a field the recorded call did not send.
    server
        .set_permissions(&session, json!({"slot_deny_list": {"narrator": ["look"]}}))
        .await;
    common::register_remote(
        &server,
        json!({"name": "search", "callback_url": callbacks.url("/ok"), "parameters": schema(&["lang"])}),
    )
    .await;
    let rows_before = journal_rows(&server, &session).await;
    assert_eq!(rows_before, 6);

    let data = dry_run(&server, &run).await;
    let calls = by_execution(&data);
    assert_eq!(calls.len(), 6, "{data}");
    // Oldest first, as the run made them.
    let order: Vec<_> = data["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|call| call["execution_id"].as_str().unwrap().to_owned())
        .collect();
    let made: Vec<_> = [&look, &search, &tweet, &dice, &missing, &bad]
        .into_iter()
        .map(id)
        .collect();
    assert_eq!(order, made);
    assert_eq!(calls[&id(&look)]["tool_name"], "look");
    assert_verdict(
        &calls[&id(&look)],
        "would_be_denied",
        "success",
        Some("`slot_deny_list`"),
    );
    assert_verdict(
        &calls[&id(&search)],
        "arguments_invalid",
        "success",
        Some("lang"),
    );
    assert_verdict(
        &calls[&id(&tweet)],
        "needs_replay_confirmation",
        "success",
        Some(&id(&tweet)),
    );
    assert_verdict(&calls[&id(&dice)], "would_run", "success", None);
    assert_verdict(
        &calls[&id(&missing)],
        "tool_missing",
        "denied",
        Some("no_such_tool"),
    );
    // The deny list comes before the arguments, as on the call path.
    assert_verdict(
        &calls[&id(&bad)],
        "would_be_denied",
        "error",
        Some("`slot_deny_list`"),
    );

    // No provider started, no row was written, the run is as it was.
    assert_eq!(callbacks.hits(), 3, "a dry run must not call any callback");
    assert_eq!(journal_rows(&server, &session).await, rows_before);
    let after = server.get(&format!("/runs/{run}")).await;
    assert_eq!(after.body["data"]["state"], "committed", "{after:?}");

    // The dry run is logged with its run, its session and the verdict counts.
    let log_path = server.data_dir.join("..").join("server.log");
    common::wait_until(Duration::from_secs(10), "the dry run's log line", || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let found = log.lines().any(|line| {
            line.contains("dry-run replay of a run")
                && line.contains(&run)
                && line.contains(&session)
                && line.contains("would_be_denied=2")
                && line.contains("would_run=1")
        });
        async move { found }
    })
    .await;

    // What the dry run predicted is what a real call now meets.
    let (_floor, next) = server.floor_and_run(&session, "again").await;
    let real = call_in(&server, &session, &next, "look", json!({"q": "door"})).await;
    assert_eq!(real["status"], "denied", "{real}");
    assert_eq!(callbacks.hits(), 3);
}

#[tokio::test]
async fn needs_replay_confirmation_follows_the_replay_guard_of_a_new_run() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    common::register_remote(
        &server,
        json!({"name": "post_tweet", "callback_url": callbacks.url("/ok"),
               "side_effect_level": "irreversible", "parameters": schema(&[])}),
    )
    .await;
    let session = server.create_session().await;
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;
    let (floor, run_a) = server.floor_and_run(&session, "hello").await;
    let first = call_in(&server, &session, &run_a, "post_tweet", json!({"q": "hi"})).await;
    assert_eq!(first["status"], "success", "{first}");
    let discarded = server
        .post(&format!("/runs/{run_a}/discard"), json!({}))
        .await;
    assert_eq!(discarded.status, StatusCode::OK, "{discarded:?}");

    // A second attempt confirms the first tweet, but its own call is refused
    // (irreversible calls are off for a while): it never reaches the callback.
    let run_b = server
        .post(
            &format!("/floors/{floor}/runs"),
            json!({"confirmed_execution_ids": [id(&first)]}),
        )
        .await;
    assert_eq!(run_b.status, StatusCode::CREATED, "{run_b:?}");
    let run_b = run_b.body["data"]["id"].as_str().unwrap().to_owned();
    server
        .set_permissions(&session, json!({"allow_irreversible": false}))
        .await;
    let refused = call_in(&server, &session, &run_b, "post_tweet", json!({"q": "hi"})).await;
    assert_eq!(refused["status"], "denied", "{refused}");
    let other = call_in(&server, &session, &run_b, "post_tweet", json!({"q": "new"})).await;
    assert_eq!(other["status"], "denied", "{other}");
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;
    let rows_before = journal_rows(&server, &session).await;

    // Run A: its tweet reached the callback and run A confirmed nothing, so a
    // new run repeating it would be blocked.
    let a = by_execution(&dry_run(&server, &run_a).await);
    assert_verdict(
        &a[&id(&first)],
        "needs_replay_confirmation",
        "success",
        Some(&id(&first)),
    );
    // Run B: the same tweet repeats only the confirmed first one; the other
    // tweet never ran anywhere on the floor.
    let b = by_execution(&dry_run(&server, &run_b).await);
    assert_verdict(&b[&id(&refused)], "would_run", "denied", None);
    assert_verdict(&b[&id(&other)], "would_run", "denied", None);

    assert_eq!(callbacks.hits(), 1, "only the first tweet ever ran");
    assert_eq!(journal_rows(&server, &session).await, rows_before);
}

#[tokio::test]
async fn only_dry_runs_of_the_accounts_own_runs_are_answered() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let (_floor, run) = server.floor_and_run(&session, "hello").await;
    server
        .tool_call(
            &session,
            json!({"name": "roll_dice", "arguments": {}, "run_id": run}),
        )
        .await;
    let path = format!("/runs/{run}/replay");
    for body in [
        Some(json!({"dry_run": false})),
        Some(json!({})),
        None,
        Some(json!({"dry_run": "yes"})),
        Some(json!({"dry_run": true, "confirmed_execution_ids": []})),
    ] {
        let reply = server
            .send(reqwest::Method::POST, &path, body.clone())
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body:?}: {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{body:?}: {reply:?}");
    }
    let reply = server.post(&path, json!({"dry_run": false})).await;
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("only dry runs are supported"),
        "{reply:?}"
    );

    // Another account's run is a 404, exactly like a missing one.
    let other = server.create_account("someone_else").await;
    for (token, path) in [
        (other.as_str(), path.clone()),
        (
            server.token.as_str(),
            "/runs/floorrun_missing/replay".to_owned(),
        ),
    ] {
        let reply = server
            .send_as(
                token,
                reqwest::Method::POST,
                &path,
                Some(json!({"dry_run": true})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply:?}");
        assert_eq!(reply.code(), "not_found", "{reply:?}");
    }
    assert_eq!(journal_rows(&server, &session).await, 1);
    let data = dry_run(&server, &run).await;
    assert_eq!(data["calls"].as_array().unwrap().len(), 1, "{data}");
    assert_verdict(&data["calls"][0], "would_run", "success", None);
}
