//! Issue 5: sandbox effects (variable and resource writes) made inside a run are
//! buffered per run — visible to the run's own later calls, invisible to the
//! session until the run commits, dropped when it is discarded — through the
//! real binary.

mod common;

use common::TestServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Session state seen from outside any run, and from inside one.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Session,
    Run(&'a str),
}

async fn floor(server: &TestServer, session: &str) -> String {
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hi"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

async fn open_run(server: &TestServer, floor_id: &str) -> String {
    let reply = server
        .post(&format!("/floors/{floor_id}/runs"), json!({}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["run_id"].as_str().unwrap().to_owned()
}

async fn finish_run(server: &TestServer, run: &str, how: &str) {
    let reply = server.post(&format!("/runs/{run}/{how}"), json!({})).await;
    assert_eq!(reply.status, StatusCode::OK, "{how}: {reply:?}");
}

/// Calls a tool as the narrator, in `scope`, and returns the `data` of the answer.
async fn call(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
    args: Value,
) -> Value {
    let mut body = json!({"name": name, "arguments": args, "caller_slot": "narrator"});
    if let Scope::Run(run) = scope {
        body["run_id"] = json!(run);
    }
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{name}: {reply:?}");
    reply.body["data"].clone()
}

/// Calls a tool that must succeed and returns its output.
async fn ok(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
    args: Value,
) -> Value {
    let result = call(server, session, scope, name, args).await;
    assert_eq!(result["status"], "success", "{name}: {result}");
    result["output"].clone()
}

/// Calls a tool that must answer a tool error mentioning `hint`.
async fn tool_error(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
    args: Value,
    hint: &str,
) {
    let result = call(server, session, scope, name, args).await;
    assert_eq!(result["status"], "error", "{name}: {result}");
    let message = result["output"].as_str().unwrap_or_default();
    assert!(message.contains(hint), "expected {hint:?} in {result}");
}

/// The variable's value as `scope` sees it (`None` when it is not set).
async fn variable(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
) -> Option<Value> {
    let output = ok(
        server,
        session,
        scope,
        "get_variable",
        json!({"name": name}),
    )
    .await;
    (output["exists"] == true).then(|| output["value"].clone())
}

async fn set_variable(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
    value: Value,
) {
    let output = ok(
        server,
        session,
        scope,
        "set_variable",
        json!({"name": name, "value": value}),
    )
    .await;
    assert_eq!(output["saved"], true);
}

/// Resource names with their content, as `scope` sees them (via
/// `list_resources`, then `read_resource` for each).
async fn resources(server: &TestServer, session: &str, scope: Scope<'_>) -> Vec<(String, Value)> {
    let listed = ok(server, session, scope, "list_resources", json!({})).await;
    assert_eq!(
        listed["count"],
        listed["resources"].as_array().unwrap().len()
    );
    let mut all = Vec::new();
    for summary in listed["resources"].as_array().unwrap() {
        let name = summary["name"].as_str().unwrap().to_owned();
        let read = ok(
            server,
            session,
            scope,
            "read_resource",
            json!({"name": name}),
        )
        .await;
        assert_eq!(read["kind"], summary["kind"], "{read} vs {summary}");
        assert_eq!(read["bytes"], summary["bytes"], "{read} vs {summary}");
        all.push((name, read["content"].clone()));
    }
    all
}

fn named(pairs: &[(&str, Value)]) -> Vec<(String, Value)> {
    pairs
        .iter()
        .map(|(name, content)| ((*name).to_owned(), content.clone()))
        .collect()
}

async fn write_resource(
    server: &TestServer,
    session: &str,
    scope: Scope<'_>,
    name: &str,
    content: Value,
) -> bool {
    let output = ok(
        server,
        session,
        scope,
        "write_resource",
        json!({"name": name, "content": content}),
    )
    .await;
    output["created"].as_bool().unwrap()
}

/// Raises the per-turn call budget so one run can make many calls.
async fn allow_many_calls(server: &TestServer, session: &str) {
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"max_calls_per_turn": 1000}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}

#[tokio::test]
async fn variable_writes_in_a_run_are_invisible_outside_it_until_commit() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    set_variable(&server, &session, Scope::Session, "hp", json!(10)).await;
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    let inside = Scope::Run(&run);

    set_variable(&server, &session, inside, "hp", json!(7)).await;
    set_variable(&server, &session, inside, "mood", json!({"joy": 1})).await;
    // The run reads its own writes; the session (and a call on the floor
    // without the run) does not.
    assert_eq!(
        variable(&server, &session, inside, "hp").await,
        Some(json!(7))
    );
    assert_eq!(
        variable(&server, &session, inside, "mood").await,
        Some(json!({"joy": 1}))
    );
    assert_eq!(
        variable(&server, &session, Scope::Session, "hp").await,
        Some(json!(10))
    );
    assert_eq!(
        variable(&server, &session, Scope::Session, "mood").await,
        None
    );
    let on_floor = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "get_variable", "arguments": {"name": "hp"}, "floor_id": floor_id}),
        )
        .await;
    assert_eq!(on_floor.body["data"]["output"]["value"], 10, "{on_floor:?}");

    // A later write in the run wins over an earlier one.
    set_variable(&server, &session, inside, "hp", json!(3)).await;
    assert_eq!(
        variable(&server, &session, inside, "hp").await,
        Some(json!(3))
    );
    assert_eq!(
        variable(&server, &session, Scope::Session, "hp").await,
        Some(json!(10))
    );

    finish_run(&server, &run, "commit").await;
    assert_eq!(
        variable(&server, &session, Scope::Session, "hp").await,
        Some(json!(3))
    );
    assert_eq!(
        variable(&server, &session, Scope::Session, "mood").await,
        Some(json!({"joy": 1}))
    );

    // The committed run takes no more writes.
    let late = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "set_variable", "arguments": {"name": "hp", "value": 0}, "run_id": run}),
        )
        .await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");
    assert_eq!(late.code(), "run_not_open");
    assert_eq!(
        variable(&server, &session, Scope::Session, "hp").await,
        Some(json!(3))
    );
}

#[tokio::test]
async fn resource_writes_and_deletes_are_buffered_and_applied_at_commit() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    let outside = Scope::Session;
    assert!(write_resource(&server, &session, outside, "keep", json!("original")).await);
    assert!(write_resource(&server, &session, outside, "gone", json!({"n": 1})).await);
    let before = named(&[("gone", json!({"n": 1})), ("keep", json!("original"))]);
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    let inside = Scope::Run(&run);

    assert!(!write_resource(&server, &session, inside, "keep", json!("changed")).await);
    assert!(write_resource(&server, &session, inside, "fresh", json!([1, 2])).await);
    // Created once as the run sees it: the second write replaces.
    assert!(!write_resource(&server, &session, inside, "fresh", json!([1, 2, 3])).await);
    let deleted = ok(
        &server,
        &session,
        inside,
        "delete_resource",
        json!({"name": "gone"}),
    )
    .await;
    assert_eq!(deleted["deleted"], true);
    // Deleted as the run sees it.
    tool_error(
        &server,
        &session,
        inside,
        "delete_resource",
        json!({"name": "gone"}),
        "no resource named",
    )
    .await;
    tool_error(
        &server,
        &session,
        inside,
        "read_resource",
        json!({"name": "gone"}),
        "no resource named",
    )
    .await;

    let merged = named(&[("fresh", json!([1, 2, 3])), ("keep", json!("changed"))]);
    assert_eq!(resources(&server, &session, inside).await, merged);
    assert_eq!(resources(&server, &session, outside).await, before);

    finish_run(&server, &run, "commit").await;
    assert_eq!(resources(&server, &session, outside).await, merged);
    let listed = ok(&server, &session, outside, "list_resources", json!({})).await;
    let fresh = &listed["resources"][0];
    assert_eq!(fresh["name"], "fresh");
    assert_eq!(fresh["kind"], "json");
    assert_eq!(fresh["bytes"], "[1,2,3]".len());
}

#[tokio::test]
async fn a_discarded_run_leaves_no_trace_in_session_state() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    let outside = Scope::Session;
    set_variable(&server, &session, outside, "hp", json!(10)).await;
    write_resource(&server, &session, outside, "log", json!("day one")).await;
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    let inside = Scope::Run(&run);

    set_variable(&server, &session, inside, "hp", json!(0)).await;
    set_variable(&server, &session, inside, "cursed", json!(true)).await;
    write_resource(&server, &session, inside, "log", json!("day two")).await;
    write_resource(&server, &session, inside, "secret", json!("x")).await;
    ok(
        &server,
        &session,
        inside,
        "delete_resource",
        json!({"name": "log"}),
    )
    .await;
    assert_eq!(
        resources(&server, &session, inside).await,
        named(&[("secret", json!("x"))])
    );

    finish_run(&server, &run, "discard").await;
    assert_eq!(
        variable(&server, &session, outside, "hp").await,
        Some(json!(10))
    );
    assert_eq!(variable(&server, &session, outside, "cursed").await, None);
    assert_eq!(
        resources(&server, &session, outside).await,
        named(&[("log", json!("day one"))])
    );

    // The next attempt on the floor starts from the session's state, not from
    // the discarded attempt's writes; committing it applies only its own.
    let retry = open_run(&server, &floor_id).await;
    assert_eq!(
        variable(&server, &session, Scope::Run(&retry), "hp").await,
        Some(json!(10))
    );
    assert_eq!(
        variable(&server, &session, Scope::Run(&retry), "cursed").await,
        None
    );
    set_variable(&server, &session, Scope::Run(&retry), "hp", json!(9)).await;
    finish_run(&server, &retry, "commit").await;
    assert_eq!(
        variable(&server, &session, outside, "hp").await,
        Some(json!(9))
    );
    assert_eq!(variable(&server, &session, outside, "cursed").await, None);
    assert_eq!(
        resources(&server, &session, outside).await,
        named(&[("log", json!("day one"))])
    );
}

#[tokio::test]
async fn a_run_committed_after_a_restart_applies_its_buffered_writes() {
    let mut server = common::spawn_app().await;
    let session = server.create_session().await;
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    set_variable(&server, &session, Scope::Run(&run), "level", json!(2)).await;
    write_resource(&server, &session, Scope::Run(&run), "map", json!("north")).await;

    server.restart().await;

    assert_eq!(
        variable(&server, &session, Scope::Session, "level").await,
        None
    );
    assert!(
        resources(&server, &session, Scope::Session)
            .await
            .is_empty()
    );
    // Still readable by the run after the restart.
    assert_eq!(
        variable(&server, &session, Scope::Run(&run), "level").await,
        Some(json!(2))
    );
    finish_run(&server, &run, "commit").await;
    assert_eq!(
        variable(&server, &session, Scope::Session, "level").await,
        Some(json!(2))
    );
    assert_eq!(
        resources(&server, &session, Scope::Session).await,
        named(&[("map", json!("north"))])
    );
}

#[tokio::test]
async fn two_runs_on_one_floor_do_not_see_each_others_writes() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    let floor_id = floor(&server, &session).await;
    let first = open_run(&server, &floor_id).await;
    let second = open_run(&server, &floor_id).await;
    let (a, b) = (Scope::Run(&first), Scope::Run(&second));

    set_variable(&server, &session, a, "choice", json!("left")).await;
    write_resource(&server, &session, a, "path", json!("left")).await;
    assert_eq!(variable(&server, &session, b, "choice").await, None);
    assert!(resources(&server, &session, b).await.is_empty());
    set_variable(&server, &session, b, "choice", json!("right")).await;
    assert_eq!(
        variable(&server, &session, a, "choice").await,
        Some(json!("left"))
    );

    finish_run(&server, &first, "commit").await;
    assert_eq!(
        variable(&server, &session, Scope::Session, "choice").await,
        Some(json!("left"))
    );
    // The second run still reads its own write over the committed one, and
    // sees the committed resource it never touched.
    assert_eq!(
        variable(&server, &session, b, "choice").await,
        Some(json!("right"))
    );
    assert_eq!(
        resources(&server, &session, b).await,
        named(&[("path", json!("left"))])
    );
    finish_run(&server, &second, "discard").await;
    assert_eq!(
        variable(&server, &session, Scope::Session, "choice").await,
        Some(json!("left"))
    );
}

#[tokio::test]
async fn buffered_writes_obey_the_same_limits_as_direct_writes() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    allow_many_calls(&server, &session).await;
    // 99 of the 100 resources a session may hold, written directly.
    for i in 0..99 {
        write_resource(
            &server,
            &session,
            Scope::Session,
            &format!("r{i:02}"),
            json!("x"),
        )
        .await;
    }
    let floor_id = floor(&server, &session).await;
    let run = open_run(&server, &floor_id).await;
    let inside = Scope::Run(&run);

    // Base and overlay count together.
    assert!(write_resource(&server, &session, inside, "new1", json!("y")).await);
    let limit = json!({"name": "new2", "content": "y"});
    tool_error(
        &server,
        &session,
        inside,
        "write_resource",
        limit.clone(),
        "maximum of 100",
    )
    .await;
    // Replacing is fine at the limit; deleting in the run frees a place.
    assert!(!write_resource(&server, &session, inside, "r00", json!("z")).await);
    ok(
        &server,
        &session,
        inside,
        "delete_resource",
        json!({"name": "r01"}),
    )
    .await;
    assert!(write_resource(&server, &session, inside, "new2", json!("y")).await);
    tool_error(
        &server,
        &session,
        inside,
        "write_resource",
        json!({"name": "new3", "content": "y"}),
        "maximum of 100",
    )
    .await;

    // Names and sizes are checked as for direct writes.
    let big = "a".repeat(64 * 1024 + 1);
    tool_error(
        &server,
        &session,
        inside,
        "write_resource",
        json!({"name": "r00", "content": big}),
        "at most",
    )
    .await;
    tool_error(
        &server,
        &session,
        inside,
        "set_variable",
        json!({"name": " hp", "value": 1}),
        "whitespace",
    )
    .await;
    let huge = json!({"name": "hp", "value": "b".repeat(16 * 1024)});
    tool_error(&server, &session, inside, "set_variable", huge, "at most").await;
    assert_eq!(variable(&server, &session, inside, "hp").await, None);

    // Nothing reached the session yet; the commit applies everything accepted.
    let listed = ok(
        &server,
        &session,
        Scope::Session,
        "list_resources",
        json!({}),
    )
    .await;
    assert_eq!(listed["count"], 99);
    finish_run(&server, &run, "commit").await;
    let listed = ok(
        &server,
        &session,
        Scope::Session,
        "list_resources",
        json!({}),
    )
    .await;
    assert_eq!(listed["count"], 100, "{listed}");
    let names: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"new1") && names.contains(&"new2") && !names.contains(&"r01"));
    let r00 = ok(
        &server,
        &session,
        Scope::Session,
        "read_resource",
        json!({"name": "r00"}),
    )
    .await;
    assert_eq!(r00["content"], "z");
}

/// Every open run may commit, so the session's limits count what all of them
/// set: runs spread over floors cannot each fill the session to its limit, and
/// a direct write cannot take a place a run holds.
#[tokio::test]
async fn open_runs_share_the_sessions_limits() {
    let server = common::spawn_app().await;
    let session = server.create_session().await;
    allow_many_calls(&server, &session).await;
    let runs = [
        open_run(&server, &floor(&server, &session).await).await,
        open_run(&server, &floor(&server, &session).await).await,
    ];
    for (k, run) in runs.iter().enumerate() {
        for i in 0..50 {
            assert!(
                write_resource(
                    &server,
                    &session,
                    Scope::Run(run),
                    &format!("r{k}_{i}"),
                    json!("y")
                )
                .await
            );
        }
    }
    // The two runs hold all 100 places between them.
    tool_error(
        &server,
        &session,
        Scope::Run(&runs[1]),
        "write_resource",
        json!({"name": "one_more", "content": "y"}),
        "maximum of 100",
    )
    .await;
    tool_error(
        &server,
        &session,
        Scope::Session,
        "write_resource",
        json!({"name": "direct", "content": "y"}),
        "maximum of 100",
    )
    .await;
    // A name another run holds takes no new place.
    assert!(write_resource(&server, &session, Scope::Run(&runs[1]), "r0_0", json!("z")).await);
    // A discarded run gives its places back.
    finish_run(&server, &runs[1], "discard").await;
    assert!(write_resource(&server, &session, Scope::Session, "direct", json!("y")).await);
    finish_run(&server, &runs[0], "commit").await;
    assert_eq!(resources(&server, &session, Scope::Session).await.len(), 51);
}
