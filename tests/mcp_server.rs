//! Issue 21 §1: toolgate as an MCP server. The official MCP Python SDK
//! (`mcp`, in the venv `.ci/mcp-client` creates; tests/mcp_client/driver.py)
//! lists a session's tools through `/mcp/sessions/{id}`, calls a builtin and a
//! remote tool through the call path, sees a denied tool absent and its call
//! refused, and is told `tools/list_changed` after a registration. The door
//! (401, 404, a session bound to its scope) is checked with plain HTTP.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::callbacks::CountingCallbacks;
use common::mcp::{initialize_body, mcp_post, open_mcp_session, post_raw, rpc_answer};
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Where the MCP SDK's python is: this variable (set by `.ci/test`), else the
/// venv `.ci/mcp-client` creates.
const PYTHON_ENV: &str = "TOOLGATE_MCP_CLIENT_PYTHON";
const DEFAULT_VENV_PYTHON: &str = "target/mcp-client-venv/bin/python";
/// How long one command of the driver may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn client_python() -> PathBuf {
    let python = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(DEFAULT_VENV_PYTHON));
    assert!(
        python.exists(),
        "the MCP client venv is missing ({}): run `bash .ci/mcp-client` (or `bash .ci/test`), or set {PYTHON_ENV}",
        python.display()
    );
    python
}

/// One connected MCP Python SDK client, driven line by line.
struct McpClient {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    ready: Value,
}

impl McpClient {
    async fn connect(server: &TestServer, session: &str, key: &str, slot: Option<&str>) -> Self {
        let client = Self::try_connect(server, session, key, slot).await;
        assert_eq!(client.ready["event"], "ready", "{}", client.ready);
        client
    }

    /// Starts the client; `ready` says whether it connected.
    async fn try_connect(
        server: &TestServer,
        session: &str,
        key: &str,
        slot: Option<&str>,
    ) -> Self {
        let mut child = Command::new(client_python())
            .arg(repo().join("tests/mcp_client/driver.py"))
            .arg(server.url(&format!("/mcp/sessions/{session}")))
            .arg(key)
            .arg(slot.unwrap_or("-"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the MCP client driver");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = Self {
            child,
            stdin,
            stdout,
            ready: Value::Null,
        };
        client.ready = client.answer().await;
        client
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(ANSWER_TIMEOUT, self.stdout.next_line())
            .await
            .expect("the MCP client answers in time")
            .expect("read the MCP client")
            .unwrap_or_else(|| panic!("the MCP client exited: {:?}", self.child.try_wait()));
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"))
    }

    async fn command(&mut self, command: Value) -> Value {
        let line = format!("{command}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
        self.answer().await
    }

    async fn tools(&mut self) -> Vec<Value> {
        let listed = self.command(json!({"op": "list"})).await;
        listed["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .clone()
    }

    async fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.command(json!({"op": "call", "name": name, "arguments": arguments}))
            .await
    }
}

fn names(tools: &[Value]) -> Vec<&str> {
    tools.iter().filter_map(|t| t["name"].as_str()).collect()
}

fn named<'a>(tools: &'a [Value], name: &str) -> &'a Value {
    tools
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {tools:#?}"))
}

async fn register(server: &TestServer, name: &str, callback: &str, extra: Value) {
    let mut body = json!({
        "name": name,
        "description": format!("{name} for the tests"),
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "callback_url": callback,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    common::register_remote(server, body).await;
}

async fn journal_row(server: &TestServer, execution_id: &str) -> Value {
    let reply = server
        .get(&format!("/tool-executions/{execution_id}"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

fn execution_id(result: &Value) -> String {
    result["meta"]["toolgate/execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no execution id: {result}"))
        .to_owned()
}

#[tokio::test]
async fn an_mcp_client_lists_and_calls_a_sessions_tools_through_the_call_path() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let callback = callbacks.url("/ok");
    register(&server, "weather", &callback, json!({})).await;
    register(
        &server,
        "wire_money",
        &callback,
        json!({"side_effect_level": "irreversible"}),
    )
    .await;
    let session = server.create_session().await;
    let reply = server
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"allow_irreversible": true}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");

    let mut client = McpClient::connect(&server, &session, &server.token, None).await;
    assert_eq!(client.ready["server"], "toolgate", "{}", client.ready);
    assert_eq!(client.ready["list_changed_capability"], true);
    let tools = client.tools().await;
    // Exactly the session's runtime catalog for the narrator slot.
    let catalog = common::mcp::catalog(&server, &session).await;
    let mut expected: Vec<&str> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["availability"] == "available")
        .filter_map(|t| t["name"].as_str())
        .collect();
    let mut listed = names(&tools);
    expected.sort();
    listed.sort();
    assert_eq!(listed, expected);
    let weather = named(&tools, "weather");
    assert_eq!(weather["description"], "weather for the tests");
    assert_eq!(
        weather["input_schema"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(weather["annotations"]["readOnlyHint"], true, "{weather}");
    let wire = named(&tools, "wire_money");
    assert_eq!(wire["annotations"]["destructiveHint"], true, "{wire}");
    assert_eq!(wire["annotations"]["readOnlyHint"], false, "{wire}");

    let dice = client
        .call("roll_dice", json!({"sides": 6, "count": 2}))
        .await;
    assert_eq!(dice["is_error"], false, "{dice}");
    assert_eq!(dice["structured"]["results"].as_array().unwrap().len(), 2);
    let row = journal_row(&server, &execution_id(&dice)).await;
    assert_eq!(row["session_id"], session);
    assert_eq!(row["caller_slot"], "narrator");
    assert_eq!(row["status"], "success");
    assert_eq!(row["provider_type"], "builtin");

    let remote = client.call("weather", json!({"city": "Oslo"})).await;
    assert_eq!(remote["is_error"], false, "{remote}");
    assert_eq!(remote["structured"]["echo"]["city"], "Oslo", "{remote}");
    assert_eq!(callbacks.hits(), 1);
    let row = journal_row(&server, &execution_id(&remote)).await;
    assert_eq!(row["session_id"], session);
    assert_eq!(row["caller_slot"], "narrator");
    assert_eq!(row["provider_type"], "remote");

    // The call path's validation: arguments against the schema.
    let invalid = client.call("roll_dice", json!({"sides": "many"})).await;
    assert_eq!(invalid["is_error"], true, "{invalid}");
    assert_eq!(invalid["meta"]["toolgate/status"], "error", "{invalid}");
    let unknown = client.call("no_such_tool", json!({})).await;
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert_eq!(unknown["meta"]["toolgate/status"], "denied", "{unknown}");
}

#[tokio::test]
async fn a_tool_denied_for_the_slot_is_absent_and_a_call_to_it_is_refused() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let callback = callbacks.url("/ok");
    register(&server, "weather", &callback, json!({})).await;
    let session = server.create_session().await;
    let reply = server
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"director": ["weather"]}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");

    let mut director = McpClient::connect(&server, &session, &server.token, Some("director")).await;
    let tools = director.tools().await;
    assert!(!names(&tools).contains(&"weather"), "{tools:#?}");
    assert!(names(&tools).contains(&"roll_dice"), "{tools:#?}");
    let refused = director.call("weather", json!({"city": "Oslo"})).await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(
        refused["text"].as_str().unwrap().contains("weather"),
        "the reason is in the text: {refused}"
    );
    assert_eq!(callbacks.hits(), 0, "the callback never ran");
    let row = journal_row(&server, &execution_id(&refused)).await;
    assert_eq!(row["status"], "denied");
    assert_eq!(row["caller_slot"], "director");
    assert_eq!(row["execution_reason_code"], "permission_slot_on_deny_list");

    // The narrator (the default slot) is not denied it.
    let mut narrator = McpClient::connect(&server, &session, &server.token, None).await;
    assert!(names(&narrator.tools().await).contains(&"weather"));
}

#[tokio::test]
async fn the_sdk_client_gets_404_for_another_accounts_session() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let other_key = server.create_account("other").await;
    let refused = McpClient::try_connect(&server, &session, &other_key, None).await;
    assert_eq!(refused.ready["event"], "failed", "{}", refused.ready);
    // The SDK names the HTTP status by its reason phrase.
    let error = refused.ready["error"].as_str().unwrap();
    assert!(
        error.contains("404") || error.contains("Not Found"),
        "{error}"
    );
    // The key's own account gets through on the same URL.
    let mut own = McpClient::connect(&server, &session, &server.token, None).await;
    assert!(!own.tools().await.is_empty());
}

#[tokio::test]
async fn a_registration_sends_tools_list_changed_to_the_connected_client() {
    let server = spawn_app().await;
    let callbacks = CountingCallbacks::start().await;
    let callback = callbacks.url("/ok");
    let session = server.create_session().await;
    let mut client = McpClient::connect(&server, &session, &server.token, None).await;
    assert!(!names(&client.tools().await).contains(&"weather"));

    register(&server, "weather", &callback, json!({})).await;
    let changed = client
        .command(json!({"op": "wait_list_changed", "seen": 0, "timeout": 30}))
        .await;
    assert!(
        changed["list_changed"].as_u64().unwrap_or(0) >= 1,
        "{changed}"
    );
    assert!(names(&client.tools().await).contains(&"weather"));

    // A permission change of the session is a catalog change too.
    let seen = changed["list_changed"].as_u64().unwrap();
    let reply = server
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["weather"]}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let changed = client
        .command(json!({"op": "wait_list_changed", "seen": seen, "timeout": 30}))
        .await;
    assert!(
        changed["list_changed"].as_u64().unwrap_or(0) > seen,
        "{changed}"
    );
    assert!(!names(&client.tools().await).contains(&"weather"));
}

/// An MCP `initialize` request, as a client's first POST.
#[tokio::test]
async fn the_door_is_checked_before_any_mcp_exchange_and_a_session_keeps_its_scope() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let other_key = server.create_account("other").await;

    let anonymous = mcp_post(&server, &session, None)
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let foreign = mcp_post(&server, &session, Some(&other_key))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::NOT_FOUND);
    let body: Value = foreign.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    let missing = mcp_post(&server, "sess_missing", Some(&server.token))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let bad_slot = mcp_post(&server, &session, Some(&server.token))
        .header("x-toolgate-slot", "writer")
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(bad_slot.status(), StatusCode::BAD_REQUEST);

    // A session initialised for one chat session cannot be used on another,
    // even of the same account.
    let opened = mcp_post(&server, &session, Some(&server.token))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::OK);
    let mcp_session = opened
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned();
    let answer = rpc_answer(opened).await;
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "toolgate",
        "{answer}"
    );
    let initialized = mcp_post(&server, &session, Some(&server.token))
        .header("mcp-session-id", &mcp_session)
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert!(initialized.status().is_success(), "{initialized:?}");
    let second = server.create_session().await;
    let crossed = mcp_post(&server, &second, Some(&server.token))
        .header("mcp-session-id", &mcp_session)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(crossed.status(), StatusCode::NOT_FOUND, "{crossed:?}");
    // Nor by another account on its own session: not its stream, not its
    // end, not its messages.
    let other_session = server.create_session_as(&other_key, "Other").await;
    let client = reqwest::Client::new();
    let url = server.url(&format!("/mcp/sessions/{other_session}"));
    let stream = client
        .get(&url)
        .bearer_auth(&other_key)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &mcp_session)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::NOT_FOUND, "{stream:?}");
    let ended = client
        .delete(&url)
        .bearer_auth(&other_key)
        .header("mcp-session-id", &mcp_session)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), StatusCode::NOT_FOUND, "{ended:?}");
    let posted = mcp_post(&server, &other_session, Some(&other_key))
        .header("mcp-session-id", &mcp_session)
        .json(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::NOT_FOUND, "{posted:?}");
    // Its messages must name its slot; its event stream need not (it only
    // carries list_changed).
    let other_slot = mcp_post(&server, &session, Some(&server.token))
        .header("x-toolgate-slot", "director")
        .header("mcp-session-id", &mcp_session)
        .json(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(other_slot.status(), StatusCode::NOT_FOUND, "{other_slot:?}");
    let stream = client
        .get(server.url(&format!("/mcp/sessions/{session}")))
        .bearer_auth(&server.token)
        .header("x-toolgate-slot", "director")
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &mcp_session)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK, "{stream:?}");
    drop(stream);
    // The session still serves its own scope.
    let listed = mcp_post(&server, &session, Some(&server.token))
        .header("mcp-session-id", &mcp_session)
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    let answer = rpc_answer(listed).await;
    assert!(answer["result"]["tools"].as_array().is_some(), "{answer}");
}

/// Posts `body` as it is (not JSON-encoded) to an open MCP session.
#[tokio::test]
async fn a_malformed_message_gets_its_json_rpc_error_not_a_415() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mcp_session = open_mcp_session(&server, &session).await;
    // (body, HTTP status, JSON-RPC code, id echoed)
    let cases = [
        ("{bad json", StatusCode::BAD_REQUEST, -32700, Value::Null),
        (
            r#"[{"jsonrpc":"2.0","id":3,"method":"tools/list"}]"#,
            StatusCode::BAD_REQUEST,
            -32600,
            Value::Null,
        ),
        (
            r#"{"id":4,"method":"tools/list"}"#,
            StatusCode::BAD_REQUEST,
            -32600,
            json!(4),
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":null}"#,
            StatusCode::OK,
            -32602,
            json!(5),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"six","method":"tools/call","params":{"name":"roll_dice","arguments":"sides=6"}}"#,
            StatusCode::OK,
            -32602,
            json!("six"),
        ),
    ];
    for (body, status, code, id) in cases {
        let answer = post_raw(&server, &session, &mcp_session, body).await;
        assert_eq!(answer.status(), status, "{body}");
        let message = rpc_answer(answer).await;
        assert_eq!(message["jsonrpc"], "2.0", "{body}: {message}");
        assert_eq!(message["error"]["code"], code, "{body}: {message}");
        assert_eq!(
            message.get("id").cloned().unwrap_or(Value::Null),
            id,
            "{body}: {message}"
        );
        assert!(
            message["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // What rmcp answers well stays its: an unknown method, a wrong type.
    let unknown = post_raw(
        &server,
        &session,
        &mcp_session,
        r#"{"jsonrpc":"2.0","id":7,"method":"vendor/thing","params":{}}"#,
    )
    .await;
    assert_eq!(rpc_answer(unknown).await["error"]["code"], -32601);
    let plain = reqwest::Client::new()
        .post(server.url(&format!("/mcp/sessions/{session}")))
        .bearer_auth(&server.token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &mcp_session)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // And the session still serves a well-formed call.
    let call = post_raw(
        &server,
        &session,
        &mcp_session,
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"roll_dice","arguments":{"sides":6}}}"#,
    )
    .await;
    let answer = rpc_answer(call).await;
    assert_eq!(answer["result"]["isError"], false, "{answer}");
}

#[tokio::test]
async fn an_initialize_whose_body_trickles_holds_up_no_other_session() {
    // Without the body deadline the stalled body waits as long as the test.
    let server = common::spawn_with(common::SpawnOptions {
        args: vec!["--request-body-timeout-ms".into(), "600000".into()],
        ..Default::default()
    })
    .await;
    let session = server.create_session().await;
    let body = initialize_body().to_string();
    // Media types are case-insensitive (rmcp reads `Application/JSON` as
    // JSON), and a body of another type must not be read under the lock
    // either.
    let mut stalled = Vec::new();
    for content_type in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "text/plain",
    ] {
        let mut connection = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let head = format!(
            "POST /mcp/sessions/{session} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
             accept: application/json, text/event-stream\r\ncontent-type: {content_type}\r\n\
             content-length: {}\r\n\r\n{}",
            server.addr,
            server.token,
            body.len(),
            &body[..10]
        );
        connection.write_all(head.as_bytes()).await.unwrap();
        stalled.push(connection);
    }
    // Opens one after another while the first body never ends: each must be
    // answered (before the fix the stalled open held the endpoint's lock
    // while rmcp waited for its body, and every later open waited too).
    for _ in 0..5 {
        let opened = tokio::time::timeout(
            Duration::from_secs(30),
            mcp_post(&server, &session, Some(&server.token))
                .json(&initialize_body())
                .send(),
        )
        .await
        .expect("an initialize waited behind another's stalled body")
        .unwrap();
        assert_eq!(opened.status(), StatusCode::OK);
    }
    drop(stalled);
}

#[tokio::test]
async fn a_tool_name_past_the_limit_is_refused_before_the_journal() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mcp_session = open_mcp_session(&server, &session).await;
    for (id, name) in [
        (10, String::new()),
        (11, "n".repeat(257)),
        (12, "n".repeat(500_000)),
    ] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": name, "arguments": {}}});
        let answer =
            rpc_answer(post_raw(&server, &session, &mcp_session, &body.to_string()).await).await;
        assert_eq!(answer["error"]["code"], -32602, "{id}: {answer:.200}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("1-256 bytes"), "{message:.200}");
        assert!(message.len() < 200, "the name was echoed");
    }
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(rows.body["meta"]["total"], 0, "{rows:?}");
    // The limit itself is callable (and refused only as an unknown tool).
    let body = json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call",
                      "params": {"name": "n".repeat(256), "arguments": {}}});
    let answer =
        rpc_answer(post_raw(&server, &session, &mcp_session, &body.to_string()).await).await;
    assert_eq!(answer["result"]["isError"], true, "{answer:.300}");
}

#[tokio::test]
async fn mcp_sessions_of_a_deleted_chat_session_can_be_ended_and_free_their_place() {
    let server = spawn_app().await;
    let doomed = server.create_session().await;
    let mut opened = Vec::new();
    for _ in 0..64 {
        opened.push(open_mcp_session(&server, &doomed).await);
    }
    let other = server.create_session().await;
    let full = mcp_post(&server, &other, Some(&server.token))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(full.status(), StatusCode::CONFLICT, "the cap holds");
    let deleted = server.delete(&format!("/sessions/{doomed}")).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    // Its client can still end one...
    let ended = reqwest::Client::new()
        .delete(server.url(&format!("/mcp/sessions/{doomed}")))
        .bearer_auth(&server.token)
        .header("mcp-session-id", &opened[0])
        .send()
        .await
        .unwrap();
    assert!(ended.status().is_success(), "{ended:?}");
    // ...another account cannot...
    let stranger = server.create_account("stranger").await;
    let refused = reqwest::Client::new()
        .delete(server.url(&format!("/mcp/sessions/{doomed}")))
        .bearer_auth(&stranger)
        .header("mcp-session-id", &opened[1])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    // ...and the rest no longer hold the account's places.
    for _ in 0..64 {
        open_mcp_session(&server, &other).await;
    }
    let gone = post_raw(
        &server,
        &doomed,
        &opened[2],
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
    )
    .await;
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
}

/// A callback server whose tool answers once `release` is set; `arrived` is
/// notified as each call arrives.
async fn held_callback() -> (
    String,
    tokio::sync::watch::Sender<bool>,
    std::sync::Arc<tokio::sync::Notify>,
) {
    let (release, released) = tokio::sync::watch::channel(false);
    let arrived = std::sync::Arc::new(tokio::sync::Notify::new());
    let seen = arrived.clone();
    let app = axum::Router::new().route(
        "/hold",
        axum::routing::post(move || {
            let (mut released, seen) = (released.clone(), seen.clone());
            async move {
                seen.notify_one();
                let _ = released.wait_for(|released| *released).await;
                axum::Json(json!({"result": "released"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hold", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, release, arrived)
}

#[tokio::test]
async fn a_request_id_still_in_flight_is_refused_not_given_the_others_answer() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let (url, release, arrived) = held_callback().await;
    register(&server, "held", &url, json!({})).await;
    let mcp_session = open_mcp_session(&server, &session).await;
    let call = |id: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "held", "arguments": {"city": "x"}}})
        .to_string()
    };
    let first = {
        let post = mcp_post(&server, &session, Some(&server.token))
            .header("mcp-session-id", &mcp_session)
            .body(call(json!(1)))
            .send();
        tokio::spawn(async move { rpc_answer(post.await.unwrap()).await })
    };
    // Sent once the first is in flight: the sending itself is awaited in the task.
    tokio::time::timeout(Duration::from_secs(20), arrived.notified())
        .await
        .expect("the first call did not reach its callback");
    let again = post_raw(&server, &session, &mcp_session, &call(json!(1))).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let refused = rpc_answer(again).await;
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert_eq!(refused["id"], 1);
    // The string "1" is another id.
    let other = {
        let post = mcp_post(&server, &session, Some(&server.token))
            .header("mcp-session-id", &mcp_session)
            .body(call(json!("1")))
            .send();
        tokio::spawn(async move { rpc_answer(post.await.unwrap()).await })
    };
    tokio::time::timeout(Duration::from_secs(20), arrived.notified())
        .await
        .expect("the call with id \"1\" did not reach its callback");
    release.send_replace(true);
    let answered = first.await.unwrap();
    assert_eq!(answered["id"], 1, "{answered}");
    assert_eq!(answered["result"]["isError"], false, "{answered}");
    let answered = other.await.unwrap();
    assert_eq!(answered["id"], "1", "{answered}");
    // Answered, the id is free again.
    let reused = rpc_answer(post_raw(&server, &session, &mcp_session, &call(json!(1))).await).await;
    assert_eq!(reused["result"]["isError"], false, "{reused}");
}

#[tokio::test]
async fn a_request_id_stays_taken_while_its_call_runs_after_the_client_went_away() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let (url, release, arrived) = held_callback().await;
    register(&server, "held", &url, json!({})).await;
    let mcp_session = open_mcp_session(&server, &session).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "held", "arguments": {"city": "x"}}})
    .to_string();
    // Sent on a connection of its own, dropped once the call has reached
    // its callback: rmcp goes on with the call and will answer id 7.
    let mut gone = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST /mcp/sessions/{session} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n\
         mcp-session-id: {mcp_session}\r\ncontent-length: {}\r\n\r\n{call}",
        server.addr,
        server.token,
        call.len()
    );
    gone.write_all(head.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), arrived.notified())
        .await
        .expect("the call did not reach its callback");
    drop(gone);
    // The id is still the running call's: another request may not take it.
    let server_ref = &server;
    let (session_ref, mcp_ref, call_ref) = (&session, &mcp_session, &call);
    for _ in 0..5 {
        let again = post_raw(server_ref, session_ref, mcp_ref, call_ref).await;
        assert_eq!(
            again.status(),
            StatusCode::CONFLICT,
            "id 7 was given to a new request while its call still ran"
        );
    }
    // Once the call is over, the id is free again.
    release.send_replace(true);
    common::wait_until(
        Duration::from_secs(20),
        "id 7 to be free again",
        || async move {
            post_raw(server_ref, session_ref, mcp_ref, call_ref)
                .await
                .status()
                == StatusCode::OK
        },
    )
    .await;
}

#[tokio::test]
async fn an_mcp_server_configured_with_the_deployments_own_endpoint_is_refused() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut events = common::events::Events::open(&server, &session).await;
    let before = common::mcp::catalog(&server, &session).await;
    let own = server.url(&format!("/mcp/sessions/{session}"));
    let looped = common::mcp::create_server(
        &server,
        common::mcp::http_body(
            "itself",
            &own,
            // A configured deployment header of its own does not hide the mark.
            json!({"tool_prefix": "self",
                   "http": {"url": own, "headers": {"Authorization": format!("Bearer {}", server.token),
                                                    "Toolgate-Deployment": "not-the-mark"}}}),
        ),
    )
    .await;
    let failed = events.next_of("mcp.error", Duration::from_secs(20)).await;
    assert_eq!(failed["server_id"], looped.as_str(), "{failed}");
    assert!(
        failed["error"].as_str().is_some_and(|e| e.contains("508")),
        "the refusal's status reaches the server's status: {failed}"
    );
    let tested = server
        .post(&format!("/mcp/servers/{looped}/test"), json!({}))
        .await;
    assert_eq!(tested.body["data"]["success"], false, "{tested:?}");
    let after = common::mcp::catalog(&server, &session).await;
    let entry = common::mcp::server_entry(&after, &looped).expect("an entry for the server");
    assert_eq!(entry["catalog_source"], "unavailable", "{after:#}");
    assert_eq!(entry["tool_count"], 0, "{after:#}");
    assert_eq!(
        after["tools"].as_array().map(Vec::len),
        before["tools"].as_array().map(Vec::len),
        "the catalog did not feed itself"
    );
    let log = server.log_containing("own MCP client").await;
    assert!(log.contains("refused an MCP request"), "{log}");

    // Another deployment's client (another mark) and a client without one
    // are served as before.
    for mark in [Some("0123456789abcdef0123456789abcdef"), None] {
        let mut request = mcp_post(&server, &session, Some(&server.token));
        if let Some(mark) = mark {
            request = request.header("toolgate-deployment", mark);
        }
        let opened = request.json(&initialize_body()).send().await.unwrap();
        assert_eq!(opened.status(), StatusCode::OK, "{mark:?}");
    }
}
