//! The test MCP server (`toolgate-test-mcp`) seen through rmcp's client side,
//! over both transports: the real binary as a stdio child and as a streamable
//! HTTP server on port 0. The connection helpers (`Client`, `connect`,
//! `stdio_transport`, `http_transport`) are the calls that work with this rmcp
//! version; the MCP provider can copy them.

use std::collections::HashMap;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ErrorCode,
    Implementation, ProtocolVersion, Tool,
};
use rmcp::service::{NotificationContext, QuitReason, RunningService};
use rmcp::transport::common::client_side_sse::FixedInterval;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{IntoTransport, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::watch;

const BIN: &str = env!("CARGO_BIN_EXE_toolgate-test-mcp");
/// Upper bound for anything a test waits on; every wait ends on a condition.
const WAIT: Duration = Duration::from_secs(10);
/// Set on every server process; the `env` tool reads it back.
const ENV_NAME: &str = "TOOLGATE_TEST_MCP_VALUE";
const ENV_VALUE: &str = "from-the-test";
/// SSE reconnect attempts of the HTTP client before a stream counts as lost.
const RECONNECT_ATTEMPTS: usize = 1;

const ALL_TOOLS: [&str; 14] = [
    "echo",
    "shout",
    "fail",
    "hang",
    "slow_lookup",
    "lookup",
    "destroy",
    "add_tool",
    "crash",
    "env",
    "header",
    "request_headers",
    "calls",
    "with_ref",
];

// ---- connection helpers: how this rmcp version is called -------------------

/// The client side: pins the `initialize` lifecycle (2025-11-25), because the
/// default LATEST (2026-07-28) has no session, and so no server notifications.
/// Counts `notifications/tools/list_changed`.
#[derive(Clone)]
struct Client {
    list_changed: Arc<watch::Sender<u64>>,
}

impl Client {
    fn new() -> Self {
        Self {
            list_changed: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Waits until at least `count` list_changed notifications have arrived.
    async fn wait_list_changed(&self, count: u64) {
        let mut seen = self.list_changed.subscribe();
        tokio::time::timeout(WAIT, seen.wait_for(|n| *n >= count))
            .await
            .expect("list_changed within the bound")
            .expect("sender alive");
    }
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate-test-client", "0.0.0"),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.send_modify(|count| *count += 1);
    }
}

type Connection = RunningService<RoleClient, Client>;

/// Runs the `initialize` handshake over `transport`.
async fn connect<T, E, A>(transport: T, client: Client) -> Connection
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(
        WAIT,
        client.serve_with_lifecycle(transport, ClientLifecycleMode::Initialize),
    )
    .await
    .expect("handshake within the bound")
    .expect("initialize")
}

/// The server as a stdio child (killed when the transport drops), and its
/// stderr.
fn stdio_transport(args: &[&str]) -> (TokioChildProcess, ChildStderr) {
    let mut command = Command::new(BIN);
    command.arg("stdio").args(args).env(ENV_NAME, ENV_VALUE);
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolgate-test-mcp stdio");
    (transport, stderr.expect("stderr piped"))
}

/// A client transport to `url` that sends `headers` on every request.
fn http_transport(
    url: &str,
    headers: &[(&'static str, &'static str)],
) -> StreamableHttpClientTransport<reqwest::Client> {
    let headers: HashMap<HeaderName, HeaderValue> = headers
        .iter()
        .map(|(name, value)| {
            (
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            )
        })
        .collect();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    // The default policy (ExponentialBackoff without max_times) reconnects a
    // broken SSE stream forever, so a call in flight when the server dies never
    // ends. The first reconnect is immediate; each later one waits at least the
    // server's SSE `retry:` hint (rmcp servers send 3 s). One attempt, then the
    // stream, and the call on it, fail at once.
    let mut retry = FixedInterval::default();
    retry.max_times = Some(RECONNECT_ATTEMPTS);
    config.retry_config = Arc::new(retry);
    StreamableHttpClientTransport::from_config(config)
}

/// The server in HTTP mode: its process and the URL it printed.
struct HttpServer {
    child: Child,
    url: String,
}

async fn spawn_http(listen: &str, args: &[&str]) -> HttpServer {
    let mut child = Command::new(BIN)
        .args(["http", "--listen", listen])
        .args(args)
        .env(ENV_NAME, ENV_VALUE)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn toolgate-test-mcp http");
    let stdout = child.stdout.take().expect("stdout piped");
    let mut line = String::new();
    tokio::time::timeout(WAIT, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("listening line within the bound")
        .expect("read stdout");
    let url = line
        .trim_end()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    HttpServer { child, url }
}

impl HttpServer {
    async fn exit_status(&mut self) -> ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("exit within the bound")
            .expect("wait")
    }
}

// ---- call helpers -----------------------------------------------------------

fn params(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object");
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)
}

async fn call(connection: &Connection, name: &str, arguments: Value) -> CallToolResult {
    tokio::time::timeout(WAIT, connection.call_tool(params(name, arguments)))
        .await
        .expect("answer within the bound")
        .unwrap_or_else(|error| panic!("{name}: {error}"))
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .map(|block| match block.as_text() {
            Some(text) => text.text.clone(),
            None => panic!("not text: {block:?}"),
        })
        .collect()
}

fn is_error(result: &CallToolResult) -> bool {
    result.is_error == Some(true)
}

async fn tool_names(connection: &Connection) -> Vec<String> {
    let tools = tokio::time::timeout(WAIT, connection.list_all_tools())
        .await
        .expect("list within the bound")
        .expect("tools/list");
    tools.iter().map(|tool| tool.name.to_string()).collect()
}

async fn first_stderr_line(stderr: ChildStderr) -> String {
    let mut line = String::new();
    tokio::time::timeout(WAIT, BufReader::new(stderr).read_line(&mut line))
        .await
        .expect("stderr line within the bound")
        .expect("read stderr");
    line
}

// ---- listing -----------------------------------------------------------------

fn schema(tool: &Tool) -> Value {
    tool.schema_as_json_value()
}

#[tokio::test]
async fn stdio_lists_every_tool_with_schemas_and_annotations() {
    let (transport, stderr) = stdio_transport(&[]);
    let pid = transport.id().expect("pid");
    let connection = connect(transport, Client::new()).await;
    // Reading one line drops the pipe: the server must go on logging into a
    // closed stderr without dying (the calls below would fail).
    assert_eq!(
        first_stderr_line(stderr).await.trim_end(),
        format!("toolgate-test-mcp started pid={pid}")
    );
    let info = connection.peer_info().expect("server info");
    let server_name = info.server_info.as_ref().map(|server| server.name.as_str());
    assert_eq!(server_name, Some("toolgate-test-mcp"));
    assert_eq!(
        info.protocol_version,
        ProtocolVersion::LATEST_WITH_INITIALIZE
    );
    assert_eq!(
        info.capabilities
            .tools
            .as_ref()
            .and_then(|t| t.list_changed),
        Some(true)
    );

    let tools = connection.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ALL_TOOLS);
    let by_name: HashMap<&str, &Tool> = tools.iter().map(|t| (t.name.as_ref(), t)).collect();
    for tool in &tools {
        assert_eq!(schema(tool)["type"], "object", "{}", tool.name);
        assert!(schema(tool)["properties"].is_object(), "{}", tool.name);
    }
    assert_eq!(schema(by_name["echo"])["additionalProperties"], false);
    assert_eq!(schema(by_name["echo"])["required"], json!(["text"]));
    assert_eq!(schema(by_name["slow_lookup"])["required"], json!(["ms"]));
    let with_ref = schema(by_name["with_ref"]);
    assert_eq!(with_ref["properties"]["item"]["$ref"], "#/$defs/Item");
    assert_eq!(with_ref["$defs"]["Item"]["required"], json!(["id"]));

    let annotations = |name: &str| by_name[name].annotations.clone().unwrap_or_default();
    assert_eq!(annotations("slow_lookup").read_only_hint, Some(true));
    assert_eq!(annotations("lookup").read_only_hint, Some(true));
    assert_eq!(annotations("lookup").idempotent_hint, Some(true));
    assert_eq!(annotations("destroy").destructive_hint, Some(true));
    assert_eq!(annotations("destroy").read_only_hint, Some(false));
    assert!(by_name["echo"].annotations.is_none());
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn stdio_pagination_is_followed_and_tools_limit_the_list() {
    let (transport, _stderr) = stdio_transport(&["--page-size", "4"]);
    let connection = connect(transport, Client::new()).await;
    let first = connection.list_tools(None).await.expect("first page");
    assert_eq!(first.tools.len(), 4);
    assert_eq!(first.next_cursor.as_deref(), Some("4"));
    assert_eq!(tool_names(&connection).await, ALL_TOOLS);
    connection.cancel().await.expect("cancel");

    let (transport, _stderr) =
        stdio_transport(&["--tools", "lookup,echo,fail", "--page-size", "2"]);
    let connection = connect(transport, Client::new()).await;
    assert_eq!(tool_names(&connection).await, ["lookup", "echo", "fail"]);
    // A tool left out of the list is unknown, not callable.
    let refused = connection
        .call_tool(params("shout", json!({"text": "x"})))
        .await;
    assert_invalid_params(refused);
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn an_unknown_tools_option_is_refused_at_start() {
    let output = Command::new(BIN)
        .args(["stdio", "--tools", "echo,nope"])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown tool \"nope\""), "{stderr}");
    assert!(output.stdout.is_empty());
}

fn assert_invalid_params(result: Result<CallToolResult, ServiceError>) {
    match result {
        Err(ServiceError::McpError(error)) => assert_eq!(error.code, ErrorCode::INVALID_PARAMS),
        other => panic!("expected an invalid_params error, got {other:?}"),
    }
}

// ---- calls ---------------------------------------------------------------------

#[tokio::test]
async fn stdio_calls_answer_fail_and_read_the_environment() {
    let (transport, _stderr) = stdio_transport(&[]);
    let connection = connect(transport, Client::new()).await;

    let echo = call(&connection, "echo", json!({"text": "hello"})).await;
    assert!(!is_error(&echo));
    assert_eq!(echo.structured_content, Some(json!({"echo": "hello"})));
    assert_eq!(text(&echo), "hello");

    let shout = call(&connection, "shout", json!({"text": "hello"})).await;
    assert_eq!(text(&shout), "HELLO");
    assert_eq!(shout.structured_content, None);

    let fail = call(&connection, "fail", json!({"message": "it broke"})).await;
    assert!(is_error(&fail));
    assert_eq!(text(&fail), "it broke");

    let env = call(&connection, "env", json!({"name": ENV_NAME})).await;
    assert!(!is_error(&env));
    assert_eq!(text(&env), ENV_VALUE);
    let unset = call(
        &connection,
        "env",
        json!({"name": "TOOLGATE_TEST_MCP_UNSET"}),
    )
    .await;
    assert!(is_error(&unset));

    // stdio has no HTTP request to read a header from.
    assert!(is_error(
        &call(&connection, "header", json!({"name": "host"})).await
    ));
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn stdio_other_tools_and_argument_checks() {
    let (transport, _stderr) = stdio_transport(&[]);
    let connection = connect(transport, Client::new()).await;

    let destroy = call(&connection, "destroy", json!({"target": "the-moon"})).await;
    assert_eq!(text(&destroy), "destroyed the-moon");
    let lookup = call(&connection, "lookup", json!({"key": "k1"})).await;
    assert_eq!(
        lookup.structured_content,
        Some(json!({"key": "k1", "value": "value-of-k1"}))
    );
    let slow = call(&connection, "slow_lookup", json!({"ms": 20})).await;
    assert_eq!(text(&slow), "slept 20 ms");
    let item = json!({"id": "a", "count": 2});
    let with_ref = call(&connection, "with_ref", json!({"item": item})).await;
    assert_eq!(with_ref.structured_content, Some(json!({"item": item})));

    // Arguments are checked against the schema, including a `$ref`'d one.
    let extra = call(&connection, "echo", json!({"text": "x", "more": 1})).await;
    assert!(is_error(&extra));
    assert!(
        text(&extra).starts_with("invalid arguments"),
        "{}",
        text(&extra)
    );
    let missing = call(&connection, "with_ref", json!({"item": {"count": 1}})).await;
    assert!(is_error(&missing));
    assert!(is_error(
        &call(&connection, "slow_lookup", json!({"ms": "x"})).await
    ));

    assert_invalid_params(connection.call_tool(params("nope", json!({}))).await);

    let calls = call(&connection, "calls", json!({})).await;
    let expected = json!([
        "destroy",
        "lookup",
        "slow_lookup",
        "with_ref",
        "echo",
        "with_ref",
        "slow_lookup",
        "nope",
        "calls"
    ]);
    assert_eq!(calls.structured_content, Some(json!({"calls": expected})));
    assert_eq!(
        serde_json::from_str::<Value>(&text(&calls)).unwrap(),
        expected
    );
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn http_calls_see_the_custom_headers() {
    let server = spawn_http("127.0.0.1:0", &[]).await;
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
    assert!(server.url.ends_with("/mcp"), "{}", server.url);
    let transport = http_transport(&server.url, &[("x-tenant", "blue")]);
    let connection = connect(transport, Client::new()).await;
    let info = connection.peer_info().expect("server info");
    assert_eq!(
        info.protocol_version,
        ProtocolVersion::LATEST_WITH_INITIALIZE
    );
    assert_eq!(tool_names(&connection).await, ALL_TOOLS);

    let header = call(&connection, "header", json!({"name": "X-Tenant"})).await;
    assert!(!is_error(&header), "{}", text(&header));
    assert_eq!(text(&header), "blue");
    assert!(is_error(
        &call(&connection, "header", json!({"name": "x-absent"})).await
    ));
    // Every request so far (initialize, initialized, the event stream, the
    // list and the calls) carried it; an absent header is null on each.
    let seen = call(&connection, "request_headers", json!({"name": "x-tenant"})).await;
    let requests = seen.structured_content.expect("structured")["requests"].clone();
    let requests = requests.as_array().expect("requests").clone();
    assert!(requests.len() >= 4, "{requests:?}");
    assert!(
        requests.iter().all(|r| r["value"] == "blue"),
        "{requests:?}"
    );
    assert!(
        requests.iter().any(|r| r["method"] == "POST"),
        "{requests:?}"
    );
    let absent = call(&connection, "request_headers", json!({"name": "x-absent"})).await;
    let absent = absent.structured_content.expect("structured");
    assert!(
        absent["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["value"].is_null()),
        "{absent}"
    );

    let echo = call(&connection, "echo", json!({"text": "over http"})).await;
    assert_eq!(echo.structured_content, Some(json!({"echo": "over http"})));
    let fail = call(&connection, "fail", json!({})).await;
    assert!(is_error(&fail));
    assert_eq!(text(&fail), "failed as asked");
    let env = call(&connection, "env", json!({"name": ENV_NAME})).await;
    assert_eq!(text(&env), ENV_VALUE);
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn http_paginates_and_a_fixed_port_can_be_reused() {
    let mut server = spawn_http("127.0.0.1:0", &["--page-size", "5"]).await;
    let connection = connect(http_transport(&server.url, &[]), Client::new()).await;
    let first = connection.list_tools(None).await.expect("first page");
    assert_eq!(first.tools.len(), 5);
    assert_eq!(tool_names(&connection).await, ALL_TOOLS);
    drop(connection);

    // Down and up again on the same port: what an "HTTP server comes back" test does.
    let url = server.url.clone();
    let listen = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    server.child.kill().await.expect("kill");
    let mut again = spawn_http(&listen, &["--tools", "echo"]).await;
    assert_eq!(again.url, url);
    let connection = connect(http_transport(&again.url, &[]), Client::new()).await;
    assert_eq!(tool_names(&connection).await, ["echo"]);
    connection.cancel().await.expect("cancel");
    again.child.kill().await.expect("kill");
    assert!(!again.exit_status().await.success());
}

// ---- hang, list_changed, crash -----------------------------------------------------

async fn assert_hang_does_not_block(connection: &Connection) {
    let peer = connection.peer().clone();
    let hang = tokio::spawn(async move { peer.call_tool(params("hang", json!({}))).await });
    // `calls` lists `hang` once the server has it, so the echo below really
    // runs while the hang is in progress.
    tokio::time::timeout(WAIT, async {
        loop {
            let calls = call(connection, "calls", json!({})).await;
            if calls.structured_content.unwrap()["calls"]
                .as_array()
                .unwrap()
                .contains(&json!("hang"))
            {
                break;
            }
        }
    })
    .await
    .expect("the server saw the hang call");
    let echo = call(connection, "echo", json!({"text": "still here"})).await;
    assert_eq!(text(&echo), "still here");
    assert!(!hang.is_finished(), "hang answered: {:?}", hang.await);
    hang.abort();
}

#[tokio::test]
async fn a_hang_does_not_block_a_parallel_echo_on_either_transport() {
    let (transport, _stderr) = stdio_transport(&[]);
    let connection = connect(transport, Client::new()).await;
    assert_hang_does_not_block(&connection).await;
    drop(connection);

    let server = spawn_http("127.0.0.1:0", &[]).await;
    let connection = connect(http_transport(&server.url, &[]), Client::new()).await;
    assert_hang_does_not_block(&connection).await;
}

#[tokio::test]
async fn closing_stdin_ends_the_process_despite_a_hang_in_flight() {
    let mut child = Command::new(BIN)
        .arg("stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    send_line(&mut stdin, initialize).await;
    send_line(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    send_line(&mut stdin, tool_call_message(1, "hang")).await;
    // Requests run concurrently: ask `calls` until the server has the hang.
    tokio::time::timeout(WAIT, async {
        for id in 2.. {
            send_line(&mut stdin, tool_call_message(id, "calls")).await;
            let answer = loop {
                let line = stdout.next_line().await.expect("read").expect("a line");
                let message: Value = serde_json::from_str(&line).expect("json");
                if message["id"] == id {
                    break message;
                }
            };
            let calls = &answer["result"]["structuredContent"]["calls"];
            if calls.as_array().expect("calls").contains(&json!("hang")) {
                break;
            }
        }
    })
    .await
    .expect("the server saw the hang call");
    // No cancellation is sent: only the end of stdin. rmcp alone would wait
    // 5 s for the hang before letting the process go.
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(3), child.wait())
        .await
        .expect("exit well before rmcp's 5 s drain")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

fn tool_call_message(id: u64, name: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": {}}})
}

async fn send_line(stdin: &mut tokio::process::ChildStdin, message: Value) {
    let line = format!("{message}\n");
    stdin.write_all(line.as_bytes()).await.expect("write");
}

#[tokio::test]
async fn stdio_add_tool_announces_list_changed() {
    let (transport, _stderr) = stdio_transport(&["--tools", "echo,add_tool"]);
    let client = Client::new();
    let connection = connect(transport, client.clone()).await;
    assert_eq!(tool_names(&connection).await, ["echo", "add_tool"]);

    let added = call(&connection, "add_tool", json!({"name": "fresh"})).await;
    assert!(!is_error(&added), "{}", text(&added));
    client.wait_list_changed(1).await;
    assert_eq!(tool_names(&connection).await, ["echo", "add_tool", "fresh"]);
    let fresh = call(&connection, "fresh", json!({"text": "new"})).await;
    assert_eq!(fresh.structured_content, Some(json!({"echo": "new"})));

    let again = call(&connection, "add_tool", json!({"name": "fresh"})).await;
    assert!(is_error(&again));
    let builtin = call(&connection, "add_tool", json!({"name": "crash"})).await;
    assert!(is_error(&builtin));
    connection.cancel().await.expect("cancel");
}

#[tokio::test]
async fn http_add_tool_announces_list_changed_to_every_session() {
    let server = spawn_http("127.0.0.1:0", &["--page-size", "3"]).await;
    let (first, second) = (Client::new(), Client::new());
    let caller = connect(http_transport(&server.url, &[]), first.clone()).await;
    let watcher = connect(http_transport(&server.url, &[]), second.clone()).await;
    assert_eq!(tool_names(&watcher).await.len(), ALL_TOOLS.len());

    let added = call(&caller, "add_tool", json!({"name": "extra_tool"})).await;
    assert!(!is_error(&added), "{}", text(&added));
    first.wait_list_changed(1).await;
    second.wait_list_changed(1).await;
    let names = tool_names(&watcher).await;
    assert_eq!(names.last().map(String::as_str), Some("extra_tool"));
    assert_eq!(names.len(), ALL_TOOLS.len() + 1);
    let echoed = call(&watcher, "extra_tool", json!({"text": "hi"})).await;
    assert_eq!(echoed.structured_content, Some(json!({"echo": "hi"})));
    caller.cancel().await.expect("cancel");
    watcher.cancel().await.expect("cancel");
}

#[tokio::test]
async fn crash_closes_the_stdio_transport() {
    let (transport, _stderr) = stdio_transport(&[]);
    let connection = connect(transport, Client::new()).await;
    let crashed = tokio::time::timeout(WAIT, connection.call_tool(params("crash", json!({}))))
        .await
        .expect("the call ends within the bound");
    assert!(crashed.is_err(), "crash answered: {crashed:?}");
    let reason = tokio::time::timeout(WAIT, connection.waiting())
        .await
        .expect("the service ends within the bound")
        .expect("join");
    assert!(matches!(reason, QuitReason::Closed), "{reason:?}");
}

#[tokio::test]
async fn crash_exits_the_http_server_with_status_3() {
    let mut server = spawn_http("127.0.0.1:0", &[]).await;
    let connection = connect(http_transport(&server.url, &[]), Client::new()).await;
    let peer = connection.peer().clone();
    // The answer never comes; the exit status is what the test waits on.
    let pending = tokio::spawn(async move { peer.call_tool(params("crash", json!({}))).await });
    assert_eq!(server.exit_status().await.code(), Some(3));
    let outcome = tokio::time::timeout(WAIT, pending)
        .await
        .expect("the call ends within the bound")
        .expect("join");
    assert!(outcome.is_err(), "crash answered: {outcome:?}");
}
