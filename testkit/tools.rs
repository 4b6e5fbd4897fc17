//! What each tool does when called. Arguments are checked against the tool's
//! own input schema first, as a strict real server would, so a bad argument is
//! an `isError` result the model can read rather than a protocol error.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use crate::handler::{AddToolError, TestServer};

/// Exit status of the `crash` tool, so a test can tell it from other exits.
pub const CRASH_STATUS: i32 = 3;

/// How long `hang` sleeps: far past any call timeout a test would use.
const HANG: Duration = Duration::from_secs(3600);

/// Runs `tool` with `arguments`; the tool is one the server lists.
pub async fn run(
    server: &TestServer,
    tool: &Tool,
    arguments: JsonObject,
    context: &RequestContext<RoleServer>,
) -> CallToolResult {
    if let Err(message) = check_arguments(tool, &arguments) {
        return error(format!("invalid arguments: {message}"));
    }
    let text = |key: &str| string_arg(&arguments, key);
    match tool.name.as_ref() {
        "shout" => success(text("text").to_uppercase()),
        "fail" => error(
            arguments
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("failed as asked")
                .to_owned(),
        ),
        "hang" => hang(server, context).await,
        "slow_lookup" => {
            let ms = arguments.get("ms").and_then(Value::as_u64).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            success(format!("slept {ms} ms"))
        }
        "lookup" => {
            let key = text("key");
            CallToolResult::structured(json!({"key": key, "value": format!("value-of-{key}")}))
        }
        "destroy" => success(format!("destroyed {}", text("target"))),
        "add_tool" => add_tool(server, &text("name")).await,
        "crash" => {
            tracing::warn!("crashing as asked");
            std::process::exit(CRASH_STATUS)
        }
        "env" => env(&text("name")),
        "header" => header(&text("name"), context),
        "request_headers" => request_headers(server, &text("name")),
        "calls" => calls(server),
        "with_ref" => CallToolResult::structured(json!({"item": arguments.get("item")})),
        // `echo` and every tool `add_tool` created.
        _ => echo(&text("text")),
    }
}

/// Sleeps for an hour. A cancelled request or a closing process ends the
/// sleep only to free the task: rmcp drops the answer to a cancelled request,
/// and a closed stdin has no one to answer.
async fn hang(server: &TestServer, context: &RequestContext<RoleServer>) -> CallToolResult {
    tokio::select! {
        () = tokio::time::sleep(HANG) => success("woke up".into()),
        () = context.ct.cancelled() => error("cancelled".into()),
        () = server.closing().cancelled() => error("closing".into()),
    }
}

fn check_arguments(tool: &Tool, arguments: &JsonObject) -> Result<(), String> {
    let schema = Value::Object(tool.input_schema.as_ref().clone());
    let validator = jsonschema::validator_for(&schema).map_err(|err| err.to_string())?;
    validator
        .validate(&Value::Object(arguments.clone()))
        .map_err(|err| err.to_string())
}

/// A string argument the schema already required.
fn string_arg(arguments: &JsonObject, key: &str) -> String {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn success(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn echo(text: &str) -> CallToolResult {
    let mut result = CallToolResult::structured(json!({"echo": text}));
    // The text content is the plain text, not the JSON `structured` puts there,
    // so a client that falls back to text sees the same words.
    result.content = vec![ContentBlock::text(text.to_owned())];
    result
}

async fn add_tool(server: &TestServer, name: &str) -> CallToolResult {
    match server.add_tool(name).await {
        Ok(()) => success(format!("added {name}")),
        Err(AddToolError::Exists) => error(format!("tool {name} already exists")),
        Err(AddToolError::Reserved) => error(format!("{name} is a built-in tool name")),
        Err(AddToolError::Invalid) => error("name must be 1-64 of [A-Za-z0-9_.-]".into()),
    }
}

fn env(name: &str) -> CallToolResult {
    match std::env::var(name) {
        Ok(value) => success(value),
        Err(_) => error(format!("{name} is not set")),
    }
}

/// The header as this request carried it; the streamable HTTP transport puts
/// the request's `http::request::Parts` into the context's extensions.
fn header(name: &str, context: &RequestContext<RoleServer>) -> CallToolResult {
    let Some(parts) = context.extensions.get::<axum::http::request::Parts>() else {
        return error("not an HTTP request".into());
    };
    match parts.headers.get(name).map(|value| value.to_str()) {
        Some(Ok(value)) => success(value.to_owned()),
        Some(Err(_)) => error(format!("header {name} is not visible ASCII")),
        None => error(format!("no header {name}")),
    }
}

fn request_headers(server: &TestServer, name: &str) -> CallToolResult {
    let requests: Vec<Value> = server
        .request_headers(name)
        .into_iter()
        .map(|(method, value)| json!({"method": method, "value": value}))
        .collect();
    CallToolResult::structured(json!({ "requests": requests }))
}

fn calls(server: &TestServer) -> CallToolResult {
    let calls = server.calls();
    let mut result = CallToolResult::structured(json!({ "calls": calls }));
    result.content = vec![ContentBlock::text(json!(calls).to_string())];
    result
}
