//! `execution_reason_code` through the real binary: every failure path of every
//! provider, and every refusal of the dispatcher, answers the call with its
//! stable code and journals the same code on the call's row; a success carries
//! null. (Refusals by permission rule, the replay guard, the step limit, jobs
//! and restarts are checked where those paths are driven: catalog_permissions,
//! jobs_replay, call_path, schema_limits, script_sandbox, tool_definitions.)

mod common;

use axum::Json;
use axum::http::{StatusCode as AxumStatus, header};
use axum::response::IntoResponse;
use axum::routing::post;
use common::{SpawnOptions, TestServer, spawn_app, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The callback response limit the remote test's server runs with.
const RESPONSE_LIMIT: usize = 1024;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// Makes a call and returns its answer and its journal row.
async fn call_and_row(server: &TestServer, session: &str, body: Value) -> (Value, Value) {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let result = reply.body["data"].clone();
    let id = result["execution_id"].as_str().expect("execution_id");
    let row = server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(row.status, StatusCode::OK, "{row:?}");
    (result, row.body["data"].clone())
}

/// The call answered and was journalled with `status` and `code` (null for a
/// success), and is an error exactly when it has a code.
fn assert_outcome(what: &str, (result, row): &(Value, Value), status: &str, code: Option<&str>) {
    let code = code.map_or(Value::Null, Value::from);
    assert_eq!(result["status"], status, "{what}: {result}");
    assert_eq!(result["execution_reason_code"], code, "{what}: {result}");
    assert_eq!(result["is_error"], !code.is_null(), "{what}: {result}");
    assert_eq!(row["status"], status, "{what}: {row}");
    assert_eq!(row["execution_reason_code"], code, "{what}: {row}");
}

// ---------------------------------------------------------------------------
// Callback servers.
// ---------------------------------------------------------------------------

/// An HTTP callback server with one route per way of answering.
async fn start_callbacks() -> String {
    let app = axum::Router::new()
        .route(
            "/ok",
            post(|| async { Json(json!({"output": {"fine": true}, "is_error": false})) }),
        )
        .route(
            "/tool_error",
            post(|| async { Json(json!({"error": "location not found", "is_error": true})) }),
        )
        .route(
            "/garbled",
            post(|| async { Json(json!({"error": "maybe", "is_error": "yes"})) }),
        )
        .route(
            "/server_error",
            post(|| async { (AxumStatus::INTERNAL_SERVER_ERROR, "the plugin broke") }),
        )
        .route(
            "/redirect",
            post(|| async {
                (
                    AxumStatus::TEMPORARY_REDIRECT,
                    [(header::LOCATION, "http://127.0.0.1:9/elsewhere")],
                )
                    .into_response()
            }),
        )
        .route(
            "/big",
            post(|| async { Json(json!({"output": "x".repeat(RESPONSE_LIMIT * 4)})) }),
        )
        .route(
            "/hang",
            post(|| async {
                std::future::pending::<()>().await;
                Json(json!({"output": "never"}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// How a raw callback server misbehaves once it has read a whole request.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// Closes the connection without answering.
    Drop,
    /// Answers a head promising a body, sends part of it and closes.
    CutShort,
}

/// A callback server below HTTP, for the failures a well-behaved one cannot
/// produce; returns its callback URL.
async fn start_raw_callback(how: Misbehaviour) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/cb", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                // The whole request is read first, so that closing the socket
                // sends an orderly end rather than a reset that could destroy
                // what was written before it.
                if read_request(&mut stream).await.is_none() {
                    return;
                }
                if let Misbehaviour::CutShort = how {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"output\":";
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.flush().await;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    url
}

/// Reads one HTTP request (head and `content-length` body).
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Some(())
}

// ---------------------------------------------------------------------------
// Remote callbacks.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn every_remote_callback_failure_has_its_code() {
    let server = spawn_with(SpawnOptions {
        env: vec![(
            "TOOLGATE_CALLBACK_RESPONSE_LIMIT_BYTES".into(),
            RESPONSE_LIMIT.to_string(),
        )],
        ..Default::default()
    })
    .await;
    let base = start_callbacks().await;
    let dropped = start_raw_callback(Misbehaviour::Drop).await;
    let cut_short = start_raw_callback(Misbehaviour::CutShort).await;
    let refused = common::ports::dead_port();
    let unreachable = refused.url("/cb");
    let tools = [
        ("fine", format!("{base}/ok"), "none"),
        ("fails", format!("{base}/tool_error"), "none"),
        ("garbles", format!("{base}/garbled"), "none"),
        ("breaks", format!("{base}/server_error"), "none"),
        ("moves", format!("{base}/redirect"), "none"),
        ("floods", format!("{base}/big"), "none"),
        ("peeks", format!("{base}/hang"), "none"),
        ("posts", format!("{base}/hang"), "irreversible"),
        ("hangs_up", dropped, "none"),
        ("trails_off", cut_short, "none"),
        ("is_gone", unreachable, "none"),
    ];
    for (name, url, level) in &tools {
        common::register_remote(
            &server,
            json!({"name": name, "callback_url": url, "timeout_seconds": 0.5,
                   "side_effect_level": level}),
        )
        .await;
    }
    let session = server.create_session().await;
    let call = |name: &str| json!({"name": name, "arguments": {}});

    // An irreversible tool is refused before its callback is tried.
    let refused = call_and_row(&server, &session, call("posts")).await;
    let code = Some("permission_irreversible_not_allowed");
    assert_outcome("posts, not allowed", &refused, "denied", code);
    server
        .set_permissions(&session, json!({"allow_irreversible": true}))
        .await;

    let expected = [
        ("fine", "success", None),
        ("fails", "error", Some("remote_tool_error")),
        ("garbles", "error", Some("remote_invalid_answer")),
        ("breaks", "error", Some("remote_http_error")),
        ("moves", "error", Some("remote_redirect_refused")),
        ("floods", "error", Some("remote_response_too_large")),
        ("peeks", "timeout", Some("remote_timeout")),
        ("posts", "uncertain", Some("remote_timeout_uncertain")),
        ("hangs_up", "error", Some("remote_request_failed")),
        ("trails_off", "error", Some("remote_response_interrupted")),
        ("is_gone", "error", Some("remote_connection_failed")),
    ];
    for (name, status, code) in expected {
        let outcome = call_and_row(&server, &session, call(name)).await;
        assert_outcome(name, &outcome, status, code);
    }
    // The tool's own error text is what the model sees.
    let (result, row) = call_and_row(&server, &session, call("fails")).await;
    assert_eq!(result["output"], "location not found");
    assert_eq!(row["error_message"], "location not found");
    assert_eq!(row["provider_started"], true);
    let (_, row) = call_and_row(&server, &session, call("is_gone")).await;
    assert_eq!(row["provider_started"], false, "{row}");
}

#[tokio::test]
async fn the_connection_failure_that_evicts_a_plugin_says_so() {
    let server = spawn_app().await;
    let refused = common::ports::dead_port();
    let url = refused.url("/cb");
    common::register_remote(
        &server,
        json!({"name": "weather", "callback_url": url, "source": "plugin:weather"}),
    )
    .await;
    let session = server.create_session().await;
    let call = json!({"name": "weather", "arguments": {}});
    for attempt in 1..=2 {
        let outcome = call_and_row(&server, &session, call.clone()).await;
        let what = format!("attempt {attempt}");
        assert_outcome(&what, &outcome, "error", Some("remote_connection_failed"));
    }
    let third = call_and_row(&server, &session, call.clone()).await;
    assert_outcome("third", &third, "error", Some("remote_plugin_evicted"));
    assert!(
        third.0["output"].as_str().unwrap().contains("unregistered"),
        "{}",
        third.0
    );
    // The evicted tool is gone from the catalog.
    let gone = call_and_row(&server, &session, call).await;
    assert_outcome("after eviction", &gone, "denied", Some("tool_not_found"));
}

// ---------------------------------------------------------------------------
// Script handlers.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn every_script_failure_has_its_code() {
    let server = spawn_with(SpawnOptions {
        env: vec![
            ("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into()),
            ("TOOLGATE_SCRIPT_TIMEOUT_MS".into(), "300".into()),
        ],
        ..Default::default()
    })
    .await;
    let session = server.create_session().await;
    let scripts = [
        ("returns", "return args.n + 1;", "success", None),
        (
            "throws",
            "throw new Error('boom');",
            "error",
            Some("script_threw"),
        ),
        (
            "rejects",
            "return Promise.reject(new Error('no'));",
            "error",
            Some("script_promise_rejected"),
        ),
        (
            "waits_forever",
            "return new Promise(() => {});",
            "error",
            Some("script_never_settled"),
        ),
        (
            "loops",
            "while (true) {}",
            "timeout",
            Some("script_time_limit"),
        ),
        (
            "hoards",
            // Buffers of a MiB each: a few allocations reach the heap limit
            // well inside the 300 ms time limit even on a loaded machine
            // (filling arrays element by element in a debug build sometimes
            // ran out of time first).
            "const a = []; while (true) a.push(new Uint8Array(1 << 20));",
            "error",
            Some("script_memory_limit"),
        ),
        (
            "recurses",
            "function f() { return f() + 1; } return f();",
            "error",
            Some("script_stack_limit"),
        ),
        (
            "floods",
            "return 'x'.repeat(2 * 1024 * 1024);",
            "error",
            Some("script_output_limit"),
        ),
        (
            "vanishes",
            "return undefined;",
            "error",
            Some("script_result_not_serializable"),
        ),
        // The body closes the function early and leaves an object last, so
        // the whole is no function.
        ("unbalanced", "}, 1, {", "error", Some("script_invalid")),
    ];
    for (name, script, _, _) in &scripts {
        let reply = server
            .post(
                "/tools/definitions",
                json!({"name": name, "handler_type": "script", "handler": {"script": script}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{name}: {reply:?}");
    }
    for (name, _, status, code) in scripts {
        let body = json!({"name": name, "arguments": {"n": 1}});
        let outcome = call_and_row(&server, &session, body).await;
        assert_outcome(name, &outcome, status, code);
    }
}

// ---------------------------------------------------------------------------
// Refusals by the dispatcher and builtin errors.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn refusals_and_builtin_errors_have_their_codes() {
    let server = spawn_app().await;
    let base = start_callbacks().await;
    // A remote tool named like a builtin: both conflict.
    common::register_remote(
        &server,
        json!({"name": "roll_dice", "callback_url": format!("{base}/ok")}),
    )
    .await;
    let session = server.create_session().await;
    let cases = [
        (
            "unknown tool",
            json!({"name": "summon_demon"}),
            "denied",
            Some("tool_not_found"),
        ),
        (
            "name conflict",
            json!({"name": "roll_dice"}),
            "denied",
            Some("tool_name_conflict"),
        ),
        (
            "arguments not JSON",
            json!({"name": "get_time", "arguments": "{not json"}),
            "error",
            Some("validation_error"),
        ),
        (
            "arguments against the schema",
            json!({"name": "get_time", "arguments": {"utc_offset": 8}}),
            "error",
            Some("validation_error"),
        ),
        (
            "builtin success",
            json!({"name": "get_time", "arguments": {"utc_offset": "+08:00"}}),
            "success",
            None,
        ),
        (
            "builtin refusing its input",
            json!({"name": "random_choice", "arguments": {"options": ["tea"], "count": 2}}),
            "error",
            Some("builtin_tool_error"),
        ),
        (
            "builtin missing a thing",
            json!({"name": "read_resource", "arguments": {"name": "nothing_here"}}),
            "error",
            Some("builtin_tool_error"),
        ),
    ];
    for (what, body, status, code) in cases {
        let outcome = call_and_row(&server, &session, body).await;
        assert_outcome(what, &outcome, status, code);
    }

    // The call budget of a floor.
    server
        .set_permissions(&session, json!({"max_calls_per_turn": 1}))
        .await;
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hi"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let floor = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let body = json!({"name": "get_time", "floor_id": floor});
    let first = call_and_row(&server, &session, body.clone()).await;
    assert_outcome("within the budget", &first, "success", None);
    let second = call_and_row(&server, &session, body).await;
    let code = Some("permission_max_calls_per_turn_exceeded");
    assert_outcome("over the budget", &second, "denied", code);
}

// ---------------------------------------------------------------------------
// The published vocabulary.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_openapi_document_publishes_the_reason_codes() {
    let server = spawn_app().await;
    let doc = server.get_without_key("/openapi.json").await.body;
    let schemas = &doc["components"]["schemas"];
    let codes: Vec<&str> = schemas["ReasonCode"]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("no ReasonCode enum: {}", schemas["ReasonCode"]))
        .iter()
        .map(|code| code.as_str().unwrap())
        .collect();
    for code in [
        "tool_not_found",
        "remote_timeout_uncertain",
        "script_time_limit",
        "builtin_tool_error",
        "mcp_not_connected",
        "mcp_call_timeout_uncertain",
        "job_lease_lost",
        "interrupted_by_restart",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
    for schema in ["ExecutionRecord", "ToolCallResult", "Delivery"] {
        let property = &schemas[schema]["properties"]["execution_reason_code"];
        assert!(
            property
                .to_string()
                .contains("#/components/schemas/ReasonCode"),
            "{schema}.execution_reason_code: {property}"
        );
    }
    // The call route documents what it answers.
    let call = &doc["paths"]["/sessions/{id}/tool-calls"]["post"]["responses"]["200"];
    assert!(
        call.to_string().contains("ToolCallResult"),
        "the tool-call answer is not described: {call}"
    );
    // Every code's meaning is in the document.
    let described = schemas["ReasonCode"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(
        described.contains("mcp_call_timeout_uncertain") && described.contains("uncertain"),
        "{described}"
    );
}
