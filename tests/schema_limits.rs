//! Schemas that cost more than their text suggests: refused at the door,
//! measured without expanding them; and argument validation that cannot stall
//! the server: it runs off the async workers, within a time budget.

mod common;

use std::time::Duration;

use common::try_register_remote as post_register;
use common::{SpawnOptions, TestServer, register_remote, spawn_with};
use serde_json::{Map, Value, json};

/// Ten levels of five references each: about 2 KB of text, 5^10 expanded.
fn fan_out_schema() -> Value {
    let mut defs = Map::new();
    for level in 0..10 {
        let next: Vec<Value> = (0..5)
            .map(|_| json!({"$ref": format!("#/$defs/l{}", level + 1)}))
            .collect();
        defs.insert(format!("l{level}"), json!({"allOf": next}));
    }
    defs.insert("l10".into(), json!({"type": "object"}));
    json!({"type": "object", "$defs": defs, "allOf": [{"$ref": "#/$defs/l0"}]})
}

#[tokio::test]
async fn a_fanning_out_schema_is_refused_at_registration_and_definition_write() {
    let server = spawn_with(SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    })
    .await;
    let schema = fan_out_schema();
    assert!(schema.to_string().len() < 3000);
    let reply = post_register(
        &server,
        json!({"name": "fan_out", "callback_url": "http://127.0.0.1:9/cb", "parameters": schema}),
    )
    .await;
    assert_eq!(reply.status, 422, "{reply:?}");
    assert_eq!(reply.code(), "validation_error");
    assert!(reply.text.contains("expand"), "{reply:?}");

    let reply = server
        .post(
            "/tools/definitions",
            json!({"name": "fan_out", "parameters": schema,
                   "handler_type": "script", "handler": {"script": "return 1;"}}),
        )
        .await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.code(), "validation_error");

    // 81 levels: within the JSON parser's limit, over the schema's.
    let mut deep = json!({"type": "string"});
    for _ in 0..40 {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    let reply = post_register(
        &server,
        json!({"name": "deep", "callback_url": "http://127.0.0.1:9/cb", "parameters": deep}),
    )
    .await;
    assert_eq!(reply.status, 422, "{reply:?}");
    assert!(reply.text.contains("levels deep"), "{reply:?}");
}

/// A schema within every limit whose validation still takes long for a large
/// argument: every item of the array matches only the last of 1,500 branches.
fn slow_schema() -> Value {
    let branches: Vec<Value> = (0..1500)
        .map(|i| json!({"required": [format!("k{i}")]}))
        .collect();
    json!({"type": "object", "properties": {"items": {"type": "array", "items": {"anyOf": branches}}}})
}

/// A server with a 50 ms validation budget and `bulk_import` (of
/// [`slow_schema`]) registered, and the tool-calls path of a new session. The
/// callback's port is closed: a call that got past validation says so
/// ("could not connect").
async fn slow_tool_server() -> (TestServer, String) {
    let server = spawn_with(SpawnOptions {
        env: vec![(
            "TOOLGATE_ARGUMENT_VALIDATION_TIMEOUT_MS".into(),
            "50".into(),
        )],
        ..Default::default()
    })
    .await;
    register_remote(
        &server,
        json!({"name": "bulk_import", "callback_url": "http://127.0.0.1:9/cb", "parameters": slow_schema()}),
    )
    .await;
    let session = server.create_session().await;
    (server, format!("/sessions/{session}/tool-calls"))
}

#[tokio::test]
async fn validation_over_its_budget_refuses_the_call_and_never_stalls_the_server() {
    let (server, path) = slow_tool_server().await;
    let items: Vec<Value> = (0..40_000).map(|_| json!({"k1499": 1})).collect();
    let call = server.post(
        &path,
        json!({"name": "bulk_import", "arguments": {"items": items}}),
    );
    let probes = async {
        // While the call validates, the server keeps answering (how fast is
        // the benchmarks' business, not a test's).
        for _ in 0..10 {
            let reply = server.get("/healthz").await;
            assert_eq!(reply.status, 200);
        }
    };
    let (reply, ()) = tokio::join!(call, probes);
    assert_eq!(reply.status, 200, "{reply:?}");
    let result = &reply.body["data"];
    assert_eq!(result["status"], "error", "{result}");
    let message = result["output"].as_str().unwrap();
    assert!(message.contains("time budget"), "{message}");
    assert_eq!(
        result["execution_reason_code"], "argument_validation_timeout",
        "{result}"
    );
    let id = result["execution_id"].as_str().unwrap();
    let row = server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(row.body["data"]["provider_started"], false, "{row:?}");
    assert_eq!(
        row.body["data"]["execution_reason_code"], "argument_validation_timeout",
        "{row:?}"
    );

    // A small argument validates within the budget and reaches the provider.
    let reply = server
        .post(
            &path,
            json!({"name": "bulk_import", "arguments": {"items": [{"k1499": 1}]}}),
        )
        .await;
    let message = reply.body["data"]["output"].as_str().unwrap_or_default();
    assert!(message.contains("could not connect"), "{reply:?}");
    assert_eq!(
        reply.body["data"]["execution_reason_code"], "remote_connection_failed",
        "{reply:?}"
    );
}

#[test]
fn the_budget_flag_must_be_positive() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--argument-validation-timeout-ms", "0"])
        .env("TOOLGATE_DATA_DIR", tempfile::tempdir().unwrap().path())
        .env("TOOLGATE_LISTEN", "127.0.0.1:0")
        .output()
        .expect("run toolgate");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("budget"));
}

/// A validation cannot be stopped, so the ones refused calls leave running
/// are bounded: at most four run at once, a call finding every slot taken is
/// refused within its budget without starting another, and the slots come
/// back as the validations end.
#[tokio::test]
async fn costly_validations_hold_at_most_four_slots_and_further_calls_are_refused_unvalidated() {
    let (server, path) = slow_tool_server().await;
    let items: Vec<Value> = (0..40_000).map(|_| json!({"k1499": 1})).collect();
    let body = json!({"name": "bulk_import", "arguments": {"items": items}});
    let replies = futures::future::join_all((0..8).map(|_| server.post(&path, body.clone()))).await;
    let mut busy = 0;
    for reply in &replies {
        let result = &reply.body["data"];
        assert_eq!(
            result["execution_reason_code"], "argument_validation_timeout",
            "{reply:?}"
        );
        let message = result["output"].as_str().unwrap();
        if message.contains("every validation slot is busy") {
            busy += 1;
        }
    }
    // Eight at once and four slots: calls arriving while four validations
    // run find no slot (how many depends on how the requests were spread
    // against the validations' end; 3-4 of the 8 in the runs seen).
    assert!(
        busy >= 1,
        "eight costly calls at once: those past the four slots find none ({busy} did)"
    );
    // Once the validations end, a small call validates and reaches the
    // provider again (its port is closed).
    common::wait_until(
        Duration::from_secs(120),
        "the validation slots to come back",
        || async {
            let reply = server
                .post(
                    &path,
                    json!({"name": "bulk_import", "arguments": {"items": [{"k1499": 1}]}}),
                )
                .await;
            reply.body["data"]["execution_reason_code"] == "remote_connection_failed"
        },
    )
    .await;
}
