//! `catalog_changed` follows every change of what a session's model may see or
//! call: tool definitions (create, patch, toggle, delete) and the session's
//! permissions, not only `/api/tools`. And what a live model session is offered
//! is what a call would allow.

mod common;

use common::events::Events;
use common::{SpawnOptions, TestServer, register_remote, spawn_with, strings as names};
use serde_json::{Value, json};

fn scripts_on() -> SpawnOptions {
    SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    }
}

fn definition() -> Value {
    json!({
        "name": "lookup_npc",
        "description": "find an NPC",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        "side_effect_level": "none",
        "source": "custom",
        "handler_type": "script",
        "handler": {"script": "return { found: true };"}
    })
}

async fn offered_names(server: &TestServer, session: &str) -> Vec<String> {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime?slot=narrator"))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let mut names: Vec<String> = reply.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn definition_writes_reach_live_model_sessions() {
    let server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    assert!(!names(&events.ready["tools"]).contains(&"lookup_npc".to_owned()));

    let created = server.post("/tools/definitions", definition()).await;
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    let changed = events.changed().await;
    assert_eq!(names(&changed["added"]), ["lookup_npc"]);
    assert!(names(&changed["tools"]).contains(&"lookup_npc".to_owned()));

    let patched = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({"description": "find a character"}),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert_eq!(names(&events.changed().await["updated"]), ["lookup_npc"]);

    let toggled = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(toggled.status, 200, "{toggled:?}");
    let changed = events.changed().await;
    assert_eq!(names(&changed["removed"]), ["lookup_npc"]);
    assert!(!names(&changed["tools"]).contains(&"lookup_npc".to_owned()));

    let toggled = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": true}),
        )
        .await;
    assert_eq!(toggled.status, 200, "{toggled:?}");
    assert_eq!(names(&events.changed().await["added"]), ["lookup_npc"]);

    let deleted = server.delete(&format!("/tools/definitions/{id}")).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let changed = events.changed().await;
    assert_eq!(names(&changed["removed"]), ["lookup_npc"]);
    assert!(!names(&changed["tools"]).contains(&"lookup_npc".to_owned()));
}

/// The lists say what the catalogs gained and lost, judged on the row before
/// the write and after it (found by a probe: a rename was `updated` under the
/// new name, a disabled definition's creation `added`, and disabling a
/// disabled one `removed` it again).
#[tokio::test]
async fn a_definitions_rename_or_a_write_of_a_disabled_one_is_told_as_it_changed_the_catalog() {
    let server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let created = server.post("/tools/definitions", definition()).await;
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    assert_eq!(names(&events.changed().await["added"]), ["lookup_npc"]);

    let renamed = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({"name": "find_npc"}),
        )
        .await;
    assert_eq!(renamed.status, 200, "{renamed:?}");
    let changed = events.changed().await;
    assert_eq!(names(&changed["removed"]), ["lookup_npc"], "{changed}");
    assert_eq!(names(&changed["added"]), ["find_npc"], "{changed}");
    assert!(names(&changed["updated"]).is_empty(), "{changed}");

    let mut parked = definition();
    parked["name"] = json!("parked");
    parked["enabled"] = json!(false);
    let parked = server.post("/tools/definitions", parked).await;
    assert_eq!(parked.status, 201, "{parked:?}");
    let changed = events.changed().await;
    for list in ["added", "updated", "removed"] {
        assert!(names(&changed[list]).is_empty(), "{list}: {changed}");
    }
    let parked = parked.body["data"]["id"].as_str().unwrap().to_owned();
    let again = server
        .patch(
            &format!("/tools/definitions/{parked}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    let changed = events.changed().await;
    assert!(names(&changed["removed"]).is_empty(), "{changed}");
}

#[tokio::test]
async fn a_refused_definition_write_sends_nothing() {
    let server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let created = server.post("/tools/definitions", definition()).await;
    assert_eq!(created.status, 201, "{created:?}");
    events.changed().await;
    // A name conflict is refused; the next event must be the permission change
    // below, not one for the refused write.
    let conflict = server.post("/tools/definitions", definition()).await;
    assert_eq!(conflict.status, 409, "{conflict:?}");
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"allow_irreversible": true}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let changed = events.changed().await;
    assert!(names(&changed["added"]).is_empty(), "{changed}");
}

#[tokio::test]
async fn permission_changes_reach_the_sessions_model_and_only_it() {
    let server = spawn_with(SpawnOptions::default()).await;
    let session = server.create_session().await;
    let other = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let mut other_events = Events::open(&server, &other).await;
    assert!(names(&events.ready["tools"]).contains(&"roll_dice".to_owned()));

    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["roll_dice"]}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let changed = events.changed().await;
    let offered = names(&changed["tools"]);
    assert!(!offered.contains(&"roll_dice".to_owned()), "{changed}");
    // What the model is offered is exactly what a narrator call may run.
    assert_eq!(offered, offered_names(&server, &session).await);
    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "arguments": {}}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "denied", "{call:?}");

    // The other session's permissions did not change: it gets no event. Its
    // next event is the one caused by a change of its own.
    let reply = server
        .patch(
            &format!("/sessions/{other}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["get_time"]}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let changed = other_events.changed().await;
    let offered = names(&changed["tools"]);
    assert!(offered.contains(&"roll_dice".to_owned()), "{changed}");
    assert!(!offered.contains(&"get_time".to_owned()), "{changed}");
}

#[tokio::test]
async fn a_model_session_is_offered_what_its_slot_may_call() {
    let server = spawn_with(SpawnOptions::default()).await;
    let session = server.create_session().await;
    let reply = server
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_allow_list": {"verifier": ["get_time"]}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let verifier = Events::open_path(
        &server,
        &format!("/sessions/{session}/events?slot=verifier"),
    )
    .await;
    assert_eq!(names(&verifier.ready["tools"]), ["get_time"]);
    assert_eq!(verifier.ready["slot"], "verifier");
    let narrator = Events::open(&server, &session).await;
    assert_eq!(
        names(&narrator.ready["tools"]),
        offered_names(&server, &session).await
    );
    let bad = server
        .get(&format!("/sessions/{session}/events?slot=writer"))
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
}

/// A session of `character` (created if it is not `Lanlan`) with `permissions`
/// (none when null), and its live model session for `slot`.
async fn live_session(
    server: &TestServer,
    character: &str,
    permissions: Value,
    slot: &str,
) -> (String, Events) {
    if character != "Lanlan" {
        let reply = server.post("/characters", json!({"name": character})).await;
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    let reply = server
        .post("/sessions", json!({"character": character}))
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
    let session = reply.body["data"]["id"].as_str().unwrap().to_owned();
    if !permissions.is_null() {
        let path = format!("/sessions/{session}/tool-permissions");
        let reply = server.put(&path, permissions).await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    let events =
        Events::open_path(server, &format!("/sessions/{session}/events?slot={slot}")).await;
    (session, events)
}

/// Sessions offered the same tools share one decision per registration
/// (model_sessions::verdicts); each must still get what its own rules allow.
#[tokio::test]
async fn one_registration_gives_every_live_session_what_its_own_rules_allow() {
    let server = spawn_with(SpawnOptions::default()).await;
    let (plain, mut plain_events) = live_session(&server, "Lanlan", Value::Null, "narrator").await;
    let (_, mut twin_events) = live_session(&server, "Lanlan", Value::Null, "narrator").await;
    let (other, mut other_events) = live_session(&server, "Second", Value::Null, "narrator").await;
    let denying = json!({"slot_deny_list": {"narrator": ["plugin_probe"]}});
    let (denied, mut denied_events) = live_session(&server, "Lanlan", denying, "narrator").await;
    let verifier_only = json!({"slot_allow_list": {"verifier": ["plugin_probe"]}});
    let (_, mut verifier_events) = live_session(&server, "Third", verifier_only, "verifier").await;

    register_remote(
        &server,
        json!({
            "name": "plugin_probe",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
            "callback_url": "http://127.0.0.1:9/probe",
            "role": null,
            "source": "plugin:probe"
        }),
    )
    .await;

    let has_probe = |changed: &Value| names(&changed["tools"]).contains(&"plugin_probe".to_owned());
    for (events, session) in [(&mut plain_events, &plain), (&mut other_events, &other)] {
        let changed = events.changed().await;
        assert!(has_probe(&changed), "{changed}");
        assert_eq!(
            names(&changed["tools"]),
            offered_names(&server, session).await
        );
    }
    let twin = twin_events.changed().await;
    assert!(has_probe(&twin), "{twin}");
    let changed = denied_events.changed().await;
    assert!(!has_probe(&changed), "its own deny list: {changed}");
    assert!(
        names(&changed["tools"]).contains(&"roll_dice".to_owned()),
        "{changed}"
    );
    assert_eq!(
        names(&changed["tools"]),
        offered_names(&server, &denied).await
    );
    let changed = verifier_events.changed().await;
    assert_eq!(
        names(&changed["tools"]),
        ["plugin_probe"],
        "its own slot: {changed}"
    );
}

/// A registration into every role reaches each live session with its own
/// character's tools and its permissions as they are now: sessions whose
/// catalogs differ only in another character's registration never share a
/// decision.
#[tokio::test]
async fn one_registration_gives_every_character_its_own_tools() {
    let server = spawn_with(SpawnOptions::default()).await;
    let (first, mut first_events) = live_session(&server, "Lanlan", Value::Null, "narrator").await;
    let (second, mut second_events) =
        live_session(&server, "Second", Value::Null, "narrator").await;
    let remote = |name: &str, role: Value| {
        json!({
            "name": name,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
            "callback_url": "http://127.0.0.1:9/probe",
            "role": role,
            "source": "plugin:probe"
        })
    };
    register_remote(&server, remote("second_only", json!("Second"))).await;
    let changed = second_events.changed().await;
    assert!(
        names(&changed["tools"]).contains(&"second_only".to_owned()),
        "{changed}"
    );

    // A permission write empties the server's session cache, so the
    // registration below reads the sessions it reaches from the database
    // (together with the others on a shared database, which caches none).
    let path = format!("/sessions/{first}/tool-permissions");
    let denying = json!({"slot_deny_list": {"narrator": ["everyone"]}});
    assert_eq!(server.put(&path, denying).await.status, 200);
    first_events.changed().await;

    register_remote(&server, remote("everyone", Value::Null)).await;
    let first_changed = first_events.changed().await;
    let second_changed = second_events.changed().await;
    let first_names = names(&first_changed["tools"]);
    let second_names = names(&second_changed["tools"]);
    let expected = [
        (&first_names, "everyone", false, "its own deny list"),
        (&first_names, "roll_dice", true, "a builtin"),
        (&first_names, "second_only", false, "another role's tool"),
        (&second_names, "everyone", true, "the registration"),
        (&second_names, "second_only", true, "its own role's tool"),
    ];
    for (names, tool, offered, why) in expected {
        assert_eq!(
            names.contains(&tool.to_owned()),
            offered,
            "{tool} ({why}): {names:?}"
        );
    }
    assert_eq!(first_names, offered_names(&server, &first).await);
    assert_eq!(second_names, offered_names(&server, &second).await);
}

/// Opens `GET /sessions/{session}/events` with `key`; the answer, whose body
/// (the stream) stays open while it is held.
async fn events_as(server: &TestServer, key: &str, session: &str) -> reqwest::Response {
    reqwest::Client::new()
        .get(server.url(&format!("/sessions/{session}/events")))
        .bearer_auth(key)
        .send()
        .await
        .expect("events request")
}

#[tokio::test]
async fn an_account_holds_at_most_its_share_of_event_streams() {
    let server = spawn_with(SpawnOptions {
        args: vec!["--max-event-streams-per-account".into(), "3".into()],
        ..Default::default()
    })
    .await;
    let tenant = server.create_account("tenant").await;
    let session = server.create_session_as(&tenant, "Tenant").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let stream = events_as(&server, &tenant, &session).await;
        assert_eq!(stream.status(), 200);
        held.push(stream);
    }
    // The console's live view of a session is a stream of the account too.
    let console = common::console::ConsoleClient::sign_in(&server, &tenant).await;
    let watching = format!("/console/sessions/{session}/events");
    let observer = console.hold(&watching).await;
    assert_eq!(observer.status(), 200);
    let refused = events_as(&server, &tenant, &session).await;
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
    let refused = console.hold(&watching).await;
    assert_eq!(refused.status(), 409, "a second console view past the cap");

    // The admin (the operator) is not held to it.
    let admin_session = server.create_session().await;
    let mut admin_streams = Vec::new();
    for _ in 0..4 {
        let stream = events_as(&server, &server.token, &admin_session).await;
        assert_eq!(stream.status(), 200);
        admin_streams.push(stream);
    }

    // A stream closed frees its place (once the server sees it closed).
    drop(held.pop());
    let reopened = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    common::wait_until(
        std::time::Duration::from_secs(30),
        "a place freed by a closed stream",
        || {
            let attempt = events_as(&server, &tenant, &session);
            let reopened = reopened.clone();
            async move {
                let answer = attempt.await;
                let ok = answer.status() == 200;
                if ok {
                    // Held, so that the place stays taken.
                    reopened.lock().unwrap().push(answer);
                }
                ok
            }
        },
    )
    .await;
    assert_eq!(reopened.lock().unwrap().len(), 1);
}

/// A definition write reaches every live session of the account, and
/// sessions offered the very same tools share one verdict (the server's and
/// the definitions' specs are keyed, so the catalog is built once): a
/// session whose permissions deny a server tool is still told its own list,
/// and each list is what its narrator's calls may run.
#[tokio::test]
async fn a_definition_write_tells_each_live_session_its_own_tools_beside_an_mcp_server() {
    let server = spawn_with(scripts_on()).await;
    let plain = server.create_session().await;
    let twin = server.create_session().await;
    let narrowed = server.create_session().await;
    let mcp = common::mcp::create_server(
        &server,
        common::mcp::stdio_body(
            "kit",
            json!({"tool_prefix": "k", "default_side_effect_level": "sandbox"}),
        ),
    )
    .await;
    common::mcp::wait_for_source(
        &server,
        &plain,
        &mcp,
        "live",
        std::time::Duration::from_secs(30),
    )
    .await;
    let reply = server
        .patch(
            &format!("/sessions/{narrowed}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["k_echo"]}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let mut streams = Vec::new();
    for session in [&plain, &twin, &narrowed] {
        streams.push((session, Events::open(&server, session).await));
    }
    let sorted = |tools: &Value| {
        let mut tools = names(tools);
        tools.sort();
        tools
    };

    let created = server.post("/tools/definitions", definition()).await;
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    for (session, events) in &mut streams {
        let changed = events.changed().await;
        let tools = sorted(&changed["tools"]);
        assert_eq!(tools, offered_names(&server, session).await, "{changed}");
        assert!(tools.contains(&"lookup_npc".to_owned()), "{changed}");
        let denied = *session == &narrowed;
        assert_eq!(!tools.contains(&"k_echo".to_owned()), denied, "{changed}");
        assert!(tools.contains(&"k_add_tool".to_owned()), "{changed}");
    }

    let toggled = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(toggled.status, 200, "{toggled:?}");
    for (session, events) in &mut streams {
        let changed = events.changed().await;
        let tools = sorted(&changed["tools"]);
        assert_eq!(tools, offered_names(&server, session).await, "{changed}");
        assert!(!tools.contains(&"lookup_npc".to_owned()), "{changed}");
        let denied = *session == &narrowed;
        assert_eq!(!tools.contains(&"k_echo".to_owned()), denied, "{changed}");
    }
}
