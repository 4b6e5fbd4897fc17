//! The generation loop through the real binary, against a scripted
//! OpenAI-compatible stand-in: text turns streamed as tokens, tool calls run
//! through the call path and answered in call order, permission refusals the
//! model reads, the step limit, retries, a provider that is down, and no
//! provider at all.

mod common;

use std::time::Duration;

use common::callbacks::HoldingCallbacks;
use common::events::Events;
use common::model::{
    Answer, StandIn, calls_answer, kinds, text_answer, turn, until_run_ends, with_model,
};
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn a_turn_without_tools_streams_its_tokens_in_order() {
    let stand_in = StandIn::start(vec![text_answer(&["Hel", "lo", ", wor", "ld"])]).await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "hi there").await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    assert!(
        started["floor_id"].is_string() && started["page_id"].is_string(),
        "{started}"
    );

    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen[0].0, "run_started", "{seen:?}");
    let tokens: String = seen
        .iter()
        .filter(|(kind, _)| kind == "token")
        .map(|(_, data)| data["text"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, "Hello, world");
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_finished");
    assert_eq!(data["content"], "Hello, world");
    assert!(
        seen.iter()
            .all(|(_, data)| data["run_id"] == run_id.as_str()),
        "{seen:?}"
    );

    let requests = stand_in.requests();
    assert_eq!(requests.len(), 1, "a default run makes one model request");
    assert_eq!(requests[0]["stream"], true);
    assert_eq!(requests[0]["model"], "stand-in");
    let messages = requests[0]["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], "hi there");
    assert!(
        requests[0]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );

    // The next floor commits the finished page; its text is the history.
    stand_in.repeat(text_answer(&["again"]));
    turn(&server, &session, "second").await;
    until_run_ends(&mut events).await;
    let floors = server.get(&format!("/sessions/{session}/floors")).await;
    let first = &floors.body["data"][0];
    assert_eq!(first["active_page_id"], started["page_id"], "{floors:?}");
    let second_request = &stand_in.requests()[1];
    let history = second_request["messages"].to_string();
    assert!(
        history.contains("Hello, world") && history.contains("hi there"),
        "{history}"
    );
}

#[tokio::test]
async fn tool_calls_run_through_the_call_path_and_answer_in_call_order() {
    let stand_in = StandIn::start(vec![
        calls_answer(&[
            ("call_a", "roll_dice", r#"{"sides": 6}"#),
            ("call_b", "get_time", "{}"),
            ("call_c", "random_choice", r#"{"options": ["x", "y"]}"#),
        ]),
        text_answer(&["done"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "roll").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");
    let kinds = kinds(&seen);
    assert_eq!(
        kinds.iter().filter(|k| **k == "tool_call_started").count(),
        3,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "tool_call_finished").count(),
        3,
        "{kinds:?}"
    );

    let requests = stand_in.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().unwrap();
    let tool_messages: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    let ids: Vec<&str> = tool_messages
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_a", "call_b", "call_c"], "results in call order");
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"], r#"{"sides": 6}"#,
        "arguments split across chunks are assembled"
    );

    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    let rows = rows.body["data"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in &rows {
        assert_eq!(row["run_id"], started["run_id"]);
        assert_eq!(row["floor_id"], started["floor_id"]);
        assert_eq!(row["page_id"], started["page_id"]);
        assert_eq!(row["caller_slot"], "narrator");
        assert_eq!(row["status"], "success", "{row}");
    }
}

/// The ids the tool messages of a request's last step answer, and the ids
/// the assistant message before them gave its calls.
fn last_step_ids(request: &Value) -> (Vec<String>, Vec<String>) {
    let messages = request["messages"].as_array().unwrap();
    let assistant = messages
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .unwrap();
    let called = messages[assistant]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|call| call["id"].as_str().unwrap().to_owned())
        .collect();
    let answered = messages[assistant + 1..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
        .collect();
    (called, answered)
}

/// Probe I: a page held whatever the model wrote (up to its 4 MiB answer),
/// so a floor of 100 pages read back as 400 MB.
#[tokio::test]
async fn a_reply_longer_than_a_page_holds_fails_the_run_and_stores_no_page() {
    let piece = "x".repeat(32 * 1024);
    let pieces = vec![piece.as_str(); 9];
    let stand_in = StandIn::start(vec![text_answer(&pieces)]).await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "tell me everything").await;
    let seen = until_run_ends(&mut events).await;
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_failed", "{:?}", kinds(&seen));
    let message = data["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "the model's reply is 294912 bytes, more than a floor or page holds (262144 bytes)"
        ),
        "{data}"
    );
    let run = server
        .get(&format!("/runs/{}", started["run_id"].as_str().unwrap()))
        .await;
    assert_eq!(run.body["data"]["state"], "discarded", "{run:?}");
    let floor = server
        .get(&format!(
            "/floors/{}",
            started["floor_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(floor.body["data"]["pages"], json!([]), "{floor:?}");
}

#[tokio::test]
async fn calls_that_share_an_id_are_answered_under_ids_of_their_own() {
    let json_call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "get_time", "arguments": "{}"}});
    let stand_in = StandIn::start(vec![
        calls_answer(&[
            ("same", "roll_dice", r#"{"sides": 6}"#),
            ("same", "get_time", "{}"),
        ]),
        Answer::Json(json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [json_call("again"), json_call("again"), json_call("")],
            }}],
        })),
        text_answer(&["done"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "roll").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");

    let requests = stand_in.requests();
    assert_eq!(requests.len(), 3);
    let (called, answered) = last_step_ids(&requests[1]);
    assert_eq!(
        called,
        ["same", "call_1"],
        "a streamed answer's repeated id"
    );
    assert_eq!(answered, called);
    let (called, answered) = last_step_ids(&requests[2]);
    assert_eq!(called, ["again", "call_1", "call_2"], "a whole answer's");
    assert_eq!(answered, called);
}

#[tokio::test]
async fn a_denied_tool_is_not_offered_and_its_refusal_reaches_the_model() {
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_1", "roll_dice", r#"{"sides": 6}"#)]),
        text_answer(&["ok"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["roll_dice"]}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "roll").await;
    until_run_ends(&mut events).await;
    let requests = stand_in.requests();
    let offered = requests[0]["tools"].to_string();
    assert!(
        !offered.contains("roll_dice"),
        "the denied tool is offered: {offered}"
    );
    let tool_message = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    let content = tool_message["content"].as_str().unwrap();
    assert!(content.contains("denied"), "{content}");
}

#[tokio::test]
async fn the_step_limit_ends_a_model_that_calls_tools_forever() {
    let stand_in = StandIn::start(Vec::new()).await;
    stand_in.repeat(calls_answer(&[("call_x", "get_time", "{}")]));
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"max_steps_per_generation": 2}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "loop").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");
    let requests = stand_in.requests();
    assert_eq!(
        requests.len(),
        3,
        "N answers with calls, then one without tools"
    );
    assert!(
        requests[2].get("tools").is_none_or(Value::is_null),
        "{}",
        requests[2]
    );
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(
        rows.body["meta"]["total"], 2,
        "the last answer's calls are not run"
    );
}

#[tokio::test]
async fn a_429_is_retried_and_a_provider_that_stays_down_fails_the_run_cleanly() {
    let stand_in = StandIn::start(vec![
        Answer::Status(429, Some(0), "slow down".into()),
        text_answer(&["after the wait"]),
    ])
    .await;
    let mut server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "hello").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(
        seen.last().unwrap().1["content"],
        "after the wait",
        "{seen:?}"
    );

    stand_in.repeat(Answer::Status(503, None, "the model is down".into()));
    turn(&server, &session, "again").await;
    let seen = until_run_ends(&mut events).await;
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_failed", "{seen:?}");
    assert_eq!(data["error"]["status"], 503, "{data}");
    assert!(
        data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the model is down"),
        "{data}"
    );
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
    // Stopped first: every line it logged is then written.
    assert!(server.stop().await.success());
    let log = std::fs::read_to_string(server.data_dir.join("..").join("server.log")).unwrap();
    assert!(
        !log.contains("sk-test-stand-in-key"),
        "the API key is in the log"
    );
}

/// A model's U+0000 is kept as U+FFFD in its reply and its calls' names and
/// ids (PostgreSQL cannot store it: the reply was lost and the run stayed
/// generating for ever, the calls had no journal row), and a tool name over
/// 256 bytes is cut to 256.
#[tokio::test]
async fn a_models_nul_characters_and_endless_names_are_stored_as_safe_text() {
    let long_name = "n".repeat(3000);
    let stand_in = StandIn::start(vec![
        calls_answer(&[
            ("call\u{0}a", "get_time\u{0}", "{}"),
            ("call_b", &long_name, "{}"),
        ]),
        text_answer(&["nul\u{0}text"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "go").await;
    let seen = until_run_ends(&mut events).await;
    let (kind, data) = seen.last().unwrap();
    assert_eq!(kind, "run_finished", "{seen:?}");
    assert_eq!(data["content"], "nul\u{FFFD}text");
    let run_id = started["run_id"].as_str().unwrap();
    // Its generation ended: a client may close it.
    let committed = server
        .post(&format!("/runs/{run_id}/commit"), json!({}))
        .await;
    assert_eq!(committed.status, StatusCode::OK, "{committed:?}");
    let floor = server
        .get(&format!(
            "/floors/{}",
            started["floor_id"].as_str().unwrap()
        ))
        .await;
    let page = &floor.body["data"]["pages"][0];
    assert_eq!(page["content"], "nul\u{FFFD}text", "{floor:?}");
    let rows = server
        .get(&format!(
            "/tool-executions?session_id={session}&sort_order=asc"
        ))
        .await;
    let mut names: Vec<&str> = rows.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["tool_name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["get_time\u{FFFD}", &long_name[..256]], "{rows:?}");
}

/// The history a turn sends keeps the newest committed turns within 6 MiB:
/// every turn kept whole would grow every later request past the model
/// request's 16 MiB cap and fail every turn of the session. Twenty turns of
/// a 200 KB message and a 200 KB reply (pages hold at most 256 KiB) are 8 MB.
#[tokio::test]
async fn the_history_sent_keeps_the_newest_turns_within_its_budget() {
    const TURNS: usize = 20;
    let reply = |n: usize| format!("reply{n}:{}", "r".repeat(200_000));
    let stand_in = StandIn::start((0..TURNS).map(|n| text_answer(&[&reply(n)])).collect()).await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    for n in 0..TURNS {
        let message = format!("turn {n}:{}", "t".repeat(200_000));
        turn(&server, &session, &message).await;
        let seen = until_run_ends(&mut events).await;
        assert_eq!(seen.last().unwrap().0, "run_finished", "turn {n}");
    }
    let requests = stand_in.requests();
    let last = requests.last().unwrap().to_string();
    assert!(last.len() < 7 * 1024 * 1024, "{} bytes", last.len());
    // The newest committed turns fit whole, the oldest do not.
    let sent: Vec<(bool, bool)> = (0..TURNS - 1)
        .map(|n| {
            (
                last.contains(&format!("turn {n}:")),
                last.contains(&format!("reply{n}:")),
            )
        })
        .collect();
    let first_kept = sent.iter().position(|&(turn, _)| turn).unwrap();
    assert!(first_kept > 0, "every turn was sent: {sent:?}");
    assert!(
        sent[first_kept..] == vec![(true, true); sent.len() - first_kept][..]
            && sent[..first_kept].iter().all(|&(_, reply)| !reply),
        "the newest turns are kept whole and the older left out: {sent:?}"
    );
    assert!(TURNS - 1 - first_kept >= 10, "{sent:?}");
    assert!(last.contains(&format!("turn {}:", TURNS - 1)));
}

/// A long session's history reaches the model whole and in order: every
/// committed turn within the budget, oldest first (300 turns; a history read
/// in chunks of 256 turns repeated or lost a row at their boundary).
#[tokio::test]
async fn a_long_sessions_history_reaches_the_model_whole_and_in_order() {
    const TURNS: usize = 300;
    let stand_in = StandIn::start(Vec::new()).await;
    stand_in.repeat(text_answer(&["ok"]));
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    for n in 0..TURNS {
        turn(&server, &session, &format!("turn {n}")).await;
        let seen = until_run_ends(&mut events).await;
        assert_eq!(seen.last().unwrap().0, "run_finished", "turn {n}");
    }
    let requests = stand_in.requests();
    let users: Vec<String> = requests.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "user")
        .map(|message| message["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    let expected: Vec<String> = (0..TURNS).map(|n| format!("turn {n}")).collect();
    assert_eq!(users, expected);
}

#[tokio::test]
async fn without_a_model_the_floor_is_stored_with_run_null() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hello"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(reply.body["data"]["run"], Value::Null);
    assert_eq!(
        reply.body["data"]["run_error"]["code"],
        "model_not_configured"
    );
    assert_eq!(reply.body["data"]["content"], "hello");
    let floors = server.get(&format!("/sessions/{session}/floors")).await;
    assert_eq!(floors.body["data"].as_array().unwrap().len(), 1);
    // A regeneration of the floor is refused 503: a state to wait out, logged as
    // a warning, not as the server's failure.
    let floor = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let run = server
        .post(&format!("/floors/{floor}/regenerate"), json!({}))
        .await;
    assert_eq!(run.status, StatusCode::SERVICE_UNAVAILABLE, "{run:?}");
    assert_eq!(run.code(), "model_not_configured", "{run:?}");
    let log = server.log_containing("service unavailable").await;
    let line = log
        .lines()
        .find(|line| line.contains("service unavailable"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(!log.contains("response failed"), "{log}");
}

#[tokio::test]
async fn a_tool_registered_during_a_run_is_offered_in_its_next_request() {
    let hold = HoldingCallbacks::start().await;
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_1", "slow_tool", "{}")]),
        text_answer(&["done"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    common::register_remote(
        &server,
        json!({"name": "slow_tool", "callback_url": hold.url(), "timeout_seconds": 30, "side_effect_level": "none"}),
    )
    .await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "go").await;
    hold.wait_hits(1).await;
    common::register_remote(
        &server,
        json!({"name": "fresh_tool", "callback_url": hold.url(), "timeout_seconds": 30}),
    )
    .await;
    hold.release();
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");
    let requests = stand_in.requests();
    assert!(!requests[0]["tools"].to_string().contains("fresh_tool"));
    assert!(
        requests[1]["tools"].to_string().contains("fresh_tool"),
        "{}",
        requests[1]["tools"]
    );
}

#[tokio::test]
async fn cancel_stops_the_run_between_steps_and_the_started_call_is_journalled() {
    let hold = HoldingCallbacks::start().await;
    let stand_in = StandIn::start(vec![calls_answer(&[("call_1", "slow_tool", "{}")])]).await;
    stand_in.repeat(text_answer(&["never asked"]));
    let server = with_model(&stand_in).await;
    common::register_remote(
        &server,
        json!({"name": "slow_tool", "callback_url": hold.url(), "timeout_seconds": 30, "side_effect_level": "none"}),
    )
    .await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "go").await;
    let run_id = started["run_id"].as_str().unwrap();
    hold.wait_hits(1).await;
    let cancelled = server
        .post(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["data"]["cancelled"], true);
    hold.release();
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_failed", "{seen:?}");
    assert_eq!(
        stand_in.requests().len(),
        1,
        "no model request after the cancel"
    );
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    let row = &rows.body["data"][0];
    assert_eq!(
        row["status"], "success",
        "the started call finished: {rows:?}"
    );
    assert_eq!(
        row["commit_outcome"], "discarded",
        "with its cancelled run: {rows:?}"
    );
}

#[tokio::test]
async fn regenerate_makes_a_new_page_and_selecting_one_commits_it() {
    let stand_in = StandIn::start(vec![text_answer(&["first"]), text_answer(&["second"])]).await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let first = turn(&server, &session, "hello").await;
    until_run_ends(&mut events).await;
    let floor_id = first["floor_id"].as_str().unwrap();
    let again = server
        .post(&format!("/floors/{floor_id}/regenerate"), json!({}))
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:?}");
    assert_eq!(again.body["data"]["floor_id"], floor_id);
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().1["content"], "second", "{seen:?}");
    let floor = server.get(&format!("/floors/{floor_id}")).await;
    let pages: Vec<&str> = floor.body["data"]["pages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["content"].as_str().unwrap())
        .collect();
    assert_eq!(pages, ["first", "second"], "earlier pages keep their text");

    let page = first["page_id"].as_str().unwrap();
    let selected = server
        .post(&format!("/pages/{page}/select"), json!({}))
        .await;
    assert_eq!(selected.status, StatusCode::OK, "{selected:?}");
    assert_eq!(selected.body["data"]["state"], "committed");
    let second_run = again.body["data"]["run_id"].as_str().unwrap();
    let other = server.get(&format!("/runs/{second_run}")).await;
    assert_eq!(other.body["data"]["state"], "discarded", "{other:?}");
    let floor = server.get(&format!("/floors/{floor_id}")).await;
    assert_eq!(floor.body["data"]["active_page_id"], page);
}

#[tokio::test]
async fn regenerate_asks_to_confirm_an_irreversible_call_before_repeating_it() {
    let hold = HoldingCallbacks::start().await;
    hold.release();
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_1", "send_gift", r#"{"to": "ann"}"#)]),
        text_answer(&["sent"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    common::register_remote(
        &server,
        json!({"name": "send_gift", "callback_url": hold.url(), "timeout_seconds": 30, "side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"allow_irreversible": true}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let mut events = Events::open(&server, &session).await;
    let first = turn(&server, &session, "send it").await;
    until_run_ends(&mut events).await;
    assert_eq!(hold.hits(), 1);
    let floor_id = first["floor_id"].as_str().unwrap();
    let refused = server
        .post(&format!("/floors/{floor_id}/regenerate"), json!({}))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(refused.code(), "tool_replay_confirmation_required");
    let ids: Vec<String> = refused.body["error"]["blocking_executions"]
        .as_array()
        .or_else(|| refused.body["blocking_executions"].as_array())
        .expect("the blocking executions are named")
        .iter()
        .map(|e| {
            e["id"]
                .as_str()
                .or(e["execution_id"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(!ids.is_empty());
    assert_eq!(hold.hits(), 1, "nothing ran without confirmation");
    stand_in.repeat(text_answer(&["no gift this time"]));
    let confirmed = server
        .post(
            &format!("/floors/{floor_id}/regenerate"),
            json!({"confirmed_execution_ids": ids}),
        )
        .await;
    assert_eq!(confirmed.status, StatusCode::ACCEPTED, "{confirmed:?}");
    until_run_ends(&mut events).await;
    assert_eq!(hold.hits(), 1, "the irreversible callback ran exactly once");
}

#[tokio::test]
async fn parallel_calls_answer_in_call_order_while_the_slowest_finishes_last() {
    use axum::routing::post;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/delay",
        post(|axum::Json(body): axum::Json<Value>| async move {
            let ms = body["arguments"]["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            axum::Json(json!({"output": format!("waited {ms}"), "is_error": false}))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let stand_in = StandIn::start(vec![
        calls_answer(&[
            ("slow", "wait_for", r#"{"ms": 600}"#),
            ("fast", "wait_for", r#"{"ms": 1}"#),
            ("middle", "wait_for", r#"{"ms": 200}"#),
        ]),
        text_answer(&["all done"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    common::register_remote(
        &server,
        json!({"name": "wait_for", "callback_url": format!("{base}/delay"), "timeout_seconds": 30, "side_effect_level": "none",
               "parameters": {"type": "object", "properties": {"ms": {"type": "integer"}}}}),
    )
    .await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "wait").await;
    let seen = until_run_ends(&mut events).await;
    let finished: Vec<&str> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_finished")
        .map(|(_, data)| data["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        finished,
        ["fast", "middle", "slow"],
        "the calls ran concurrently"
    );
    let request = &stand_in.requests()[1];
    let tool_messages: Vec<(String, String)> = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        tool_messages,
        [
            ("slow".to_owned(), "waited 600".to_owned()),
            ("fast".to_owned(), "waited 1".to_owned()),
            ("middle".to_owned(), "waited 200".to_owned()),
        ],
        "results go back in call order"
    );
}

#[tokio::test]
async fn an_endpoint_that_does_not_stream_answers_in_one_piece() {
    let stand_in = StandIn::start(vec![Answer::Json(json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"}, "finish_reason": "stop"}],
    }))])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "hi").await;
    let seen = until_run_ends(&mut events).await;
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_finished", "{seen:?}");
    assert_eq!(data["content"], "whole answer");
    assert!(
        seen.iter()
            .any(|(kind, data)| kind == "token" && data["text"] == "whole answer")
    );
}

#[tokio::test]
async fn a_character_brings_its_own_model_temperature_and_system_prompt() {
    let stand_in = StandIn::start(vec![text_answer(&["aye"])]).await;
    let server = with_model(&stand_in).await;
    let created = server
        .post(
            "/characters",
            json!({"name": "Pirate", "persona": "a pirate", "model": "pirate-model", "temperature": 0.3, "system_prompt": "Talk like a pirate."}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["data"]["model"], "pirate-model");
    let bad = server
        .patch("/characters/Pirate", json!({"temperature": 7}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    assert!(
        bad.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("temperature")
    );
    let session = server
        .post("/sessions", json!({"character": "Pirate"}))
        .await;
    let session = session.body["data"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "ahoy").await;
    until_run_ends(&mut events).await;
    let request = &stand_in.requests()[0];
    assert_eq!(request["model"], "pirate-model");
    assert_eq!(request["temperature"], 0.3);
    assert_eq!(
        request["messages"][0],
        json!({"role": "system", "content": "Talk like a pirate."})
    );

    let reset = server
        .patch(
            "/characters/Pirate",
            json!({"model": null, "system_prompt": null}),
        )
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{reset:?}");
    assert_eq!(reset.body["data"]["model"], Value::Null);
    assert_eq!(reset.body["data"]["temperature"], 0.3);
}

#[tokio::test]
async fn a_deferred_result_delivered_after_the_commit_reaches_the_model_in_the_next_turn() {
    let hold = HoldingCallbacks::start().await;
    hold.release();
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_later", "later_tool", r#"{"n": 1}"#)]),
        text_answer(&["it is queued"]),
    ])
    .await;
    stand_in.repeat(text_answer(&["thanks"]));
    let server = with_model(&stand_in).await;
    register_deferred(&server, "later_tool", &hold.url()).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "start it").await;
    until_run_ends(&mut events).await;
    // The next floor commits the run; its staged job is released and delivers.
    turn(&server, &session, "anything new?").await;
    until_run_ends(&mut events).await;
    let server_ref = &server;
    let session_ref = &session;
    common::wait_until(
        Duration::from_secs(20),
        "the deferred result",
        || async move {
            let results = server_ref
                .get(&format!("/sessions/{session_ref}/tool-results"))
                .await;
            results.body["data"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
        },
    )
    .await;
    turn(&server, &session, "and now?").await;
    until_run_ends(&mut events).await;
    turn(&server, &session, "once more").await;
    until_run_ends(&mut events).await;
    let requests = stand_in.requests();
    let given = |request: &Value| {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                m["role"] == "tool"
                    && m["tool_call_id"] == "call_later"
                    && m["content"] == "held result"
            })
            .count()
    };
    // It is delivered while or after the second turn runs, so the first
    // request built after its delivery carries it: exactly once over the
    // later requests, and never in the last one.
    assert_eq!(requests.len(), 5);
    let total: usize = requests[2..].iter().map(given).sum();
    assert_eq!(total, 1, "given exactly once: {requests:#?}");
    assert_eq!(given(&requests[4]), 0, "not again in a later turn");
    // The result follows the call it answers, with that call's arguments
    // read back from the journal.
    let carried = requests[2..]
        .iter()
        .find(|request| given(request) == 1)
        .unwrap();
    let messages = carried["messages"].as_array().unwrap();
    let at = messages
        .iter()
        .position(|m| m["role"] == "tool" && m["tool_call_id"] == "call_later")
        .unwrap();
    let call = &messages[at - 1]["tool_calls"][0];
    assert_eq!(call["id"], "call_later", "{call}");
    assert_eq!(call["function"]["name"], "later_tool", "{call}");
    assert_eq!(call["function"]["arguments"], r#"{"n":1}"#, "{call}");
}

/// A backlog of delivered results is given to the model 32 a turn, oldest
/// first, each once; `GET /sessions/{id}/tool-results` pages them.
#[tokio::test]
async fn a_backlog_of_deferred_results_is_given_a_bounded_number_a_turn() {
    let hold = HoldingCallbacks::start().await;
    hold.release();
    let stand_in = StandIn::start(vec![]).await;
    stand_in.repeat(text_answer(&["noted"]));
    let server = with_model(&stand_in).await;
    register_deferred(&server, "later_tool", &hold.url()).await;
    let session = server.create_session().await;
    // Outside a run each deferred call is queued at once, and delivers.
    for n in 0..40 {
        let called = server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": "later_tool", "arguments": {"n": n}, "call_id": format!("call_{n:02}")}),
            )
            .await;
        assert_eq!(called.status, StatusCode::OK, "{called:?}");
    }
    let every = tool_results_pages(&server, &session).await;

    let mut events = Events::open(&server, &session).await;
    for content in ["one", "two", "three"] {
        turn(&server, &session, content).await;
        until_run_ends(&mut events).await;
    }
    let given = |request: &Value| -> Vec<String> {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let requests = stand_in.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    assert_eq!(given(&requests[0]), every[..32].to_vec());
    assert_eq!(given(&requests[1]), every[32..].to_vec());
    assert!(given(&requests[2]).is_empty(), "{:#?}", requests[2]);
}

/// A page of delivered results ends early once its outputs pass 8 MiB,
/// says there is more, and the next offset goes on from there.
#[tokio::test]
async fn a_page_of_large_delivered_results_ends_early() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/big",
        axum::routing::post(|| async {
            axum::Json(json!({"output": "x".repeat(1_000_000), "is_error": false}))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let server = spawn_app().await;
    register_deferred(&server, "big_tool", &format!("{base}/big")).await;
    let session = server.create_session().await;
    for n in 0..12 {
        let called = server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": "big_tool", "arguments": {"n": n}}),
            )
            .await;
        assert_eq!(called.status, StatusCode::OK, "{called:?}");
    }
    let page = |offset: usize| {
        let server = &server;
        let session = &session;
        async move {
            server
                .get(&format!("/sessions/{session}/tool-results?offset={offset}"))
                .await
                .body
        }
    };
    common::wait_until(Duration::from_secs(30), "12 deliveries", || async {
        page(0).await["meta"]["total"] == 12
    })
    .await;
    let first = page(0).await;
    let held = first["data"].as_array().unwrap().len();
    assert_eq!(held, 8, "8 outputs of 1,000,002 bytes fit 8 MiB");
    assert_eq!(first["meta"]["has_more"], true, "{}", first["meta"]);
    let rest = page(held).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 4);
    assert_eq!(rest["meta"]["has_more"], false, "{}", rest["meta"]);
}

/// Registers a remote tool whose calls run as deferred jobs, answered at
/// `callback_url`.
async fn register_deferred(server: &TestServer, name: &str, callback_url: &str) {
    common::register_remote(
        server,
        json!({"name": name, "callback_url": callback_url, "timeout_seconds": 30,
               "side_effect_level": "none", "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
}

/// Checks `GET /sessions/{id}/tool-results`' pages over the session's 40
/// delivered results, once all are there; answers their call ids in
/// delivery order.
async fn tool_results_pages(server: &TestServer, session: &str) -> Vec<String> {
    let results = |query: &'static str| async move {
        let page = server
            .get(&format!("/sessions/{session}/tool-results{query}"))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{page:?}");
        page.body
    };
    common::wait_until(Duration::from_secs(30), "40 deliveries", || async {
        results("").await["meta"]["total"] == 40
    })
    .await;
    let call_ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["call_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = results("?limit=15").await;
    let last = results("?limit=15&offset=30").await;
    let newest = results("?limit=5&sort_order=desc").await;
    assert_eq!(call_ids(&first).len(), 15);
    assert_eq!(call_ids(&last).len(), 10);
    assert_eq!(last["meta"]["total"], 40, "{last}");
    let every = call_ids(&results("?limit=200").await);
    assert_eq!(every.len(), 40);
    assert_eq!(
        call_ids(&newest),
        every[35..].iter().rev().cloned().collect::<Vec<_>>()
    );
    assert_eq!(call_ids(&first), every[..15].to_vec());
    for bad in ["?limit=0", "?limit=201", "?offset=-1", "?sort_by=tool_name"] {
        let refused = server
            .get(&format!("/sessions/{session}/tool-results{bad}"))
            .await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {refused:?}"
        );
    }

    every
}

#[tokio::test]
async fn cancel_and_shutdown_stop_a_model_request_in_flight() {
    // The first answer never comes (the model's idle timeout is 120 s).
    let stand_in = StandIn::start(vec![Answer::Hang, text_answer(&["after"])]).await;
    let mut server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "go").await;
    let run_id = started["run_id"].as_str().unwrap();
    common::wait_until(Duration::from_secs(10), "the model request", || {
        let asked = stand_in.requests().len();
        async move { asked == 1 }
    })
    .await;
    // While it generates, the run can be neither committed nor discarded.
    for change in ["commit", "discard"] {
        let refused = server
            .post(&format!("/runs/{run_id}/{change}"), json!({}))
            .await;
        assert_eq!(
            refused.status,
            StatusCode::CONFLICT,
            "{change}: {refused:?}"
        );
        assert_eq!(refused.code(), "generation_in_progress", "{change}");
    }
    let cancelled = server
        .post(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    let seen = until_run_ends(&mut events).await;
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_failed", "{seen:?}");
    assert!(data.to_string().contains("cancelled"), "{data}");
    // The failed run was discarded with it; no longer generating.
    let discarded = server
        .post(&format!("/runs/{run_id}/discard"), json!({}))
        .await;
    assert_eq!(discarded.code(), "run_not_open", "{discarded:?}");
    // The session is free again, and the cancelled request was not retried.
    turn(&server, &session, "again").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");
    assert_eq!(stand_in.requests().len(), 2);

    // A shutdown does not wait for a model that never answers.
    stand_in.repeat(Answer::Hang);
    turn(&server, &session, "once more").await;
    common::wait_until(Duration::from_secs(10), "the third model request", || {
        let asked = stand_in.requests().len();
        async move { asked == 3 }
    })
    .await;
    server.terminate();
    let status = server
        .wait_exit(Duration::from_secs(60))
        .await
        .expect("the server waited for the model at shutdown");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn deleting_a_session_stops_its_generation() {
    let stand_in = StandIn::start(Vec::new()).await;
    stand_in.repeat(Answer::Hang);
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    turn(&server, &session, "go").await;
    stand_in.wait_for_requests(1).await;
    let deleted = server.delete(&format!("/sessions/{session}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    // The model request in flight is dropped, not left to its own timeout.
    stand_in.wait_for_abandoned(1).await;
    assert_eq!(stand_in.requests().len(), 1, "no step after the delete");
}

#[tokio::test]
async fn an_event_stream_that_falls_behind_skips_tokens_but_gets_the_runs_end() {
    // Many small deltas: more token events than the stream's queue and the
    // kernel's socket buffers together hold (about 14 MB of events).
    let mut chunks: Vec<Value> = (0..90_000)
        .map(|i| json!({"choices": [{"index": 0, "delta": {"content": format!("{}", i % 10)}}]}))
        .collect();
    chunks.push(common::model::finish("stop"));
    let stand_in = StandIn::start(vec![Answer::Stream(chunks)]).await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    // A subscriber that reads nothing yet. (Its receive buffer keeps the
    // kernel's default: one shrunk to 4 KB, far under loopback's 64 KB
    // segment, made the sender wait on zero-window probes whose backoff
    // grows with the stall, past this test's 30 s on a loaded CI machine.)
    let mut stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stalled
        .write_all(
            format!(
                "GET /sessions/{session}/events HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
                 accept: text/event-stream\r\n\r\n",
                server.addr, server.token
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 64];
    let n = stalled.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    // A subscriber that reads, as fast as this test's client can.
    let mut reading = Events::open(&server, &session).await;
    turn(&server, &session, "talk a lot").await;
    let seen = until_run_ends(&mut reading).await;
    assert_eq!(kinds(&seen).last(), Some(&"run_finished"));
    let text = seen.last().unwrap().1["content"].as_str().unwrap().len();
    assert_eq!(text, 90_000, "run_finished carries the whole text");
    // The stalled one, read now, has the run's end too (tokens were left
    // out for it, not the events that say what happened).
    const MARK: &[u8] = b"event: run_finished";
    let mut read = Vec::new();
    let mut buffer = vec![0u8; 65536];
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let n = stalled.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the stalled stream ended without the run's end");
            // Only the new bytes (and a name's length before them) are
            // searched: scanning all that was read at every read is
            // quadratic in the megabytes the kernel buffered, and took over
            // 30 s in a debug build on a loaded 2-core CI machine.
            let from = read.len().saturating_sub(MARK.len() - 1);
            read.extend_from_slice(&buffer[..n]);
            if read[from..].windows(MARK.len()).any(|w| w == MARK) {
                return;
            }
        }
    })
    .await;
    if found.is_err() {
        let log = std::fs::read_to_string(server.data_dir.join("..").join("server.log"));
        let warnings: Vec<String> = log
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("WARN") || line.contains("ERROR"))
            .map(str::to_owned)
            .collect();
        panic!(
            "the stalled stream never got run_finished ({} bytes read, ending {:?}; the server warned {warnings:#?})",
            read.len(),
            String::from_utf8_lossy(&read[read.len().saturating_sub(400)..])
        );
    }
    let tokens = memchr::memmem::find_iter(&read, b"event: token").count();
    assert!(
        tokens < 90_000,
        "no token was left out: the stream never fell behind"
    );
}

#[tokio::test]
async fn a_turn_whose_conversation_outgrows_the_request_limit_fails_instead_of_growing() {
    // Every step answers with one call whose arguments are near the answer
    // limit (4 MiB): the conversation resent at each step passes 16 MiB at
    // the sixth request.
    let arguments = json!({"x": "a".repeat(3_600_000)}).to_string();
    let stand_in = StandIn::start(Vec::new()).await;
    stand_in.repeat(Answer::Stream(vec![
        common::model::tool_chunk(0, Some(("call_big", "no_such_tool")), &arguments),
        common::model::finish("tool_calls"),
    ]));
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "go").await;
    let seen = until_run_ends(&mut events).await;
    let (kind, data) = seen.last().unwrap();
    assert_eq!(kind, "run_failed", "{data}");
    let error = data.to_string();
    assert!(error.contains("was not sent"), "{error:.500}");
    assert_eq!(stand_in.requests().len(), 5, "the sixth request was sent");
    // The session generates again.
    stand_in.repeat(text_answer(&["fine"]));
    turn(&server, &session, "again").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(kinds(&seen).last(), Some(&"run_finished"));
}

#[tokio::test]
async fn regenerating_an_earlier_floor_leaves_the_later_floors_reply_in_the_history() {
    let stand_in = StandIn::start(vec![
        text_answer(&["R1"]),
        text_answer(&["R2"]),
        text_answer(&["R1-bis"]),
        text_answer(&["R3"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let first = turn(&server, &session, "U1").await;
    until_run_ends(&mut events).await;
    let second = turn(&server, &session, "U2").await;
    until_run_ends(&mut events).await;
    // U2's reply is finished, not yet committed, when U1 is regenerated.
    let floor_one = first["floor_id"].as_str().unwrap();
    let again = server
        .post(&format!("/floors/{floor_one}/regenerate"), json!({}))
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:?}");
    until_run_ends(&mut events).await;
    turn(&server, &session, "U3").await;
    until_run_ends(&mut events).await;
    // The next floor accepted both: U1's new reply and U2's.
    let floor_two = server
        .get(&format!("/floors/{}", second["floor_id"].as_str().unwrap()))
        .await;
    assert_eq!(
        floor_two.body["data"]["active_page_id"], second["page_id"],
        "{floor_two:?}"
    );
    let floor_one = server.get(&format!("/floors/{floor_one}")).await;
    assert_eq!(
        floor_one.body["data"]["active_page_id"], again.body["data"]["page_id"],
        "{floor_one:?}"
    );
    let u3_request = &stand_in.requests()[3];
    let contents: Vec<&str> = u3_request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|message| message["content"].as_str())
        .collect();
    let history: Vec<&str> = contents
        .iter()
        .copied()
        .filter(|text| ["U1", "R1", "R1-bis", "U2", "R2", "U3"].contains(text))
        .collect();
    assert_eq!(history, ["U1", "R1-bis", "U2", "R2", "U3"], "{contents:?}");
}
