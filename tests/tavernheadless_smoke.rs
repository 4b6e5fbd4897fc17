//! TavernHeadless's own smoke run for tools (`../shared/reference/tavernheadless-smoke-tools.ts`),
//! request by request, against the real server with the script switch off and
//! on: a TavernHeadless client must work against toolgate unchanged.

mod common;

use common::{SpawnOptions, TestServer, spawn_app, spawn_with};
use serde_json::{Value, json};

/// The definition the smoke run posts: a script handler with no script.
fn smoke_definition(run_id: &str) -> Value {
    json!({
        "name": format!("{run_id}-tool"),
        "description": "smoke test tool",
        "parameters": {"type": "object", "properties": {}},
        "side_effect_level": "none",
        "source": "custom",
        "handler_type": "script",
        "handler": {},
    })
}

#[tokio::test]
async fn with_the_switch_off_the_definition_step_is_403_whatever_the_body() {
    let server = spawn_app().await;
    let reply = server
        .post("/tools/definitions", smoke_definition("smoke1"))
        .await;
    assert_eq!(reply.status, 403, "{reply:?}");
    assert_eq!(reply.code(), "tool_script_handler_disabled");
    // The switch decides before validation: an invalid name changes nothing.
    let mut invalid = smoke_definition("smoke1");
    invalid["name"] = json!("not a valid name!");
    let reply = server.post("/tools/definitions", invalid).await;
    assert_eq!(reply.status, 403, "{reply:?}");
    assert_eq!(reply.code(), "tool_script_handler_disabled");
    let listed = server.get("/tools/definitions").await;
    assert_eq!(listed.status, 200);
    assert!(listed.body["data"].as_array().unwrap().is_empty());
}

async fn tool_call(server: &TestServer, session: &str, name: &str) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": {}}),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body["data"].clone()
}

#[tokio::test]
async fn with_the_switch_on_the_whole_crud_sequence_answers_as_tavernheadless_does() {
    let server = spawn_with(SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    })
    .await;
    let created = server
        .post("/tools/definitions", smoke_definition("smoke2"))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    assert_eq!(created.body["data"]["handler"], json!({}));

    let listed = server.get("/tools/definitions").await;
    assert_eq!(listed.status, 200);
    assert!(listed.body["data"].is_array());
    let got = server.get(&format!("/tools/definitions/{id}")).await;
    assert_eq!(got.body["data"]["id"], id.as_str());
    let patched = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({"description": "updated"}),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    for enabled in [false, true] {
        let toggled = server
            .patch(
                &format!("/tools/definitions/{id}/toggle"),
                json!({"enabled": enabled}),
            )
            .await;
        assert_eq!(toggled.status, 200, "{toggled:?}");
        assert_eq!(toggled.body["data"]["enabled"], enabled);
    }

    // Listed in the catalog with the reason, and a call is a clear tool error.
    let session = server.create_session().await;
    let catalog = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    let entry = catalog.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "smoke2-tool")
        .cloned()
        .unwrap_or_else(|| panic!("not listed: {catalog:?}"));
    assert_eq!(entry["availability"], "unavailable", "{entry}");
    let result = tool_call(&server, &session, "smoke2-tool").await;
    assert_eq!(result["is_error"], true, "{result}");
    assert!(
        result["output"].as_str().unwrap().contains("no handler"),
        "{result}"
    );

    let deleted = server.delete(&format!("/tools/definitions/{id}")).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
}
