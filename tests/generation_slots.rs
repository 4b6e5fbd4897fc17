//! The generation loop's optional slots through the real binary, against a
//! scripted stand-in: the director's notes reach the narrator, the verifier
//! rejects once and the narrator tries again, the memory slot's facts land in
//! the session's memory only when the run is committed; plus what must hold
//! across restarts and concurrent floors.

mod common;

use std::time::Duration;

use common::events::Events;
use common::model::{Answer, StandIn, calls_answer, text_answer, turn, until_run_ends, with_model};
use common::{SpawnOptions, TestServer, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A session of a new character with `slots` enabled.
async fn session_with_slots(server: &TestServer, name: &str, slots: Value) -> String {
    let created = server
        .post(
            "/characters",
            json!({"name": name, "persona": "a tea-loving cat", "slots": slots}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let session = server.post("/sessions", json!({"character": name})).await;
    session.body["data"]["id"].as_str().unwrap().to_owned()
}

fn tool_names(request: &Value) -> Vec<String> {
    let mut names: Vec<String> = request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn system_text(request: &Value) -> String {
    request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn memories(server: &TestServer, session: &str) -> Vec<String> {
    let listed = server.get(&format!("/sessions/{session}/memories")).await;
    assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
    listed.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn director_verifier_and_memory_slots_run_in_order_with_their_own_tools() {
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_d", "get_time", "{}")]),
        text_answer(&["Be warm and offer tea."]),
        text_answer(&["Hi."]),
        text_answer(&["REJECT: too curt for a friendly cat"]),
        text_answer(&["Hello, friend! Some tea?"]),
        text_answer(&["- The user was offered tea\nNONE"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = session_with_slots(
        &server,
        "Mio",
        json!(["memory", "verifier", "director", "director"]),
    )
    .await;
    let character = server.get("/characters/Mio").await;
    assert_eq!(
        character.body["data"]["slots"],
        json!(["narrator", "director", "verifier", "memory"]),
        "{character:?}"
    );
    let permissions = server
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_allow_list": {"director": ["get_time"], "verifier": ["roll_dice"], "memory": ["query_memory"]}}),
        )
        .await;
    assert_eq!(permissions.status, StatusCode::OK, "{permissions:?}");
    let mut events = Events::open(&server, &session).await;
    let started = turn(&server, &session, "hello").await;
    let seen = until_run_ends(&mut events).await;
    let (last, data) = seen.last().unwrap();
    assert_eq!(last, "run_finished", "{seen:?}");
    assert_eq!(data["content"], "Hello, friend! Some tea?");
    let rejected = seen.iter().find(|(kind, _)| kind == "reply_rejected");
    assert_eq!(
        rejected.map(|(_, d)| d["reason"].clone()),
        Some(json!("too curt for a friendly cat")),
        "{seen:?}"
    );
    let tokens: String = seen
        .iter()
        .filter(|(kind, _)| kind == "token")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        tokens, "Hi.Hello, friend! Some tea?",
        "only the narrator streams"
    );

    let requests = stand_in.requests();
    assert_eq!(requests.len(), 6, "{requests:#?}");
    // Director: its prompt, only its tools; its call journalled as director.
    assert!(system_text(&requests[0]).starts_with("You are the director"));
    assert!(system_text(&requests[0]).contains("a tea-loving cat"));
    assert_eq!(tool_names(&requests[0]), ["get_time"]);
    // Narrator: the director's notes, then the narrator's tools.
    let narrator = requests[2]["messages"].to_string();
    assert!(narrator.contains("Be warm and offer tea."), "{narrator}");
    assert_eq!(system_text(&requests[2]), "a tea-loving cat");
    assert!(tool_names(&requests[2]).contains(&"roll_dice".to_owned()));
    assert!(!tool_names(&requests[2]).is_empty());
    // Verifier: its prompt and the candidate reply; only its tools.
    assert!(system_text(&requests[3]).starts_with("You check"));
    assert!(requests[3]["messages"].to_string().contains("\"Hi.\""));
    assert_eq!(tool_names(&requests[3]), ["roll_dice"]);
    // The retry is told why.
    let retry = requests[4]["messages"].to_string();
    assert!(retry.contains("too curt for a friendly cat"), "{retry}");
    // Memory: after the final reply, with its own tools.
    assert!(system_text(&requests[5]).starts_with("You keep the long-term memory"));
    assert!(
        requests[5]["messages"]
            .to_string()
            .contains("Hello, friend! Some tea?")
    );
    assert_eq!(tool_names(&requests[5]), ["query_memory"]);

    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    let row = &rows.body["data"][0];
    assert_eq!(row["tool_name"], "get_time", "{rows:?}");
    assert_eq!(row["caller_slot"], "director");
    assert_eq!(row["run_id"], started["run_id"]);

    // The memory lands only with the commit, and query_memory finds it.
    assert!(
        memories(&server, &session).await.is_empty(),
        "not before the commit"
    );
    let run_id = started["run_id"].as_str().unwrap();
    let committed = server
        .post(&format!("/runs/{run_id}/commit"), json!({}))
        .await;
    assert_eq!(committed.status, StatusCode::OK, "{committed:?}");
    assert_eq!(
        memories(&server, &session).await,
        ["The user was offered tea"]
    );
    let found = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "query_memory", "arguments": {"query": "tea"}, "call_id": "q1"}),
        )
        .await;
    assert!(
        found.body.to_string().contains("The user was offered tea"),
        "{found:?}"
    );
}

#[tokio::test]
async fn a_swiped_away_page_leaves_no_memory_behind() {
    let stand_in = StandIn::start(vec![
        text_answer(&["first reply"]),
        text_answer(&["fact from the first page"]),
        text_answer(&["second reply"]),
        text_answer(&["fact from the second page"]),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = session_with_slots(&server, "Swiper", json!(["memory"])).await;
    let mut events = Events::open(&server, &session).await;
    let first = turn(&server, &session, "tell me").await;
    until_run_ends(&mut events).await;
    let floor_id = first["floor_id"].as_str().unwrap();
    let again = server
        .post(&format!("/floors/{floor_id}/regenerate"), json!({}))
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{again:?}");
    until_run_ends(&mut events).await;
    let page = again.body["data"]["page_id"].as_str().unwrap();
    let selected = server
        .post(&format!("/pages/{page}/select"), json!({}))
        .await;
    assert_eq!(selected.status, StatusCode::OK, "{selected:?}");
    assert_eq!(
        memories(&server, &session).await,
        ["fact from the second page"]
    );
    assert_eq!(
        stand_in.requests().len(),
        4,
        "no director or verifier request"
    );
}

#[tokio::test]
async fn a_failing_memory_slot_leaves_the_reply_standing() {
    let stand_in = StandIn::start(vec![
        text_answer(&["the reply"]),
        Answer::Status(400, None, "memory model refused".into()),
    ])
    .await;
    let server = with_model(&stand_in).await;
    let session = session_with_slots(&server, "Forgetful", json!(["memory"])).await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "hi").await;
    let seen = until_run_ends(&mut events).await;
    let failed = seen.iter().find(|(kind, _)| kind == "slot_failed");
    assert_eq!(
        failed.map(|(_, d)| d["slot"].clone()),
        Some(json!("memory")),
        "{seen:?}"
    );
    assert_eq!(seen.last().unwrap().0, "run_finished", "{seen:?}");
    assert_eq!(seen.last().unwrap().1["content"], "the reply");
}

#[tokio::test]
async fn slots_can_be_changed_and_reset_and_unknown_slots_are_refused() {
    let stand_in = StandIn::start(vec![]).await;
    let server = with_model(&stand_in).await;
    let default = server.post("/characters", json!({"name": "Plain"})).await;
    assert_eq!(default.body["data"]["slots"], json!(["narrator"]));
    let bad = server
        .patch("/characters/Plain", json!({"slots": ["critic"]}))
        .await;
    assert!(bad.status.is_client_error(), "{bad:?}");
    assert!(bad.body.to_string().contains("critic"), "{bad:?}");
    let set = server
        .patch("/characters/Plain", json!({"slots": ["verifier"]}))
        .await;
    assert_eq!(
        set.body["data"]["slots"],
        json!(["narrator", "verifier"]),
        "{set:?}"
    );
    let kept = server
        .patch("/characters/Plain", json!({"description": "x"}))
        .await;
    assert_eq!(kept.body["data"]["slots"], json!(["narrator", "verifier"]));
    let reset = server
        .patch("/characters/Plain", json!({"slots": null}))
        .await;
    assert_eq!(
        reset.body["data"]["slots"],
        json!(["narrator"]),
        "{reset:?}"
    );
}

#[tokio::test]
async fn the_first_tool_choice_setting_forces_a_call_on_the_first_request_only() {
    let stand_in = StandIn::start(vec![
        calls_answer(&[("call_1", "get_time", "{}")]),
        text_answer(&["it is late"]),
    ])
    .await;
    let mut env = stand_in.env();
    env.push(("TOOLGATE_LLM_FIRST_TOOL_CHOICE".into(), "required".into()));
    let server = spawn_with(SpawnOptions {
        env,
        ..Default::default()
    })
    .await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "time?").await;
    until_run_ends(&mut events).await;
    let requests = stand_in.requests();
    assert_eq!(requests[0]["tool_choice"], "required");
    assert!(
        requests[1].get("tool_choice").is_none(),
        "{:?}",
        requests[1]
    );

    let unforced = StandIn::start(vec![text_answer(&["hi"])]).await;
    let server = with_model(&unforced).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "hi").await;
    until_run_ends(&mut events).await;
    assert!(unforced.requests()[0].get("tool_choice").is_none());
}

#[tokio::test]
async fn a_finished_page_is_committed_by_the_next_floor_after_a_restart() {
    let stand_in = StandIn::start(vec![text_answer(&["before the restart"])]).await;
    stand_in.repeat(text_answer(&["after"]));
    let mut server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let first = turn(&server, &session, "one").await;
    until_run_ends(&mut events).await;
    drop(events);
    server.restart().await;
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "two").await;
    until_run_ends(&mut events).await;
    let floor_id = first["floor_id"].as_str().unwrap();
    let floor = server.get(&format!("/floors/{floor_id}")).await;
    assert_eq!(
        floor.body["data"]["active_page_id"], first["page_id"],
        "{floor:?}"
    );
    let history = stand_in.requests()[1]["messages"].to_string();
    assert!(history.contains("before the restart"), "{history}");
}

#[tokio::test]
async fn a_generation_cut_off_by_a_kill_is_discarded_at_the_next_start() {
    let stand_in = StandIn::start(vec![Answer::Hang]).await;
    let mut server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let started = turn(&server, &session, "hello?").await;
    common::wait_until(Duration::from_secs(20), "the model request", || {
        let stand_in = stand_in.clone();
        async move { !stand_in.requests().is_empty() }
    })
    .await;
    server.kill().await;
    server.restart().await;
    let run_id = started["run_id"].as_str().unwrap();
    let run = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(run.body["data"]["state"], "discarded", "{run:?}");
    // The session is free again.
    stand_in.repeat(text_answer(&["back"]));
    let mut events = Events::open(&server, &session).await;
    turn(&server, &session, "again").await;
    let seen = until_run_ends(&mut events).await;
    assert_eq!(seen.last().unwrap().1["content"], "back", "{seen:?}");
}

#[tokio::test]
async fn two_floors_at_once_start_one_generation() {
    let stand_in = StandIn::start(vec![]).await;
    stand_in.repeat(Answer::Hang);
    let server = with_model(&stand_in).await;
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/floors");
    let (a, b) = tokio::join!(
        server.post(&path, json!({"content": "a"})),
        server.post(&path, json!({"content": "b"}))
    );
    let mut statuses = [a.status.as_u16(), b.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, [202, 409], "{a:?} {b:?}");
    let refused = if a.status == StatusCode::CONFLICT {
        &a
    } else {
        &b
    };
    assert_eq!(refused.code(), "generation_in_progress", "{refused:?}");
    let floors = server.get(&path).await;
    assert_eq!(
        floors.body["data"].as_array().unwrap().len(),
        1,
        "the refused floor was not stored: {floors:?}"
    );
}
