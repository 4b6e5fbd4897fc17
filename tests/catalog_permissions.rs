//! The runtime catalog, the tool-permissions API, and the permission checks every
//! tool call passes, through the real server.

mod common;

use std::collections::BTreeSet;

use common::{TestServer, spawn_app};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn catalog(server: &TestServer, session: &str, query: &str) -> Value {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime{query}"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

fn names(tools: &Value) -> BTreeSet<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["name"]
                .as_str()
                .or(t["function"]["name"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const ALL_BUILTINS: [&str; 11] = [
    "roll_dice",
    "random_choice",
    "get_time",
    "get_character_info",
    "get_variable",
    "set_variable",
    "query_memory",
    "list_resources",
    "read_resource",
    "write_resource",
    "delete_resource",
];

async fn put_permissions(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .put(&format!("/sessions/{session}/tool-permissions"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

async fn tool_call(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

/// The `execution_reason_code` of a refusal by `rule`.
fn reason_code_of(rule: &str) -> &'static str {
    match rule {
        "enabled" => "permission_tools_disabled",
        "allowed_slots" => "permission_slot_not_allowed_by_tool",
        "slot_allow_list" => "permission_slot_not_on_allow_list",
        "slot_deny_list" => "permission_slot_on_deny_list",
        "allow_irreversible" => "permission_irreversible_not_allowed",
        "max_calls_per_turn" => "permission_max_calls_per_turn_exceeded",
        other => panic!("no permission rule {other}"),
    }
}

/// A refusal: model-visible, `denied`, naming the rule that refused, with the
/// rule's reason code.
fn assert_denied(result: &Value, rule: &str) {
    assert_eq!(result["is_error"], true, "{result}");
    assert_eq!(result["status"], "denied", "{result}");
    assert_eq!(
        result["execution_reason_code"],
        reason_code_of(rule),
        "{result}"
    );
    let message = result["output"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("`{rule}`")),
        "expected rule {rule}: {result}"
    );
}

#[tokio::test]
async fn catalog_lists_every_builtin_with_the_seeds_fields() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let before = common_now_ms();
    let data = catalog(&server, &session, "").await;
    assert_eq!(data["session_id"], session.as_str());
    assert!(data["generated_at"].as_i64().unwrap() >= before);
    assert_eq!(data["conflicts"], json!([]));
    assert_eq!(names(&data["tools"]), set(&ALL_BUILTINS));

    let tools = data["tools"].as_array().unwrap();
    let dice = tools.iter().find(|t| t["name"] == "roll_dice").unwrap();
    let mut expected = json!({
        "name": "roll_dice",
        "provider_id": "builtin",
        "provider_type": "builtin",
        "source": "builtin",
        "side_effect_level": "none",
        "allowed_slots": [],
        "availability": "available",
        "availability_reason": null,
        "async_capability": "inline_only",
        "default_delivery_mode": "inline",
        "catalog_source": null,
        "replay_safety": "safe",
        "result_visibility": "immediate",
        "side_effect_level_basis": "tool_declared",
        "allowed_slots_basis": "tool_declared",
        "parameter_schema_basis": "tool_declared",
        "replay_safety_basis": "inferred_from_execution_policy",
        "metadata_basis_detail": {
            "side_effect_level": {"basis": "tool_declared", "scope": "tool"},
            "allowed_slots": {"basis": "tool_declared", "scope": "tool"},
            "parameter_schema": {"basis": "tool_declared", "scope": "tool"},
            "replay_safety": {"basis": "inferred_from_execution_policy", "scope": "inference"}
        }
    });
    expected["description"] = dice["description"].clone();
    expected["parameters"] = dice["parameters"].clone();
    assert_eq!(dice, &expected);
    assert_eq!(dice["parameters"]["properties"]["sides"]["type"], "integer");

    let set_variable = tools.iter().find(|t| t["name"] == "set_variable").unwrap();
    assert_eq!(set_variable["provider_id"], "builtin:session");
    assert_eq!(set_variable["provider_type"], "builtin");
    assert_eq!(set_variable["side_effect_level"], "sandbox");
    assert_eq!(set_variable["replay_safety"], "safe");
    assert_eq!(
        set_variable["allowed_slots"],
        json!(["director", "memory", "narrator"])
    );
    let write = tools
        .iter()
        .find(|t| t["name"] == "write_resource")
        .unwrap();
    assert_eq!(write["provider_id"], "builtin:resource");
    assert_eq!(write["source"], "resource");
    assert_eq!(write["side_effect_level"], "sandbox");
    let read = tools.iter().find(|t| t["name"] == "read_resource").unwrap();
    assert_eq!(read["side_effect_level"], "none");
}

#[tokio::test]
async fn catalog_rejects_bad_queries_and_foreign_sessions() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    for query in ["?slot=writer", "?format=anthropic", "?slot=", "?colour=red"] {
        let reply = server
            .get(&format!("/sessions/{session}/tools/runtime{query}"))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {reply:?}");
        assert_eq!(reply.code(), "validation_error");
    }
    let reply = server.get("/sessions/sess_nope/tools/runtime").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.code(), "not_found");

    let stranger = server.create_account("stranger").await;
    for path in [
        format!("/sessions/{session}/tools/runtime"),
        format!("/sessions/{session}/tool-permissions"),
    ] {
        let reply = server.send_as(&stranger, Method::GET, &path, None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}: {reply:?}");
    }
}

#[tokio::test]
async fn catalog_narrows_to_what_a_slot_may_call() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    // Defaults: the verifier may not call the state-changing builtins.
    let verifier = catalog(&server, &session, "?slot=verifier").await;
    let mut expected = set(&ALL_BUILTINS);
    for writer in ["set_variable", "write_resource", "delete_resource"] {
        expected.remove(writer);
    }
    assert_eq!(names(&verifier["tools"]), expected);
    let narrator = catalog(&server, &session, "?slot=narrator").await;
    assert_eq!(names(&narrator["tools"]), set(&ALL_BUILTINS));

    put_permissions(
        &server,
        &session,
        json!({
            "slot_allow_list": {"narrator": ["roll_dice", "get_time", "no_such_tool"]},
            "slot_deny_list": {"director": ["roll_dice"], "memory": []}
        }),
    )
    .await;
    let narrator = catalog(&server, &session, "?slot=narrator").await;
    assert_eq!(names(&narrator["tools"]), set(&["roll_dice", "get_time"]));
    let director = catalog(&server, &session, "?slot=director").await;
    let mut expected = set(&ALL_BUILTINS);
    expected.remove("roll_dice");
    assert_eq!(names(&director["tools"]), expected);
    // An empty deny list denies nothing.
    let memory = catalog(&server, &session, "?slot=memory").await;
    assert_eq!(names(&memory["tools"]), set(&ALL_BUILTINS));
    // Without a slot, slot rules do not apply: everything stays listed and available.
    let all = catalog(&server, &session, "").await;
    assert!(
        all["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["availability"] == "available")
    );

    put_permissions(&server, &session, json!({"enabled": false})).await;
    let narrator = catalog(&server, &session, "?slot=narrator").await;
    assert_eq!(narrator["tools"], json!([]));
    let all = catalog(&server, &session, "").await;
    assert_eq!(names(&all["tools"]), set(&ALL_BUILTINS));
    for tool in all["tools"].as_array().unwrap() {
        assert_eq!(tool["availability"], "unavailable", "{tool}");
        assert!(
            tool["availability_reason"]
                .as_str()
                .unwrap()
                .contains("`enabled`"),
            "{tool}"
        );
    }
    let openai = catalog(&server, &session, "?format=openai").await;
    assert_eq!(openai["tools"], json!([]));
}

#[tokio::test]
async fn openai_format_is_a_ready_to_send_tools_array() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let full = catalog(&server, &session, "").await;
    let data = catalog(&server, &session, "?format=openai").await;
    assert_eq!(data["session_id"], session.as_str());
    let tools = data["tools"].as_array().unwrap();
    assert_eq!(tools.len(), ALL_BUILTINS.len());
    for tool in tools {
        let keys: BTreeSet<&str> = tool
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, BTreeSet::from(["type", "function"]), "{tool}");
        assert_eq!(tool["type"], "function");
        let function = &tool["function"];
        let keys: BTreeSet<&str> = function
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, BTreeSet::from(["name", "description", "parameters"]));
        let entry = full["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == function["name"])
            .unwrap();
        assert_eq!(function["parameters"], entry["parameters"]);
        assert_eq!(function["description"], entry["description"]);
        assert_eq!(function["parameters"]["type"], "object");
    }
    let verifier = catalog(&server, &session, "?slot=verifier&format=openai").await;
    let names = names(&verifier["tools"]);
    assert!(!names.contains("set_variable") && names.contains("get_variable"));
}

#[tokio::test]
async fn permissions_default_replace_and_merge() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/tool-permissions");
    let defaults = json!({
        "enabled": true,
        "max_calls_per_turn": 10,
        "max_steps_per_generation": 5,
        "allow_irreversible": false,
        "slot_allow_list": {},
        "slot_deny_list": {}
    });
    let reply = server.get(&path).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["data"], defaults);

    // PUT replaces the whole object with the seed's example.
    let seed = json!({
        "allow_irreversible": false,
        "max_calls_per_turn": 10,
        "max_steps_per_generation": 5,
        "slot_allow_list": {"narrator": ["roll_dice", "get_time"]},
        "slot_deny_list": {"verifier": ["set_variable"]}
    });
    let stored = put_permissions(&server, &session, seed.clone()).await;
    let mut expected = seed.clone();
    expected["enabled"] = json!(true);
    assert_eq!(stored, expected);
    assert_eq!(server.get(&path).await.body["data"], expected);
    // Stored in the session's metadata_json.tool_permissions.
    let reply = server.get(&format!("/sessions/{session}")).await;
    assert_eq!(reply.body["data"]["metadata"]["tool_permissions"], expected);

    // The seed's merge example: narrator's list is kept, director's added.
    let reply = server
        .patch(
            &path,
            json!({"max_calls_per_turn": 20, "slot_allow_list": {"director": ["get_time"]}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let merged = json!({
        "enabled": true,
        "allow_irreversible": false,
        "max_calls_per_turn": 20,
        "max_steps_per_generation": 5,
        "slot_allow_list": {"narrator": ["roll_dice", "get_time"], "director": ["get_time"]},
        "slot_deny_list": {"verifier": ["set_variable"]}
    });
    assert_eq!(reply.body["data"], merged);
    assert_eq!(server.get(&path).await.body["data"], merged);

    // Replacing a slot's list replaces only that slot; null removes it.
    let reply = server
        .patch(
            &path,
            json!({"enabled": false, "slot_allow_list": {"narrator": ["query_memory"], "director": null}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["data"]["enabled"], false);
    assert_eq!(
        reply.body["data"]["slot_allow_list"],
        json!({"narrator": ["query_memory"]})
    );
    assert_eq!(
        reply.body["data"]["slot_deny_list"],
        json!({"verifier": ["set_variable"]})
    );

    // PUT with missing fields resets them to the defaults.
    let stored = put_permissions(&server, &session, json!({"max_calls_per_turn": 3})).await;
    let mut expected = defaults.clone();
    expected["max_calls_per_turn"] = json!(3);
    assert_eq!(stored, expected);
    let stored = put_permissions(&server, &session, json!({})).await;
    assert_eq!(stored, defaults);
}

#[tokio::test]
async fn permissions_reject_bad_bodies_and_unknown_sessions() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/tool-permissions");
    let bad_patches = [
        json!({}),
        json!({"slot_allow_list": {"writer": ["roll_dice"]}}),
        json!({"slot_deny_list": {"Narrator": ["roll_dice"]}}),
        json!({"max_calls_per_turn": -1}),
        json!({"max_steps_per_generation": -5}),
        json!({"max_calls_per_turn": "10"}),
        json!({"max_calls_per_turn": 2.5}),
        json!({"enabled": "true"}),
        json!({"allow_irreversible": 1}),
        json!({"slot_allow_list": ["roll_dice"]}),
        json!({"slot_allow_list": {"narrator": "roll_dice"}}),
        json!({"slot_allow_list": {"narrator": [42]}}),
        json!({"colour": "red"}),
        json!([]),
    ];
    for body in bad_patches {
        for method in [Method::PATCH, Method::PUT] {
            if method == Method::PUT && body == json!({}) {
                continue; // an empty PUT is a valid reset to defaults
            }
            let reply = server.send(method.clone(), &path, Some(body.clone())).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{method} {body}: {reply:?}"
            );
            assert_eq!(reply.code(), "validation_error", "{body}");
        }
    }
    let raw = server
        .client
        .patch(server.url(&path))
        .bearer_auth(&server.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    // Nothing was changed by the refused requests.
    assert_eq!(
        server.get(&path).await.body["data"]["max_calls_per_turn"],
        10
    );

    for method in [Method::GET, Method::PUT, Method::PATCH] {
        let body = (method != Method::GET).then(|| json!({"enabled": false}));
        let reply = server
            .send(method.clone(), "/sessions/sess_nope/tool-permissions", body)
            .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method}: {reply:?}");
        assert_eq!(reply.code(), "not_found");
    }
}

#[tokio::test]
async fn concurrent_patches_do_not_lose_each_others_lists() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/tool-permissions");
    let mut patches = Vec::new();
    for list in ["slot_allow_list", "slot_deny_list"] {
        for slot in ["director", "memory", "narrator", "verifier"] {
            patches.push(json!({ list: { slot: [format!("{list}_{slot}")] } }));
        }
    }
    let replies =
        futures::future::join_all(patches.iter().map(|body| server.patch(&path, body.clone())))
            .await;
    assert!(
        replies.iter().all(|r| r.status == StatusCode::OK),
        "{replies:?}"
    );
    let stored = server.get(&path).await.body["data"].clone();
    for list in ["slot_allow_list", "slot_deny_list"] {
        for slot in ["director", "memory", "narrator", "verifier"] {
            assert_eq!(
                stored[list][slot],
                json!([format!("{list}_{slot}")]),
                "{stored}"
            );
        }
    }
}

#[tokio::test]
async fn each_permission_rule_refuses_without_running_the_tool() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let set_hp = |slot: &str, value: i64| json!({"name": "set_variable", "caller_slot": slot, "arguments": {"name": "hp", "value": value}});

    // The caller slot defaults to narrator; unknown slots are client errors.
    let ok = tool_call(
        &server,
        &session,
        json!({"name": "set_variable", "arguments": {"name": "hp", "value": 1}}),
    )
    .await;
    assert_eq!(ok["status"], "success", "{ok}");
    assert_eq!(ok["execution_reason_code"], Value::Null, "{ok}");
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "caller_slot": "writer"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);

    // enabled
    put_permissions(&server, &session, json!({"enabled": false})).await;
    assert_denied(
        &tool_call(&server, &session, set_hp("narrator", 2)).await,
        "enabled",
    );
    assert_denied(
        &tool_call(&server, &session, json!({"name": "roll_dice"})).await,
        "enabled",
    );

    // the tool's allowed_slots (checked before the deny list that also names it,
    // as in the seed's example permissions)
    put_permissions(
        &server,
        &session,
        json!({"slot_deny_list": {"verifier": ["set_variable"]}}),
    )
    .await;
    assert_denied(
        &tool_call(&server, &session, set_hp("verifier", 3)).await,
        "allowed_slots",
    );

    // slot allow list
    put_permissions(
        &server,
        &session,
        json!({"slot_allow_list": {"narrator": ["roll_dice", "get_time"]}}),
    )
    .await;
    assert_denied(
        &tool_call(&server, &session, set_hp("narrator", 4)).await,
        "slot_allow_list",
    );
    let allowed = tool_call(&server, &session, json!({"name": "roll_dice"})).await;
    assert_eq!(allowed["status"], "success", "{allowed}");
    // ...which binds only its own slot.
    let director = tool_call(&server, &session, set_hp("director", 5)).await;
    assert_eq!(director["status"], "success", "{director}");

    // slot deny list
    put_permissions(
        &server,
        &session,
        json!({"slot_deny_list": {"director": ["set_variable"]}}),
    )
    .await;
    assert_denied(
        &tool_call(&server, &session, set_hp("director", 6)).await,
        "slot_deny_list",
    );
    let hp = tool_call(
        &server,
        &session,
        json!({"name": "get_variable", "arguments": {"name": "hp"}}),
    )
    .await;
    assert_eq!(hp["output"]["value"], 5, "no refused call ran: {hp}");

    // An unknown tool is refused as well, and a refusal is not a client error.
    let unknown = tool_call(&server, &session, json!({"name": "summon_demon"})).await;
    assert_eq!(unknown["status"], "denied");
    assert_eq!(unknown["is_error"], true);
    assert_eq!(unknown["execution_reason_code"], "tool_not_found");

    // The journal rows carry the codes the answers did.
    let rows = server
        .get(&format!(
            "/tool-executions?session_id={session}&sort_order=asc&limit=200"
        ))
        .await;
    assert_eq!(rows.status, StatusCode::OK, "{rows:?}");
    let codes: Vec<&Value> = rows.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| &row["execution_reason_code"])
        .collect();
    for (result, code) in [(&ok, Value::Null), (&unknown, json!("tool_not_found"))] {
        let id = result["execution_id"].as_str().unwrap();
        let row = server.get(&format!("/tool-executions/{id}")).await;
        assert_eq!(row.body["data"]["execution_reason_code"], code, "{row:?}");
    }
    for rule in [
        "enabled",
        "allowed_slots",
        "slot_allow_list",
        "slot_deny_list",
    ] {
        assert!(
            codes.contains(&&json!(reason_code_of(rule))),
            "{rule}: {codes:?}"
        );
    }
}

#[tokio::test]
async fn parallel_calls_cannot_exceed_max_calls_per_turn() {
    let mut server = spawn_app().await;
    let session = server.create_session().await;
    put_permissions(&server, &session, json!({"max_calls_per_turn": 3})).await;
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "Let's write notes."}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let floor = reply.body["data"]["id"].as_str().unwrap().to_owned();

    let calls = (0..20).map(|i| {
        let server = &server;
        let session = session.clone();
        let floor = floor.clone();
        async move {
            tool_call(
                server,
                &session,
                json!({
                    "name": "write_resource",
                    "floor_id": floor,
                    "arguments": {"name": format!("note_{i:02}"), "content": "x"}
                }),
            )
            .await
        }
    });
    let results = futures::future::join_all(calls).await;
    let succeeded = results.iter().filter(|r| r["status"] == "success").count();
    assert_eq!(succeeded, 3, "{results:?}");
    for refused in results.iter().filter(|r| r["status"] != "success") {
        assert_denied(refused, "max_calls_per_turn");
    }
    // Exactly three tools ran: three resources exist.
    let listed = tool_call(&server, &session, json!({"name": "list_resources"})).await;
    assert_eq!(listed["output"]["count"], 3, "{listed}");

    // Another floor has its own budget; calls without a floor are not counted.
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "Next turn."}),
        )
        .await;
    let next_floor = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let next = tool_call(
        &server,
        &session,
        json!({"name": "roll_dice", "floor_id": next_floor}),
    )
    .await;
    assert_eq!(next["status"], "success", "{next}");

    // The spent budget survives a restart.
    server.restart().await;
    let again = tool_call(
        &server,
        &session,
        json!({"name": "roll_dice", "floor_id": floor}),
    )
    .await;
    assert_denied(&again, "max_calls_per_turn");

    // A floor of another session is not found.
    let other = server.create_session().await;
    let reply = server
        .post(
            &format!("/sessions/{other}/tool-calls"),
            json!({"name": "roll_dice", "floor_id": floor}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn max_calls_per_turn_zero_refuses_every_floor_call() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    put_permissions(&server, &session, json!({"max_calls_per_turn": 0})).await;
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hi"}),
        )
        .await;
    let floor = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let refused = tool_call(
        &server,
        &session,
        json!({"name": "get_time", "floor_id": floor}),
    )
    .await;
    assert_denied(&refused, "max_calls_per_turn");
}

#[tokio::test]
async fn openapi_lists_the_new_routes() {
    let server = spawn_app().await;
    let reply = server.get("/openapi.json").await;
    let paths = &reply.body["paths"];
    for path in [
        "/tools/builtin",
        "/sessions/{id}/tools/runtime",
        "/sessions/{id}/tool-permissions",
        "/sessions/{id}/memories",
    ] {
        assert!(
            paths.get(path).is_some(),
            "{path} missing from /openapi.json"
        );
    }
    let permissions = &paths["/sessions/{id}/tool-permissions"];
    assert!(
        permissions.get("get").is_some()
            && permissions.get("put").is_some()
            && permissions.get("patch").is_some()
    );
}

fn common_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
