//! Black-box tests of the Runtime Tools API (`runtime-tools-api.txt`) and of the
//! remote-tool call path, against the real binary with real callback servers on
//! loopback.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::events::Events;
use common::{Reply, SpawnOptions, TestServer, read_reply, spawn_app, spawn_with, strings};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------
// Helpers: Runtime Tools API calls (no API key: the API is loopback-only).
// ---------------------------------------------------------------------------

async fn api_post(server: &TestServer, path: &str, body: Value) -> Reply {
    let response = server
        .client
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("request");
    read_reply(response).await
}

async fn api_post_raw(server: &TestServer, path: &str, body: &'static str) -> Reply {
    let response = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    read_reply(response).await
}

async fn api_get(server: &TestServer, path: &str) -> Reply {
    read_reply(
        server
            .client
            .get(server.url(path))
            .send()
            .await
            .expect("request"),
    )
    .await
}

async fn register(server: &TestServer, body: Value) -> Reply {
    api_post(server, "/api/tools/register", body).await
}

async fn register_ok(server: &TestServer, body: Value) -> Value {
    let reply = register(server, body).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body["ok"], true, "{reply:?}");
    reply.body
}

/// An `/api/tools` answer without the `boot_id` it always carries (tests/boot_id.rs
/// covers it): exactly the contract's fields.
fn contract_fields(body: &Value) -> Value {
    let mut body = body.clone();
    let boot_id = body
        .as_object_mut()
        .and_then(|fields| fields.remove("boot_id"));
    assert!(
        boot_id.as_ref().is_some_and(Value::is_string),
        "no boot_id in {body}"
    );
    body
}

/// `tools_by_role` of `GET /api/tools`.
async fn listing(server: &TestServer) -> Value {
    let reply = api_get(server, "/api/tools").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body["ok"], true);
    reply.body["tools_by_role"].clone()
}

fn names_of(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn create_character(server: &TestServer, name: &str) {
    let reply = server
        .post(
            "/characters",
            json!({"name": name, "description": "", "persona": ""}),
        )
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");
}

/// Runs a tool call on a session as its model would; returns `data`.
async fn call(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": arguments}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body["data"].clone()
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("expected a string, got {value}"))
}

// ---------------------------------------------------------------------------
// Helpers: a callback server on 127.0.0.1:0 with one route per behaviour.
// ---------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Seen {
    fn record(&self, path: &str, body: &Value) {
        self.requests
            .lock()
            .unwrap()
            .push((path.to_owned(), body.clone()));
    }

    fn for_path(&self, path: &str) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

struct Callbacks {
    addr: SocketAddr,
    seen: Seen,
    _task: JoinHandle<()>,
}

impl Callbacks {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

fn big_body(bytes: usize) -> String {
    // A JSON string of exactly `bytes` bytes.
    format!("\"{}\"", "x".repeat(bytes - 2))
}

async fn start_callbacks() -> Callbacks {
    let seen = Seen::default();
    let app = Router::new()
        .route(
            "/ok",
            post(|State(seen): State<Seen>, body: String| async move {
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                seen.record("/ok", &body);
                axum::Json(json!({
                    "output": {"echo": body["arguments"], "raw": body["raw_arguments"], "call_id": body["call_id"]},
                    "is_error": false
                }))
            }),
        )
        .route(
            "/weather",
            post(|State(seen): State<Seen>, axum::Json(body): axum::Json<Value>| async move {
                seen.record("/weather", &body);
                axum::Json(json!({"output": {"temperature_c": 28}, "is_error": false}))
            }),
        )
        .route(
            "/tool-error",
            post(|State(seen): State<Seen>, axum::Json(body): axum::Json<Value>| async move {
                seen.record("/tool-error", &body);
                axum::Json(json!({"error": "location not found", "is_error": true}))
            }),
        )
        .route(
            "/status/{code}",
            post(|Path(code): Path<u16>| async move {
                (
                    StatusCode::from_u16(code).unwrap(),
                    format!("upstream exploded with code {code}; more details follow"),
                )
            }),
        )
        .route(
            "/text",
            post(|| async { ([(header::CONTENT_TYPE, "text/plain")], "plain text answer") }),
        )
        .route(
            "/any-json",
            post(|| async { axum::Json(json!({"output": [1, "two", {"three": 3}], "is_error": false})) }),
        )
        .route("/bare-json", post(|| async { axum::Json(json!([1, 2, 3])) }))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(20)).await;
                axum::Json(json!({"output": "too late"}))
            }),
        )
        .route(
            "/redirect",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(header::LOCATION, "/ok")],
                    "",
                )
            }),
        )
        .route(
            "/sized/{bytes}",
            post(|Path(bytes): Path<usize>| async move {
                ([(header::CONTENT_TYPE, "application/json")], big_body(bytes))
            }),
        )
        .route(
            "/streamed/{bytes}",
            // Chunked, without Content-Length: the cap must apply while reading.
            post(|Path(bytes): Path<usize>| async move {
                let body = big_body(bytes).into_bytes();
                let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                    body.chunks(100).map(|c| Ok(c.to_vec())).collect();
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from_stream(futures::stream::iter(chunks)))
                    .unwrap()
            }),
        )
        .route(
            "/versioned/{tag}",
            post(|Path(tag): Path<String>| async move {
                axum::Json(json!({"output": tag, "is_error": false}))
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Callbacks {
        addr,
        seen,
        _task: task,
    }
}

/// A loopback port that was free a moment ago (for a server the test starts
/// on it later).
async fn free_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------
// Register, list, defaults, replace.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn register_the_seed_example_and_list_it() {
    let server = spawn_app().await;
    let reply = register(
        &server,
        json!({
            "name": "get_weather",
            "description": "Get weather for a location.",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"]
            },
            "callback_url": "http://127.0.0.1:9333/tools/get_weather",
            "role": null,
            "source": "plugin:weather",
            "timeout_seconds": 30
        }),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "registered": "get_weather", "affected_roles": ["Lanlan"], "failed_roles": []})
    );

    let tools = listing(&server).await;
    let listed = &tools["Lanlan"][0];
    assert_eq!(tools["Lanlan"].as_array().unwrap().len(), 1);
    assert_eq!(listed["name"], "get_weather");
    assert_eq!(listed["description"], "Get weather for a location.");
    assert_eq!(listed["source"], "plugin:weather");
    assert_eq!(
        listed["callback_url"],
        "http://127.0.0.1:9333/tools/get_weather"
    );
    assert_eq!(listed["is_remote"], true);

    let one = api_get(&server, "/api/tools?role=Lanlan").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["tools_by_role"], tools);
}

#[tokio::test]
async fn defaults_apply_and_a_same_named_registration_replaces() {
    let server = spawn_app().await;
    register_ok(
        &server,
        json!({"name": "minimal", "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    let tools = listing(&server).await;
    let tool = &tools["Lanlan"][0];
    assert_eq!(tool["description"], "");
    assert_eq!(tool["source"], "external");
    assert_eq!(tool["timeout_seconds"], 30.0);
    assert_eq!(
        tool["parameters"],
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(tool["side_effect_level"], "none");
    assert_eq!(tool["replay_safety"], "safe");
    assert_eq!(tool["async_capability"], "inline_only");

    // Explicit nulls mean "default" too.
    register_ok(
        &server,
        json!({"name": "nulls", "callback_url": "http://127.0.0.1:9/x", "description": null,
               "parameters": null, "source": null, "timeout_seconds": null, "role": null}),
    )
    .await;
    let tools = listing(&server).await;
    assert_eq!(tools["Lanlan"][1]["source"], "external");
    assert_eq!(tools["Lanlan"][1]["timeout_seconds"], 30.0);

    // Same name again: replaced in place, not duplicated.
    register_ok(
        &server,
        json!({"name": "minimal", "description": "second", "callback_url": "http://localhost:10/y",
               "source": "plugin:two", "timeout_seconds": 0.25,
               "side_effect_level": "irreversible"}),
    )
    .await;
    let tools = listing(&server).await;
    assert_eq!(names_of(&tools["Lanlan"]), ["minimal", "nulls"]);
    let tool = &tools["Lanlan"][0];
    assert_eq!(tool["description"], "second");
    assert_eq!(tool["callback_url"], "http://localhost:10/y");
    assert_eq!(tool["source"], "plugin:two");
    assert_eq!(tool["timeout_seconds"], 0.25);
    assert_eq!(tool["side_effect_level"], "irreversible");
    assert_eq!(tool["replay_safety"], "never_auto_replay");

    // Integer and float timeouts at the bounds are accepted.
    for timeout in [json!(300), json!(300.0), json!(0.001), json!(1)] {
        register_ok(
            &server,
            json!({"name": "bounds", "callback_url": "http://127.0.0.1:9/x", "timeout_seconds": timeout}),
        )
        .await;
    }
}

#[tokio::test]
async fn declared_allowed_slots_decide_which_slots_may_call() {
    let server = spawn_app().await;
    let dead = common::ports::dead_port();
    let url = format!("http://127.0.0.1:{}/x", dead.port);
    register_ok(
        &server,
        json!({"name": "directed", "callback_url": url, "allowed_slots": ["director"]}),
    )
    .await;
    let tools = listing(&server).await;
    assert_eq!(tools["Lanlan"][0]["allowed_slots"], json!(["director"]));
    let session = server.create_session().await;
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "directed", "arguments": {}, "caller_slot": "narrator"}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body["data"]["status"], "denied", "{reply:?}");
    assert_eq!(
        reply.body["data"]["execution_reason_code"],
        "permission_slot_not_allowed_by_tool"
    );
    // The director may: the call reaches the (dead) callback.
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "directed", "arguments": {}, "caller_slot": "director"}),
        )
        .await;
    assert_eq!(
        reply.body["data"]["execution_reason_code"], "remote_connection_failed",
        "{reply:?}"
    );

    // Without the field every slot may call, as before.
    register_ok(
        &server,
        json!({"name": "open", "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    assert_eq!(
        listing(&server).await["Lanlan"][1]["allowed_slots"],
        json!([])
    );
    let reply = register(
        &server,
        json!({"name": "bad", "callback_url": "http://127.0.0.1:9/x", "allowed_slots": ["boss"]}),
    )
    .await;
    assert_eq!(reply.status, 422, "{reply:?}");
}

#[tokio::test]
async fn schema_errors_are_422_with_a_message_naming_the_field() {
    let server = spawn_app().await;
    let base = json!({"name": "t", "callback_url": "http://127.0.0.1:9333/cb"});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let without = |field: &str| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().remove(field);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (without("name"), "name"),
        (without("callback_url"), "callback_url"),
        (with("name", json!("")), "name"),
        (with("name", json!("a".repeat(65))), "name"),
        (with("name", json!(12)), "name"),
        (with("name", Value::Null), "name"),
        (with("description", json!(5)), "description"),
        // Arguments are always an object: no other top-level type can be called.
        (with("parameters", json!({"type": "string"})), "parameters"),
        (
            with("parameters", json!({"type": ["object", "null"]})),
            "parameters",
        ),
        (
            with("description", json!("d".repeat(20_000))),
            "description",
        ),
        (with("parameters", json!("object")), "parameters"),
        (with("parameters", json!([])), "parameters"),
        (
            with("parameters", json!({"type": "nonsense"})),
            "parameters",
        ),
        (
            with(
                "parameters",
                json!({"type": "object", "required": "location"}),
            ),
            "parameters",
        ),
        (with("callback_url", json!(7)), "callback_url"),
        (with("callback_url", json!("")), "callback_url"),
        (with("callback_url", json!("not a url")), "callback_url"),
        (
            with("callback_url", json!("http://10.0.0.1/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://192.168.1.10:9333/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://example.com/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://localhost.example.com/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://0.0.0.0:9333/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://[::]:9333/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://[::ffff:10.0.0.1]:9333/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("ftp://127.0.0.1/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("file:///etc/passwd")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://user@127.0.0.1/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://user:pw@127.0.0.1:9333/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://127.0.0.1:99999/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://127.0.0.1:0/")),
            "callback_url",
        ),
        (
            with("callback_url", json!("http://127.0.0.1:abc/")),
            "callback_url",
        ),
        (with("timeout_seconds", json!(0)), "timeout_seconds"),
        (with("timeout_seconds", json!(-1)), "timeout_seconds"),
        (with("timeout_seconds", json!(300.5)), "timeout_seconds"),
        (with("timeout_seconds", json!(301)), "timeout_seconds"),
        (with("timeout_seconds", json!("30")), "timeout_seconds"),
        (with("source", json!("")), "source"),
        (with("source", json!(["plugin:x"])), "source"),
        (with("role", json!(3)), "role"),
        (
            with("side_effect_level", json!("explosive")),
            "side_effect_level",
        ),
        (with("replay_safety", json!("sometimes")), "replay_safety"),
        (with("async_capability", json!("maybe")), "async_capability"),
        (with("colour", json!("red")), "colour"),
        (json!([1, 2]), "body"),
        (json!("register me"), "body"),
    ];
    for (body, field) in cases {
        let reply = register(&server, body.clone()).await;
        assert_eq!(reply.status, 422, "{body} -> {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{body}");
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(field),
            "message for {body} should name {field}: {message}"
        );
    }
    for raw in ["", "{not json", "null"] {
        let reply = api_post_raw(&server, "/api/tools/register", raw).await;
        assert_eq!(reply.status, 422, "{raw:?} -> {reply:?}");
        assert!(!reply.body["error"]["message"].as_str().unwrap().is_empty());
    }
    // Nothing was registered by any of that.
    assert_eq!(listing(&server).await["Lanlan"], json!([]));

    // Unregister and clear validate their bodies the same way.
    for (path, body) in [
        ("/api/tools/unregister", json!({})),
        ("/api/tools/unregister", json!({"name": 1})),
        ("/api/tools/unregister", json!({"name": ""})),
        ("/api/tools/clear", json!({})),
        ("/api/tools/clear", json!({"source": ""})),
        ("/api/tools/clear", json!({"source": "x", "extra": 1})),
        // Past what a registration may hold: nothing to remove, and never
        // logged whole.
        ("/api/tools/unregister", json!({"name": "n".repeat(65)})),
        (
            "/api/tools/unregister",
            json!({"name": "n".repeat(900_000)}),
        ),
        ("/api/tools/clear", json!({"source": "s".repeat(129)})),
    ] {
        let reply = api_post(&server, path, body.clone()).await;
        assert_eq!(reply.status, 422, "{path} -> {reply:?}");
    }
    for (path, body) in [
        ("/api/tools/unregister", json!({"name": "n".repeat(64)})),
        ("/api/tools/clear", json!({"source": "s".repeat(128)})),
    ] {
        let reply = api_post(&server, path, body).await;
        assert_eq!(reply.status, 200, "{path} -> {reply:?}");
    }
}

#[tokio::test]
async fn every_loopback_callback_form_is_accepted() {
    let server = spawn_app().await;
    for (i, url) in [
        "http://[::ffff:127.0.0.1]:9333/",
        "http://127.5.6.7:9333/",
        "http://localhost:9333/",
        "http://LOCALHOST:9333/cb",
        "http://[::1]:9333/cb",
        "https://localhost:9443/cb",
        "https://127.0.0.1/cb",
        "http://127.0.0.1/no-port",
        "http://127.0.0.1:65535/?with=query",
    ]
    .into_iter()
    .enumerate()
    {
        let reply = register(
            &server,
            json!({"name": format!("t{i}"), "callback_url": url}),
        )
        .await;
        assert_eq!(reply.status, 200, "{url} -> {reply:?}");
        let tools = listing(&server).await;
        assert_eq!(
            tools["Lanlan"][i]["callback_url"], url,
            "shown as registered"
        );
    }
    // 64 characters (not bytes) is the longest name.
    register_ok(
        &server,
        json!({"name": "天".repeat(64), "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    register_ok(
        &server,
        json!({"name": "a".repeat(64), "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
}

#[tokio::test]
async fn unknown_roles_are_404() {
    let server = spawn_app().await;
    let url = "http://127.0.0.1:9/x";
    let reply = register(
        &server,
        json!({"name": "t", "callback_url": url, "role": "Nobody"}),
    )
    .await;
    assert_eq!(reply.status, 404, "{reply:?}");
    assert_eq!(reply.code(), "not_found");
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Nobody")
    );
    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "t", "role": "Nobody"}),
    )
    .await;
    assert_eq!(reply.status, 404, "{reply:?}");
    let reply = api_post(
        &server,
        "/api/tools/clear",
        json!({"source": "external", "role": "Nobody"}),
    )
    .await;
    assert_eq!(reply.status, 404, "{reply:?}");
    let reply = api_get(&server, "/api/tools?role=Nobody").await;
    assert_eq!(reply.status, 404, "{reply:?}");
    // Role names are exact.
    let reply = api_get(&server, "/api/tools?role=lanlan").await;
    assert_eq!(reply.status, 404, "{reply:?}");
    assert_eq!(listing(&server).await, json!({"Lanlan": []}));
}

#[tokio::test]
async fn a_null_role_targets_the_characters_existing_now_and_an_empty_one_nobody() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    // Roles are server-wide: another account's character is a role too.
    let other_key = server.create_account("other").await;
    let reply = server
        .send_as(
            &other_key,
            Method::POST,
            "/characters",
            Some(json!({"name": "Other"})),
        )
        .await;
    assert_eq!(reply.status, 201, "{reply:?}");

    let body = register_ok(
        &server,
        json!({"name": "everyone", "callback_url": "http://127.0.0.1:9/x", "role": null}),
    )
    .await;
    assert_eq!(body["affected_roles"], json!(["Lanlan", "Mio", "Other"]));
    // "" is a role no character has, not null: it reaches nobody.
    for (path, body) in [
        (
            "/api/tools/register",
            json!({"name": "empty_role", "callback_url": "http://127.0.0.1:9/x", "role": ""}),
        ),
        (
            "/api/tools/unregister",
            json!({"name": "everyone", "role": ""}),
        ),
        (
            "/api/tools/clear",
            json!({"source": "external", "role": ""}),
        ),
    ] {
        let reply = api_post(&server, path, body).await;
        assert_eq!(reply.status, 404, "{path}: {reply:?}");
    }
    let reply = api_get(&server, "/api/tools?role=").await;
    assert_eq!(reply.status, 404, "{reply:?}");
    let body = register_ok(
        &server,
        json!({"name": "absent_role", "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    assert_eq!(body["affected_roles"], json!(["Lanlan", "Mio", "Other"]));
    let body = register_ok(
        &server,
        json!({"name": "just_mio", "callback_url": "http://127.0.0.1:9/x", "role": "Mio"}),
    )
    .await;
    assert_eq!(body["affected_roles"], json!(["Mio"]));

    // A character created later has none of the earlier global registrations.
    create_character(&server, "Late").await;
    let tools = listing(&server).await;
    assert_eq!(tools["Late"], json!([]));
    assert_eq!(names_of(&tools["Lanlan"]), ["absent_role", "everyone"]);
    assert_eq!(
        names_of(&tools["Mio"]),
        ["absent_role", "everyone", "just_mio"]
    );
    assert_eq!(names_of(&tools["Other"]), ["absent_role", "everyone"]);
    let only_mio = api_get(&server, "/api/tools?role=Mio").await;
    assert_eq!(only_mio.body["tools_by_role"].as_object().unwrap().len(), 1);

    // A renamed character keeps its registrations; a deleted one takes them along.
    let reply = server
        .patch("/characters/Mio", json!({"name": "Mio2"}))
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(names_of(&listing(&server).await["Mio2"]).len(), 3);
    let reply = server.delete("/characters/Mio2").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    create_character(&server, "Mio2").await;
    assert_eq!(listing(&server).await["Mio2"], json!([]));
}

// ---------------------------------------------------------------------------
// Unregister and clear.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn unregister_with_and_without_role() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    for name in ["a", "b"] {
        register_ok(
            &server,
            json!({"name": name, "callback_url": "http://127.0.0.1:9/x"}),
        )
        .await;
    }
    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "a", "role": "Mio"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": true, "affected_roles": ["Mio"], "failed_roles": []})
    );
    let tools = listing(&server).await;
    assert_eq!(names_of(&tools["Mio"]), ["b"]);
    assert_eq!(names_of(&tools["Lanlan"]), ["a", "b"]);

    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "b", "role": null}),
    )
    .await;
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": true, "affected_roles": ["Lanlan", "Mio"], "failed_roles": []})
    );
    let reply = api_post(&server, "/api/tools/unregister", json!({"name": "a"})).await;
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": true, "affected_roles": ["Lanlan"], "failed_roles": []})
    );
    // Nothing left to remove: not an error, but removed is false.
    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "a", "role": null}),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": false, "affected_roles": [], "failed_roles": []})
    );
    let tools = listing(&server).await;
    assert_eq!(tools, json!({"Lanlan": [], "Mio": []}));
}

#[tokio::test]
async fn clear_removes_one_source_with_and_without_role() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    for (name, source) in [
        ("w1", "plugin:weather"),
        ("w2", "plugin:weather"),
        ("n1", "plugin:news"),
        ("e1", "external"),
    ] {
        register_ok(
            &server,
            json!({"name": name, "callback_url": "http://127.0.0.1:9/x", "source": source}),
        )
        .await;
    }
    let reply = api_post(
        &server,
        "/api/tools/clear",
        json!({"source": "plugin:weather", "role": "Lanlan"}),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": 2, "affected_roles": ["Lanlan"], "failed_roles": []})
    );
    let tools = listing(&server).await;
    assert_eq!(names_of(&tools["Lanlan"]), ["e1", "n1"]);
    assert_eq!(names_of(&tools["Mio"]), ["e1", "n1", "w1", "w2"]);

    let reply = api_post(
        &server,
        "/api/tools/clear",
        json!({"source": "plugin:news", "role": null}),
    )
    .await;
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": 2, "affected_roles": ["Lanlan", "Mio"], "failed_roles": []})
    );
    let reply = api_post(
        &server,
        "/api/tools/clear",
        json!({"source": "plugin:weather"}),
    )
    .await;
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": 2, "affected_roles": ["Mio"], "failed_roles": []})
    );
    let reply = api_post(
        &server,
        "/api/tools/clear",
        json!({"source": "plugin:none"}),
    )
    .await;
    assert_eq!(
        contract_fields(&reply.body),
        json!({"ok": true, "removed": 0, "affected_roles": [], "failed_roles": []})
    );
    let tools = listing(&server).await;
    assert_eq!(names_of(&tools["Lanlan"]), ["e1"]);
    assert_eq!(names_of(&tools["Mio"]), ["e1"]);
}

#[tokio::test]
async fn registrations_are_not_persisted_across_restart() {
    let mut server = spawn_app().await;
    register_ok(
        &server,
        json!({"name": "ephemeral", "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    assert_eq!(names_of(&listing(&server).await["Lanlan"]), ["ephemeral"]);
    server.restart().await;
    assert_eq!(listing(&server).await, json!({"Lanlan": []}));
}

// ---------------------------------------------------------------------------
// The callback contract, through POST /sessions/{id}/tool-calls.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn callback_outcomes_reach_the_model() {
    let refused = common::ports::dead_port();
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    let schema = json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]});
    let tools: Vec<(&str, String, Value)> = vec![
        ("echo", callbacks.url("/ok"), schema.clone()),
        ("get_weather", callbacks.url("/weather"), schema.clone()),
        (
            "tool_error",
            callbacks.url("/tool-error"),
            json!({"type": "object"}),
        ),
        (
            "http_500",
            callbacks.url("/status/500"),
            json!({"type": "object"}),
        ),
        (
            "http_404",
            callbacks.url("/status/404"),
            json!({"type": "object"}),
        ),
        (
            "http_204",
            callbacks.url("/status/204"),
            json!({"type": "object"}),
        ),
        ("text", callbacks.url("/text"), json!({"type": "object"})),
        (
            "any_json",
            callbacks.url("/any-json"),
            json!({"type": "object"}),
        ),
        (
            "bare_json",
            callbacks.url("/bare-json"),
            json!({"type": "object"}),
        ),
        (
            "redirect",
            callbacks.url("/redirect"),
            json!({"type": "object"}),
        ),
        (
            "refused",
            format!("http://127.0.0.1:{}/cb", refused.port),
            json!({"type": "object"}),
        ),
        (
            "via_localhost",
            format!("http://localhost:{}/weather", callbacks.addr.port()),
            schema.clone(),
        ),
    ];
    for (name, url, parameters) in &tools {
        register_ok(
            &server,
            json!({"name": name, "callback_url": url, "parameters": parameters, "source": "external"}),
        )
        .await;
    }

    // Success: the callback receives exactly {name, arguments, call_id, raw_arguments}.
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "get_weather", "arguments": {"location": "Shanghai"}, "call_id": "call_123"}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let data = &reply.body["data"];
    assert_eq!(data["call_id"], "call_123");
    assert_eq!(data["name"], "get_weather");
    assert_eq!(data["output"], json!({"temperature_c": 28}));
    assert_eq!(data["is_error"], false);
    let sent = callbacks.seen.for_path("/weather");
    assert_eq!(
        sent,
        vec![json!({
            "name": "get_weather",
            "arguments": {"location": "Shanghai"},
            "call_id": "call_123",
            "raw_arguments": "{\"location\":\"Shanghai\"}"
        })]
    );

    // A raw argument string is passed through untouched as raw_arguments.
    let raw = "{ \"location\" :  \"Shang\\u0068ai\" }";
    let data = call(&server, &session, "echo", json!(raw)).await;
    assert_eq!(data["is_error"], false, "{data}");
    assert_eq!(data["output"]["raw"], raw);
    assert_eq!(data["output"]["echo"], json!({"location": "Shanghai"}));
    assert!(data["output"]["call_id"].as_str().unwrap().len() > 4);

    // Arguments that fail the declared schema never reach the callback.
    let before = callbacks.seen.for_path("/ok").len();
    let data = call(&server, &session, "echo", json!({"location": 5})).await;
    assert_eq!(data["is_error"], true);
    assert_eq!(callbacks.seen.for_path("/ok").len(), before);

    // A tool-level error: is_error with the tool's message.
    let data = call(&server, &session, "tool_error", json!({})).await;
    assert_eq!(data["is_error"], true);
    assert_eq!(data["output"], "location not found");
    assert_eq!(callbacks.seen.for_path("/tool-error").len(), 1);

    // HTTP 5xx and 4xx: tool errors naming the status and the start of the body.
    for (name, code) in [("http_500", "500"), ("http_404", "404")] {
        let data = call(&server, &session, name, json!({})).await;
        assert_eq!(data["is_error"], true, "{data}");
        let message = text(&data["output"]);
        assert!(message.contains(code), "{message}");
        assert!(message.contains("upstream exploded"), "{message}");
    }
    // 2xx with an empty (non-JSON) body: empty text output.
    let data = call(&server, &session, "http_204", json!({})).await;
    assert_eq!(data["is_error"], false, "{data}");
    assert_eq!(data["output"], "");

    // A non-JSON body is passed through as text.
    let data = call(&server, &session, "text", json!({})).await;
    assert_eq!(data["is_error"], false);
    assert_eq!(data["output"], "plain text answer");

    // Any JSON value can come back through output.
    let data = call(&server, &session, "any_json", json!({})).await;
    assert_eq!(data["output"], json!([1, "two", {"three": 3}]));
    let data = call(&server, &session, "bare_json", json!({})).await;
    assert_eq!(data["output"], json!([1, 2, 3]));

    // Redirects are never followed.
    let before = callbacks.seen.for_path("/ok").len();
    let data = call(&server, &session, "redirect", json!({})).await;
    assert_eq!(data["is_error"], true, "{data}");
    assert!(text(&data["output"]).contains("redirect"), "{data}");
    assert_eq!(callbacks.seen.for_path("/ok").len(), before);

    // A connection failure is a model-visible tool error.
    let data = call(&server, &session, "refused", json!({})).await;
    assert_eq!(data["is_error"], true);
    assert!(text(&data["output"]).contains("connect"), "{data}");

    // localhost is resolved (to loopback) and works.
    let data = call(&server, &session, "via_localhost", json!({"location": "x"})).await;
    assert_eq!(data["is_error"], false, "{data}");
    assert_eq!(data["output"], json!({"temperature_c": 28}));
}

#[tokio::test]
async fn a_slow_callback_times_out_after_its_timeout_seconds() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    register_ok(
        &server,
        json!({"name": "slow", "callback_url": callbacks.url("/slow"), "timeout_seconds": 0.5}),
    )
    .await;
    let started = Instant::now();
    let data = call(&server, &session, "slow", json!({})).await;
    let elapsed = started.elapsed();
    assert_eq!(data["is_error"], true, "{data}");
    assert_eq!(data["status"], "timeout", "{data}");
    assert!(text(&data["output"]).contains("0.5"), "{data}");
    assert!(
        elapsed >= Duration::from_millis(450) && elapsed < Duration::from_secs(10),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn callback_responses_are_capped_at_1_mib_by_default() {
    let server = spawn_app().await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    let limit = 1024 * 1024;
    for (name, path) in [
        ("fits", format!("/sized/{limit}")),
        ("too_big", format!("/sized/{}", limit + 1)),
        ("streamed_too_big", format!("/streamed/{}", 2 * limit)),
    ] {
        register_ok(
            &server,
            json!({"name": name, "callback_url": callbacks.url(&path)}),
        )
        .await;
    }
    let data = call(&server, &session, "fits", json!({})).await;
    assert_eq!(data["is_error"], false);
    assert_eq!(data["output"].as_str().unwrap().len(), limit - 2);
    for name in ["too_big", "streamed_too_big"] {
        let data = call(&server, &session, name, json!({})).await;
        assert_eq!(data["is_error"], true, "{name}");
        assert!(text(&data["output"]).contains("1048576"), "{data}");
    }
}

#[tokio::test]
async fn the_callback_response_cap_is_configurable() {
    let server = spawn_with(SpawnOptions {
        env: vec![(
            "TOOLGATE_CALLBACK_RESPONSE_LIMIT_BYTES".into(),
            "1000".into(),
        )],
        ..Default::default()
    })
    .await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    for (name, path) in [
        ("fits", "/sized/1000"),
        ("too_big", "/sized/1001"),
        ("streamed_fits", "/streamed/1000"),
        ("streamed_too_big", "/streamed/1001"),
    ] {
        register_ok(
            &server,
            json!({"name": name, "callback_url": callbacks.url(path)}),
        )
        .await;
    }
    for name in ["fits", "streamed_fits"] {
        let data = call(&server, &session, name, json!({})).await;
        assert_eq!(data["is_error"], false, "{name}: {data}");
    }
    for name in ["too_big", "streamed_too_big"] {
        let data = call(&server, &session, name, json!({})).await;
        assert_eq!(data["is_error"], true, "{name}: {data}");
        assert!(text(&data["output"]).contains("1000 bytes"), "{data}");
    }
}

// ---------------------------------------------------------------------------
// Plugin eviction.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn three_connection_failures_evict_only_that_plugin_origin() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    let callbacks = start_callbacks().await;
    let session = server.create_session().await;
    let (dead_one, dead_two) = (common::ports::dead_port(), common::ports::dead_port());
    let dead = format!("http://127.0.0.1:{}", dead_one.port);
    let other_dead = format!("http://127.0.0.1:{}", dead_two.port);
    let register_as = |name: &'static str, url: String, source: &'static str, role: Value| {
        let server = &server;
        async move {
            register_ok(
                server,
                json!({"name": name, "callback_url": url, "source": source, "role": role}),
            )
            .await;
        }
    };
    // Two tools of plugin:p at the dead origin (one on both roles, one on Mio).
    register_as("p_dead_a", format!("{dead}/a"), "plugin:p", Value::Null).await;
    register_as("p_dead_b", format!("{dead}/b"), "plugin:p", json!("Mio")).await;
    // Same plugin, a live origin: stays.
    register_as("p_live", callbacks.url("/weather"), "plugin:p", Value::Null).await;
    // Same dead origin, but not a plugin source: never evicted.
    register_as("ext_dead", format!("{dead}/c"), "external", Value::Null).await;
    // Same dead origin, another plugin: its own counter.
    register_as("q_dead", format!("{dead}/d"), "plugin:q", Value::Null).await;
    // Another dead origin of plugin:p: its own counter.
    register_as(
        "p_other_dead",
        format!("{other_dead}/e"),
        "plugin:p",
        Value::Null,
    )
    .await;

    let mut events = Events::open(&server, &session).await;

    // A non-plugin source never counts, however often it fails.
    for _ in 0..4 {
        let data = call(&server, &session, "ext_dead", json!({})).await;
        assert_eq!(data["is_error"], true);
    }
    // One failure each on plugin:q and the other origin: below the threshold.
    call(&server, &session, "q_dead", json!({})).await;
    call(&server, &session, "p_other_dead", json!({})).await;
    // Two failures on plugin:p at the dead origin: still registered.
    for _ in 0..2 {
        let data = call(&server, &session, "p_dead_a", json!({})).await;
        assert_eq!(data["is_error"], true);
    }
    assert!(names_of(&listing(&server).await["Lanlan"]).contains(&"p_dead_a".to_owned()));
    // The third consecutive failure evicts that origin's plugin:p tools everywhere.
    let data = call(&server, &session, "p_dead_a", json!({})).await;
    assert_eq!(data["is_error"], true);
    assert!(text(&data["output"]).contains("unregistered"), "{data}");

    // The live model session was synchronised before the call returned.
    let changed = events.changed().await;
    assert_eq!(changed["role"], "Lanlan");
    assert_eq!(strings(&changed["removed"]), ["p_dead_a"]);
    assert_eq!(changed["accepted"], true);
    assert!(!strings(&changed["tools"]).contains(&"p_dead_a".to_owned()));

    let tools = listing(&server).await;
    assert_eq!(
        names_of(&tools["Lanlan"]),
        ["ext_dead", "p_live", "p_other_dead", "q_dead"]
    );
    assert_eq!(
        names_of(&tools["Mio"]),
        ["ext_dead", "p_live", "p_other_dead", "q_dead"]
    );
    let data = call(&server, &session, "p_dead_a", json!({})).await;
    assert!(text(&data["output"]).contains("unknown tool"), "{data}");
    let data = call(&server, &session, "p_live", json!({})).await;
    assert_eq!(data["is_error"], false);
    // One log line for the eviction, not one per character that held the tools.
    let log = server
        .log_containing("evicted plugin tools after repeated connection failures")
        .await;
    assert_eq!(
        log.matches("evicted plugin tools after repeated connection failures")
            .count(),
        1,
        "{log}"
    );
}

/// A callback server that can be taken down and brought back on the same port.
struct Flaky {
    port: u16,
    mode: Arc<Mutex<&'static str>>,
    task: Option<JoinHandle<()>>,
}

impl Flaky {
    async fn new() -> Self {
        Self {
            port: free_port().await,
            mode: Arc::new(Mutex::new("ok")),
            task: None,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/cb", self.port)
    }

    async fn up(&mut self, mode: &'static str) {
        self.down().await;
        *self.mode.lock().unwrap() = mode;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], self.port)))
            .unwrap();
        let listener = socket.listen(128).unwrap();
        let mode = self.mode.clone();
        let app = Router::new().route(
            "/cb",
            post(move || {
                let mode = *mode.lock().unwrap();
                async move {
                    let mut response = match mode {
                        "ok" => axum::Json(json!({"output": "fine"})).into_response(),
                        "500" => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
                        "tool_error" => {
                            axum::Json(json!({"error": "nope", "is_error": true})).into_response()
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_secs(20)).await;
                            "late".into_response()
                        }
                    };
                    // No pooled connections: when the server goes down, the next
                    // call must really fail to connect.
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    response
                }
            }),
        );
        self.task = Some(tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        }));
    }

    async fn down(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

#[tokio::test]
async fn any_http_answer_or_read_timeout_resets_the_failure_streak() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut flaky = Flaky::new().await;
    register_ok(
        &server,
        json!({"name": "flaky", "callback_url": flaky.url(), "source": "plugin:flaky", "timeout_seconds": 0.5}),
    )
    .await;
    let still_registered = || async { names_of(&listing(&server).await["Lanlan"]) == ["flaky"] };
    // Each round: two connection failures, then an answer of some kind, which
    // must reset the streak (otherwise the next failure would be the third).
    for answer in ["ok", "500", "tool_error", "slow"] {
        flaky.down().await;
        for _ in 0..2 {
            let data = call(&server, &session, "flaky", json!({})).await;
            assert_eq!(data["is_error"], true, "{data}");
            assert!(text(&data["output"]).contains("connect"), "{data}");
        }
        assert!(still_registered().await, "evicted before the third failure");
        flaky.up(answer).await;
        let data = call(&server, &session, "flaky", json!({})).await;
        match answer {
            "ok" => assert_eq!(data["is_error"], false, "{data}"),
            "slow" => assert_eq!(data["status"], "timeout", "{data}"),
            _ => assert_eq!(data["is_error"], true, "{data}"),
        }
        flaky.down().await;
        let data = call(&server, &session, "flaky", json!({})).await;
        assert!(text(&data["output"]).contains("connect"), "{data}");
        assert!(
            still_registered().await,
            "a {answer} answer should have reset the streak"
        );
        // Bring it back once more so the next round starts from zero.
        flaky.up("ok").await;
        let data = call(&server, &session, "flaky", json!({})).await;
        assert_eq!(data["is_error"], false, "{data}");
    }
    // Finally three in a row evict it.
    flaky.down().await;
    for _ in 0..3 {
        call(&server, &session, "flaky", json!({})).await;
    }
    assert_eq!(listing(&server).await["Lanlan"], json!([]));
}

// ---------------------------------------------------------------------------
// Model sessions and synchronisation.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_event_stream_needs_the_sessions_own_account() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let url = server.url(&format!("/sessions/{session}/events"));
    let reply = read_reply(server.client.get(&url).send().await.unwrap()).await;
    assert_eq!(reply.status, 401, "{reply:?}");
    let other = server.create_account("stranger").await;
    let reply = read_reply(
        server
            .client
            .get(&url)
            .bearer_auth(&other)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, 404, "{reply:?}");
    let reply = server.get("/sessions/sess_missing/events").await;
    assert_eq!(reply.status, 404, "{reply:?}");
}

#[tokio::test]
async fn live_sessions_receive_every_catalog_change_before_the_response() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    let lanlan_session = server.create_session().await;
    let reply = server.post("/sessions", json!({"character": "Mio"})).await;
    let mio_session = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let mut lanlan = Events::open(&server, &lanlan_session).await;
    let mut mio = Events::open(&server, &mio_session).await;

    register_ok(
        &server,
        json!({"name": "get_weather", "callback_url": "http://127.0.0.1:9/x", "source": "plugin:w"}),
    )
    .await;
    for events in [&mut lanlan, &mut mio] {
        let changed = events.changed().await;
        assert_eq!(strings(&changed["added"]), ["get_weather"]);
        assert_eq!(changed["accepted"], true);
        assert!(strings(&changed["tools"]).contains(&"get_weather".to_owned()));
    }
    lanlan.assert_nothing_pending(&server, "Lanlan").await;

    // A role-scoped change reaches only that role's sessions.
    register_ok(
        &server,
        json!({"name": "get_weather", "callback_url": "http://127.0.0.1:9/y", "role": "Mio", "source": "plugin:w"}),
    )
    .await;
    let changed = mio.changed().await;
    assert_eq!(changed["role"], "Mio");
    assert_eq!(strings(&changed["updated"]), ["get_weather"]);
    assert_eq!(strings(&changed["added"]), Vec::<String>::new());

    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "get_weather", "role": "Lanlan"}),
    )
    .await;
    assert_eq!(reply.body["affected_roles"], json!(["Lanlan"]));
    let changed = lanlan.changed().await;
    assert_eq!(strings(&changed["removed"]), ["get_weather"]);
    assert!(!strings(&changed["tools"]).contains(&"get_weather".to_owned()));

    let reply = api_post(&server, "/api/tools/clear", json!({"source": "plugin:w"})).await;
    assert_eq!(reply.body["removed"], 1);
    assert_eq!(reply.body["affected_roles"], json!(["Mio"]));
    let changed = mio.changed().await;
    assert_eq!(strings(&changed["removed"]), ["get_weather"]);

    // Both streams are still in step: nothing else was queued for Lanlan.
    lanlan.assert_nothing_pending(&server, "Lanlan").await;
}

impl Events {
    /// Proves no event is pending for this stream: a marker registered on its
    /// role must produce the very next event.
    async fn assert_nothing_pending(&mut self, server: &TestServer, role: &str) {
        register_ok(
            server,
            json!({"name": "zz_marker", "callback_url": "http://127.0.0.1:9/m", "role": role}),
        )
        .await;
        let next = self.changed().await;
        assert_eq!(
            strings(&next["added"]),
            ["zz_marker"],
            "unexpected pending event: {next}"
        );
        let reply = api_post(
            server,
            "/api/tools/unregister",
            json!({"name": "zz_marker", "role": role}),
        )
        .await;
        assert_eq!(reply.body["removed"], true);
        let removed = self.changed().await;
        assert_eq!(strings(&removed["removed"]), ["zz_marker"]);
    }
}

#[tokio::test]
async fn a_session_rejecting_the_catalog_makes_a_partial_success() {
    let server = spawn_app().await;
    create_character(&server, "Mio").await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;

    // Valid for the registry (1-64 characters), invalid for the OpenAI-compatible
    // provider of Lanlan's live model session.
    let reply = register(
        &server,
        json!({"name": "get.weather", "callback_url": "http://127.0.0.1:9/x", "role": null}),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body["ok"], true, "partial success keeps ok: true");
    assert_eq!(reply.body["registered"], "get.weather");
    assert_eq!(reply.body["affected_roles"], json!(["Mio"]));
    let failed = reply.body["failed_roles"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{reply:?}");
    assert_eq!(failed[0]["role"], "Lanlan");
    assert!(
        text(&failed[0]["error"]).contains("get.weather"),
        "{failed:?}"
    );
    let changed = events.changed().await;
    assert_eq!(changed["accepted"], false);
    assert!(text(&changed["error"]).contains("get.weather"));
    assert!(!strings(&changed["tools"]).contains(&"get.weather".to_owned()));
    // The registration itself stays.
    let tools = listing(&server).await;
    assert_eq!(names_of(&tools["Lanlan"]), ["get.weather"]);
    assert_eq!(names_of(&tools["Mio"]), ["get.weather"]);

    // When no role accepts, ok is false (and it still stays registered).
    let reply = register(
        &server,
        json!({"name": "get.weather", "description": "again", "callback_url": "http://127.0.0.1:9/x", "role": "Lanlan"}),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["ok"], false, "{reply:?}");
    assert_eq!(reply.body["affected_roles"], json!([]));
    assert_eq!(reply.body["failed_roles"][0]["role"], "Lanlan");
    events.changed().await;
    assert_eq!(listing(&server).await["Lanlan"][0]["description"], "again");

    // Once the offending name is gone, the session takes the catalog again.
    let reply = api_post(
        &server,
        "/api/tools/unregister",
        json!({"name": "get.weather"}),
    )
    .await;
    assert_eq!(reply.body["ok"], true);
    assert_eq!(reply.body["affected_roles"], json!(["Lanlan", "Mio"]));
    let changed = events.changed().await;
    assert_eq!(changed["accepted"], true);
    register_ok(
        &server,
        json!({"name": "get_weather", "callback_url": "http://127.0.0.1:9/x", "role": "Lanlan"}),
    )
    .await;
    let changed = events.changed().await;
    assert_eq!(changed["accepted"], true);
    assert!(strings(&changed["tools"]).contains(&"get_weather".to_owned()));

    // With the stream closed there is no live model session left to refuse.
    drop(events);
    let server = &server;
    common::wait_until(
        Duration::from_secs(10),
        "the closed stream to end its model session",
        move || async move {
            let reply = register(
                server,
                json!({"name": "get.weather", "callback_url": "http://127.0.0.1:9/x", "role": "Lanlan"}),
            )
            .await;
            reply.body["ok"] == true && reply.body["failed_roles"] == json!([])
        },
    )
    .await;
}

#[tokio::test]
async fn a_session_refuses_a_catalog_of_more_than_128_tools() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let mut last_accepted: Vec<String> = Vec::new();
    let mut refusal = None;
    for i in 0..200 {
        let reply = register(
            &server,
            json!({"name": format!("tool_{i:03}"), "callback_url": "http://127.0.0.1:9/x", "role": "Lanlan"}),
        )
        .await;
        let changed = events.changed().await;
        if reply.body["ok"] == false {
            refusal = Some((reply.body.clone(), changed));
            break;
        }
        last_accepted = strings(&changed["tools"]);
    }
    let (reply, changed) = refusal.expect("a catalog over 128 tools must be refused");
    assert_eq!(
        last_accepted.len(),
        128,
        "the last accepted catalog is full"
    );
    assert!(
        text(&reply["failed_roles"][0]["error"]).contains("128"),
        "{reply}"
    );
    assert_eq!(changed["accepted"], false);
    assert_eq!(strings(&changed["tools"]), last_accepted);
}

#[tokio::test]
async fn a_stream_opens_with_the_current_catalog_and_ends_at_shutdown() {
    let mut server = spawn_app().await;
    let session = server.create_session().await;
    register_ok(
        &server,
        json!({"name": "get_weather", "callback_url": "http://127.0.0.1:9/x"}),
    )
    .await;
    let mut events = Events::open(&server, &session).await;
    assert_eq!(events.ready["session_id"], session.as_str());
    assert_eq!(events.ready["role"], "Lanlan");
    assert_eq!(events.ready["accepted"], true);
    assert!(strings(&events.ready["tools"]).contains(&"get_weather".to_owned()));

    // An open stream must not keep the server from shutting down.
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.response.chunk().await {
                Ok(Some(_)) => continue,
                _ => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the event stream did not end");
}

// ---------------------------------------------------------------------------
// Concurrency.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_mutations_and_calls_stay_consistent() {
    let server = Arc::new(spawn_app().await);
    create_character(&server, "Mio").await;
    let callbacks = Arc::new(start_callbacks().await);
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    let names = ["n0", "n1", "n2", "n3", "n4"];
    let roles = [Value::Null, json!("Lanlan"), json!("Mio")];

    let mut tasks = Vec::new();
    for i in 0..200usize {
        let server = server.clone();
        let callbacks = callbacks.clone();
        let session = session.clone();
        let name = names[i % names.len()];
        let role = roles[(i * 7) % roles.len()].clone();
        tasks.push(tokio::spawn(async move {
            match i % 4 {
                0 | 1 => {
                    let tag = format!("v{i}");
                    let reply = register(
                        &server,
                        json!({"name": name, "description": tag,
                               "callback_url": callbacks.url(&format!("/versioned/{tag}")),
                               "role": role, "source": "plugin:storm"}),
                    )
                    .await;
                    ("register", reply)
                }
                2 => {
                    let reply = api_post(
                        &server,
                        "/api/tools/unregister",
                        json!({"name": name, "role": role}),
                    )
                    .await;
                    ("unregister", reply)
                }
                _ => {
                    let reply = server
                        .post(
                            &format!("/sessions/{session}/tool-calls"),
                            json!({"name": name, "arguments": {}}),
                        )
                        .await;
                    ("call", reply)
                }
            }
        }));
    }
    let results = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(tasks))
        .await
        .expect("200 concurrent requests must finish (no deadlock)");

    let mut lanlan_changes = 0;
    for result in results {
        let (kind, reply) = result.expect("task");
        assert_eq!(reply.status, 200, "{kind}: {reply:?}");
        match kind {
            "call" => {
                let data = &reply.body["data"];
                if data["is_error"] == false {
                    assert!(text(&data["output"]).starts_with('v'), "{data}");
                } else {
                    assert!(text(&data["output"]).contains("unknown tool"), "{data}");
                }
            }
            _ => {
                assert_eq!(reply.body["failed_roles"], json!([]), "{reply:?}");
                if reply.body["affected_roles"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("Lanlan"))
                {
                    lanlan_changes += 1;
                }
            }
        }
    }

    // Every registry holds each name at most once, each entry whole (description
    // and callback from the same registration).
    let tools = listing(&server).await;
    let mut lanlan_names = BTreeSet::new();
    for (role, list) in tools.as_object().unwrap() {
        let listed = names_of(list);
        let unique: BTreeSet<&String> = listed.iter().collect();
        assert_eq!(unique.len(), listed.len(), "{role}: {listed:?}");
        for tool in list.as_array().unwrap() {
            let tag = text(&tool["description"]);
            assert!(
                text(&tool["callback_url"]).ends_with(&format!("/versioned/{tag}")),
                "{tool}"
            );
            if role == "Lanlan" {
                lanlan_names.insert(tool["name"].as_str().unwrap().to_owned());
            }
        }
    }
    // The dispatcher agrees with the registry: listed names answer with their
    // own registration's tag, unlisted ones are unknown.
    let by_name: BTreeMap<String, String> = tools["Lanlan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                text(&t["name"]).to_owned(),
                text(&t["description"]).to_owned(),
            )
        })
        .collect();
    for name in names {
        let data = call(&server, &session, name, json!({})).await;
        match by_name.get(name) {
            Some(tag) => assert_eq!(data["output"], json!(tag), "{name}"),
            None => assert!(text(&data["output"]).contains("unknown tool"), "{data}"),
        }
    }
    // The live model session saw exactly one event per change of its role, and
    // the last catalog it took is the registry's final state.
    let mut last = None;
    for _ in 0..lanlan_changes {
        last = Some(events.changed().await);
    }
    if let Some(last) = last {
        let taken: BTreeSet<String> = strings(&last["tools"])
            .into_iter()
            .filter(|name| names.contains(&name.as_str()))
            .collect();
        assert_eq!(taken, lanlan_names);
    }
    events.assert_nothing_pending(&server, "Lanlan").await;
}

// ---------------------------------------------------------------------------
// The routes are documented.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn openapi_lists_the_runtime_tools_routes() {
    let server = spawn_app().await;
    let reply = server.get("/openapi.json").await;
    assert_eq!(reply.status, 200);
    let paths = &reply.body["paths"];
    for (path, method) in [
        ("/api/tools/register", "post"),
        ("/api/tools/unregister", "post"),
        ("/api/tools/clear", "post"),
        ("/api/tools", "get"),
        ("/sessions/{id}/events", "get"),
    ] {
        assert!(paths[path][method].is_object(), "{path} {method} missing");
    }
}

#[tokio::test]
async fn a_callback_outage_is_one_log_line_and_so_is_its_end() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let dead = common::ports::dead_port();
    let port = dead.port;
    register_ok(
        &server,
        json!({"name": "flaky", "callback_url": dead.url("/cb"), "source": "external"}),
    )
    .await;
    for _ in 0..3 {
        let data = call(&server, &session, "flaky", json!({})).await;
        assert_eq!(data["is_error"], true, "{data}");
    }
    let stopped = "a callback origin stopped accepting connections";
    let log = server.log_containing(stopped).await;
    assert_eq!(log.matches(stopped).count(), 1, "{log}");
    // The plugin comes back on the same port.
    drop(dead);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the freed port");
    let app = Router::new().route(
        "/cb",
        post(|| async { axum::Json(json!({"output": "back"})) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let data = call(&server, &session, "flaky", json!({})).await;
    assert_eq!(data["is_error"], false, "{data}");
    server
        .log_containing("a callback origin answers again")
        .await;
}

#[tokio::test]
async fn a_callback_urls_path_stays_out_of_the_log_and_of_refusals() {
    // Plugins put a secret token in the path (the Python SDK does).
    let server = spawn_app().await;
    let kept = "tok_kept_0f3a9c";
    register_ok(
        &server,
        json!({"name": "tokened", "callback_url": format!("http://127.0.0.1:9/{kept}/tools/tokened")}),
    )
    .await;
    let refused_token = "tok_refused_77b1e2";
    for url in [
        format!("http://10.0.0.1:9/{refused_token}/tools/x"),
        format!("ftp://127.0.0.1:9/{refused_token}/tools/x"),
        format!("http://user:pw@127.0.0.1:9/{refused_token}"),
        format!("http://127.0.0.1:0/{refused_token}"),
    ] {
        let reply = register(&server, json!({"name": "refused", "callback_url": url})).await;
        assert_eq!(reply.status, 422, "{reply:?}");
        assert!(reply.text.contains("callback_url"), "{reply:?}");
        assert!(!reply.text.contains(refused_token), "{reply:?}");
    }
    let log = server.log_containing("remote tool registered").await;
    assert!(log.contains("callback_origin=http://127.0.0.1:9"), "{log}");
    assert!(!log.contains(kept) && !log.contains(refused_token), "{log}");
}
