//! Issue 4 with remote tools: catalog fields of remote tools with and without
//! declared metadata, a conflict between a remote tool and a builtin, and the
//! `allow_irreversible` rule on a real irreversible tool.

mod common;

use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(server: &TestServer, body: Value) {
    common::register_remote(server, body).await;
}

async fn catalog(server: &TestServer, session: &str) -> Value {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

fn entries<'a>(catalog: &'a Value, name: &str) -> Vec<&'a Value> {
    catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == name)
        .collect()
}

#[tokio::test]
async fn remote_tools_show_their_metadata_and_its_basis() {
    let server = spawn_app().await;
    // Port 9 is never called here: the catalog does not contact callbacks.
    register(&server, json!({"name": "get_weather", "callback_url": "http://127.0.0.1:9/w", "source": "plugin:weather"})).await;
    register(
        &server,
        json!({"name": "buy_item", "callback_url": "http://127.0.0.1:9/b", "side_effect_level": "irreversible",
               "replay_safety": "confirm_on_replay", "async_capability": "deferred_ok"}),
    )
    .await;
    let session = server.create_session().await;
    let catalog = catalog(&server, &session).await;
    let weather = entries(&catalog, "get_weather")[0];
    let expected_default = json!({
        "provider_id": "remote:plugin:weather", "provider_type": "remote", "source": "plugin:weather",
        "side_effect_level": "none", "allowed_slots": [], "availability": "available",
        "availability_reason": null, "async_capability": "inline_only", "default_delivery_mode": "inline",
        "catalog_source": null, "replay_safety": "safe", "result_visibility": "immediate",
        "side_effect_level_basis": "platform_default", "allowed_slots_basis": "platform_default",
        "replay_safety_basis": "inferred_from_execution_policy",
    });
    for (key, value) in expected_default.as_object().unwrap() {
        assert_eq!(&weather[key], value, "get_weather.{key}");
    }
    assert_eq!(
        weather["metadata_basis_detail"]["side_effect_level"],
        json!({"basis": "platform_default", "scope": "platform"})
    );
    assert!(weather["parameters"].is_object());

    let buy = entries(&catalog, "buy_item")[0];
    assert_eq!(buy["side_effect_level"], "irreversible");
    assert_eq!(buy["side_effect_level_basis"], "tool_declared");
    assert_eq!(buy["replay_safety"], "confirm_on_replay");
    assert_eq!(buy["replay_safety_basis"], "tool_declared");
    assert_eq!(buy["async_capability"], "deferred_ok");
    assert_eq!(
        buy["metadata_basis_detail"]["replay_safety"],
        json!({"basis": "tool_declared", "scope": "tool"})
    );
    // Not callable under default permissions (allow_irreversible is false).
    let narrowed = server
        .get(&format!("/sessions/{session}/tools/runtime?slot=narrator"))
        .await;
    assert!(entries(&narrowed.body["data"], "buy_item").is_empty());
    let refused = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "buy_item", "arguments": {}}),
        )
        .await;
    assert_eq!(refused.body["data"]["status"], "denied");
    assert!(
        refused.body["data"]["output"]
            .as_str()
            .unwrap()
            .contains("allow_irreversible"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_remote_tool_named_like_a_builtin_is_a_conflict_and_cannot_be_called() {
    let server = spawn_app().await;
    register(&server, json!({"name": "roll_dice", "callback_url": "http://127.0.0.1:9/dice", "source": "plugin:dice"})).await;
    let session = server.create_session().await;
    let catalog = catalog(&server, &session).await;
    let both = entries(&catalog, "roll_dice");
    assert_eq!(both.len(), 2, "{catalog}");
    for entry in &both {
        assert_eq!(entry["availability"], "conflict");
        assert!(
            entry["availability_reason"]
                .as_str()
                .unwrap()
                .contains("roll_dice")
        );
    }
    let providers: Vec<&str> = both
        .iter()
        .map(|e| e["provider_type"].as_str().unwrap())
        .collect();
    assert!(providers.contains(&"builtin") && providers.contains(&"remote"));
    let conflict = &catalog["conflicts"][0];
    assert_eq!(conflict["name"], "roll_dice");
    let openai = server
        .get(&format!("/sessions/{session}/tools/runtime?format=openai"))
        .await;
    let names: Vec<&str> = openai.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"roll_dice"),
        "a conflicted name is never offered to the model"
    );

    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "arguments": {}}),
        )
        .await;
    assert_eq!(call.body["data"]["is_error"], true);
    assert_eq!(call.body["data"]["status"], "denied");
    assert!(
        call.body["data"]["output"]
            .as_str()
            .unwrap()
            .contains("several providers")
    );
    let journal = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(journal.body["data"][0]["status"], "denied");
    assert_eq!(journal.body["data"][0]["tool_name"], "roll_dice");
}
