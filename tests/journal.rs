//! Issue 5: the execution journal, its queries, the call-record projection and
//! runs, through the real binary. (Provider-specific outcomes are covered with
//! the providers' own tests.)

mod common;

use common::spawn_app;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn floor(server: &common::TestServer, session: &str) -> String {
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hi"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

/// Opens a run on `floor_id`: its id and its page's.
async fn open_run(server: &common::TestServer, floor_id: &str) -> (String, String) {
    let opened = server
        .post(&format!("/floors/{floor_id}/runs"), json!({}))
        .await;
    assert_eq!(opened.status, StatusCode::CREATED, "{opened:?}");
    let id = |field: &str| opened.body["data"][field].as_str().unwrap().to_owned();
    (id("run_id"), id("page_id"))
}

async fn call(server: &common::TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

const ROW_FIELDS: &[&str] = &[
    "id",
    "run_id",
    "floor_id",
    "page_id",
    "caller_slot",
    "provider_id",
    "provider_type",
    "tool_name",
    "args",
    "result",
    "status",
    "lifecycle_state",
    "commit_outcome",
    "side_effect_level",
    "error_message",
    "duration_ms",
    "started_at",
    "finished_at",
    "delivery_mode",
    "attempt_no",
    "runtime_job_id",
    "replay_parent_execution_id",
    "created_at",
    "session_id",
    "call_id",
];

#[tokio::test]
async fn refused_calls_are_journalled_with_every_field() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let result = call(
        &server,
        &session,
        json!({"name": "no_such_tool", "arguments": "{\"x\": 1}", "call_id": "call_1", "caller_slot": "director"}),
    )
    .await;
    assert_eq!(result["is_error"], true);
    assert_eq!(result["status"], "denied");
    assert!(result["output"].as_str().unwrap().contains("unknown tool"));
    let execution_id = result["execution_id"].as_str().unwrap();

    let list = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    let row = &list.body["data"][0];
    for field in ROW_FIELDS {
        assert!(row.get(*field).is_some(), "missing field {field} in {row}");
    }
    assert_eq!(row["id"], execution_id);
    assert_eq!(row["call_id"], "call_1");
    assert_eq!(row["caller_slot"], "director");
    assert_eq!(row["tool_name"], "no_such_tool");
    assert_eq!(row["args"], json!({"x": 1}));
    assert_eq!(row["status"], "denied");
    assert_eq!(row["lifecycle_state"], "finished");
    assert_eq!(row["commit_outcome"], "pending");
    assert_eq!(row["provider_type"], "unknown");
    assert_eq!(row["attempt_no"], 1);
    assert!(row["finished_at"].as_i64().is_some());
    let one = server
        .get(&format!("/tool-executions/{execution_id}"))
        .await;
    assert_eq!(one.body["data"]["id"], execution_id);
}

#[tokio::test]
async fn journal_queries_need_a_scope_and_validate_every_parameter() {
    let server = spawn_app().await;
    let none = server.get("/tool-executions").await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert_eq!(none.code(), "validation_error");
    let only_status = server.get("/tool-executions?status=denied").await;
    assert_eq!(only_status.status, StatusCode::BAD_REQUEST);
    // An empty id is no scope, and says so rather than answering nothing.
    for empty in [
        "/tool-executions?session_id=",
        "/tool-executions?floor_id=&status=denied",
        "/tools/call-records?page_id=",
    ] {
        let reply = server.get(empty).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{empty}: {reply:?}");
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("must not be empty"),
            "{empty}: {reply:?}"
        );
    }
    for bad in [
        "status=exploded",
        "lifecycle_state=half",
        "commit_outcome=maybe",
        "provider_type=alien",
        "caller_slot=writer",
        "sort_by=id",
        "sort_order=sideways",
        "limit=0",
        "limit=500",
        "offset=-3",
        "colour=red",
    ] {
        let reply = server
            .get(&format!("/tool-executions?session_id=s&{bad}"))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let calls = server.get("/tools/call-records").await;
    assert_eq!(calls.status, StatusCode::BAD_REQUEST);
    let bad_status = server
        .get("/tools/call-records?floor_id=f&status=timeout")
        .await;
    assert_eq!(
        bad_status.status,
        StatusCode::BAD_REQUEST,
        "timeout is not a legacy status"
    );
}

#[tokio::test]
async fn filters_sorting_and_paging_over_the_journal() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor_a = floor(&server, &session).await;
    let floor_b = floor(&server, &session).await;
    for (i, (floor, slot)) in [
        (&floor_a, "narrator"),
        (&floor_a, "director"),
        (&floor_b, "narrator"),
        (&floor_b, "verifier"),
        (&floor_b, "narrator"),
    ]
    .into_iter()
    .enumerate()
    {
        call(
            &server,
            &session,
            json!({"name": format!("tool_{}", i % 2), "floor_id": floor, "caller_slot": slot}),
        )
        .await;
    }
    let get = |query: String| {
        let server = &server;
        async move {
            let reply = server.get(&query).await;
            assert_eq!(reply.status, StatusCode::OK, "{query}: {reply:?}");
            reply.body
        }
    };
    let all = get(format!("/tool-executions?session_id={session}")).await;
    assert_eq!(all["meta"]["total"], 5);
    assert_eq!(all["meta"]["sort_by"], "started_at");
    assert_eq!(all["meta"]["sort_order"], "desc");
    assert_eq!(
        get(format!("/tool-executions?floor_id={floor_b}")).await["meta"]["total"],
        3
    );
    assert_eq!(
        get(format!("/floors/{floor_b}/tool-executions")).await["meta"]["total"],
        3
    );
    assert_eq!(
        get(format!(
            "/floors/{floor_b}/tool-executions?caller_slot=narrator"
        ))
        .await["meta"]["total"],
        2
    );
    assert_eq!(
        get(format!(
            "/tool-executions?session_id={session}&tool_name=tool_1"
        ))
        .await["meta"]["total"],
        2
    );
    assert_eq!(
        get(format!("/tool-executions?session_id={session}&status=denied&lifecycle_state=finished&commit_outcome=pending&provider_type=unknown")).await["meta"]["total"],
        5
    );
    assert_eq!(
        get(format!(
            "/tool-executions?session_id={session}&status=success"
        ))
        .await["meta"]["total"],
        0
    );
    let page = get(format!(
        "/tool-executions?session_id={session}&sort_by=created_at&sort_order=asc&limit=2&offset=1"
    ))
    .await;
    assert_eq!(page["meta"]["has_more"], true);
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["data"][0]["tool_name"], "tool_1");
    let ascending: Vec<i64> = get(format!(
        "/tool-executions?session_id={session}&sort_by=finished_at&sort_order=asc"
    ))
    .await["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["finished_at"].as_i64().unwrap())
        .collect();
    assert!(ascending.windows(2).all(|w| w[0] <= w[1]));

    // Another account sees none of it, and a foreign floor is a 404.
    let other = server.create_account("other").await;
    let foreign = server
        .send_as(
            &other,
            reqwest::Method::GET,
            &format!("/tool-executions?session_id={session}"),
            None,
        )
        .await;
    assert_eq!(foreign.body["meta"]["total"], 0);
    let foreign_floor = server
        .send_as(
            &other,
            reqwest::Method::GET,
            &format!("/floors/{floor_a}/tool-executions"),
            None,
        )
        .await;
    assert_eq!(foreign_floor.status, StatusCode::NOT_FOUND);

    // The legacy projection: blocked/denied fold to denied, seq per page, no journal-only fields.
    let records = get(format!(
        "/tools/call-records?floor_id={floor_b}&sort_order=asc"
    ))
    .await;
    assert_eq!(records["meta"]["total"], 3);
    assert_eq!(records["meta"]["sort_by"], "seq");
    let record = &records["data"][0];
    assert_eq!(record["status"], "denied");
    assert_eq!(record["seq"], 0);
    assert_eq!(records["data"][2]["seq"], 2);
    for hidden in [
        "delivery_mode",
        "runtime_job_id",
        "lifecycle_state",
        "commit_outcome",
        "attempt_no",
        "replay_parent_execution_id",
        "side_effect_level",
        "provider_type",
    ] {
        assert!(
            record.get(hidden).is_none(),
            "{hidden} must not be projected"
        );
    }
    for field in [
        "id",
        "page_id",
        "seq",
        "caller_slot",
        "tool_name",
        "args",
        "result",
        "status",
        "duration_ms",
        "created_at",
    ] {
        assert!(record.get(field).is_some(), "{field}");
    }
    let denied = get(format!(
        "/tools/call-records?floor_id={floor_b}&status=denied&caller_slot=verifier"
    ))
    .await;
    assert_eq!(denied["meta"]["total"], 1);
}

#[tokio::test]
async fn runs_open_commit_and_discard() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor_id = floor(&server, &session).await;

    let (run, page) = open_run(&server, &floor_id).await;
    let result = call(&server, &session, json!({"name": "nope", "run_id": run})).await;
    assert_eq!(result["status"], "denied");
    let rows = server.get(&format!("/tool-executions?run_id={run}")).await;
    assert_eq!(rows.body["data"][0]["page_id"], page.as_str());
    assert_eq!(rows.body["data"][0]["floor_id"], floor_id.as_str());

    let committed = server
        .post(
            &format!("/runs/{run}/commit"),
            json!({"content": "the reply"}),
        )
        .await;
    assert_eq!(committed.status, StatusCode::OK, "{committed:?}");
    assert_eq!(committed.body["data"]["state"], "committed");
    let rows = server.get(&format!("/tool-executions?run_id={run}")).await;
    assert_eq!(rows.body["data"][0]["commit_outcome"], "committed");
    let floors = server.get(&format!("/sessions/{session}/floors")).await;
    assert_eq!(floors.body["data"][0]["active_page_id"], page.as_str());
    assert_eq!(floors.body["data"][0]["pages"][0]["content"], "the reply");
    // A finished run takes no more calls and cannot be committed twice.
    let again = server.post(&format!("/runs/{run}/commit"), json!({})).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.code(), "run_not_open");
    let late = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "nope", "run_id": run}),
        )
        .await;
    assert_eq!(late.status, StatusCode::CONFLICT);

    let second = server
        .post(&format!("/floors/{floor_id}/runs"), json!(null))
        .await;
    assert_eq!(second.status, StatusCode::CREATED, "{second:?}");
    let second_run = second.body["data"]["run_id"].as_str().unwrap().to_owned();
    call(
        &server,
        &session,
        json!({"name": "nope", "run_id": second_run}),
    )
    .await;
    let discarded = server
        .post(&format!("/runs/{second_run}/discard"), json!({}))
        .await;
    assert_eq!(discarded.status, StatusCode::OK);
    let rows = server
        .get(&format!("/tool-executions?run_id={second_run}"))
        .await;
    assert_eq!(rows.body["data"][0]["commit_outcome"], "discarded");
    let floors = server.get(&format!("/sessions/{session}/floors")).await;
    assert_eq!(
        floors.body["data"][0]["active_page_id"],
        page.as_str(),
        "discard keeps the active page"
    );
    assert_eq!(floors.body["data"][0]["pages"].as_array().unwrap().len(), 1);

    assert_eq!(
        server
            .post("/floors/floor_missing/runs", json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server
            .post("/runs/floorrun_missing/commit", json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let other = server.create_account("o").await;
    let foreign = server
        .send_as(
            &other,
            reqwest::Method::POST,
            &format!("/runs/{second_run}/discard"),
            None,
        )
        .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
}

/// A run's commit changes its calls' rows after the journal has folded them,
/// and every page must show the new outcome: a page that kept a row's text
/// from the fold would not (issue 20, twenty-fourth look).
#[tokio::test]
async fn a_committed_runs_calls_show_the_outcome_after_their_rows_were_folded() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor_id = floor(&server, &session).await;
    let (run, _page) = open_run(&server, &floor_id).await;
    let result = call(
        &server,
        &session,
        json!({"name": "roll_dice", "arguments": {"sides": 6}, "run_id": run}),
    )
    .await;
    assert_eq!(result["status"], "success", "{result}");
    // Read once before the commit: the row is folded.
    let rows = server.get(&format!("/tool-executions?run_id={run}")).await;
    assert_eq!(
        rows.body["data"][0]["commit_outcome"], "pending",
        "{rows:?}"
    );
    assert_eq!(rows.body["data"][0]["lifecycle_state"], "finished");
    let committed = server
        .post(&format!("/runs/{run}/commit"), json!({"content": "done"}))
        .await;
    assert_eq!(committed.status, StatusCode::OK, "{committed:?}");
    for query in [
        format!("run_id={run}"),
        format!("session_id={session}&sort_by=created_at"),
    ] {
        let rows = server.get(&format!("/tool-executions?{query}")).await;
        assert_eq!(
            rows.body["data"][0]["commit_outcome"], "committed",
            "{query}: {rows:?}"
        );
        assert_eq!(
            rows.body["data"][0]["id"], result["execution_id"],
            "{query}"
        );
    }
}

#[tokio::test]
async fn a_run_stops_at_max_steps_per_generation() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let patched = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"max_steps_per_generation": 2, "max_calls_per_turn": 50}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let floor_id = floor(&server, &session).await;
    let run = server
        .post(&format!("/floors/{floor_id}/runs"), json!({}))
        .await
        .body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let dice = |step: Option<u32>| {
        let mut body = json!({"name": "roll_dice", "arguments": {"sides": 6}, "run_id": run});
        if let Some(step) = step {
            body["step"] = json!(step);
        }
        body
    };
    // Step 0 with three parallel calls, then step 1: two steps used.
    for _ in 0..3 {
        assert_eq!(
            call(&server, &session, dice(Some(0))).await["status"],
            "success"
        );
    }
    assert_eq!(
        call(&server, &session, dice(Some(1))).await["status"],
        "success"
    );
    // More calls of a step already used are fine; a third step is not.
    assert_eq!(
        call(&server, &session, dice(Some(1))).await["status"],
        "success"
    );
    let third = call(&server, &session, dice(Some(2))).await;
    assert_eq!(third["status"], "blocked", "{third}");
    assert!(
        third["output"]
            .as_str()
            .unwrap()
            .contains("max_steps_per_generation")
    );
    let unnamed = call(&server, &session, dice(None)).await;
    assert_eq!(
        unnamed["status"], "success",
        "calls without a step are not step-guarded"
    );
    let rows = server
        .get(&format!("/tool-executions?run_id={run}&status=blocked"))
        .await;
    assert_eq!(rows.body["meta"]["total"], 1);
    // A new run starts with a fresh step budget.
    server.post(&format!("/runs/{run}/commit"), json!({})).await;
    let next = server
        .post(&format!("/floors/{floor_id}/runs"), json!({}))
        .await
        .body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let fresh = call(
        &server,
        &session,
        json!({"name": "roll_dice", "arguments": {}, "run_id": next}),
    )
    .await;
    assert_eq!(fresh["status"], "success");
}
