//! MCP test helpers: the repository's test MCP server (`toolgate-test-mcp`) over
//! stdio or streamable HTTP, and shortcuts for the `/mcp` API and catalogs.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::TestServer;

/// The test MCP server binary.
pub fn test_server_bin() -> &'static str {
    env!("CARGO_BIN_EXE_toolgate-test-mcp")
}

/// A config body for a stdio test server with extra fields merged in.
pub fn stdio_body(name: &str, extra: Value) -> Value {
    let mut body = json!({
        "name": name,
        "transport": "stdio",
        "stdio": {"command": test_server_bin(), "args": ["stdio"]},
    });
    merge(&mut body, extra);
    body
}

/// A config body for a stdio test server started through `sh`, leaving a
/// `sleep <marker>` in its process group: while that runs, the server is
/// attached ([`processes_running`]).
pub fn grouped_stdio_body(name: &str, marker: &str) -> Value {
    json!({
        "name": name,
        "transport": "stdio",
        "stdio": {"command": "sh", "args": ["-c", format!("sleep {marker} & exec {} stdio", test_server_bin())]},
    })
}

/// A config body for an HTTP server at `url` with extra fields merged in.
pub fn http_body(name: &str, url: &str, extra: Value) -> Value {
    let mut body = json!({"name": name, "transport": "http", "http": {"url": url}});
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
}

/// Creates an MCP server config and answers its id.
pub async fn create_server(server: &TestServer, body: Value) -> String {
    let reply = server.post("/mcp/servers", body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

/// The session's runtime catalog (`data`).
pub async fn catalog(server: &TestServer, session: &str) -> Value {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

/// The catalog entry named `name`, if any.
pub fn tool<'a>(catalog: &'a Value, name: &str) -> Option<&'a Value> {
    catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
}

/// The `mcp_servers` entry of `server_id`, if any.
pub fn server_entry<'a>(catalog: &'a Value, server_id: &str) -> Option<&'a Value> {
    catalog["mcp_servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["server_id"] == server_id)
}

/// Waits until the catalog shows `server_id` with `source` (`live`, `cached`,
/// `unavailable`), answering that catalog.
pub async fn wait_for_source(
    server: &TestServer,
    session: &str,
    server_id: &str,
    source: &str,
    timeout: Duration,
) -> Value {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let current = catalog(server, session).await;
        if server_entry(&current, server_id).is_some_and(|s| s["catalog_source"] == source) {
            return current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for MCP server {server_id} to be {source}: {current:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lets the session call irreversible tools (every MCP tool without a
/// declared level is one).
pub async fn allow_irreversible(server: &TestServer, session: &str) {
    let reply = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"allow_irreversible": true}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}

/// Makes a tool call on the session and answers the reply's `data`.
pub async fn call(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": arguments}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

/// A test MCP server over streamable HTTP, killed when dropped.
pub struct HttpMcp {
    pub url: String,
    pub port: u16,
    child: Option<Child>,
}

impl HttpMcp {
    /// Starts one on an ephemeral port.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// Starts one listening on `addr` (a fixed port, to come back on it).
    pub async fn start_on(addr: &str) -> Self {
        let mut child = Command::new(test_server_bin())
            .args(["http", "--listen", addr])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn toolgate-test-mcp");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                if let Some(url) = line.strip_prefix("listening ") {
                    return url.trim().to_owned();
                }
            }
            panic!("toolgate-test-mcp exited before listening");
        })
        .await
        .expect("toolgate-test-mcp did not listen within 30 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let port = url::Url::parse(&url)
            .ok()
            .and_then(|u| u.port())
            .expect("port in the listening URL");
        Self {
            url,
            port,
            child: Some(child),
        }
    }

    /// Kills the server (as a crash or an outage would) and waits for it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A loopback MCP URL nothing listens on, while the port lives.
pub fn dead_url() -> (String, super::ports::DeadPort) {
    let port = super::ports::dead_port();
    (port.url("/mcp"), port)
}

/// Pids of running processes whose command line is exactly `args`.
pub fn processes_running(args: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = args.join("\0").into_bytes();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = cmdline.strip_suffix(b"\0").unwrap_or(&cmdline);
            (cmdline == wanted.as_slice()).then_some(pid)
        })
        .collect()
}

// The MCP endpoint (`/mcp/sessions/{id}`) spoken as plain HTTP.

/// An `initialize` request body.
pub fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"},
        },
    })
}

/// A POST to the chat session's MCP endpoint, as MCP clients send it.
pub fn mcp_post(server: &TestServer, session: &str, key: Option<&str>) -> reqwest::RequestBuilder {
    let request = reqwest::Client::new()
        .post(server.url(&format!("/mcp/sessions/{session}")))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    match key {
        Some(key) => request.bearer_auth(key),
        None => request,
    }
}

/// The JSON-RPC message of an SSE or JSON answer.
pub async fn rpc_answer(response: reqwest::Response) -> Value {
    let text = response.text().await.unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| !data.is_empty())
        .find_map(|data| serde_json::from_str::<Value>(data).ok())
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC message in {text:?}"))
}

/// `body` posted as a message of the MCP session `mcp_session`.
pub async fn post_raw(
    server: &TestServer,
    session: &str,
    mcp_session: &str,
    body: &str,
) -> reqwest::Response {
    mcp_post(server, session, Some(&server.token))
        .header("mcp-session-id", mcp_session)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

/// Opens an MCP session on `session` and says it is initialised; returns its id.
pub async fn open_mcp_session(server: &TestServer, session: &str) -> String {
    let opened = mcp_post(server, session, Some(&server.token))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::OK);
    let id = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let initialized = post_raw(
        server,
        session,
        &id,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert!(initialized.status().is_success(), "{initialized:?}");
    id
}
