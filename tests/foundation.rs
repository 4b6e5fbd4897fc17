//! Issue 2: the server, storage, accounts, characters, sessions, floors, errors,
//! paging and the OpenAPI document, all through the real binary over HTTP.

mod common;

use common::{SpawnOptions, spawn_app, spawn_with};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn first_start_generates_a_private_admin_key_and_restart_keeps_everything() {
    let mut server = spawn_with(SpawnOptions {
        no_admin_token: true,
        ..Default::default()
    })
    .await;
    let token_path = server.data_dir.join("admin-token");
    let key = std::fs::read_to_string(&token_path)
        .unwrap()
        .trim()
        .to_owned();
    assert!(key.starts_with("tg_") && key.len() > 40, "{key}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The key is stored hashed, never in plain text.
    if server.on_postgres() {
        let pool = sqlx::PgPool::connect(&server.database_url()).await.unwrap();
        let accounts: Vec<String> = sqlx::query_scalar("SELECT t::text FROM accounts t")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        assert!(!accounts.is_empty());
        assert!(
            accounts.iter().all(|row| !row.contains(&key)),
            "{accounts:?}"
        );
    } else {
        let db = std::fs::read(server.data_dir.join("toolgate.db")).unwrap();
        let wal = std::fs::read(server.data_dir.join("toolgate.db-wal")).unwrap_or_default();
        let needle = key.as_bytes();
        assert!(!db.windows(needle.len()).any(|w| w == needle));
        assert!(!wal.windows(needle.len()).any(|w| w == needle));
    }

    let lanlan = server.get("/characters/Lanlan").await;
    assert_eq!(lanlan.status, StatusCode::OK, "{lanlan:?}");
    let created = server
        .post("/characters", json!({"name": "Mio", "persona": "cheerful"}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let session = server.create_session().await;
    let floor = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hello"}),
        )
        .await;
    assert_eq!(floor.status, StatusCode::CREATED);

    server.restart().await;
    assert_eq!(std::fs::read_to_string(&token_path).unwrap().trim(), key);
    assert_eq!(
        server.get("/characters/Mio").await.body["data"]["persona"],
        "cheerful"
    );
    let floors = server.get(&format!("/sessions/{session}/floors")).await;
    assert_eq!(floors.body["data"][0]["content"], "hello");
    let list = server.get("/characters").await;
    assert_eq!(
        list.body["meta"]["total"], 2,
        "bootstrap must not run twice: {list:?}"
    );
}

#[tokio::test]
async fn start_up_reads_the_database_before_it_says_it_is_listening() {
    // A supervisor that saw the listening line must not then see the start
    // fail on a database read: the reads that can fail come first.
    let server = spawn_app().await;
    let log = server.log_containing(" listening addr=").await;
    let position = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{log}"))
    };
    assert!(
        position("attaching MCP servers") < position(" listening addr="),
        "{log}"
    );
}

#[tokio::test]
async fn configured_admin_token_and_config_file_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgate.toml");
    std::fs::write(&config, "default_character = \"Aoi\"\n").unwrap();
    let server = spawn_with(SpawnOptions {
        args: vec!["--config".into(), config.display().to_string()],
        ..Default::default()
    })
    .await;
    assert!(!server.data_dir.join("admin-token").exists());
    assert_eq!(server.get("/characters/Aoi").await.status, StatusCode::OK);
    assert_eq!(
        server.get("/characters/Lanlan").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn health_needs_no_key_but_everything_else_does() {
    let server = spawn_app().await;
    let health = server
        .client
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    for (method, path) in [
        (Method::GET, "/characters"),
        (Method::POST, "/characters"),
        (Method::GET, "/sessions"),
        (Method::POST, "/accounts"),
        (Method::GET, "/characters/Lanlan"),
    ] {
        let bare = common::read_reply(
            server
                .client
                .request(method.clone(), server.url(path))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(bare.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert_eq!(bare.code(), "unauthorized");
        assert!(bare.body["error"]["message"].is_string());
        let wrong = server.send_as("tg_wrong", method.clone(), path, None).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        let basic = common::read_reply(
            server
                .client
                .request(method.clone(), server.url(path))
                .header("Authorization", format!("Basic {}", common::ADMIN_TOKEN))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(basic.status, StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn every_answer_carries_a_request_id_and_a_given_one_is_echoed() {
    let server = spawn_app().await;
    // A routed request, an unrouted one and one refused before its handler:
    // the id is set around everything the router does.
    for path in ["/healthz", "/no/such/route", "/characters"] {
        let answer = server.client.get(server.url(path)).send().await.unwrap();
        let id = answer
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{path}: no x-request-id"))
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(id.len(), 36, "{path}: {id}");
    }
    let echoed = server
        .client
        .get(server.url("/healthz"))
        .header("x-request-id", "caller-chosen-7")
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.headers()["x-request-id"], "caller-chosen-7");
    let first = server
        .client
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    let second = server
        .client
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_ne!(
        first.headers()["x-request-id"],
        second.headers()["x-request-id"]
    );
}

#[tokio::test]
async fn accounts_never_see_each_others_data() {
    let server = spawn_app().await;
    let other = server.create_account("tenant-b").await;
    let session = server.create_session().await;
    let floor = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "secret"}),
        )
        .await;
    assert_eq!(floor.status, StatusCode::CREATED);

    // Only the admin account may create accounts.
    let denied = server
        .send_as(
            &other,
            Method::POST,
            "/accounts",
            Some(json!({"name": "x"})),
        )
        .await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);

    let foreign = [
        (Method::GET, "/characters/Lanlan".to_owned(), None),
        (
            Method::PATCH,
            "/characters/Lanlan".to_owned(),
            Some(json!({"persona": "x"})),
        ),
        (Method::DELETE, "/characters/Lanlan".to_owned(), None),
        (Method::GET, format!("/sessions/{session}"), None),
        (Method::DELETE, format!("/sessions/{session}"), None),
        (Method::GET, format!("/sessions/{session}/floors"), None),
        (
            Method::POST,
            format!("/sessions/{session}/floors"),
            Some(json!({"content": "x"})),
        ),
        (
            Method::POST,
            format!("/sessions/{session}/tool-calls"),
            Some(json!({"name": "roll_dice", "arguments": {}})),
        ),
        (
            Method::POST,
            "/sessions".to_owned(),
            Some(json!({"character": "Lanlan"})),
        ),
    ];
    for (method, path, body) in foreign {
        let reply = server
            .send_as(&other, method.clone(), &path, body.clone())
            .await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {reply:?}"
        );
        assert_eq!(reply.code(), "not_found");
        // A foreign id answers exactly like a missing one.
        let missing_path = path
            .replace(&session, "sess_missing")
            .replace("Lanlan", "Nobody");
        let missing = server
            .send_as(&other, method.clone(), &missing_path, body)
            .await;
        assert_eq!(
            missing.status,
            StatusCode::NOT_FOUND,
            "{method} {missing_path}"
        );
    }
    assert_eq!(
        server
            .send_as(&other, Method::GET, "/characters", None)
            .await
            .body["meta"]["total"],
        0
    );
    assert_eq!(
        server
            .send_as(&other, Method::GET, "/sessions", None)
            .await
            .body["meta"]["total"],
        0
    );
    // Nothing of the admin's changed.
    assert_eq!(
        server
            .get(&format!("/sessions/{session}/floors"))
            .await
            .body["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        server.get("/characters/Lanlan").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn character_crud_and_server_wide_unique_names() {
    let server = spawn_app().await;
    let created = server
        .post(
            "/characters",
            json!({"name": "Mio", "description": "a cat", "persona": "purrs"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["data"]["name"], "Mio");
    assert_eq!(created.body["data"]["description"], "a cat");
    assert!(
        created.body["data"]["account_id"].is_null(),
        "no internal fields"
    );

    let dup = server.post("/characters", json!({"name": "Mio"})).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.code(), "character_conflict");
    // Names are unique across accounts too.
    let other = server.create_account("b").await;
    let dup_other = server
        .send_as(
            &other,
            Method::POST,
            "/characters",
            Some(json!({"name": "Mio"})),
        )
        .await;
    assert_eq!(dup_other.code(), "character_conflict");

    for bad in [
        json!({"name": ""}),
        json!({"name": "x".repeat(65)}),
        json!({"name": 5}),
        json!({}),
        // Looks like "Mio", or shows reversed, in every list.
        json!({"name": "Mio\u{200B}"}),
        json!({"name": "\u{202E}oiM"}),
    ] {
        let reply = server.post("/characters", bad.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.code(), "validation_error");
    }

    let renamed = server
        .patch(
            "/characters/Mio",
            json!({"name": "Mio2", "persona": "naps"}),
        )
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{renamed:?}");
    assert_eq!(renamed.body["data"]["persona"], "naps");
    assert_eq!(renamed.body["data"]["description"], "a cat");
    assert_eq!(
        server.get("/characters/Mio").await.status,
        StatusCode::NOT_FOUND
    );
    let empty = server.patch("/characters/Mio2", json!({})).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    let clash = server
        .patch("/characters/Mio2", json!({"name": "Lanlan"}))
        .await;
    assert_eq!(clash.code(), "character_conflict");

    let deleted = server.delete("/characters/Mio2").await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body["data"]["deleted"], true);
    assert_eq!(
        server.get("/characters/Mio2").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.delete("/characters/Mio2").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn session_crud_and_floors() {
    let server = spawn_app().await;
    let created = server
        .post(
            "/sessions",
            json!({"character": "Lanlan", "title": "first"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let data = &created.body["data"];
    let id = data["id"].as_str().unwrap().to_owned();
    assert_eq!(data["character"], "Lanlan");
    assert_eq!(data["title"], "first");
    assert!(data["created_at"].as_i64().unwrap() > 1_600_000_000_000);

    let unknown = server
        .post("/sessions", json!({"character": "Nobody"}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.body["data"]["title"],
        "first"
    );
    let list = server.get("/sessions").await;
    assert_eq!(list.body["meta"]["total"], 1);

    let first = server
        .post(&format!("/sessions/{id}/floors"), json!({"content": "hi"}))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body["data"]["seq"], 1);
    assert_eq!(first.body["data"]["pages"], json!([]));
    assert!(first.body["data"]["active_page_id"].is_null());
    let second = server
        .post(
            &format!("/sessions/{id}/floors"),
            json!({"content": "again"}),
        )
        .await;
    assert_eq!(second.body["data"]["seq"], 2);
    let floors = server.get(&format!("/sessions/{id}/floors")).await;
    let contents: Vec<_> = floors.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["content"].clone())
        .collect();
    assert_eq!(contents, vec![json!("hi"), json!("again")]);
    let missing_content = server
        .post(&format!("/sessions/{id}/floors"), json!({}))
        .await;
    assert_eq!(missing_content.status, StatusCode::BAD_REQUEST);

    assert_eq!(
        server.delete(&format!("/sessions/{id}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        server.get(&format!("/sessions/{id}/floors")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bad_requests_get_the_envelope_and_change_nothing() {
    let server = spawn_app().await;
    let raw = |body: Vec<u8>| {
        server
            .client
            .post(server.url("/characters"))
            .bearer_auth(&server.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("wrong type", br#"{"name": ["a"]}"#.to_vec()),
        ("missing field", br#"{"persona": "x"}"#.to_vec()),
        (
            "unknown field",
            br#"{"name": "Q", "colour": "red"}"#.to_vec(),
        ),
        ("not json", b"name=Q".to_vec()),
        ("empty", Vec::new()),
        ("array", b"[1,2]".to_vec()),
        ("invalid utf-8", b"{\"name\": \"\xff\xfe\"}".to_vec()),
    ];
    for (what, body) in cases {
        let reply = common::read_reply(raw(body).await.unwrap()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{what}: {reply:?}");
        assert_eq!(reply.code(), "validation_error", "{what}");
        assert!(!reply.body["error"]["message"].as_str().unwrap().is_empty());
    }
    let named = server.post("/characters", json!({"name": 7})).await;
    assert!(
        named.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("name"),
        "{named:?}"
    );

    // Above the 1 MiB default body limit.
    let huge = json!({"name": "Huge", "persona": "x".repeat(2 * 1024 * 1024)});
    // A fresh client: the server may close the connection without reading the rest
    // of an oversized body, so that connection must not be reused.
    let too_large = common::read_reply(
        reqwest::Client::new()
            .post(server.url("/characters"))
            .bearer_auth(&server.token)
            .json(&huge)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.code(), "payload_too_large");

    let bad_query = server.get("/characters?limit=abc").await;
    assert_eq!(bad_query.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad_query.code(), "validation_error");

    let no_route = server.get("/nope").await;
    assert_eq!(no_route.status, StatusCode::NOT_FOUND);
    assert_eq!(no_route.code(), "not_found");
    let wrong_method = server
        .send(Method::PUT, "/characters", Some(json!({})))
        .await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong_method.code(), "method_not_allowed");

    let list = server.get("/characters").await;
    assert_eq!(
        list.body["meta"]["total"], 1,
        "nothing was stored: {list:?}"
    );
}

#[tokio::test]
async fn body_limit_is_configurable() {
    let server = spawn_with(SpawnOptions {
        args: vec!["--body-limit-bytes".into(), "200".into()],
        ..Default::default()
    })
    .await;
    let big = server
        .post(
            "/characters",
            json!({"name": "Big", "persona": "y".repeat(300)}),
        )
        .await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    let small = server.post("/characters", json!({"name": "Small"})).await;
    assert_eq!(small.status, StatusCode::CREATED);
}

#[tokio::test]
async fn lists_share_one_paging_shape() {
    let server = spawn_app().await;
    for name in ["A1", "A2", "A3", "A4"] {
        assert_eq!(
            server
                .post("/characters", json!({"name": name}))
                .await
                .status,
            StatusCode::CREATED
        );
    }
    let page = server
        .get("/characters?limit=2&offset=1&sort_by=name&sort_order=asc")
        .await;
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
    assert_eq!(
        page.body["meta"],
        json!({"total": 5, "limit": 2, "offset": 1, "has_more": true, "sort_by": "name", "sort_order": "asc"})
    );
    let names: Vec<_> = page.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("A2"), json!("A3")]);
    let last = server
        .get("/characters?limit=2&offset=4&sort_by=name&sort_order=asc")
        .await;
    assert_eq!(last.body["meta"]["has_more"], false);
    assert_eq!(last.body["data"][0]["name"], "Lanlan");
    let defaults = server.get("/sessions").await;
    assert_eq!(
        defaults.body["meta"],
        json!({"total": 0, "limit": 50, "offset": 0, "has_more": false, "sort_by": "created_at", "sort_order": "desc"})
    );
    for bad in [
        "limit=0",
        "limit=201",
        "offset=-1",
        "sort_by=password",
        "sort_order=up",
        "unknown=1",
        "cursor=garbage",
        "%ff=1",
    ] {
        let reply = server.get(&format!("/characters?{bad}")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.code(), "validation_error");
    }
}

/// Every route the server answers, as (method, OpenAPI path).
const ROUTES: &[(&str, &str)] = &[
    ("post", "/accounts"),
    ("get", "/api/tools"),
    ("post", "/api/tools/clear"),
    ("post", "/api/tools/register"),
    ("post", "/api/tools/unregister"),
    ("get", "/characters"),
    ("post", "/characters"),
    ("get", "/characters/{name}"),
    ("delete", "/characters/{name}"),
    ("patch", "/characters/{name}"),
    ("post", "/floors/{id}/runs"),
    ("get", "/floors/{id}/tool-executions"),
    ("get", "/mcp/servers"),
    ("post", "/mcp/servers"),
    ("get", "/mcp/servers/{id}"),
    ("delete", "/mcp/servers/{id}"),
    ("patch", "/mcp/servers/{id}"),
    ("patch", "/mcp/servers/{id}/toggle"),
    ("get", "/mcp/servers/{id}/status"),
    ("get", "/mcp/statuses"),
    ("post", "/mcp/servers/{id}/connect"),
    ("post", "/mcp/servers/{id}/disconnect"),
    ("post", "/mcp/servers/{id}/test"),
    ("get", "/mcp/servers/{id}/tools"),
    ("post", "/floors/{id}/regenerate"),
    ("get", "/floors/{id}"),
    ("post", "/pages/{id}/select"),
    ("post", "/runs/{id}/cancel"),
    ("get", "/runs/{id}"),
    ("post", "/runs/{id}/commit"),
    ("post", "/runs/{id}/discard"),
    ("post", "/runs/{id}/replay"),
    ("get", "/runtime-jobs/{id}"),
    ("get", "/sessions"),
    ("post", "/sessions"),
    ("get", "/sessions/{id}"),
    ("delete", "/sessions/{id}"),
    ("get", "/sessions/{id}/events"),
    ("get", "/sessions/{id}/floors"),
    ("post", "/sessions/{id}/floors"),
    ("get", "/sessions/{id}/memories"),
    ("post", "/sessions/{id}/memories"),
    ("post", "/sessions/{id}/tool-calls"),
    ("get", "/sessions/{id}/tool-permissions"),
    ("put", "/sessions/{id}/tool-permissions"),
    ("patch", "/sessions/{id}/tool-permissions"),
    ("get", "/sessions/{id}/tool-results"),
    ("get", "/sessions/{id}/tools/runtime"),
    ("get", "/tool-executions"),
    ("get", "/tool-executions/{id}"),
    ("post", "/tool-executions/{id}/approve"),
    ("post", "/tool-executions/{id}/reject"),
    ("post", "/tool-executions/approvals"),
    ("get", "/tools/builtin"),
    ("get", "/tools/call-records"),
    ("get", "/tools/definitions"),
    ("post", "/tools/definitions"),
    ("get", "/tools/definitions/{id}"),
    ("delete", "/tools/definitions/{id}"),
    ("patch", "/tools/definitions/{id}"),
    ("patch", "/tools/definitions/{id}/toggle"),
];

#[tokio::test]
async fn openapi_document_lists_every_route() {
    let server = spawn_app().await;
    let doc = server
        .client
        .get(server.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(doc.status(), StatusCode::OK);
    let doc: serde_json::Value = doc.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let paths = doc["paths"].as_object().unwrap();
    let documented: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(
        documented,
        ROUTES.len(),
        "a documented route is missing from ROUTES"
    );
    for (method, path) in ROUTES {
        assert!(
            paths.get(*path).and_then(|p| p.get(*method)).is_some(),
            "{method} {path} missing from /openapi.json"
        );
        // And the route really exists on the server (not a 404 fallback).
        let concrete = path.replace("{name}", "Lanlan").replace("{id}", "x");
        let reply = server
            .send(
                method.to_uppercase().parse().unwrap(),
                &concrete,
                Some(json!({})),
            )
            .await;
        assert!(
            !(reply.status == StatusCode::NOT_FOUND
                && reply.body["error"]["message"] == "no such route")
                && reply.status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is documented but not routed"
        );
    }
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let mut server = spawn_app().await;
    assert_eq!(
        server
            .post("/characters", json!({"name": "Keep"}))
            .await
            .status,
        StatusCode::CREATED
    );
    let status = server.stop().await;
    assert!(status.success(), "exit status {status:?}");
    server.restart().await;
    assert_eq!(server.get("/characters/Keep").await.status, StatusCode::OK);
}

#[tokio::test]
async fn sessions_follow_their_characters_rename_and_deletion() {
    let server = spawn_app().await;
    assert_eq!(
        server
            .post("/characters", json!({"name": "Rin"}))
            .await
            .status,
        StatusCode::CREATED
    );
    let created = server.post("/sessions", json!({"character": "Rin"})).await;
    let id = created.body["data"]["id"].as_str().unwrap().to_owned();
    // Read it (and any cache) before the character changes.
    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.body["data"]["character"],
        "Rin"
    );
    let renamed = server
        .patch("/characters/Rin", json!({"name": "Rin2"}))
        .await;
    assert_eq!(renamed.status, StatusCode::OK);
    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.body["data"]["character"],
        "Rin2"
    );
    let patched = server
        .patch(
            &format!("/sessions/{id}/tool-permissions"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.body["data"]["metadata"]["tool_permissions"]["enabled"],
        false
    );
    assert_eq!(
        server.delete("/characters/Rin2").await.status,
        StatusCode::OK
    );
    assert_eq!(
        server.get(&format!("/sessions/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
}

/// The OpenAPI document carries the error-code table, and every code an error
/// answer uses is in it.
#[tokio::test]
async fn the_error_code_table_is_served() {
    let server = common::spawn_app().await;
    let doc = server.get("/openapi.json").await.body;
    let schema = &doc["components"]["schemas"]["ErrorCode"];
    let codes: Vec<&str> = schema["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("ErrorCode has no enum: {schema}"))
        .iter()
        .map(|code| code.as_str().unwrap())
        .collect();
    for code in [
        "validation_error",
        "run_not_open",
        "shutting_down",
        "loopback_only",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
    let description = schema["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("| `shutting_down` | 503 |"),
        "{description}"
    );
    let missing = server.get("/no/such/route").await;
    assert!(codes.contains(&missing.code()), "{missing:?}");
}

/// Many deletes of one character or session at once: exactly one answers 200
/// (the one that removed it), every other 404.
#[tokio::test]
async fn of_concurrent_deletes_of_one_thing_exactly_one_succeeds() {
    let server = spawn_app().await;
    for round in 0..5 {
        let name = format!("Racer{round}");
        let created = server.post("/characters", json!({"name": name})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        let session = server.create_session().await;
        for path in [
            format!("/characters/{name}"),
            format!("/sessions/{session}"),
        ] {
            let deletes = (0..20).map(|_| server.delete(&path));
            let statuses: Vec<StatusCode> = futures::future::join_all(deletes)
                .await
                .into_iter()
                .map(|reply| reply.status)
                .collect();
            let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
            let missing = statuses
                .iter()
                .filter(|s| **s == StatusCode::NOT_FOUND)
                .count();
            assert_eq!((ok, missing), (1, 19), "{path}: {statuses:?}");
        }
    }
}

/// An account holds at most 1,000 characters (each a role of `/api/tools`
/// with texts of up to 64 KiB), counted and written in one step: creates
/// racing at the cap do not pass it together.
#[tokio::test]
async fn an_account_holds_at_most_1000_characters_even_when_creates_race() {
    let server = spawn_app().await;
    let create = |name: String| {
        let server = &server;
        async move { server.post("/characters", json!({"name": name})).await }
    };
    // The admin account has Lanlan; 998 more leave one place.
    for chunk in 0..998 / 50 + 1 {
        let names = (chunk * 50..((chunk + 1) * 50).min(998)).map(|n| format!("Mio{n}"));
        for reply in futures::future::join_all(names.map(create)).await {
            assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        }
    }
    let racing = (0..5).map(|n| create(format!("Last{n}")));
    let replies = futures::future::join_all(racing).await;
    common::assert_one_created_rest_over_limit(&replies, "1000");
    let list = server.get("/characters").await;
    assert_eq!(list.body["meta"]["total"], 1000, "{list:?}");
    // Another account's place is its own; a delete makes room.
    let other = server.create_account("other").await;
    let theirs = server
        .send_as(
            &other,
            Method::POST,
            "/characters",
            Some(json!({"name": "Theirs"})),
        )
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{theirs:?}");
    let deleted = server.delete("/characters/Mio0").await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    let again = create("Again".into()).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
}

/// An account holds at most 100,000 sessions (its sessions list counts them
/// exactly), counted and written in one step: creates racing at the cap do
/// not pass it together.
#[tokio::test]
async fn an_account_holds_at_most_100000_sessions_even_when_creates_race() {
    let server = spawn_app().await;
    let first = server.create_session().await;
    // 99,998 more, written as an operator's bulk import would: one place is left.
    server
        .execute_sql(format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 99998) \
             INSERT INTO sessions (id, account_id, character_id, title, metadata_json, created_at, updated_at) \
             SELECT 'sess_bulk_' || i, s.account_id, s.character_id, '', '{{}}', 0, 0 \
             FROM n, sessions s WHERE s.id = '{first}'"
        ))
        .await;
    let racing =
        (0..5).map(|_| server.post("/sessions", serde_json::json!({"character": "Lanlan"})));
    let replies = futures::future::join_all(racing).await;
    common::assert_one_created_rest_over_limit(&replies, "100000");
    let list = server.get("/sessions?limit=1").await;
    assert_eq!(list.body["meta"]["total"], 100_000, "{list:?}");
    let deleted = server.delete(&format!("/sessions/{first}")).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    server.create_session().await;
}
