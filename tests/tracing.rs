//! Trace context through the real binary: every callback and every MCP HTTP
//! request carries a valid W3C `traceparent` (a call's joins the caller's
//! trace when the API request sent one), and with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! set the spans of a request and its tool call reach an OTLP/HTTP receiver
//! with their attributes and parent, the MCP server's `tools/call` request
//! naming the exported `tool_call` span as its parent.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::callbacks::RecordingCallbacks;
use common::mcp::{HttpMcp, create_server, http_body, wait_for_source};
use common::{SpawnOptions, TestServer, register_remote, spawn_app, spawn_with, wait_until};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// `00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero; answers (trace, span).
fn parse_traceparent(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    };
    assert!(hex(parts[1], 32) && parts[1] != "0".repeat(32), "{value}");
    assert!(hex(parts[2], 16) && parts[2] != "0".repeat(16), "{value}");
    assert!(hex(parts[3], 2), "{value}");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// Calls `name` on the session, sending `traceparent` when given; answers `data`.
async fn call_tool(
    server: &TestServer,
    session: &str,
    name: &str,
    arguments: Value,
    traceparent: Option<&str>,
) -> Value {
    let mut request = server
        .client
        .post(server.url(&format!("/sessions/{session}/tool-calls")))
        .bearer_auth(&server.token)
        .json(&json!({"name": name, "arguments": arguments}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json::<Value>().await.unwrap()["data"].clone()
}

async fn call_with_traceparent(server: &TestServer, session: &str, traceparent: Option<&str>) {
    let data = call_tool(server, session, "traced_tool", json!({}), traceparent).await;
    assert_eq!(data["status"], "success", "{data}");
}

#[tokio::test]
async fn every_callback_carries_a_traceparent_joining_the_callers_trace() {
    let callbacks = RecordingCallbacks::start().await;
    let server = spawn_app().await;
    register_remote(
        &server,
        json!({"name": "traced_tool", "callback_url": callbacks.url("/cb")}),
    )
    .await;
    let session = server.create_session().await;

    call_with_traceparent(&server, &session, None).await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    call_with_traceparent(&server, &session, Some(&caller)).await;

    let seen: Vec<Option<String>> = callbacks
        .received()
        .iter()
        .map(|request| request.header("traceparent").map(str::to_owned))
        .collect();
    assert_eq!(seen.len(), 2);
    let (fresh_trace, _) =
        parse_traceparent(seen[0].as_deref().expect("a traceparent without exporter"));
    let (joined_trace, joined_span) = parse_traceparent(seen[1].as_deref().expect("a traceparent"));
    assert_ne!(fresh_trace, CALLER_TRACE);
    assert_eq!(
        joined_trace, CALLER_TRACE,
        "the callback joins the caller's trace"
    );
    assert_ne!(
        joined_span, CALLER_SPAN,
        "as a child span, not the caller's own"
    );
}

/// An OTLP/HTTP (JSON) receiver that keeps every span it is sent.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let spans: Arc<Mutex<Vec<Value>>> = Default::default();
    let keep = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::Json<Value>| {
            let keep = keep.clone();
            async move {
                for resource in body.0["resourceSpans"].as_array().into_iter().flatten() {
                    for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                        for span in scope["spans"].as_array().into_iter().flatten() {
                            keep.lock().unwrap().push(span.clone());
                        }
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, spans)
}

/// A server exporting its spans (OTLP/HTTP JSON, every 100 ms) to a
/// receiver of the test's, and what that receiver was sent.
async fn exporting_server() -> (TestServer, Arc<Mutex<Vec<Value>>>) {
    let (endpoint, spans) = otlp_receiver().await;
    let server = spawn_with(SpawnOptions {
        env: vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ],
        ..Default::default()
    })
    .await;
    (server, spans)
}

fn attribute(span: &Value, key: &str) -> Option<String> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .and_then(|a| {
            let value = &a["value"];
            value["stringValue"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| Some(value.to_string()))
        })
}

#[tokio::test]
async fn spans_of_a_request_and_its_tool_call_reach_the_otlp_receiver() {
    let callbacks = RecordingCallbacks::start().await;
    let (server, spans) = exporting_server().await;
    register_remote(
        &server,
        json!({"name": "traced_tool", "callback_url": callbacks.url("/cb")}),
    )
    .await;
    let session = server.create_session().await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    call_with_traceparent(&server, &session, Some(&caller)).await;

    wait_until(Duration::from_secs(30), "the tool call's span", || {
        let spans = spans.clone();
        async move {
            spans
                .lock()
                .unwrap()
                .iter()
                .any(|s| s["name"] == "tool_call")
        }
    })
    .await;
    let spans = spans.lock().unwrap().clone();
    let call = spans.iter().find(|s| s["name"] == "tool_call").unwrap();
    assert_eq!(
        attribute(call, "session_id").as_deref(),
        Some(session.as_str()),
        "{call}"
    );
    assert_eq!(
        attribute(call, "tool").as_deref(),
        Some("\"traced_tool\""),
        "{call}"
    );
    assert_eq!(
        attribute(call, "provider").as_deref(),
        Some("remote"),
        "{call}"
    );
    assert_eq!(
        attribute(call, "status").as_deref(),
        Some("success"),
        "{call}"
    );
    assert!(
        attribute(call, "execution_id").is_some_and(|id| id.starts_with("texec_")),
        "{call}"
    );
    assert_eq!(call["traceId"], CALLER_TRACE, "{call}");
    let request = spans
        .iter()
        .find(|s| s["name"] == "http_request" && s["spanId"] == call["parentSpanId"])
        .unwrap_or_else(|| panic!("the tool call's parent is its request span: {spans:#?}"));
    assert_eq!(request["parentSpanId"], CALLER_SPAN, "{request}");
}

/// Long enough for a cold test-server start on a loaded 2-core machine.
const CONNECTED: Duration = Duration::from_secs(30);

/// The repository's test MCP server over streamable HTTP, attached to the
/// server's account with prefix `m`, connected; its `m_header` tool answers
/// a header of the `tools/call` request that ran it.
async fn attach_http_mcp(server: &TestServer, session: &str) -> HttpMcp {
    let mcp = HttpMcp::start().await;
    let body = http_body(
        "traced",
        &mcp.url,
        json!({"tool_prefix": "m", "default_side_effect_level": "none"}),
    );
    let id = create_server(server, body).await;
    wait_for_source(server, session, &id, "live", CONNECTED).await;
    mcp
}

/// The `traceparent` the MCP server's `tools/call` request carried.
async fn mcp_call_traceparent(server: &TestServer, session: &str, caller: Option<&str>) -> String {
    let data = call_tool(
        server,
        session,
        "m_header",
        json!({"name": "traceparent"}),
        caller,
    )
    .await;
    assert_eq!(data["status"], "success", "a traceparent header: {data}");
    data["output"].as_str().expect("text output").to_owned()
}

#[tokio::test]
async fn every_mcp_http_request_carries_a_traceparent_without_an_exporter() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let _mcp = attach_http_mcp(&server, &session).await;

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let joined = mcp_call_traceparent(&server, &session, Some(&caller)).await;
    let (joined_trace, joined_span) = parse_traceparent(&joined);
    assert_eq!(
        joined_trace, CALLER_TRACE,
        "tools/call joins the caller's trace"
    );
    assert_ne!(joined_span, CALLER_SPAN, "through the tool_call span");
    let fresh = mcp_call_traceparent(&server, &session, None).await;
    let (fresh_trace, _) = parse_traceparent(&fresh);
    assert_ne!(fresh_trace, CALLER_TRACE);

    // The handshake, the notifications, the event stream and the list carry
    // one of their own: valid, and not the caller's.
    let seen = call_tool(
        &server,
        &session,
        "m_request_headers",
        json!({"name": "traceparent"}),
        None,
    )
    .await;
    let requests = seen["output"]["requests"].as_array().expect("requests");
    assert!(requests.len() >= 5, "{seen}");
    for request in requests {
        let value = request["value"].as_str();
        let value = value.unwrap_or_else(|| panic!("a request without traceparent: {seen}"));
        parse_traceparent(value);
    }
    let before_calls: Vec<&Value> = requests
        .iter()
        .take_while(|r| r["value"] != json!(joined))
        .collect();
    assert!(before_calls.len() >= 3, "{seen}");
    assert!(
        before_calls
            .iter()
            .all(|r| !r["value"].as_str().unwrap().contains(CALLER_TRACE)),
        "{seen}"
    );
}

#[tokio::test]
async fn an_mcp_tools_call_names_the_exported_tool_call_span_as_its_parent() {
    let (server, spans) = exporting_server().await;
    let session = server.create_session().await;
    let _mcp = attach_http_mcp(&server, &session).await;
    let sent = mcp_call_traceparent(&server, &session, None).await;
    let (trace, parent) = parse_traceparent(&sent);

    let is_the_call = |s: &Value| {
        s["name"] == "tool_call" && attribute(s, "tool").as_deref() == Some("\"m_header\"")
    };
    wait_until(Duration::from_secs(30), "the MCP call's span", || {
        let spans = spans.clone();
        async move { spans.lock().unwrap().iter().any(is_the_call) }
    })
    .await;
    let spans = spans.lock().unwrap().clone();
    let call = spans.iter().find(|s| is_the_call(s)).unwrap();
    assert_eq!(
        attribute(call, "provider").as_deref(),
        Some("mcp"),
        "{call}"
    );
    assert_eq!(call["traceId"], trace, "{call}");
    assert_eq!(
        call["spanId"], parent,
        "the server's parent is the tool_call span: {call}"
    );
}
