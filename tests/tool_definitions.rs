//! `/tools/definitions` through the real server: every route, default, filter,
//! sort, paging parameter and error code, account-scoped identity, and the
//! script-handler switch in both states.

mod common;

use common::{SpawnOptions, TestServer, spawn_app, spawn_with};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn scripts_on() -> SpawnOptions {
    SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    }
}

fn lookup_npc() -> Value {
    json!({
        "name": "lookup_npc",
        "description": "根据名字查找 NPC 信息",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "NPC 名字"}},
            "required": ["name"]
        },
        "side_effect_level": "none",
        "allowed_slots": ["narrator", "director"],
        "source": "custom",
        "handler_type": "script",
        "handler": {"script": "return { found: true, info: args.name };"}
    })
}

async fn create(server: &TestServer, body: Value) -> Value {
    let reply = server.post("/tools/definitions", body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"].clone()
}

fn id_of(definition: &Value) -> String {
    definition["id"].as_str().expect("id").to_owned()
}

/// Waits until the wall clock has moved past `ms`, so the next write gets a later
/// `updated_at` than the last one.
async fn clock_past(ms: i64) {
    common::wait_until(
        std::time::Duration::from_secs(2),
        "the clock to tick",
        || async move {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            now > ms
        },
    )
    .await;
}

async fn call_tool(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": arguments}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

#[tokio::test]
async fn create_applies_the_seed_defaults() {
    let server = spawn_app().await;
    let created = create(&server, json!({"name": "bare"})).await;
    assert!(created["id"].as_str().unwrap().starts_with("tooldef_"));
    assert_eq!(created["name"], "bare");
    assert_eq!(created["description"], "");
    assert_eq!(
        created["parameters"],
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(created["side_effect_level"], "none");
    assert_eq!(created["allowed_slots"], json!([]));
    assert_eq!(created["source"], "custom");
    assert_eq!(created["source_id"], Value::Null);
    assert_eq!(created["enabled"], true);
    assert_eq!(created["handler_type"], Value::Null);
    assert_eq!(created["handler"], Value::Null);
    assert!(created["created_at"].as_i64().unwrap() > 1_700_000_000_000);
    assert_eq!(created["created_at"], created["updated_at"]);
    assert!(created.get("account_id").is_none());
    let fetched = server
        .get(&format!("/tools/definitions/{}", id_of(&created)))
        .await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert_eq!(fetched.body["data"], created);
}

#[tokio::test]
async fn crud_round_trip_with_a_script_handler() {
    let server = spawn_with(scripts_on()).await;
    let created = create(&server, lookup_npc()).await;
    let id = id_of(&created);
    let mut expected = lookup_npc();
    expected["id"] = json!(id);
    expected["source_id"] = Value::Null;
    expected["enabled"] = json!(true);
    expected["created_at"] = created["created_at"].clone();
    expected["updated_at"] = created["updated_at"].clone();
    assert_eq!(created, expected);

    let got = server.get(&format!("/tools/definitions/{id}")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["data"], created);

    clock_past(created["updated_at"].as_i64().unwrap()).await;
    let patched = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({
                "description": "finds NPCs",
                "side_effect_level": "sandbox",
                "allowed_slots": ["verifier"],
                "source": "character",
                "source_id": "char_1",
                "handler": {"script": "return args.name;"}
            }),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let patched = patched.body["data"].clone();
    assert_eq!(patched["name"], "lookup_npc");
    assert_eq!(patched["description"], "finds NPCs");
    assert_eq!(patched["side_effect_level"], "sandbox");
    assert_eq!(patched["allowed_slots"], json!(["verifier"]));
    assert_eq!(patched["source"], "character");
    assert_eq!(patched["source_id"], "char_1");
    assert_eq!(patched["handler_type"], "script");
    assert_eq!(patched["handler"], json!({"script": "return args.name;"}));
    assert_eq!(patched["parameters"], created["parameters"]);
    assert_eq!(patched["created_at"], created["created_at"]);
    assert!(patched["updated_at"].as_i64() > created["updated_at"].as_i64());

    // source_id can be set back to null; absent fields stay as they are.
    let cleared = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({"source_id": null}),
        )
        .await;
    assert_eq!(cleared.status, StatusCode::OK, "{cleared:?}");
    assert_eq!(cleared.body["data"]["source_id"], Value::Null);
    assert_eq!(cleared.body["data"]["source"], "character");

    let toggled = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(toggled.status, StatusCode::OK, "{toggled:?}");
    assert_eq!(toggled.body["data"]["enabled"], false);
    assert_eq!(toggled.body["data"]["id"], id.as_str());
    let toggled = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": true}),
        )
        .await;
    assert_eq!(toggled.body["data"]["enabled"], true);

    let deleted = server.delete(&format!("/tools/definitions/{id}")).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body, json!({"data": {"id": id, "deleted": true}}));
    for (method, path, body) in [
        (Method::GET, format!("/tools/definitions/{id}"), None),
        (Method::DELETE, format!("/tools/definitions/{id}"), None),
        (
            Method::PATCH,
            format!("/tools/definitions/{id}"),
            Some(json!({"description": "x"})),
        ),
        (
            Method::PATCH,
            format!("/tools/definitions/{id}/toggle"),
            Some(json!({"enabled": true})),
        ),
    ] {
        let reply = server.send(method.clone(), &path, body).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {reply:?}"
        );
        assert_eq!(reply.code(), "not_found");
    }
}

#[tokio::test]
async fn invalid_requests_are_validation_errors() {
    let server = spawn_with(scripts_on()).await;
    let with = |patch: Value| {
        let mut body = json!({"name": "t"});
        for (key, value) in patch.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let bad_creates = [
        json!({}),
        json!({"name": ""}),
        json!({"name": "has space"}),
        json!({"name": "dot.name"}),
        json!({"name": "名字"}),
        json!({"name": "x".repeat(65)}),
        json!({"name": 5}),
        with(json!({"parameters": "not a schema"})),
        with(json!({"parameters": {"type": "nonsense"}})),
        with(json!({"parameters": {"type": "object", "required": "name"}})),
        with(json!({"parameters": {"type": "string"}})),
        with(json!({"side_effect_level": "catastrophic"})),
        with(json!({"allowed_slots": ["narrator", "writer"]})),
        with(json!({"allowed_slots": "narrator"})),
        with(json!({"source": "plugin"})),
        with(json!({"source_id": ""})),
        with(json!({"enabled": "yes"})),
        with(json!({"handler_type": "http"})),
        with(json!({"handler_type": "script"})),
        with(json!({"handler": {"script": ""}})),
        with(json!({"handler": {"script": "return 1;", "extra": true}})),
        with(json!({"handler": {"script": "   "}})),
        with(json!({"handler": {"script": "return 1;\0"}})),
        with(json!({"handler": {"script": "x".repeat(64 * 1024 + 1)}})),
        with(json!({"description": "d".repeat(16 * 1024 + 1)})),
        with(json!({"unknown_field": 1})),
    ];
    for body in bad_creates {
        let reply = server.post("/tools/definitions", body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{body}");
        assert!(!reply.body["error"]["message"].as_str().unwrap().is_empty());
    }
    // Not JSON at all.
    let reply = server
        .client
        .post(server.url("/tools/definitions"))
        .bearer_auth(&server.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::BAD_REQUEST);

    let id = id_of(&create(&server, json!({"name": "t"})).await);
    let path = format!("/tools/definitions/{id}");
    for body in [
        json!({}),
        json!({"name": null}),
        json!({"name": "bad name"}),
        json!({"side_effect_level": "x"}),
        json!({"allowed_slots": ["x"]}),
        json!({"parameters": {"type": 3}}),
        json!({"handler_type": "script"}),
        json!({"nope": 1}),
    ] {
        let reply = server.patch(&path, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{body}");
    }
    let reply = server.patch(&path, json!({})).await;
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at least one field"),
        "{reply:?}"
    );
    for body in [
        json!({}),
        json!({"enabled": "no"}),
        json!({"enabled": true, "x": 1}),
    ] {
        let reply = server.patch(&format!("{path}/toggle"), body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {reply:?}");
        assert_eq!(reply.code(), "validation_error");
    }
    // Nothing was changed by the refused requests.
    let after = server.get(&path).await;
    assert_eq!(after.body["data"]["name"], "t");
    assert_eq!(after.body["data"]["handler"], Value::Null);
    // Without a key nothing is reachable.
    let reply = server
        .send_as("wrong", Method::GET, "/tools/definitions", None)
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn list_filters_sorts_and_pages() {
    let server = spawn_app().await;
    let specs = [
        ("delta", "custom", None, true),
        ("alpha", "preset", Some("pack_1"), true),
        ("charlie", "character", Some("char_1"), false),
        ("bravo", "custom", Some("pack_1"), false),
        ("echo", "preset", None, true),
    ];
    let mut last = 0;
    let mut ids = std::collections::HashMap::new();
    for (name, source, source_id, enabled) in specs {
        clock_past(last).await;
        let created = create(
            &server,
            json!({"name": name, "source": source, "source_id": source_id, "enabled": enabled}),
        )
        .await;
        last = created["updated_at"].as_i64().unwrap();
        ids.insert(name, id_of(&created));
    }
    let names = |reply: &common::Reply| -> Vec<String> {
        reply.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    };

    // Default: updated_at desc, limit 50, offset 0.
    let all = server.get("/tools/definitions").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(names(&all), ["echo", "bravo", "charlie", "alpha", "delta"]);
    assert_eq!(
        all.body["meta"],
        json!({"total": 5, "limit": 50, "offset": 0, "has_more": false, "sort_by": "updated_at", "sort_order": "desc"})
    );

    // Updating moves a definition to the front of updated_at desc.
    clock_past(last).await;
    let reply = server
        .patch(
            &format!("/tools/definitions/{}", ids["alpha"]),
            json!({"description": "now"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let all = server.get("/tools/definitions").await;
    assert_eq!(names(&all), ["alpha", "echo", "bravo", "charlie", "delta"]);
    let asc = server.get("/tools/definitions?sort_order=asc").await;
    assert_eq!(names(&asc), ["delta", "charlie", "bravo", "echo", "alpha"]);
    assert_eq!(asc.body["meta"]["sort_order"], "asc");

    let by_name = server
        .get("/tools/definitions?sort_by=name&sort_order=asc")
        .await;
    assert_eq!(
        names(&by_name),
        ["alpha", "bravo", "charlie", "delta", "echo"]
    );
    assert_eq!(by_name.body["meta"]["sort_by"], "name");
    let by_name_desc = server.get("/tools/definitions?sort_by=name").await;
    assert_eq!(
        names(&by_name_desc),
        ["echo", "delta", "charlie", "bravo", "alpha"]
    );

    // Filters, alone and combined.
    let cases: [(&str, &[&str]); 8] = [
        ("source=custom", &["bravo", "delta"]),
        ("source=preset", &["alpha", "echo"]),
        ("source=character", &["charlie"]),
        ("source_id=pack_1", &["alpha", "bravo"]),
        ("source_id=nothing", &[]),
        ("enabled=true", &["alpha", "delta", "echo"]),
        ("enabled=false", &["bravo", "charlie"]),
        ("source=preset&source_id=pack_1&enabled=true", &["alpha"]),
    ];
    for (query, expected) in cases {
        let reply = server
            .get(&format!(
                "/tools/definitions?{query}&sort_by=name&sort_order=asc"
            ))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{query}: {reply:?}");
        assert_eq!(names(&reply), expected, "{query}");
        assert_eq!(reply.body["meta"]["total"], expected.len(), "{query}");
    }

    // Paging.
    let page = server
        .get("/tools/definitions?sort_by=name&sort_order=asc&limit=2&offset=1")
        .await;
    assert_eq!(names(&page), ["bravo", "charlie"]);
    assert_eq!(
        page.body["meta"],
        json!({"total": 5, "limit": 2, "offset": 1, "has_more": true, "sort_by": "name", "sort_order": "asc"})
    );
    let last_page = server
        .get("/tools/definitions?sort_by=name&sort_order=asc&limit=2&offset=4")
        .await;
    assert_eq!(names(&last_page), ["echo"]);
    assert_eq!(last_page.body["meta"]["has_more"], false);
    let beyond = server.get("/tools/definitions?offset=10").await;
    assert_eq!(names(&beyond), Vec::<String>::new());
    assert_eq!(beyond.body["meta"]["total"], 5);
    let filtered_page = server
        .get("/tools/definitions?enabled=true&sort_by=name&sort_order=asc&limit=1&offset=1")
        .await;
    assert_eq!(names(&filtered_page), ["delta"]);
    assert_eq!(filtered_page.body["meta"]["total"], 3);
    assert_eq!(filtered_page.body["meta"]["has_more"], true);

    for query in [
        "sort_by=created_at",
        "sort_by=id",
        "sort_order=up",
        "limit=0",
        "limit=201",
        "limit=x",
        "offset=-1",
        "enabled=yes",
        "source=plugin",
        "color=red",
    ] {
        let reply = server.get(&format!("/tools/definitions?{query}")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{query}");
    }
}

#[tokio::test]
async fn identity_is_unique_per_account_with_null_source_id_as_a_value() {
    let server = spawn_app().await;
    let first = create(&server, json!({"name": "lookup", "source": "custom"})).await;
    // Same name, source and (null) source_id: a stable conflict, every time.
    for body in [
        json!({"name": "lookup"}),
        json!({"name": "lookup", "source": "custom", "source_id": null}),
    ] {
        let reply = server.post("/tools/definitions", body).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
        assert_eq!(reply.code(), "tool_definition_conflict");
    }
    // Any part of the identity differing is a new definition.
    create(&server, json!({"name": "lookup", "source_id": "pack_1"})).await;
    create(&server, json!({"name": "lookup", "source": "preset"})).await;
    create(&server, json!({"name": "lookup2"})).await;
    let reply = server
        .post(
            "/tools/definitions",
            json!({"name": "lookup", "source_id": "pack_1"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(reply.code(), "tool_definition_conflict");

    // Renaming or re-sourcing into an existing identity conflicts too.
    let second = create(&server, json!({"name": "other"})).await;
    let path = format!("/tools/definitions/{}", id_of(&second));
    let reply = server.patch(&path, json!({"name": "lookup"})).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.code(), "tool_definition_conflict");
    let moved = server
        .patch(&path, json!({"name": "lookup", "source_id": "pack_2"}))
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{moved:?}");
    let reply = server.patch(&path, json!({"source_id": null})).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    // A definition never conflicts with itself.
    let reply = server
        .patch(
            &format!("/tools/definitions/{}", id_of(&first)),
            json!({"name": "lookup"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    // Deleting frees the identity.
    server
        .delete(&format!("/tools/definitions/{}", id_of(&first)))
        .await;
    create(&server, json!({"name": "lookup"})).await;

    // Another account may use the same name and sees nothing of this one's.
    let other = server.create_account("other").await;
    let reply = server
        .send_as(
            &other,
            Method::POST,
            "/tools/definitions",
            Some(json!({"name": "lookup"})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let theirs = id_of(&reply.body["data"]);
    let listed = server
        .send_as(&other, Method::GET, "/tools/definitions", None)
        .await;
    assert_eq!(listed.body["meta"]["total"], 1);
    assert_eq!(listed.body["data"][0]["id"], theirs.as_str());
    let mine = id_of(&second);
    for (method, path, body) in [
        (Method::GET, format!("/tools/definitions/{mine}"), None),
        (
            Method::PATCH,
            format!("/tools/definitions/{mine}"),
            Some(json!({"description": "x"})),
        ),
        (
            Method::PATCH,
            format!("/tools/definitions/{mine}/toggle"),
            Some(json!({"enabled": false})),
        ),
        (Method::DELETE, format!("/tools/definitions/{mine}"), None),
    ] {
        let reply = server.send_as(&other, method.clone(), &path, body).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {reply:?}"
        );
        assert_eq!(reply.code(), "not_found");
    }
    let still = server.get(&format!("/tools/definitions/{mine}")).await;
    assert_eq!(still.status, StatusCode::OK);
    assert_eq!(still.body["data"]["enabled"], true);
}

#[tokio::test]
async fn switch_on_definitions_join_the_catalog_and_run() {
    let server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let created = create(&server, lookup_npc()).await;
    let id = id_of(&created);

    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "Aria"})).await;
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["status"], "success");
    assert_eq!(result["output"], json!({"found": true, "info": "Aria"}));
    // The raw-string form of arguments works the same way.
    let result = call_tool(&server, &session, "lookup_npc", json!("{\"name\": \"Bo\"}")).await;
    assert_eq!(result["output"], json!({"found": true, "info": "Bo"}));
    // Arguments are checked against the definition's schema before the script runs.
    let result = call_tool(&server, &session, "lookup_npc", json!({})).await;
    assert_eq!(result["is_error"], true);
    assert_eq!(result["status"], "error");
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("invalid arguments"),
        "{result}"
    );

    // A new script takes effect on the next call.
    let reply = server
        .patch(
            &format!("/tools/definitions/{id}"),
            json!({"handler": {"script": "return { upper: args.name.toUpperCase() };"}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "aria"})).await;
    assert_eq!(result["output"], json!({"upper": "ARIA"}));

    // Disabled definitions leave the catalog; enabling brings them back.
    let reply = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "a"})).await;
    assert_eq!(result["status"], "denied");
    assert!(
        result["output"].as_str().unwrap().contains("unknown tool"),
        "{result}"
    );
    let reply = server
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": true}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "a"})).await;
    assert_eq!(result["status"], "success");

    // The same name from a second definition is a conflict; both calls are refused.
    create(
        &server,
        json!({"name": "lookup_npc", "source": "preset", "handler": {"script": "return 2;"}}),
    )
    .await;
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "a"})).await;
    assert_eq!(result["status"], "denied");
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("several providers"),
        "{result}"
    );

    // A definition without a handler is listed but cannot run.
    create(&server, json!({"name": "declared_only"})).await;
    let result = call_tool(&server, &session, "declared_only", json!({})).await;
    assert_eq!(result["status"], "denied");
    assert!(
        result["output"].as_str().unwrap().contains("no handler"),
        "{result}"
    );

    // Another account's sessions never see this account's definitions.
    let other = server.create_account("other").await;
    let other_session = server.create_session_as(&other, "Other").await;
    let reply = server
        .send_as(
            &other,
            Method::POST,
            &format!("/sessions/{other_session}/tool-calls"),
            Some(json!({"name": "declared_only", "arguments": {}})),
        )
        .await;
    assert_eq!(reply.body["data"]["status"], "denied", "{reply:?}");
    assert!(
        reply.body["data"]["output"]
            .as_str()
            .unwrap()
            .contains("unknown tool")
    );
}

#[tokio::test]
async fn switch_off_refuses_script_writes_and_calls_but_keeps_them_listed() {
    let mut server = spawn_with(scripts_on()).await;
    let session = server.create_session().await;
    let script = id_of(&create(&server, lookup_npc()).await);
    let mut parked_body = lookup_npc();
    parked_body["name"] = json!("parked");
    parked_body["enabled"] = json!(false);
    let parked = id_of(&create(&server, parked_body).await);
    let plain = id_of(&create(&server, json!({"name": "plain"})).await);
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "A"})).await;
    assert_eq!(result["status"], "success");

    server.restart_with_env(Vec::new()).await;
    let forbidden = |reply: &common::Reply| {
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{reply:?}");
        assert_eq!(reply.code(), "tool_script_handler_disabled");
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("ENABLE_UNSAFE_SCRIPT_HANDLER")
        );
    };

    // Creating a script definition, enabled or not.
    let mut body = lookup_npc();
    body["name"] = json!("new_one");
    forbidden(&server.post("/tools/definitions", body.clone()).await);
    body["enabled"] = json!(false);
    forbidden(&server.post("/tools/definitions", body).await);
    forbidden(
        &server
            .post(
                "/tools/definitions",
                json!({"name": "implied", "handler": {"script": "return 1;"}}),
            )
            .await,
    );
    // Definitions without a script handler are unaffected.
    create(&server, json!({"name": "still_fine"})).await;

    // Updating a script definition, or giving one a script handler.
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{script}"),
                json!({"description": "x"}),
            )
            .await,
    );
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{plain}"),
                json!({"handler": {"script": "return 1;"}}),
            )
            .await,
    );
    // The switch decides before the change's own checks: a script handler
    // type without a script is 403, not 400.
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{plain}"),
                json!({"handler_type": "script"}),
            )
            .await,
    );
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{script}"),
                json!({"parameters": "not a schema"}),
            )
            .await,
    );
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{parked}"),
                json!({"enabled": true}),
            )
            .await,
    );
    // Toggling one back on.
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{parked}/toggle"),
                json!({"enabled": true}),
            )
            .await,
    );
    let unchanged = server.get(&format!("/tools/definitions/{parked}")).await;
    assert_eq!(unchanged.body["data"]["enabled"], false);

    // Stored script tools stay listed and readable, and are refused when called.
    let listed = server
        .get("/tools/definitions?sort_by=name&sort_order=asc")
        .await;
    assert_eq!(listed.body["meta"]["total"], 4);
    let got = server.get(&format!("/tools/definitions/{script}")).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body["data"]["handler_type"], "script");
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "A"})).await;
    assert_eq!(result["is_error"], true, "{result}");
    assert_eq!(result["status"], "denied");
    assert_eq!(
        result["execution_reason_code"], "tool_unavailable",
        "{result}"
    );
    let message = result["output"].as_str().unwrap();
    assert!(message.contains("unavailable"), "{message}");
    assert!(
        message.contains("ENABLE_UNSAFE_SCRIPT_HANDLER"),
        "{message}"
    );
    // The runtime catalog keeps the stored script tool, marked unavailable.
    let catalog = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    let entry = catalog.body["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "lookup_npc")
        .expect("script tool listed")
        .clone();
    assert_eq!(entry["availability"], "unavailable", "{entry}");
    assert_eq!(entry["provider_type"], "preset");
    assert!(
        entry["availability_reason"]
            .as_str()
            .unwrap()
            .contains("ENABLE_UNSAFE_SCRIPT_HANDLER")
    );
    // Both calls are in the journal: the one that ran and the refused one.
    let journal = server
        .get(&format!("/tool-executions?session_id={session}&tool_name=lookup_npc&sort_by=created_at&sort_order=asc"))
        .await;
    let statuses: Vec<&str> = journal.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["success", "denied"], "{journal:?}");
    assert_eq!(journal.body["data"][0]["provider_type"], "preset");
    assert_eq!(
        journal.body["data"][0]["execution_reason_code"],
        Value::Null
    );
    assert_eq!(
        journal.body["data"][1]["execution_reason_code"],
        "tool_unavailable"
    );

    // Making things safer stays possible: disabling and deleting.
    let reply = server
        .patch(
            &format!("/tools/definitions/{script}"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let reply = server
        .patch(
            &format!("/tools/definitions/{script}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    forbidden(
        &server
            .patch(
                &format!("/tools/definitions/{script}/toggle"),
                json!({"enabled": true}),
            )
            .await,
    );
    let reply = server.delete(&format!("/tools/definitions/{parked}")).await;
    assert_eq!(reply.status, StatusCode::OK);

    // Back on: the same stored tool runs again.
    server.restart_with_env(scripts_on().env).await;
    let reply = server
        .patch(
            &format!("/tools/definitions/{script}/toggle"),
            json!({"enabled": true}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let result = call_tool(&server, &session, "lookup_npc", json!({"name": "B"})).await;
    assert_eq!(result["output"], json!({"found": true, "info": "B"}));
}

#[tokio::test]
async fn only_exactly_true_turns_the_switch_on() {
    for value in ["1", "TRUE", "yes", "True", ""] {
        let server = spawn_with(SpawnOptions {
            env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), value.into())],
            ..Default::default()
        })
        .await;
        let reply = server.post("/tools/definitions", lookup_npc()).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{value:?}: {reply:?}");
        assert_eq!(reply.code(), "tool_script_handler_disabled");
    }
}

#[tokio::test]
async fn routes_are_in_the_openapi_document() {
    let server = spawn_app().await;
    let doc = server.get("/openapi.json").await;
    let paths = &doc.body["paths"];
    for (path, methods) in [
        ("/tools/definitions", &["get", "post"][..]),
        ("/tools/definitions/{id}", &["get", "patch", "delete"][..]),
        ("/tools/definitions/{id}/toggle", &["patch"][..]),
    ] {
        for method in methods {
            assert!(paths[path][method].is_object(), "{method} {path} missing");
        }
    }
}

#[tokio::test]
async fn an_account_holds_at_most_256_definitions() {
    let server = spawn_app().await;
    let mut last = String::new();
    for n in 0..256 {
        last = id_of(&create(&server, json!({"name": format!("tool_{n}")})).await);
    }
    let refused = server
        .post("/tools/definitions", json!({"name": "one_more"}))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(refused.code(), "limit_exceeded");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("256"),
        "{refused:?}"
    );
    // Another account's place is its own.
    let other = server.create_account("other").await;
    let theirs = server
        .send_as(
            &other,
            Method::POST,
            "/tools/definitions",
            Some(json!({"name": "one_more"})),
        )
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{theirs:?}");
    let deleted = server.delete(&format!("/tools/definitions/{last}")).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    create(&server, json!({"name": "one_more"})).await;
}

/// Reads every page of `path` (a list with `limit=200`), checking that each
/// page past the first byte bound says `has_more`; the ids in order and the
/// number of pages.
async fn read_all_pages(server: &TestServer, path: &str, total: usize) -> (Vec<String>, usize) {
    let (mut ids, mut pages) = (Vec::new(), 0);
    while ids.len() < total {
        let reply = server
            .get(&format!("{path}?limit=200&offset={}", ids.len()))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let data = reply.body["data"].as_array().unwrap();
        assert!(!data.is_empty(), "a page before the end holds a row");
        ids.extend(data.iter().map(id_of));
        pages += 1;
        assert_eq!(reply.body["meta"]["total"], total, "{path}");
        assert_eq!(reply.body["meta"]["has_more"], ids.len() < total, "{path}");
    }
    (ids, pages)
}

/// Probe I: a page of 200 definitions with large schemas was read, copied
/// and written whole (over 100 MB); it ends past 8 MiB, as journal pages do.
#[tokio::test]
async fn a_page_of_large_definitions_ends_past_8_mib_and_the_next_offset_reads_on() {
    let server = spawn_app().await;
    // 120 definitions of 76 KB (a 60 KB schema, a 16 KB description).
    let (schema_text, description) = ("s".repeat(60_000), "d".repeat(16_000));
    for n in 0..120 {
        create(
            &server,
            json!({"name": format!("big_{n:03}"), "description": description,
                   "parameters": {"type": "object", "description": schema_text}}),
        )
        .await;
    }
    let (ids, pages) = read_all_pages(&server, "/tools/definitions", 120).await;
    assert!(
        pages >= 2,
        "120 definitions of 76 KB are more than one page"
    );
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 120, "each definition once: {ids:?}");
}

/// A page of characters (three texts of up to 64 KiB each) ends past 8 MiB
/// too.
#[tokio::test]
async fn a_page_of_large_characters_ends_past_8_mib_and_the_next_offset_reads_on() {
    let server = spawn_app().await;
    let before = server.get("/characters?limit=200").await;
    let existing = before.body["meta"]["total"].as_u64().unwrap() as usize;
    // 50 characters of 180 KB (three 60 KB texts).
    let text = "p".repeat(60_000);
    for n in 0..50 {
        let reply = server
            .post(
                "/characters",
                json!({"name": format!("Big{n}"), "description": text, "persona": text,
                       "system_prompt": text}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let (ids, pages) = read_all_pages(&server, "/characters", existing + 50).await;
    assert!(pages >= 2, "50 characters of 180 KB are more than one page");
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), existing + 50, "each character once: {ids:?}");
}
