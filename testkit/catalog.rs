//! The tools the test server offers: names, input schemas and annotations.
//! What each one does lives in `tools.rs`; this file is only what a client
//! sees in `tools/list`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

/// Every built-in tool name, in the order `tools/list` returns them.
pub const BUILTIN_NAMES: &[&str] = &[
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

/// The definition of the built-in tool `name`, or `None` for any other name.
pub fn builtin(name: &str) -> Option<Tool> {
    let tool = match name {
        "echo" => echo_like("echo"),
        "shout" => tool(
            name,
            "Answers the text upper-cased, as text only",
            text_schema(),
        ),
        "fail" => tool(
            name,
            "Always fails with isError, carrying the message",
            object(json!({"message": {"type": "string"}}), &[]),
        ),
        "hang" => tool(name, "Never answers", object(json!({}), &[])),
        "slow_lookup" => tool(
            name,
            "Sleeps `ms` milliseconds, then answers",
            object(
                json!({"ms": {"type": "integer", "minimum": 0, "maximum": 600_000}}),
                &["ms"],
            ),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        "lookup" => tool(name, "Looks a key up", key_schema("key"))
            .with_annotations(ToolAnnotations::new().read_only(true).idempotent(true)),
        "destroy" => tool(name, "Destroys the target", key_schema("target"))
            .with_annotations(ToolAnnotations::new().read_only(false).destructive(true)),
        "add_tool" => tool(
            name,
            "Adds an echo-like tool and announces notifications/tools/list_changed",
            key_schema("name"),
        ),
        "crash" => tool(
            name,
            "Exits the process with status 3",
            object(json!({}), &[]),
        ),
        "env" => tool(name, "Answers an environment variable", key_schema("name")),
        "header" => tool(name, "Answers an HTTP request header", key_schema("name")),
        "request_headers" => tool(
            name,
            "Answers one header of every HTTP request received so far (the last 256): {requests: [{method, value}]}, value null where absent",
            key_schema("name"),
        ),
        "calls" => tool(name, "The tool names called so far", object(json!({}), &[])),
        "with_ref" => tool(name, "Answers the item; its schema uses $ref", ref_schema()),
        // Only with `--tools`: the default list is what other tests count.
        "meta" => tool(
            name,
            "Answers the call's _meta object",
            object(json!({}), &[]),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        _ => return None,
    };
    Some(tool)
}

/// A tool that behaves like `echo`; `add_tool` creates these under new names.
pub fn echo_like(name: &str) -> Tool {
    let mut schema = text_schema();
    schema.insert("additionalProperties".into(), Value::Bool(false));
    tool(
        name,
        "Answers the text as structuredContent {echo} and as text",
        schema,
    )
}

fn tool(name: &str, description: &'static str, schema: JsonObject) -> Tool {
    Tool::new(name.to_owned(), description, Arc::new(schema))
}

fn text_schema() -> JsonObject {
    key_schema("text")
}

/// An object schema with one required string property.
fn key_schema(key: &str) -> JsonObject {
    let mut properties = serde_json::Map::new();
    properties.insert(key.to_owned(), json!({"type": "string"}));
    object(Value::Object(properties), &[key])
}

fn object(properties: Value, required: &[&str]) -> JsonObject {
    let mut schema = serde_json::Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), properties);
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema
}

/// A schema that needs `$defs` + `$ref` resolution, for the projection tests.
fn ref_schema() -> JsonObject {
    let schema = json!({
        "type": "object",
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "count": {"type": "integer", "minimum": 0}
                },
                "required": ["id"]
            }
        },
        "properties": {"item": {"$ref": "#/$defs/Item"}},
        "required": ["item"]
    });
    match schema {
        Value::Object(map) => map,
        _ => unreachable!("a json! object literal"),
    }
}
