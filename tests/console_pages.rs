//! Issue 17's console pages beyond the first set, over plain HTTP against the
//! real binary: definitions (list, create with a schema and a script, edit,
//! toggle, "try it" into a session), a floor keeping its discarded runs, the
//! session page's MCP servers as a table, the catalog redrawn live after a
//! change, and failed sign-ins throttled per address.

mod common;

use std::time::Duration;

use common::console::{ConsoleClient, login_token, post_login};
use common::events::Events;
use common::{SpawnOptions, TestServer, spawn_app, spawn_with};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use serde_json::{Value, json};

fn scripts_on() -> SpawnOptions {
    SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    }
}

const SCHEMA: &str =
    r#"{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}"#;

/// The definition id a `/console/definitions/{id}?notice=…` redirect names.
fn definition_id(location: Option<&str>) -> String {
    let location = location.expect("a redirect");
    let rest = location
        .strip_prefix("/console/definitions/")
        .unwrap_or_else(|| panic!("not a definition page: {location}"));
    rest.split('?').next().unwrap().to_owned()
}

async fn stored_definition(server: &TestServer, id: &str) -> Value {
    let reply = server.get(&format!("/tools/definitions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn create_shout(console: &ConsoleClient) -> String {
    let created = console
        .submit(
            "/console/definitions",
            &[
                ("name", "shout"),
                ("description", "Shouts the text"),
                ("parameters", SCHEMA),
                ("side_effect_level", "none"),
                ("allowed_slots", "narrator"),
                ("enabled", "on"),
                ("script", "return { shouted: args.text.toUpperCase() };"),
            ],
        )
        .await;
    assert_eq!(created.status, StatusCode::SEE_OTHER, "{}", created.body);
    definition_id(created.location.as_deref())
}

#[tokio::test]
async fn definitions_are_created_edited_toggled_and_tried_from_the_console() {
    let server = spawn_with(scripts_on()).await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let (status, html) = console.get("/console/definitions").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("No definitions yet"), "{html}");
    let (status, html) = console.get("/console/definitions/new").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("name=\"parameters\""), "{html}");

    let id = create_shout(&console).await;
    let stored = stored_definition(&server, &id).await;
    assert_eq!(stored["name"], "shout");
    assert_eq!(
        stored["parameters"],
        serde_json::from_str::<Value>(SCHEMA).unwrap()
    );
    assert_eq!(stored["handler_type"], "script");
    assert_eq!(stored["allowed_slots"], json!(["narrator"]));
    let (_, listed) = console.get("/console/definitions").await;
    assert!(
        listed.contains(&format!("/console/definitions/{id}")),
        "{listed}"
    );

    // A bad schema is refused on the form, which keeps what was typed.
    let refused = console
        .submit(
            &format!("/console/definitions/{id}"),
            &[("name", "shout_louder"), ("parameters", "{not json")],
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body.contains("not valid JSON"), "{}", refused.body);
    assert!(
        refused.body.contains("value=\"shout_louder\""),
        "{}",
        refused.body
    );
    assert_eq!(stored_definition(&server, &id).await["name"], "shout");

    let saved = console
        .submit(
            &format!("/console/definitions/{id}"),
            &[
                ("name", "shout"),
                ("description", "Shouts louder"),
                ("parameters", SCHEMA),
                ("side_effect_level", "none"),
            ],
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    let stored = stored_definition(&server, &id).await;
    assert_eq!(stored["description"], "Shouts louder");
    assert_eq!(stored["allowed_slots"], json!([]), "no slot ticked: any");
    assert_eq!(
        stored["handler"]["script"], "return { shouted: args.text.toUpperCase() };",
        "an empty script keeps the handler"
    );

    let toggled = console
        .submit(
            &format!("/console/definitions/{id}/toggle"),
            &[("enabled", "false")],
        )
        .await;
    assert_eq!(toggled.status, StatusCode::SEE_OTHER, "{}", toggled.body);
    assert_eq!(stored_definition(&server, &id).await["enabled"], false);
    let session = server.create_session().await;
    let catalog = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    assert!(
        !catalog.body.to_string().contains("\"shout\""),
        "a disabled definition is not offered: {catalog:?}"
    );
    console
        .submit(
            &format!("/console/definitions/{id}/toggle"),
            &[("enabled", "true")],
        )
        .await;
    assert_eq!(stored_definition(&server, &id).await["enabled"], true);

    try_it(&server, &console, &id, &session).await;
}

/// "Try it" runs the tool through the session's call path and opens the
/// execution it journalled; another account's session is not found.
async fn try_it(server: &TestServer, console: &ConsoleClient, id: &str, session: &str) {
    let (_, page) = console.get(&format!("/console/definitions/{id}")).await;
    assert!(
        page.contains(&format!("value=\"{session}\"")),
        "the session is offered: {page}"
    );
    let tried = console
        .submit(
            &format!("/console/definitions/{id}/try"),
            &[
                ("session_id", session),
                ("caller_slot", "narrator"),
                ("arguments", r#"{"text":"hello"}"#),
            ],
        )
        .await;
    assert_eq!(tried.status, StatusCode::SEE_OTHER, "{}", tried.body);
    let location = tried.location.expect("a redirect");
    let execution = location
        .strip_prefix("/console/executions/")
        .expect("to the execution")
        .to_owned();
    let record = server.get(&format!("/tool-executions/{execution}")).await;
    assert_eq!(record.body["data"]["status"], "success", "{record:?}");
    assert_eq!(record.body["data"]["tool_name"], "shout");
    assert_eq!(record.body["data"]["session_id"], session);
    let (status, html) = console.get(&location).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("HELLO"), "{html}");

    let invalid = console
        .submit(
            &format!("/console/definitions/{id}/try"),
            &[
                ("session_id", session),
                ("caller_slot", "memory"),
                ("arguments", "[1, \"<b>\"]"),
            ],
        )
        .await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST, "{}", invalid.body);
    assert!(invalid.body.contains("JSON object"), "{}", invalid.body);
    // The form comes back with what was typed.
    assert_eq!(
        common::console::textarea_text(&invalid.body, "arguments"),
        "[1, \"<b>\"]"
    );
    assert!(
        invalid
            .body
            .contains("<option value=\"memory\" selected>memory</option>"),
        "{}",
        invalid.body
    );

    let key = server.create_account("tenant").await;
    let foreign = server.create_session_as(&key, "Other").await;
    let foreign = foreign.as_str();
    let refused = console
        .submit(
            &format!("/console/definitions/{id}/try"),
            &[("session_id", foreign)],
        )
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND, "{}", refused.body);

    let tenant = ConsoleClient::sign_in(server, &key).await;
    for path in [format!("/console/definitions/{id}")] {
        assert_eq!(tenant.status(&path).await, StatusCode::NOT_FOUND, "{path}");
    }
    for (path, fields) in [
        (
            format!("/console/definitions/{id}"),
            vec![("name", "stolen")],
        ),
        (
            format!("/console/definitions/{id}/toggle"),
            vec![("enabled", "false")],
        ),
        (
            format!("/console/definitions/{id}/try"),
            vec![("session_id", foreign)],
        ),
    ] {
        let answer = tenant.submit(&path, &fields).await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "{path}: {}",
            answer.body
        );
    }
    let stored = stored_definition(server, id).await;
    assert_eq!(
        (stored["name"].as_str(), stored["enabled"].as_bool()),
        (Some("shout"), Some(true))
    );
}

#[tokio::test]
async fn a_floor_page_keeps_its_discarded_runs() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let (floor, run) = server.floor_and_run(&session, "hi").await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let discarded = console
        .submit(&format!("/console/runs/{run}/discard"), &[])
        .await;
    assert_eq!(
        discarded.status,
        StatusCode::SEE_OTHER,
        "{}",
        discarded.body
    );
    let (status, html) = console.get(&format!("/console/floors/{floor}")).await;
    assert_eq!(status, StatusCode::OK);
    let row = html
        .split("<tr")
        .find(|row| row.contains(&format!("data-run=\"{run}\"")))
        .unwrap_or_else(|| panic!("the discarded run is listed: {html}"));
    assert!(row.contains("discarded"), "{row}");
    assert!(
        !html.contains(&format!("/console/runs/{run}/discard")),
        "no discard button for it"
    );
}

#[tokio::test]
async fn the_session_page_lists_mcp_servers_as_a_table() {
    let server = spawn_app().await;
    let body = json!({"name": "ghost", "transport": "stdio", "stdio": {"command": "toolgate-test-no-such-mcp-server"}});
    let created = server.post("/mcp/servers", body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let server_id = created.body["data"]["id"].as_str().unwrap().to_owned();
    let session = server.create_session().await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let (status, html) = console.get(&format!("/console/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    let row = html
        .split("<tr")
        .find(|row| row.contains(&format!("data-server=\"{server_id}\"")))
        .unwrap_or_else(|| panic!("the server has a row: {html}"));
    assert!(row.contains("ghost"), "{row}");
    assert!(!html.contains("{&quot;"), "no raw JSON on the page: {html}");
    let (status, html) = console.get("/console/mcp").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains(&format!("data-server=\"{server_id}\"")),
        "{html}"
    );
    assert!(!html.contains("{&quot;"), "no raw JSON on the page: {html}");
}

#[tokio::test]
async fn the_console_stream_resends_the_catalog_after_a_change() {
    let server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let console = ConsoleClient::sign_in(&server, &server.token).await;
    let response = console
        .client
        .get(console.url(&format!("/console/sessions/{session}/events")))
        .header(COOKIE, &console.cookie)
        .send()
        .await
        .expect("console events");
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = Events::of_response(response);
    let created = server
        .post(
            "/tools/definitions",
            json!({"name": "lookup_npc", "handler_type": "script", "handler": {"script": "return 1;"}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let catalog = events.next_of("catalog", Duration::from_secs(10)).await;
    let row = catalog["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row["tool"] == "lookup_npc")
        .unwrap_or_else(|| panic!("the new tool is in the redrawn catalog: {catalog}"))
        .clone();
    assert_eq!(row["availability"], "available", "{row}");
    assert_eq!(row["cells"][0]["text"], "lookup_npc", "{row}");

    let denied = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(denied.status, StatusCode::OK, "{denied:?}");
    let catalog = events.next_of("catalog", Duration::from_secs(10)).await;
    let row = catalog["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["tool"] == "lookup_npc")
        .unwrap_or_else(|| panic!("{catalog}"))
        .clone();
    assert_ne!(row["availability"], "available", "the switch shows: {row}");
    assert!(
        row["cells"][2]["detail"]
            .as_str()
            .is_some_and(|reason| !reason.is_empty()),
        "its reason: {row}"
    );
}

#[tokio::test]
async fn failed_sign_ins_are_throttled_per_address_until_the_window_ends() {
    let server = spawn_app().await;
    let token = login_token(&server).await;
    for attempt in 0..10 {
        // A valid key signing in between does not clear the count: one held
        // key must not buy unlimited guesses at the others.
        if attempt == 5 {
            let signed_in = post_login(&server, &token, &server.token).await;
            assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
        }
        let answer = post_login(&server, &token, "tg_wrong_key").await;
        assert_eq!(
            answer.status(),
            StatusCode::UNAUTHORIZED,
            "attempt {attempt}"
        );
    }
    let answer = post_login(&server, &token, &server.token).await;
    assert_eq!(
        answer.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "even the right key waits"
    );
    assert!(
        answer.headers().get(SET_COOKIE).is_none(),
        "no session cookie"
    );
    let wait: u64 = answer.headers()[RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=300).contains(&wait), "Retry-After {wait}");
    let html = answer.text().await.unwrap();
    assert!(html.contains("Too many failed sign-ins"), "{html}");
    assert!(
        html.contains("name=\"api_key\""),
        "the form is shown again: {html}"
    );
}

#[tokio::test]
async fn concurrent_failed_sign_ins_are_judged_at_most_the_limit() {
    let server = spawn_app().await;
    let token = login_token(&server).await;
    // All at once: the check and the count are one step, so no attempt slips
    // past a check made before the others were counted.
    let answers =
        futures::future::join_all((0..40).map(|_| post_login(&server, &token, "tg_wrong_key")))
            .await;
    let judged = answers
        .iter()
        .filter(|answer| answer.status() == StatusCode::UNAUTHORIZED)
        .count();
    let throttled = answers
        .iter()
        .filter(|answer| answer.status() == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((judged, throttled), (10, 30));
}
