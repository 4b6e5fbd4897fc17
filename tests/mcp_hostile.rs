//! toolgate as the client of MCP servers that misbehave on purpose: a scripted
//! streamable-HTTP server in the test answers each JSON-RPC request by the
//! mode named in its URL (`/<mode>/mcp`). Each case is one found by probing
//! the real binary: a schema whose references fan out, one name listed many
//! times, a cursor that never ends, a list without end, an error message of
//! megabytes, an answer that cannot be read after the call ran, and a flood of
//! notifications; and stdio servers that hang after the handshake or write
//! stderr without a newline.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::mcp::{
    allow_irreversible, call, create_server, http_body, server_entry, tool, wait_for_source,
};
use common::{SpawnOptions, TestServer, spawn_app, spawn_with};
use futures::StreamExt;
use serde_json::{Value, json};

/// What the scripted server counted.
#[derive(Default)]
struct Seen {
    listings: AtomicUsize,
    calls: AtomicUsize,
    /// Session ends (`DELETE`) received.
    ends: AtomicUsize,
    /// Answers to the server's own requests received.
    answers: AtomicUsize,
}

/// A session's end; in `slowclose` mode never answered.
async fn end_session(State(seen): State<Arc<Seen>>, Path(mode): Path<String>) -> StatusCode {
    seen.ends.fetch_add(1, Ordering::SeqCst);
    if mode == "slowclose" {
        std::future::pending::<()>().await;
    }
    StatusCode::OK
}

/// Starts the scripted server; answers its base URL and what it counts.
async fn start_hostile() -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let app = axum::Router::new()
        .route(
            "/{mode}/mcp",
            post(answer)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(end_session),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

async fn answer(
    State(seen): State<Arc<Seen>>,
    Path(mode): Path<String>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(id) = request.get("id").cloned() else {
        // A notification (`notifications/initialized`, a cancel).
        return StatusCode::ACCEPTED.into_response();
    };
    if request.get("method").is_none() {
        // toolgate's answer to one of our requests.
        seen.answers.fetch_add(1, Ordering::SeqCst);
        return StatusCode::ACCEPTED.into_response();
    }
    let result = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    match request["method"].as_str().unwrap_or_default() {
        "initialize" => {
            let version = match mode.as_str() {
                "badversion" => json!("1999-01-01"),
                _ => request["params"]["protocolVersion"].clone(),
            };
            let body = result(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }));
            ([("mcp-session-id", "hostile-1")], axum::Json(body)).into_response()
        }
        "tools/list" => {
            seen.listings.fetch_add(1, Ordering::SeqCst);
            let cursor = request["params"]["cursor"].as_str().map(str::to_owned);
            axum::Json(result(listing(&mode, cursor))).into_response()
        }
        "tools/call" => {
            seen.calls.fetch_add(1, Ordering::SeqCst);
            called(&mode, id)
        }
        _ => axum::Json(result(json!({}))).into_response(),
    }
}

fn plain_tool(name: &str) -> Value {
    json!({"name": name, "description": "d", "inputSchema": {"type": "object"}})
}

/// The `tools/list` answer of each mode.
fn listing(mode: &str, cursor: Option<String>) -> Value {
    match mode {
        // Eight definitions, each a choice of eight references to the next:
        // under a kilobyte of schema, 8^8 values expanded.
        "fanout" => {
            let mut defs = serde_json::Map::new();
            for level in 0..8 {
                let next = json!({"$ref": format!("#/$defs/d{}", level + 1)});
                defs.insert(format!("d{level}"), json!({"anyOf": vec![next; 8]}));
            }
            defs.insert("d8".into(), json!({"type": "string"}));
            let fan = json!({"name": "fan", "description": "d", "inputSchema": {
                "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs,
            }});
            json!({"tools": [fan, plain_tool("ok")]})
        }
        "dups" => {
            let mut tools = vec![plain_tool("echo"); 300];
            tools.push(plain_tool("other"));
            json!({"tools": tools})
        }
        // Always one more page, whatever the cursor.
        "endless" => {
            let page: usize = cursor.and_then(|c| c.parse().ok()).unwrap_or(0);
            json!({"tools": [plain_tool(&format!("t{page}"))], "nextCursor": (page + 1).to_string()})
        }
        "many" => {
            let tools: Vec<Value> = (0..1_001).map(|n| plain_tool(&format!("t{n}"))).collect();
            json!({"tools": tools})
        }
        _ => json!({"tools": [plain_tool("work")]}),
    }
}

/// The `tools/call` answer of each mode.
fn called(mode: &str, id: Value) -> Response {
    match mode {
        "bigerror" => axum::Json(json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32000, "message": "e".repeat(3 << 20),
        }}))
        .into_response(),
        // The call ran; its answer cannot be read.
        "garbled" => (
            [(header::CONTENT_TYPE, "application/json")],
            "this is not JSON",
        )
            .into_response(),
        // The answer comes as an event stream, behind a flood of
        // notifications: list changes and log messages with a marker.
        "flood" => {
            let mut events = String::new();
            for n in 0..300 {
                let notice = if n % 2 == 0 {
                    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
                } else {
                    json!({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": format!("FLOOD-MARKER-{n}")}})
                };
                events.push_str(&format!("data: {notice}\n\n"));
            }
            let done = json!({"jsonrpc": "2.0", "id": id, "result": {
                "content": [{"type": "text", "text": "flooded"}],
            }});
            events.push_str(&format!("data: {done}\n\n"));
            ([(header::CONTENT_TYPE, "text/event-stream")], events).into_response()
        }
        // A flood of the server's own requests, and then no answer: the
        // stream stays open, so the call can end only with its connection.
        "requests" => {
            let events: Vec<Result<String, std::convert::Infallible>> = (0..400)
                .map(|n| {
                    let request =
                        json!({"jsonrpc": "2.0", "id": format!("s{n}"), "method": "roots/list"});
                    Ok(format!("data: {request}\n\n"))
                })
                .collect();
            let body = futures::stream::iter(events).chain(futures::stream::pending());
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
        _ => axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": {
            "content": [{"type": "text", "text": "done"}],
        }}))
        .into_response(),
    }
}

/// Attaches the scripted server in `mode` with tool prefix `prefix`.
async fn attach(server: &TestServer, base: &str, mode: &str, prefix: &str) -> String {
    create_server(
        server,
        http_body(
            mode,
            &format!("{base}/{mode}/mcp"),
            json!({"tool_prefix": prefix, "default_side_effect_level": "irreversible",
                   "connect_timeout_ms": 10000, "call_timeout_ms": 10000}),
        ),
    )
    .await
}

const WAIT: Duration = Duration::from_secs(30);

/// Waits until the MCP server's status (`GET /mcp/servers/{id}/status`, as
/// the admin) shows an `error` containing `text`.
async fn wait_for_error(server: &TestServer, id: &str, text: &str) {
    let status = format!("/mcp/servers/{id}/status");
    common::wait_until(WAIT, &format!("the status error {text:?}"), || async {
        let reply = server.get(&status).await;
        reply.body["data"]["error"]
            .as_str()
            .is_some_and(|error| error.contains(text))
    })
    .await;
}

/// A server with the scripted one attached in `mode`, live, and a session
/// that may call its (irreversible) tools: the server, what the scripted one
/// counted, the session and the MCP server's id.
async fn attached_live(mode: &str, prefix: &str) -> (TestServer, Arc<Seen>, String, String) {
    let server = spawn_app().await;
    let (base, seen) = start_hostile().await;
    let session = server.create_session().await;
    let id = attach(&server, &base, mode, prefix).await;
    wait_for_source(&server, &session, &id, "live", WAIT).await;
    allow_irreversible(&server, &session).await;
    (server, seen, session, id)
}

#[tokio::test]
async fn a_schema_whose_references_fan_out_is_left_out_and_costs_nothing() {
    let (server, _seen, session, _id) = attached_live("fanout", "f").await;
    let catalog = common::mcp::catalog(&server, &session).await;
    assert!(tool(&catalog, "f_ok").is_some(), "{catalog:#}");
    assert!(tool(&catalog, "f_fan").is_none(), "{catalog:#}");
    server.log_containing("would take more than").await;
}

#[tokio::test]
async fn a_name_listed_many_times_is_offered_once_without_a_conflict() {
    let (server, _seen, session, _id) = attached_live("dups", "d").await;
    let catalog = common::mcp::catalog(&server, &session).await;
    let echoes: Vec<&Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "d_echo")
        .collect();
    assert_eq!(echoes.len(), 1, "{catalog:#}");
    assert_eq!(echoes[0]["availability"], "available", "{:#}", echoes[0]);
    assert!(catalog["conflicts"].as_array().unwrap().is_empty());
    assert!(tool(&catalog, "d_other").is_some());
}

#[tokio::test]
async fn a_listing_without_end_fails_with_its_reason() {
    let server = spawn_app().await;
    let (base, seen) = start_hostile().await;
    let session = server.create_session().await;
    for (mode, prefix, reason) in [
        ("endless", "e", "past 100 pages"),
        ("many", "m", "more than 1000 tools"),
    ] {
        let id = attach(&server, &base, mode, prefix).await;
        wait_for_error(&server, &id, reason).await;
        let catalog = common::mcp::catalog(&server, &session).await;
        let entry = server_entry(&catalog, &id).unwrap();
        assert_eq!(entry["catalog_source"], "unavailable", "{entry}");
        assert_eq!(entry["tool_count"], 0, "{entry}");
    }
    // The endless cursor was followed 100 pages per attempt, not for ever.
    let pages = seen.listings.load(Ordering::SeqCst);
    assert!(pages >= 100, "{pages}");
}

#[tokio::test]
async fn an_error_message_of_megabytes_is_cut_to_the_result_limit() {
    let (server, _seen, session, _id) = attached_live("bigerror", "b").await;
    let result = call(&server, &session, "b_work", json!({})).await;
    assert_eq!(
        result["execution_reason_code"], "mcp_remote_error",
        "{result}"
    );
    let output = result["output"].as_str().unwrap();
    assert!(output.len() <= 1 << 20, "{} bytes", output.len());
}

#[tokio::test]
async fn an_answer_that_cannot_be_read_after_the_call_ran_is_uncertain() {
    let (server, seen, session, _id) = attached_live("garbled", "g").await;
    let result = call(&server, &session, "g_work", json!({})).await;
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        1,
        "the server got the call"
    );
    assert_eq!(result["status"], "uncertain", "{result}");
    let output = result["output"].as_str().unwrap();
    assert!(
        !output.contains("rmcp::"),
        "a type path is no message: {output}"
    );
    let row = server
        .get(&format!(
            "/tool-executions/{}",
            result["execution_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(row.body["data"]["provider_started"], true, "{row:?}");
}

#[tokio::test]
async fn a_flood_of_notifications_is_neither_logged_nor_listed_for_each() {
    let (server, seen, session, id) = attached_live("flood", "l").await;
    let before = seen.listings.load(Ordering::SeqCst);
    let result = call(&server, &session, "l_work", json!({})).await;
    assert_eq!(result["output"], "flooded", "{result}");
    // 150 list changes ask for one listing, half a second later.
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.listings.load(Ordering::SeqCst) == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no listing asked for"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A line logged after the flood was read: none of it is in the log.
    let deleted = server.delete(&format!("/mcp/servers/{id}")).await;
    assert_eq!(deleted.status, StatusCode::OK);
    let log = server.log_containing("MCP server deleted").await;
    assert!(
        !log.contains("FLOOD-MARKER"),
        "notifications reached the log"
    );
    let listings = seen.listings.load(Ordering::SeqCst) - before;
    assert!(listings <= 2, "{listings} listings for one flood");
}

/// A stdio test server started through `sh` after `before` (a shell command),
/// leaving a `sleep <marker>` in its process group.
fn shell_body(name: &str, marker: &str, before: &str, args: &str) -> Value {
    let bin = common::mcp::test_server_bin();
    json!({
        "name": name,
        "transport": "stdio",
        "stdio": {"command": "sh", "args": ["-c", format!("sleep {marker} & {before} exec {bin} stdio {args}")]},
        "connect_timeout_ms": 500,
    })
}

#[tokio::test]
async fn a_stdio_server_that_hangs_after_the_handshake_leaves_no_process_behind() {
    let server = spawn_app().await;
    let marker = format!("{}3", 7_000_000 + std::process::id());
    let id = create_server(
        &server,
        shell_body("hangs", &marker, "", "--hang-tools-list"),
    )
    .await;
    wait_for_error(&server, &id, "connect_timeout_ms").await;
    // A test connection times out the same way.
    let tested = server
        .post(&format!("/mcp/servers/{id}/test"), json!({}))
        .await;
    assert_eq!(tested.body["data"]["success"], false, "{tested:?}");
    let disabled = server
        .patch(
            &format!("/mcp/servers/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(disabled.status, StatusCode::OK, "{disabled:?}");
    common::wait_until(
        Duration::from_secs(15),
        "every timed-out attempt's process group to die",
        || async { common::mcp::processes_running(&["sleep", &marker]).is_empty() },
    )
    .await;
}

/// The peak resident memory of `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn stderr_without_a_newline_costs_no_memory() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let before = peak_rss_kib(server.pid());
    let marker = format!("{}4", 7_000_000 + std::process::id());
    // 200 MB of stderr in one line, all read before the server answers.
    let flood = "head -c 200000000 /dev/zero | tr '\\0' x >&2;";
    let mut body = shell_body("floods", &marker, flood, "");
    body["connect_timeout_ms"] = json!(60_000);
    let id = create_server(&server, body).await;
    wait_for_source(&server, &session, &id, "live", Duration::from_secs(60)).await;
    let grown_mib = peak_rss_kib(server.pid()).saturating_sub(before) / 1024;
    assert!(
        grown_mib < 64,
        "the server's peak memory grew {grown_mib} MiB"
    );
}

#[tokio::test]
async fn one_accounts_server_slow_to_close_holds_up_no_other_accounts_writes() {
    // The scripted server is on loopback, which a tenant may reach only so.
    let server = spawn_with(SpawnOptions {
        args: vec!["--mcp-private-urls-for-all-accounts".into()],
        ..Default::default()
    })
    .await;
    let (base, seen) = start_hostile().await;
    let tenant = server.create_account("tenant").await;
    let url = format!("{base}/slowclose/mcp");
    let created = server
        .send_as(
            &tenant,
            reqwest::Method::POST,
            "/mcp/servers",
            Some(http_body("slow", &url, json!({"tool_prefix": "s"}))),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    let status = format!("/mcp/servers/{id}/status");
    common::wait_until(WAIT, "the tenant's server to connect", || async {
        let reply = server
            .send_as(&tenant, reqwest::Method::GET, &status, None)
            .await;
        reply.body["data"]["state"] == "connected"
    })
    .await;
    // The tenant's delete waits for a session end that never comes...
    let path = format!("/mcp/servers/{id}");
    let delete = server.send_as(&tenant, reqwest::Method::DELETE, &path, None);
    tokio::pin!(delete);
    let waiting = async {
        while seen.ends.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        reply = &mut delete => panic!("the delete did not wait for the close: {reply:?}"),
        () = waiting => {}
    }
    // ...while the admin's writes go through.
    let admin_write = attach(&server, &base, "other", "o");
    tokio::select! {
        reply = &mut delete => panic!("the delete ended first: {reply:?}"),
        id = admin_write => assert!(id.starts_with("mcp_")),
    }
    let deleted = delete.await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
}

#[tokio::test]
async fn only_the_admin_attaches_servers_on_loopback_or_private_networks() {
    let refusing = spawn_app().await;
    let allowing = spawn_with(SpawnOptions {
        args: vec!["--mcp-private-urls-for-all-accounts".into()],
        ..Default::default()
    })
    .await;
    for url in [
        "http://127.0.0.1:8700/api/tools/register",
        "http://localhost:6379/",
        "http://10.0.0.7/mcp",
        "http://[::1]:8700/mcp",
    ] {
        for (server, expected) in [
            (&refusing, StatusCode::FORBIDDEN),
            (&allowing, StatusCode::CREATED),
        ] {
            let tenant = server.create_account(&format!("t{}", url.len())).await;
            let body = http_body(&format!("near{}", url.len()), url, json!({"enabled": true}));
            let reply = server
                .send_as(
                    &tenant,
                    reqwest::Method::POST,
                    "/mcp/servers",
                    Some(body.clone()),
                )
                .await;
            assert_eq!(reply.status, expected, "{url}: {reply:?}");
            if expected == StatusCode::FORBIDDEN {
                assert!(
                    reply.text.contains("--mcp-private-urls-for-all-accounts"),
                    "{reply:?}"
                );
                // The admin is the operator, and may.
                assert_eq!(
                    server.post("/mcp/servers", body).await.status,
                    StatusCode::CREATED
                );
            }
        }
    }
    // A tenant's disabled server runs nothing, and may be stored; enabling it
    // is refused.
    let tenant = refusing.create_account("later").await;
    let body = http_body("off", "http://127.0.0.1:1/mcp", json!({"enabled": false}));
    let stored = refusing
        .send_as(&tenant, reqwest::Method::POST, "/mcp/servers", Some(body))
        .await;
    assert_eq!(stored.status, StatusCode::CREATED, "{stored:?}");
    let id = stored.body["data"]["id"].as_str().unwrap();
    let toggled = refusing
        .send_as(
            &tenant,
            reqwest::Method::PATCH,
            &format!("/mcp/servers/{id}/toggle"),
            Some(json!({"enabled": true})),
        )
        .await;
    assert_eq!(toggled.status, StatusCode::FORBIDDEN, "{toggled:?}");
}

#[tokio::test]
async fn a_flood_of_server_requests_drops_the_connection() {
    let (server, seen, session, id) = attached_live("requests", "r").await;
    // No answer comes behind the 400 requests: the call ends when the
    // connection is dropped (not at its 10 s timeout), and may have run.
    let result = call(&server, &session, "r_work", json!({})).await;
    assert_eq!(result["status"], "uncertain", "{result}");
    assert_eq!(
        result["execution_reason_code"], "mcp_transport_error",
        "{result}"
    );
    // Why is said before the connection is closed (which waits for rmcp to
    // end its service), so the status already tells when the call has ended.
    let status = server.get(&format!("/mcp/servers/{id}/status")).await;
    let error = status.body["data"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("requests in a second"), "{status:?}");
    let answered = seen.answers.load(Ordering::SeqCst);
    assert!(
        answered <= 60,
        "{answered} of the server's requests answered"
    );
}

#[tokio::test]
async fn a_server_speaking_an_unknown_protocol_version_is_not_connected() {
    let server = spawn_app().await;
    let (base, seen) = start_hostile().await;
    let session = server.create_session().await;
    let id = attach(&server, &base, "badversion", "v").await;
    wait_for_error(&server, &id, "protocol version \"1999-01-01\"").await;
    let catalog = common::mcp::catalog(&server, &session).await;
    assert!(tool(&catalog, "v_work").is_none(), "{catalog:#}");
    assert_eq!(
        seen.listings.load(Ordering::SeqCst),
        0,
        "nothing was listed"
    );
}
