//! Floors and their pages through the API, without a model: selecting pages
//! (two selects of one floor at once, a committed page chosen again), the
//! session's floors by page, and what deleting a session does to the calls of
//! its open runs.

mod common;

use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Appends a floor and answers its id.
async fn floor(server: &TestServer, session: &str, content: &str) -> String {
    let appended = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": content}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{appended:?}");
    appended.body["data"]["id"].as_str().unwrap().to_owned()
}

/// The `seq` of each floor of a page of floors.
fn seqs(reply: &common::Reply) -> Vec<i64> {
    reply.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["seq"].as_i64().unwrap())
        .collect()
}

/// Opens a run on the floor and answers it (`id`, `page_id`).
async fn open_run(server: &TestServer, floor: &str) -> Value {
    let opened = server
        .post(&format!("/floors/{floor}/runs"), json!({}))
        .await;
    assert!(opened.status.is_success(), "{opened:?}");
    opened.body["data"].clone()
}

/// `set_variable` in the run: an effect its commit applies.
async fn set_in_run(server: &TestServer, session: &str, floor: &str, run: &Value, value: &str) {
    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "set_variable", "arguments": {"name": "chosen", "value": value},
                   "run_id": run["id"], "floor_id": floor}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "success", "{call:?}");
}

/// Ends the run with `action` (`commit` with `body`, or `discard`).
async fn close(server: &TestServer, run: &Value, action: &str, body: Value) {
    let id = run["id"].as_str().unwrap();
    let closed = server.post(&format!("/runs/{id}/{action}"), body).await;
    assert_eq!(closed.status, StatusCode::OK, "{action}: {closed:?}");
}

async fn run_state(server: &TestServer, run: &Value) -> String {
    let id = run["id"].as_str().unwrap();
    let got = server.get(&format!("/runs/{id}")).await;
    got.body["data"]["state"].as_str().unwrap().to_owned()
}

async fn active_page(server: &TestServer, floor: &str) -> Value {
    server.get(&format!("/floors/{floor}")).await.body["data"]["active_page_id"].clone()
}

#[tokio::test]
async fn two_selects_of_one_floor_at_once_commit_one_run_and_discard_the_other() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    for trial in 0..12 {
        let floor = floor(&server, &session, &format!("trial {trial}")).await;
        let (a, b) = (
            open_run(&server, &floor).await,
            open_run(&server, &floor).await,
        );
        set_in_run(&server, &session, &floor, &a, "a").await;
        set_in_run(&server, &session, &floor, &b, "b").await;
        let select = |run: &Value| {
            let page = run["page_id"].as_str().unwrap().to_owned();
            let server = &server;
            async move {
                server
                    .post(&format!("/pages/{page}/select"), json!({}))
                    .await
            }
        };
        let (first, second) = tokio::join!(select(&a), select(&b));
        let mut statuses = [first.status, second.status];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::OK, StatusCode::CONFLICT],
            "trial {trial}: {first:?} {second:?}"
        );
        let refused = if first.status == StatusCode::CONFLICT {
            &first
        } else {
            &second
        };
        assert_eq!(refused.code(), "run_not_open", "{refused:?}");
        let (chosen, other, value) = if first.status == StatusCode::OK {
            (&a, &b, "a")
        } else {
            (&b, &a, "b")
        };
        assert_eq!(
            run_state(&server, chosen).await,
            "committed",
            "trial {trial}"
        );
        assert_eq!(
            run_state(&server, other).await,
            "discarded",
            "trial {trial}"
        );
        assert_eq!(active_page(&server, &floor).await, chosen["page_id"]);
        let read = server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": "get_variable", "arguments": {"name": "chosen"}}),
            )
            .await;
        assert_eq!(
            read.body["data"]["output"]["value"], value,
            "trial {trial}: only the chosen run's effect landed: {read:?}"
        );
    }
}

#[tokio::test]
async fn selecting_a_committed_page_makes_it_the_floors_reply_again() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor = floor(&server, &session, "hello").await;
    let first = open_run(&server, &floor).await;
    close(&server, &first, "commit", json!({"content": "one"})).await;
    let second = open_run(&server, &floor).await;
    close(&server, &second, "commit", json!({"content": "two"})).await;
    assert_eq!(active_page(&server, &floor).await, second["page_id"]);

    let page = first["page_id"].as_str().unwrap();
    let selected = server
        .post(&format!("/pages/{page}/select"), json!({}))
        .await;
    assert_eq!(selected.status, StatusCode::OK, "{selected:?}");
    assert_eq!(selected.body["data"]["state"], "committed");
    assert_eq!(
        active_page(&server, &floor).await,
        first["page_id"],
        "swiped back"
    );

    // A discarded run's page is gone: choosing it is refused, and the
    // floor keeps its reply.
    let third = open_run(&server, &floor).await;
    close(&server, &third, "discard", json!({})).await;
    let gone = third["page_id"].as_str().unwrap();
    let refused = server
        .post(&format!("/pages/{gone}/select"), json!({}))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(refused.code(), "run_not_open");
    assert_eq!(active_page(&server, &floor).await, first["page_id"]);
}

#[tokio::test]
async fn the_sessions_floors_are_listed_by_page() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut floors = Vec::new();
    for n in 1..=5 {
        floors.push(floor(&server, &session, &format!("floor {n}")).await);
    }
    let run = open_run(&server, &floors[1]).await;
    close(&server, &run, "commit", json!({"content": "reply"})).await;

    let all = server.get(&format!("/sessions/{session}/floors")).await;
    assert_eq!(all.status, StatusCode::OK, "{all:?}");
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5], "oldest first by default");
    assert_eq!(all.body["meta"]["total"], 5);
    assert_eq!(all.body["data"][1]["pages"][0]["content"], "reply");

    let first = server
        .get(&format!("/sessions/{session}/floors?limit=2"))
        .await;
    assert_eq!(seqs(&first), [1, 2]);
    assert_eq!(first.body["meta"]["has_more"], true, "{first:?}");
    let last = server
        .get(&format!("/sessions/{session}/floors?limit=2&offset=4"))
        .await;
    assert_eq!(seqs(&last), [5]);
    assert_eq!(last.body["meta"]["has_more"], false, "{last:?}");
    let newest = server
        .get(&format!(
            "/sessions/{session}/floors?limit=2&sort_order=desc"
        ))
        .await;
    assert_eq!(seqs(&newest), [5, 4]);
    for bad in ["limit=0", "limit=201", "offset=-1", "sort_by=content"] {
        let refused = server
            .get(&format!("/sessions/{session}/floors?{bad}"))
            .await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {refused:?}"
        );
        assert_eq!(refused.code(), "validation_error");
    }

    let twice = server
        .get(&format!("/sessions/{session}/floors?limit=5&limit=10"))
        .await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{twice:?}");
    assert_eq!(
        twice.body["error"]["message"], "invalid query: duplicate field `limit`",
        "the message names no `.` parameter: {twice:?}"
    );

    let one = server.get(&format!("/floors/{}", floors[1])).await;
    assert_eq!(one.status, StatusCode::OK);
    assert_eq!(one.body["data"]["seq"], 2);
    assert_eq!(one.body["data"]["pages"][0]["content"], "reply");
    assert_eq!(one.body["data"]["active_page_id"], run["page_id"]);
}

#[tokio::test]
async fn deleting_a_session_discards_its_open_runs_calls_and_cancels_their_staged_jobs() {
    let server = spawn_app().await;
    // Never called: a staged job does not start before its run commits.
    let (unreachable, _held) = common::mcp::dead_url();
    common::register_remote(
        &server,
        json!({"name": "later", "parameters": {"type": "object"}, "callback_url": unreachable,
               "source": "plugin:test", "timeout_seconds": 30, "async_capability": "deferred_ok",
               "default_delivery_mode": "async_job", "side_effect_level": "none"}),
    )
    .await;
    let session = server.create_session().await;
    let floor = floor(&server, &session, "hello").await;
    let run = open_run(&server, &floor).await;
    let direct = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "arguments": {"sides": 6}, "run_id": run["id"], "floor_id": floor}),
        )
        .await;
    assert_eq!(direct.body["data"]["status"], "success", "{direct:?}");
    let deferred = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "later", "arguments": {}, "run_id": run["id"], "floor_id": floor}),
        )
        .await;
    let job = deferred.body["data"]["output"]["runtime_job_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a deferred call answers its job: {deferred:?}"))
        .to_owned();
    let staged = server.get(&format!("/runtime-jobs/{job}")).await;
    assert_eq!(staged.body["data"]["state"], "staged", "{staged:?}");

    let mut events = common::events::Events::open(&server, &session).await;
    let deleted = server.delete(&format!("/sessions/{session}")).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    // Its event stream ends with it, and nothing more reaches it.
    events.until_ended(std::time::Duration::from_secs(10)).await;

    let direct_id = direct.body["data"]["execution_id"].as_str().unwrap();
    let row = server.get(&format!("/tool-executions/{direct_id}")).await;
    assert_eq!(row.body["data"]["commit_outcome"], "discarded", "{row:?}");
    let deferred_id = deferred.body["data"]["execution_id"].as_str().unwrap();
    let row = server.get(&format!("/tool-executions/{deferred_id}")).await;
    assert_eq!(row.body["data"]["commit_outcome"], "discarded", "{row:?}");
    assert_eq!(
        row.body["data"]["status"], "blocked",
        "never started: {row:?}"
    );
    assert_eq!(
        row.body["data"]["execution_reason_code"], "job_session_gone",
        "{row:?}"
    );
    let job = server.get(&format!("/runtime-jobs/{job}")).await;
    assert_eq!(job.body["data"]["state"], "cancelled", "{job:?}");
}

#[tokio::test]
async fn a_floor_holds_at_most_100_pages_and_a_discard_frees_a_place() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor = floor(&server, &session, "swipe").await;
    let mut runs = Vec::new();
    for _ in 0..100 {
        runs.push(open_run(&server, &floor).await);
    }
    let refused = server
        .post(&format!("/floors/{floor}/runs"), json!({}))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(refused.code(), "limit_exceeded");
    close(&server, &runs[0], "discard", json!({})).await;
    open_run(&server, &floor).await;
    let read = server.get(&format!("/floors/{floor}")).await;
    assert_eq!(
        read.body["data"]["pages"].as_array().map(Vec::len),
        Some(100)
    );
}

/// A stream whose session went without this server closing it (a delete that
/// ran while the stream was opening; here the row is deleted behind the
/// server's back) is closed once the server finds the session gone, and a
/// live session's stream is left alone.
#[tokio::test]
async fn a_stream_of_a_session_gone_from_the_database_is_closed() {
    let server = spawn_app().await;
    let gone = server.create_session().await;
    let kept = server.create_session().await;
    let mut gone_events = common::events::Events::open(&server, &gone).await;
    let mut kept_events = common::events::Events::open(&server, &kept).await;
    server
        .execute_sql(format!("DELETE FROM sessions WHERE id = '{gone}'"))
        .await;
    gone_events
        .until_ended(std::time::Duration::from_secs(20))
        .await;
    server.create_definition("lore_lookup").await;
    let changed = kept_events
        .next_of("catalog_changed", std::time::Duration::from_secs(10))
        .await;
    assert_eq!(changed["added"], json!(["lore_lookup"]), "{changed}");
}

#[tokio::test]
async fn a_page_of_large_floors_ends_at_its_byte_bound_counting_their_pages() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    // Twelve floors of a 700 KB message and a 250 KB reply: eight fit the
    // 8 MiB bound (7.6 MB), a ninth would not (8.55 MB). Counting the
    // messages only, eleven would fit (7.7 MB).
    let reply = "r".repeat(250_000);
    for n in 1..=12 {
        let floor = floor(&server, &session, &format!("floor {n}")).await;
        let run = open_run(&server, &floor).await;
        close(&server, &run, "commit", json!({"content": reply})).await;
    }
    let big = if server.on_postgres() {
        "repeat('m', 700000)"
    } else {
        "replace(hex(zeroblob(350000)), '0', 'm')"
    };
    server
        .execute_sql(format!(
            "UPDATE floors SET user_content = {big} WHERE session_id = '{session}'"
        ))
        .await;

    let first = server
        .get(&format!("/sessions/{session}/floors?limit=200"))
        .await;
    assert_eq!(
        seqs(&first),
        (1..=8).collect::<Vec<_>>(),
        "{:?}",
        first.body["meta"]
    );
    assert_eq!(first.body["meta"]["has_more"], true);
    assert_eq!(first.body["meta"]["total"], 12);
    assert_eq!(first.body["data"][7]["pages"][0]["content"], reply.as_str());
    // The next offset is this one's plus the floors received.
    let rest = server
        .get(&format!("/sessions/{session}/floors?limit=200&offset=8"))
        .await;
    assert_eq!(seqs(&rest), [9, 10, 11, 12]);
    assert_eq!(rest.body["meta"]["has_more"], false);
}

/// A floor's message and a committed page hold at most 256 KiB: one byte
/// more is refused with the size and the bound, and a refused commit leaves
/// its run open.
#[tokio::test]
async fn a_floor_or_a_commit_past_256_kib_is_refused_and_the_run_stays_open() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let bound = 256 * 1024;
    let too_long = "y".repeat(bound + 1);
    let refused = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": too_long}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
    assert_eq!(refused.body["error"]["code"], "validation_error");
    assert_eq!(
        refused.body["error"]["message"],
        "content is 262145 bytes, more than a floor or page holds (262144 bytes)"
    );
    let floor_id = floor(&server, &session, &"y".repeat(bound)).await;
    let run = open_run(&server, &floor_id).await;
    let id = run["id"].as_str().unwrap();
    let commit = server
        .post(&format!("/runs/{id}/commit"), json!({"content": too_long}))
        .await;
    assert_eq!(commit.status, StatusCode::BAD_REQUEST, "{commit:?}");
    assert_eq!(
        commit.body["error"]["message"],
        "content is 262145 bytes, more than a floor or page holds (262144 bytes)"
    );
    assert_eq!(run_state(&server, &run).await, "open");
    close(
        &server,
        &run,
        "commit",
        json!({"content": "z".repeat(bound)}),
    )
    .await;
    let page = server.get(&format!("/floors/{floor_id}")).await;
    let pages = page.body["data"]["pages"].as_array().expect("pages");
    assert_eq!(pages.len(), 1, "{pages:?}");
    assert_eq!(pages[0]["content"].as_str().map(str::len), Some(bound));
}
