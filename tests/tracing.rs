//! Trace context through the real binary: every callback carries a valid W3C
//! `traceparent` (joining the caller's trace when the API request sent one),
//! and with `OTEL_EXPORTER_OTLP_ENDPOINT` set the spans of a request and its
//! tool call reach an OTLP/HTTP receiver with their attributes and parent.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use common::{SpawnOptions, TestServer, register_remote, spawn_app, spawn_with, wait_until};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A callback that answers and keeps the `traceparent` of every request.
async fn recording_callback() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Default::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/cb",
        axum::routing::post(move |headers: HeaderMap| {
            let record = record.clone();
            async move {
                let parent = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                record.lock().unwrap().push(parent);
                axum::Json(json!({"output": "ok", "is_error": false}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/cb", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

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

async fn call_with_traceparent(server: &TestServer, session: &str, traceparent: Option<&str>) {
    let mut request = server
        .client
        .post(server.url(&format!("/sessions/{session}/tool-calls")))
        .bearer_auth(&server.token)
        .json(&json!({"name": "traced_tool", "arguments": {}, "call_id": "t1"}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn every_callback_carries_a_traceparent_joining_the_callers_trace() {
    let (url, seen) = recording_callback().await;
    let server = spawn_app().await;
    register_remote(&server, json!({"name": "traced_tool", "callback_url": url})).await;
    let session = server.create_session().await;

    call_with_traceparent(&server, &session, None).await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    call_with_traceparent(&server, &session, Some(&caller)).await;

    let seen = seen.lock().unwrap().clone();
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
    let (url, _) = recording_callback().await;
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
    register_remote(&server, json!({"name": "traced_tool", "callback_url": url})).await;
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
