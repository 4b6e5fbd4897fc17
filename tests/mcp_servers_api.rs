//! The MCP server management API (`/mcp/servers`) through the real binary:
//! CRUD and defaults, validation naming the field, duplicate names, account
//! isolation, secrets that never leave the server (responses, log, database
//! file), the secrets key across restarts and key changes, list filter / sort /
//! paging, and the configuration steps of TavernHeadless's own smoke run.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Reply, SpawnOptions, TestServer, spawn_app, spawn_with};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A value long enough to be masked as its ends (24+ characters).
const LONG_ENV_SECRET: &str = "sk-live-ENVSECRET-q8Zr2LwX0m4c";
/// A value shorter than that: masked as `****`.
const SHORT_ENV_SECRET: &str = "shEnvQ7x9Kp";
const LONG_HEADER_SECRET: &str = "Bearer HDRSECRET-v3Tn8YpQe6Wd1";
const SHORT_HEADER_SECRET: &str = "shHdrZ4m2Rt";
const SECRETS: [&str; 4] = [
    LONG_ENV_SECRET,
    SHORT_ENV_SECRET,
    LONG_HEADER_SECRET,
    SHORT_HEADER_SECRET,
];

fn stdio_body(name: &str) -> Value {
    json!({"name": name, "transport": "stdio", "stdio": {"command": "toolgate-test-no-such-mcp-server"}})
}

fn secret_stdio_body(name: &str) -> Value {
    json!({
        "name": name,
        "transport": "stdio",
        "stdio": {
            "command": "toolgate-test-no-such-mcp-server",
            "args": ["--flag", "value"],
            "env": {"API_TOKEN": LONG_ENV_SECRET, "SHORT": SHORT_ENV_SECRET}
        }
    })
}

fn secret_http_body(name: &str) -> Value {
    json!({
        "name": name,
        "transport": "http",
        // Nothing listens on the discard port: connecting fails at once.
        "http": {"url": "http://127.0.0.1:9/mcp",
                 "headers": {"Authorization": LONG_HEADER_SECRET, "X-Short": SHORT_HEADER_SECRET}}
    })
}

fn data(reply: &Reply, status: StatusCode, what: &str) -> Value {
    assert_eq!(reply.status, status, "{what}: {reply:?}");
    reply.body["data"].clone()
}

async fn create(server: &TestServer, body: Value) -> Value {
    let reply = server.post("/mcp/servers", body).await;
    data(&reply, StatusCode::CREATED, "create")
}

fn id_of(server: &Value) -> String {
    server["id"].as_str().expect("id").to_owned()
}

fn names(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|server| server["name"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_no_secret(text: &str, what: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} contains a secret: {text}");
    }
}

/// A 400 `validation_error` whose message names `field`.
fn assert_refused(reply: &Reply, field: &str, what: &str) {
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{what}: {reply:?}");
    assert_eq!(reply.code(), "validation_error", "{what}: {reply:?}");
    let message = reply.body["error"]["message"].as_str().unwrap_or_default();
    // Our own checks start with the field; serde's name its path in backquotes.
    assert!(
        message.starts_with(field) || message.contains(&format!("`{field}")),
        "{what}: the message should name {field}: {message}"
    );
}

#[tokio::test]
async fn crud_round_trip_with_defaults() {
    let server = spawn_app().await;
    let created = create(&server, stdio_body("files")).await;
    let id = id_of(&created);
    assert!(id.starts_with("mcp_"), "{id}");
    assert_eq!(created["name"], "files");
    assert_eq!(created["transport"], "stdio");
    assert_eq!(
        created["stdio"],
        json!({"command": "toolgate-test-no-such-mcp-server", "args": [], "cwd": null, "env_masked": {}})
    );
    assert_eq!(created["http"], Value::Null);
    let defaults = [
        ("tool_prefix", Value::Null),
        ("enabled", json!(true)),
        ("connect_timeout_ms", json!(30000)),
        ("call_timeout_ms", json!(60000)),
        ("tool_refresh_interval_ms", json!(300000)),
        ("default_side_effect_level", Value::Null),
        ("default_allowed_slots", Value::Null),
        ("trust_annotations", json!(false)),
        ("default_async_capability", Value::Null),
        ("tool_overrides", json!({})),
        ("secrets_error", Value::Null),
    ];
    for (field, expected) in defaults {
        assert_eq!(created[field], expected, "default of {field}: {created}");
    }
    assert!(created["created_at"].as_i64().unwrap() > 0);
    assert_eq!(created["created_at"], created["updated_at"]);
    let live = &created["live_status"];
    for field in [
        "attached",
        "reason",
        "state",
        "tool_count",
        "connected_at",
        "tools_refreshed_at",
        "error",
        "reconnect_required",
        "last_timeout_at",
    ] {
        assert!(live.get(field).is_some(), "live_status.{field}: {live}");
    }

    let fetched = data(
        &server.get(&format!("/mcp/servers/{id}")).await,
        StatusCode::OK,
        "get",
    );
    assert_eq!(fetched["id"], created["id"]);
    assert_eq!(fetched["stdio"], created["stdio"]);
    assert_eq!(fetched["created_at"], created["created_at"]);

    let patched = data(
        &server
            .patch(
                &format!("/mcp/servers/{id}"),
                json!({"name": "  files2  ", "call_timeout_ms": 1500, "tool_prefix": "fs",
                       "default_side_effect_level": "none"}),
            )
            .await,
        StatusCode::OK,
        "patch",
    );
    assert_eq!(patched["name"], "files2", "names are trimmed");
    assert_eq!(patched["call_timeout_ms"], 1500);
    assert_eq!(patched["tool_prefix"], "fs");
    assert_eq!(patched["default_side_effect_level"], "none");
    assert_eq!(
        patched["connect_timeout_ms"], 30000,
        "untouched fields stay"
    );
    assert!(patched["updated_at"].as_i64() >= created["updated_at"].as_i64());
    let fetched = data(
        &server.get(&format!("/mcp/servers/{id}")).await,
        StatusCode::OK,
        "get after patch",
    );
    assert_eq!(fetched["name"], "files2");
    assert_eq!(fetched["call_timeout_ms"], 1500);

    let deleted = data(
        &server.delete(&format!("/mcp/servers/{id}")).await,
        StatusCode::OK,
        "delete",
    );
    assert_eq!(deleted, json!({"id": id, "deleted": true}));
    let gone = server.get(&format!("/mcp/servers/{id}")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{gone:?}");
    assert_eq!(gone.code(), "not_found");
    let again = server.delete(&format!("/mcp/servers/{id}")).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{again:?}");
    let list = server.get("/mcp/servers").await;
    assert_eq!(names(&list.body), Vec::<String>::new());
}

#[tokio::test]
async fn every_field_round_trips() {
    let server = spawn_app().await;
    let body = json!({
        "name": "remote",
        "transport": "http",
        "stdio": null,
        "http": {"url": "https://mcp.example.com/mcp", "headers": {"X-Api-Key": "k"}},
        "tool_prefix": "smoke_",
        "enabled": false,
        "connect_timeout_ms": 100,
        "call_timeout_ms": 3600000,
        "tool_refresh_interval_ms": 0,
        "default_side_effect_level": "sandbox",
        "default_allowed_slots": ["narrator", "director"],
        "trust_annotations": true,
        "default_async_capability": "deferred_ok",
        "tool_overrides": {
            "search": {"side_effect_level": "none", "allowed_slots": ["memory"],
                       "replay_safety": "safe", "enabled": true,
                       "async_capability": "deferred_ok", "default_delivery_mode": "async_job"},
            "delete.all": {"enabled": false}
        }
    });
    let created = create(&server, body.clone()).await;
    assert_eq!(created["stdio"], Value::Null);
    assert_eq!(
        created["http"],
        json!({"url": "https://mcp.example.com/mcp", "headers_masked": {"X-Api-Key": "****"}})
    );
    for field in [
        "tool_prefix",
        "enabled",
        "connect_timeout_ms",
        "call_timeout_ms",
        "tool_refresh_interval_ms",
        "default_side_effect_level",
        "default_allowed_slots",
        "trust_annotations",
        "default_async_capability",
        "tool_overrides",
    ] {
        assert_eq!(created[field], body[field], "{field}");
    }
    assert_eq!(created["live_status"]["attached"], false, "disabled");
    assert_eq!(created["live_status"]["reason"], "disabled");
    let fetched = data(
        &server
            .get(&format!("/mcp/servers/{}", id_of(&created)))
            .await,
        StatusCode::OK,
        "get",
    );
    assert_eq!(fetched, created);
}

/// Create bodies that are refused, with the field each message must name.
fn refused_creates() -> Vec<(Value, &'static str)> {
    let stdio = |extra: Value| {
        let mut body = stdio_body("bad");
        for (key, value) in extra.as_object().unwrap() {
            body["stdio"][key] = value.clone();
        }
        body
    };
    let with = |key: &str, value: Value| {
        let mut body = stdio_body("bad");
        body[key] = value;
        body
    };
    let http = |http: Value| json!({"name": "bad", "transport": "http", "http": http});
    let many_env: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("V{i}"), json!("x"))).collect();
    let many_overrides: serde_json::Map<String, Value> =
        (0..257).map(|i| (format!("t{i}"), json!({}))).collect();
    vec![
        (
            json!({"transport": "stdio", "stdio": {"command": "x"}}),
            "name",
        ),
        (with("name", json!("   ")), "name"),
        (with("name", json!(null)), "name"),
        (with("name", json!("a".repeat(129))), "name"),
        (with("name", json!("line\nbreak")), "name"),
        (with("name", json!(7)), "name"),
        (
            json!({"name": "bad", "stdio": {"command": "x"}}),
            "transport",
        ),
        (with("transport", json!("sse")), "transport"),
        (json!({"name": "bad", "transport": "stdio"}), "stdio"),
        (
            json!({"name": "bad", "transport": "stdio", "stdio": null}),
            "stdio",
        ),
        (
            with("http", json!({"url": "http://127.0.0.1:9/mcp"})),
            "http",
        ),
        (json!({"name": "bad", "transport": "http"}), "http"),
        (
            json!({"name": "bad", "transport": "http", "http": {"url": "http://h/"},
                "stdio": {"command": "x"}}),
            "stdio",
        ),
        (
            json!({"name": "bad", "transport": "stdio", "stdio": {}}),
            "stdio.command",
        ),
        (stdio(json!({"command": ""})), "stdio.command"),
        (stdio(json!({"command": "a\u{0}b"})), "stdio.command"),
        (stdio(json!({"command": "a".repeat(1025)})), "stdio.command"),
        (stdio(json!({"args": "not-a-list"})), "stdio.args"),
        (stdio(json!({"args": vec!["a"; 65]})), "stdio.args"),
        (stdio(json!({"args": ["ok", "nul\u{0}"]})), "stdio.args[1]"),
        (stdio(json!({"env": {"1BAD": "x"}})), "stdio.env"),
        (stdio(json!({"env": {"GOOD": 5}})), "stdio.env"),
        (stdio(json!({"env": many_env})), "stdio.env"),
        (
            stdio(json!({"env": {"BIG": "x".repeat(8193)}})),
            "stdio.env.BIG",
        ),
        (stdio(json!({"cwd": ""})), "stdio.cwd"),
        (stdio(json!({"shell": true})), "shell"),
        (http(json!({})), "http.url"),
        (http(json!({"url": "ftp://127.0.0.1/mcp"})), "http.url"),
        (http(json!({"url": "not a url"})), "http.url"),
        (
            http(json!({"url": "https://user:pw@mcp.example.com/"})),
            "http.url",
        ),
        // Where cloud metadata services answer, in two spellings.
        (
            http(json!({"url": "http://169.254.169.254/latest/meta-data"})),
            "http.url",
        ),
        (http(json!({"url": "http://[fe80::1]:80/mcp"})), "http.url"),
        (
            http(json!({"url": "http://h/", "headers": {"Bad Header": "x"}})),
            "http.headers",
        ),
        (
            http(json!({"url": "http://h/", "headers": {"Host": "x"}})),
            "http.headers",
        ),
        (
            http(json!({"url": "http://h/", "headers": {"a": "1", "A": "2"}})),
            "http.headers",
        ),
        (
            http(json!({"url": "http://h/", "headers": {"X-Token": "a\nb"}})),
            "http.headers.X-Token",
        ),
        (http(json!({"url": "http://h/", "timeout": 5})), "timeout"),
        (with("tool_prefix", json!("a b")), "tool_prefix"),
        (with("tool_prefix", json!("p".repeat(33))), "tool_prefix"),
        (with("enabled", json!("yes")), "enabled"),
        (with("connect_timeout_ms", json!(99)), "connect_timeout_ms"),
        (
            with("connect_timeout_ms", json!(300001)),
            "connect_timeout_ms",
        ),
        (with("connect_timeout_ms", json!(-1)), "connect_timeout_ms"),
        (
            with("connect_timeout_ms", json!("30000")),
            "connect_timeout_ms",
        ),
        (with("call_timeout_ms", json!(0)), "call_timeout_ms"),
        (with("call_timeout_ms", json!(3600001)), "call_timeout_ms"),
        (
            with("tool_refresh_interval_ms", json!(999)),
            "tool_refresh_interval_ms",
        ),
        (
            with("tool_refresh_interval_ms", json!(86400001)),
            "tool_refresh_interval_ms",
        ),
        (
            with("default_side_effect_level", json!("huge")),
            "default_side_effect_level",
        ),
        (
            with("default_allowed_slots", json!(["writer"])),
            "default_allowed_slots",
        ),
        (
            with("default_allowed_slots", json!(["narrator", "narrator"])),
            "default_allowed_slots",
        ),
        (with("trust_annotations", json!("yes")), "trust_annotations"),
        (
            with("default_async_capability", json!("sometimes")),
            "default_async_capability",
        ),
        (with("tool_overrides", json!([])), "tool_overrides"),
        (
            with("tool_overrides", json!({"foo": {"side_effect_level": "x"}})),
            "tool_overrides.foo.side_effect_level",
        ),
        (
            with("tool_overrides", json!({"foo": {"replay_safety": "maybe"}})),
            "tool_overrides.foo.replay_safety",
        ),
        (
            with("tool_overrides", json!({"foo": {"colour": "red"}})),
            "colour",
        ),
        (
            with(
                "tool_overrides",
                json!({"foo": {"allowed_slots": ["memory", "memory"]}}),
            ),
            "tool_overrides.foo.allowed_slots",
        ),
        (
            with(
                "tool_overrides",
                json!({"foo": {"default_delivery_mode": "async_job"}}),
            ),
            "tool_overrides.foo.default_delivery_mode",
        ),
        (with("tool_overrides", json!({"a b": {}})), "tool_overrides"),
        (
            with("tool_overrides", json!(many_overrides)),
            "tool_overrides",
        ),
        (with("bogus", json!(1)), "bogus"),
        // A secret in the wrong shape: refused without being repeated.
        (stdio(json!({"env": LONG_ENV_SECRET})), "stdio.env"),
        (
            http(json!({"url": "http://h/", "headers": LONG_HEADER_SECRET})),
            "http.headers",
        ),
        (
            stdio(json!({"env": {"API_TOKEN": [LONG_ENV_SECRET]}})),
            "stdio.env",
        ),
    ]
}

#[tokio::test]
async fn every_validation_rule_names_its_field() {
    let server = spawn_app().await;
    for (body, field) in refused_creates() {
        let reply = server.post("/mcp/servers", body.clone()).await;
        assert_refused(&reply, field, &format!("POST {body}"));
        assert_no_secret(&reply.text, &format!("the refusal of POST {body}"));
    }
    for raw in ["", "[]", "{\"name\":", "{} {}"] {
        let reply = read(
            server
                .client
                .post(server.url("/mcp/servers"))
                .bearer_auth(&server.token)
                .header("content-type", "application/json")
                .body(raw),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{raw:?}: {reply:?}");
        assert_eq!(reply.code(), "validation_error");
    }
    // Nothing refused was stored.
    assert_eq!(names(&server.get("/mcp/servers").await.body).len(), 0);
    // The bounds are inclusive, and the other transport may be null.
    let edge = json!({"name": "a".repeat(128), "transport": "stdio", "http": null,
        "stdio": {"command": "x", "args": vec!["a"; 64], "cwd": "/tmp", "env": {"_OK1": ""}},
        "tool_prefix": "A-z_0", "connect_timeout_ms": 300000, "call_timeout_ms": 100,
        "tool_refresh_interval_ms": 1000, "default_async_capability": "deferred_ok",
        "tool_overrides": {"t": {"default_delivery_mode": "async_job"}}});
    let created = create(&server, edge).await;
    assert_eq!(created["stdio"]["env_masked"], json!({"_OK1": "****"}));
    let empty_prefix = create(
        &server,
        json!({"name": "p", "transport": "stdio", "stdio": {"command": "x"}, "tool_prefix": ""}),
    )
    .await;
    assert_eq!(empty_prefix["tool_prefix"], Value::Null);
}

async fn read(request: reqwest::RequestBuilder) -> Reply {
    common::read_reply(request.send().await.expect("request")).await
}

#[tokio::test]
async fn patches_are_checked_whole_and_refusals_change_nothing() {
    let server = spawn_app().await;
    let created = create(&server, secret_stdio_body("s")).await;
    let path = format!("/mcp/servers/{}", id_of(&created));
    let refusals = [
        (json!({}), "PATCH needs at least one field"),
        (json!({"name": null}), "name"),
        (json!({"name": ""}), "name"),
        (json!({"transport": null}), "transport"),
        (json!({"transport": "http"}), "http"),
        (json!({"transport": "http", "http": null}), "http"),
        (json!({"http": {"url": "http://127.0.0.1:9/"}}), "http"),
        (json!({"stdio": null}), "stdio"),
        (json!({"stdio": {"command": null}}), "stdio.command"),
        (json!({"stdio": {"env": {"BAD-NAME": "x"}}}), "stdio.env"),
        (json!({"connect_timeout_ms": 5}), "connect_timeout_ms"),
        (
            json!({"default_async_capability": "inline_only",
                "tool_overrides": {"t": {"default_delivery_mode": "async_job"}}}),
            "tool_overrides.t.default_delivery_mode",
        ),
        (json!({"id": "mcp_other"}), "id"),
        (json!({"live_status": {}}), "live_status"),
    ];
    for (body, field) in refusals {
        let reply = server.patch(&path, body.clone()).await;
        assert_refused(&reply, field, &format!("PATCH {body}"));
    }
    let after = data(&server.get(&path).await, StatusCode::OK, "get");
    assert_eq!(
        config_of(&after),
        config_of(&created),
        "a refused PATCH changed the server"
    );
    let missing = server
        .patch("/mcp/servers/mcp_nonexistent", json!({"enabled": false}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
    let toggle = server
        .patch(&format!("{path}/toggle"), json!({"enabled": "no"}))
        .await;
    assert_refused(&toggle, "enabled", "toggle with a string");
    let toggle = server
        .patch(&format!("{path}/toggle"), json!({"enabled": true, "x": 1}))
        .await;
    assert_refused(&toggle, "x", "toggle with an unknown field");
    let toggle = server.patch(&format!("{path}/toggle"), json!({})).await;
    assert_refused(&toggle, "enabled", "toggle without enabled");
}

#[tokio::test]
async fn patches_merge_null_resets_and_transports_switch() {
    let server = spawn_app().await;
    let mut body = secret_stdio_body("m");
    body["stdio"]["cwd"] = json!("/tmp");
    body["tool_prefix"] = json!("m");
    body["connect_timeout_ms"] = json!(5000);
    let created = create(&server, body).await;
    let path = format!("/mcp/servers/{}", id_of(&created));
    let masked = created["stdio"]["env_masked"].clone();
    assert_eq!(
        masked,
        json!({"API_TOKEN": "sk-l****0m4c", "SHORT": "****"})
    );

    // A nested field replaces its own value only; env stays.
    let patched = data(
        &server
            .patch(&path, json!({"stdio": {"args": ["--other"]}}))
            .await,
        StatusCode::OK,
        "patch args",
    );
    assert_eq!(patched["stdio"]["args"], json!(["--other"]));
    assert_eq!(patched["stdio"]["command"], created["stdio"]["command"]);
    assert_eq!(patched["stdio"]["cwd"], "/tmp");
    assert_eq!(patched["stdio"]["env_masked"], masked);

    // null resets to the default.
    let reset = data(
        &server
            .patch(
                &path,
                json!({"tool_prefix": null, "connect_timeout_ms": null, "stdio": {"cwd": null}}),
            )
            .await,
        StatusCode::OK,
        "patch nulls",
    );
    assert_eq!(reset["tool_prefix"], Value::Null);
    assert_eq!(reset["connect_timeout_ms"], 30000);
    assert_eq!(reset["stdio"]["cwd"], Value::Null);
    assert_eq!(reset["stdio"]["env_masked"], masked);

    // env is replaced whole.
    let replaced = data(
        &server
            .patch(&path, json!({"stdio": {"env": {"ONLY": "v"}}}))
            .await,
        StatusCode::OK,
        "patch env",
    );
    assert_eq!(replaced["stdio"]["env_masked"], json!({"ONLY": "****"}));

    // Switching transport needs the new object and drops the old one.
    let switched = data(
        &server
            .patch(
                &path,
                json!({"transport": "http", "stdio": null, "http": {"url": "https://h.example/mcp"}}),
            )
            .await,
        StatusCode::OK,
        "switch to http",
    );
    assert_eq!(switched["transport"], "http");
    assert_eq!(switched["stdio"], Value::Null);
    assert_eq!(
        switched["http"],
        json!({"url": "https://h.example/mcp", "headers_masked": {}})
    );
    let back = server.patch(&path, json!({"transport": "stdio"})).await;
    assert_refused(&back, "stdio", "switch back without stdio");
    let back = data(
        &server
            .patch(
                &path,
                json!({"transport": "stdio", "stdio": {"command": "y"}}),
            )
            .await,
        StatusCode::OK,
        "switch back",
    );
    assert_eq!(
        back["stdio"],
        json!({"command": "y", "args": [], "cwd": null, "env_masked": {}})
    );
    assert_eq!(back["http"], Value::Null);
}

#[tokio::test]
async fn duplicate_names_conflict_on_create_and_rename() {
    let server = spawn_app().await;
    create(&server, stdio_body("taken")).await;
    let duplicate = server.post("/mcp/servers", stdio_body("taken")).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{duplicate:?}");
    assert_eq!(duplicate.code(), "mcp_server_conflict");
    let padded = server.post("/mcp/servers", stdio_body(" taken ")).await;
    assert_eq!(padded.code(), "mcp_server_conflict", "{padded:?}");
    // The other transport does not make it another server.
    let mut http = secret_http_body("taken");
    http["enabled"] = json!(false);
    let other_transport = server.post("/mcp/servers", http).await;
    assert_eq!(other_transport.code(), "mcp_server_conflict");

    let other = create(&server, stdio_body("other")).await;
    let path = format!("/mcp/servers/{}", id_of(&other));
    let rename = server.patch(&path, json!({"name": "taken"})).await;
    assert_eq!(rename.status, StatusCode::CONFLICT, "{rename:?}");
    assert_eq!(rename.code(), "mcp_server_conflict");
    let unchanged = data(&server.get(&path).await, StatusCode::OK, "get");
    assert_eq!(unchanged["name"], "other");
    // Keeping its own name is no conflict; a free one is taken.
    let same = server.patch(&path, json!({"name": "other"})).await;
    assert_eq!(same.status, StatusCode::OK, "{same:?}");
    let free = server.patch(&path, json!({"name": "free"})).await;
    assert_eq!(free.status, StatusCode::OK, "{free:?}");
    // Names are compared exactly: case makes another name.
    create(&server, stdio_body("TAKEN")).await;
    assert_eq!(
        names(
            &server
                .get("/mcp/servers?sort_by=name&sort_order=asc")
                .await
                .body
        ),
        ["TAKEN", "free", "taken"]
    );
}

#[tokio::test]
async fn accounts_never_see_each_other() {
    // Tenants' servers here are on loopback (`tests/mcp_hostile.rs` tests
    // that reach).
    let server = spawn_with(SpawnOptions {
        args: vec!["--mcp-private-urls-for-all-accounts".into()],
        ..Default::default()
    })
    .await;
    let second = server.create_account("second").await;
    let first_server = create(&server, secret_stdio_body("shared-name")).await;
    let id = id_of(&first_server);
    let path = format!("/mcp/servers/{id}");
    let as_second = |method: Method, path: String, body: Option<Value>| {
        let second = second.clone();
        let server = &server;
        async move { server.send_as(&second, method, &path, body).await }
    };
    for (method, path, body) in [
        (Method::GET, path.clone(), None),
        (Method::PATCH, path.clone(), Some(json!({"name": "stolen"}))),
        (
            Method::PATCH,
            format!("{path}/toggle"),
            Some(json!({"enabled": false})),
        ),
        (Method::DELETE, path.clone(), None),
    ] {
        let reply = as_second(method.clone(), path.clone(), body).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {reply:?}"
        );
        assert_eq!(reply.code(), "not_found");
    }
    // The same name in another account is another server (an http one: only
    // the admin may run stdio commands, below).
    let theirs = as_second(
        Method::POST,
        "/mcp/servers".into(),
        Some(secret_http_body("shared-name")),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{theirs:?}");
    let their_id = id_of(&theirs.body["data"]);
    let their_list = as_second(Method::GET, "/mcp/servers".into(), None).await;
    let their_ids: Vec<&str> = their_list.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(their_ids, [their_id.as_str()]);
    let our_list = server.get("/mcp/servers").await;
    assert_eq!(our_list.body["meta"]["total"], 1);
    assert_eq!(our_list.body["data"][0]["id"], id.as_str());
    // Nothing the second account tried changed ours.
    let ours = data(&server.get(&path).await, StatusCode::OK, "get");
    assert_eq!(config_of(&ours), config_of(&first_server));
    let mine = server.get(&format!("/mcp/servers/{their_id}")).await;
    assert_eq!(mine.status, StatusCode::NOT_FOUND, "{mine:?}");
}

/// Every response of every route a secret passes through, and the masks.
async fn exercise_secret_routes(server: &TestServer) -> Vec<Reply> {
    let mut replies = Vec::new();
    let stdio = server.post("/mcp/servers", secret_stdio_body("env")).await;
    let http = server.post("/mcp/servers", secret_http_body("hdr")).await;
    let stdio_id = id_of(&data(&stdio, StatusCode::CREATED, "stdio"));
    let http_id = id_of(&data(&http, StatusCode::CREATED, "http"));
    assert_eq!(
        stdio.body["data"]["stdio"]["env_masked"],
        json!({"API_TOKEN": "sk-l****0m4c", "SHORT": "****"})
    );
    assert_eq!(
        http.body["data"]["http"]["headers_masked"],
        json!({"Authorization": "Bear****6Wd1", "X-Short": "****"})
    );
    replies.extend([stdio, http]);
    for id in [&stdio_id, &http_id] {
        let path = format!("/mcp/servers/{id}");
        replies.push(server.get(&path).await);
        replies.push(server.patch(&path, json!({"call_timeout_ms": 2000})).await);
        replies.push(
            server
                .patch(&format!("{path}/toggle"), json!({"enabled": false}))
                .await,
        );
        replies.push(
            server
                .patch(&format!("{path}/toggle"), json!({"enabled": true}))
                .await,
        );
    }
    // Rows that are only ever created: what the database holds is the first write.
    replies.push(
        server
            .post("/mcp/servers", secret_stdio_body("env-once"))
            .await,
    );
    replies.push(
        server
            .post("/mcp/servers", secret_http_body("hdr-once"))
            .await,
    );
    replies.push(server.get("/mcp/servers").await);
    replies.push(server.get("/mcp/servers?enabled=true&sort_by=name").await);
    // A refused secret is not quoted back either.
    let mut bad = secret_stdio_body("bad");
    bad["stdio"]["env"]["BAD"] = json!(format!("{LONG_ENV_SECRET}\u{0}"));
    let refused = server.post("/mcp/servers", bad).await;
    assert_refused(&refused, "stdio.env.BAD", "NUL in a secret");
    replies.push(refused);
    replies
}

#[tokio::test]
async fn secrets_never_appear_in_responses_logs_or_the_database_file() {
    let mut server = spawn_with(SpawnOptions {
        // rmcp's own lines too: they are off unless RUST_LOG names rmcp.
        env: vec![("RUST_LOG".into(), "debug,rmcp=debug".into())],
        ..Default::default()
    })
    .await;
    for reply in exercise_secret_routes(&server).await {
        assert!(reply.status.is_success() || reply.status == StatusCode::BAD_REQUEST);
        assert_no_secret(&reply.text, "a response");
    }
    let key = std::fs::read_to_string(server.data_dir.join("secrets-key")).expect("key file");
    assert!(server.stop().await.success());
    let log = std::fs::read_to_string(server.data_dir.join("..").join("server.log")).unwrap();
    assert!(
        log.contains("MCP server created"),
        "nothing was logged: {log}"
    );
    assert_no_secret(&log, "the server log");
    assert!(
        !log.contains(key.trim()),
        "the log contains the secrets key"
    );
    if server.on_postgres() {
        let pool = sqlx::PgPool::connect(&server.database_url()).await.unwrap();
        let rows: Vec<String> = sqlx::query_scalar("SELECT t::text FROM mcp_servers t")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        let all = rows.join("\n");
        for secret in SECRETS {
            assert!(!all.contains(secret), "mcp_servers holds a secret in clear");
        }
        assert!(all.contains("toolgate-test-no-such-mcp-server"), "{all}");
        return;
    }
    let mut scanned = 0;
    for entry in std::fs::read_dir(&server.data_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("toolgate.db") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        scanned += bytes.len();
        for secret in SECRETS {
            assert!(
                !contains(&bytes, secret.as_bytes()),
                "{name} holds a secret in clear"
            );
        }
        // The non-secret configuration is there: the scan looks at real data.
        if name == "toolgate.db" {
            assert!(contains(&bytes, b"toolgate-test-no-such-mcp-server"));
        }
    }
    assert!(scanned > 0, "no database file was scanned");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn assert_key_file(dir: &Path) -> String {
    let path = dir.join("secrets-key");
    let text = std::fs::read_to_string(&path).expect("the secrets key file");
    let key = text.trim();
    assert_eq!(key.len(), 64, "64 hex digits");
    assert!(key.chars().all(|c| c.is_ascii_hexdigit()), "hex");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }
    key.to_owned()
}

#[tokio::test]
async fn secrets_survive_a_restart_with_the_generated_key() {
    let mut server = spawn_app().await;
    let key = assert_key_file(&server.data_dir);
    let stdio = create(&server, secret_stdio_body("env")).await;
    let http = create(&server, secret_http_body("hdr")).await;
    server.restart().await;
    assert_eq!(assert_key_file(&server.data_dir), key, "the key was reused");
    for before in [&stdio, &http] {
        let path = format!("/mcp/servers/{}", id_of(before));
        let after = data(
            &server.get(&path).await,
            StatusCode::OK,
            "get after restart",
        );
        assert_eq!(after["stdio"], before["stdio"]);
        assert_eq!(after["http"], before["http"]);
        assert_eq!(after["secrets_error"], Value::Null);
        // A PATCH that does not touch the secrets keeps them...
        let patched = data(
            &server
                .patch(&path, json!({"connect_timeout_ms": 1234}))
                .await,
            StatusCode::OK,
            "patch after restart",
        );
        assert_eq!(patched["stdio"], before["stdio"]);
        assert_eq!(patched["http"], before["http"]);
    }
    // ...sealed again with the same key: they still open after another restart.
    server.restart().await;
    let list = server.get("/mcp/servers?sort_by=name&sort_order=asc").await;
    assert_eq!(names(&list.body), ["env", "hdr"]);
    assert_eq!(list.body["data"][0]["stdio"], stdio["stdio"]);
    assert_eq!(list.body["data"][1]["http"], http["http"]);
    assert_eq!(list.body["data"][0]["connect_timeout_ms"], 1234);
}

const OTHER_KEY: &str = "1111111111111111111111111111111111111111111111111111111111111111";

/// The start refused for its key, saying why and how out, never the key.
fn assert_refused_for_its_key(output: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("does not open the secrets stored in the database"),
        "{stderr}"
    );
    assert!(stderr.contains("toolgate forget-secrets"), "{stderr}");
    assert!(!stderr.contains(OTHER_KEY), "the key was echoed: {stderr}");
}

fn forget_secrets(server: &TestServer, args: &[&str]) -> std::process::Output {
    let mut all = vec!["forget-secrets"];
    all.extend_from_slice(args);
    common::toolgate_command(&all, &server.data_dir, Some(&server.database_url()))
}

#[tokio::test]
async fn another_key_is_refused_until_the_old_one_returns_or_the_secrets_are_forgotten() {
    let mut server = spawn_app().await;
    let key_file = server.data_dir.join("secrets-key");
    let sealed = create(&server, secret_stdio_body("sealed")).await;
    let plain = create(&server, stdio_body("plain")).await;
    let path = |server: &Value| format!("/mcp/servers/{}", id_of(server));
    server.stop().await;

    // Another key would seal what this database's key cannot open.
    let refused = server
        .start_refused(vec![("TOOLGATE_SECRETS_KEY".into(), OTHER_KEY.into())])
        .await;
    assert_refused_for_its_key(&refused);
    // So would a key generated because the key file is gone; the refused
    // start leaves no key file behind to be taken for the database's.
    let kept_aside = server.data_dir.join("secrets-key.kept");
    std::fs::rename(&key_file, &kept_aside).unwrap();
    assert_refused_for_its_key(&server.start_refused(Vec::new()).await);
    assert!(!key_file.exists(), "a refused start left a generated key");
    std::fs::rename(&kept_aside, &key_file).unwrap();

    // The old key back: the secrets open.
    server.restart().await;
    let back = data(&server.get(&path(&sealed)).await, StatusCode::OK, "get");
    assert_eq!(back["secrets_error"], Value::Null);
    assert_eq!(back["stdio"]["env_masked"], sealed["stdio"]["env_masked"]);
    // Forgetting is refused while a server runs on the database...
    let busy = forget_secrets(&server, &["--yes"]);
    assert!(!busy.status.success(), "{busy:?}");
    server.stop().await;
    // ...and without its confirmation.
    let unconfirmed = forget_secrets(&server, &[]);
    assert!(!unconfirmed.status.success(), "{unconfirmed:?}");
    assert!(
        String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"),
        "{unconfirmed:?}"
    );
    let forgot = forget_secrets(&server, &["--yes"]);
    assert!(forgot.status.success(), "{forgot:?}");
    let said = String::from_utf8_lossy(&forgot.stdout);
    assert!(said.contains("secrets of 1 MCP server(s)"), "{said}");
    assert!(said.contains(&id_of(&sealed)), "{said}");
    assert!(!said.contains(&id_of(&plain)), "{said}");

    // The new key takes over: the server that had secrets is kept without
    // them and disabled; the other is as it was.
    let other_key = vec![("TOOLGATE_SECRETS_KEY".to_owned(), OTHER_KEY.to_owned())];
    server.restart_with_env(other_key.clone()).await;
    let forgotten = data(&server.get(&path(&sealed)).await, StatusCode::OK, "get");
    assert_eq!(forgotten["enabled"], false);
    assert_eq!(forgotten["secrets_error"], Value::Null);
    assert_eq!(forgotten["stdio"]["env_masked"], json!({}));
    assert_eq!(forgotten["stdio"]["args"], sealed["stdio"]["args"]);
    let untouched = data(&server.get(&path(&plain)).await, StatusCode::OK, "get");
    assert_eq!(untouched["enabled"], plain["enabled"]);
    let resealed = data(
        &server
            .patch(&path(&sealed), json!({"stdio": {"env": {"NEW": "v"}}}))
            .await,
        StatusCode::OK,
        "new env",
    );
    assert_eq!(resealed["stdio"]["env_masked"], json!({"NEW": "****"}));
    server.restart_with_env(other_key).await;
    let reopened = data(&server.get(&path(&sealed)).await, StatusCode::OK, "get");
    assert_eq!(reopened["secrets_error"], Value::Null);
    assert_eq!(reopened["stdio"]["env_masked"], json!({"NEW": "****"}));
    // The old key is now the one refused.
    server.stop().await;
    assert_refused_for_its_key(&server.start_refused(Vec::new()).await);
}

#[tokio::test]
async fn a_secret_the_key_cannot_open_is_kept_sealed_until_replaced() {
    let mut server = spawn_app().await;
    let kept = create(&server, secret_stdio_body("kept")).await;
    let rewritten = create(&server, secret_http_body("rewritten")).await;
    let plain = create(&server, stdio_body("plain")).await;
    server.stop().await;
    // A sealed value copied onto another row does not open there (sealing
    // binds it to its server's id): what a hand-edited or damaged row gives.
    server
        .execute_sql(
            "UPDATE mcp_servers SET secrets = \
             (SELECT secrets FROM mcp_servers WHERE name = 'rewritten') \
             WHERE name = 'kept'",
        )
        .await;
    server.restart().await;
    let path = |server: &Value| format!("/mcp/servers/{}", id_of(server));
    let unreadable = data(&server.get(&path(&kept)).await, StatusCode::OK, "get");
    let error = unreadable["secrets_error"].as_str().expect("secrets_error");
    assert!(error.contains("secrets key"), "{error}");
    assert_eq!(unreadable["stdio"]["env_masked"], json!({}));
    assert_eq!(unreadable["stdio"]["args"], kept["stdio"]["args"]);
    for readable in [&rewritten, &plain] {
        let clean = data(&server.get(&path(readable)).await, StatusCode::OK, "get");
        assert_eq!(clean["secrets_error"], Value::Null, "{clean}");
    }
    // Writes that leave the secrets alone keep them sealed as they were...
    let toggled = data(
        &server
            .patch(
                &format!("{}/toggle", path(&kept)),
                json!({"enabled": false}),
            )
            .await,
        StatusCode::OK,
        "toggle",
    );
    assert!(toggled["secrets_error"].is_string());
    let renamed = server
        .patch(
            &path(&kept),
            json!({"name": "kept2", "stdio": {"args": []}}),
        )
        .await;
    assert!(data(&renamed, StatusCode::OK, "rename")["secrets_error"].is_string());
    server.restart().await;
    let still = data(&server.get(&path(&kept)).await, StatusCode::OK, "get");
    assert!(still["secrets_error"].is_string(), "{still}");
    assert_eq!(still["name"], "kept2");
    assert_eq!(still["enabled"], false);
    // ...and new ones replace them.
    let replaced = data(
        &server
            .patch(&path(&kept), json!({"stdio": {"env": {"X_NEW": "v"}}}))
            .await,
        StatusCode::OK,
        "new env",
    );
    assert_eq!(replaced["secrets_error"], Value::Null);
    assert_eq!(replaced["stdio"]["env_masked"], json!({"X_NEW": "****"}));
}

#[tokio::test]
async fn a_malformed_key_refuses_to_start_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad_key = "not-a-key-but-a-passphrase-that-must-not-be-echoed";
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .env("TOOLGATE_SECRETS_KEY", bad_key)
            .env("TOOLGATE_ADMIN_TOKEN", common::ADMIN_TOKEN)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("toolgate did not exit")
    .expect("run toolgate");
    assert!(!output.status.success(), "started with a malformed key");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("secrets key"), "{stderr}");
    assert!(stderr.contains("64 hexadecimal digits"), "{stderr}");
    assert!(!stderr.contains(bad_key), "the key was echoed: {stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
}

#[tokio::test]
async fn lists_filter_sort_and_page() {
    let server = spawn_app().await;
    for name in ["charlie", "alpha", "bravo", "delta"] {
        create(&server, stdio_body(name)).await;
    }
    let bravo = server
        .get("/mcp/servers?sort_by=name&sort_order=asc&limit=1&offset=1")
        .await;
    let bravo_id = id_of(&bravo.body["data"][0]);
    assert_eq!(bravo.body["data"][0]["name"], "bravo");
    let off = server
        .patch(
            &format!("/mcp/servers/{bravo_id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(off.status, StatusCode::OK, "{off:?}");
    let cases = [
        ("", vec!["delta", "bravo", "alpha", "charlie"]),
        (
            "?sort_order=asc",
            vec!["charlie", "alpha", "bravo", "delta"],
        ),
        (
            "?sort_by=created_at&sort_order=desc",
            vec!["delta", "bravo", "alpha", "charlie"],
        ),
        ("?sort_by=name", vec!["delta", "charlie", "bravo", "alpha"]),
        (
            "?sort_by=name&sort_order=asc",
            vec!["alpha", "bravo", "charlie", "delta"],
        ),
        ("?enabled=false", vec!["bravo"]),
        (
            "?enabled=true&sort_by=name&sort_order=asc",
            vec!["alpha", "charlie", "delta"],
        ),
        (
            "?enabled=true&sort_by=name&sort_order=asc&limit=2&offset=1",
            vec!["charlie", "delta"],
        ),
        ("?limit=2", vec!["delta", "bravo"]),
        ("?offset=10", vec![]),
    ];
    for (query, expected) in cases {
        let reply = server.get(&format!("/mcp/servers{query}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{query}: {reply:?}");
        assert_eq!(names(&reply.body), expected, "{query}");
        assert!(reply.body["data"][0].get("live_status").is_some() || expected.is_empty());
    }
    let meta = server.get("/mcp/servers").await.body["meta"].clone();
    assert_eq!(
        meta,
        json!({"total": 4, "limit": 50, "offset": 0, "has_more": false,
               "sort_by": "created_at", "sort_order": "desc"})
    );
    let meta = server
        .get("/mcp/servers?enabled=true&sort_by=name&sort_order=asc&limit=2")
        .await
        .body["meta"]
        .clone();
    assert_eq!(
        meta,
        json!({"total": 3, "limit": 2, "offset": 0, "has_more": true,
               "sort_by": "name", "sort_order": "asc"})
    );
    for (query, field) in [
        ("?sort_by=id", "sort_by"),
        ("?sort_order=up", "sort_order"),
        ("?limit=0", "limit"),
        ("?limit=201", "limit"),
        ("?offset=-1", "offset"),
        ("?enabled=maybe", "enabled"),
        ("?transport=stdio", "transport"),
    ] {
        let reply = server.get(&format!("/mcp/servers{query}")).await;
        assert_refused(&reply, field, query);
    }
}

#[tokio::test]
async fn racing_patches_and_toggles_all_land() {
    let server = spawn_app().await;
    let created = create(&server, secret_stdio_body("raced")).await;
    let path = format!("/mcp/servers/{}", id_of(&created));
    let toggle = format!("{path}/toggle");
    for round in 0..20u64 {
        let enabled = round % 2 == 0;
        let (a, b, c, d) = tokio::join!(
            server.patch(&path, json!({"connect_timeout_ms": 1000 + round})),
            server.patch(&path, json!({"call_timeout_ms": 2000 + round})),
            server.patch(&path, json!({"tool_prefix": format!("p{round}")})),
            server.patch(&toggle, json!({"enabled": enabled})),
        );
        for reply in [a, b, c, d] {
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        }
        let now = data(&server.get(&path).await, StatusCode::OK, "get");
        assert_eq!(now["connect_timeout_ms"], 1000 + round, "round {round}");
        assert_eq!(now["call_timeout_ms"], 2000 + round, "round {round}");
        assert_eq!(now["tool_prefix"], format!("p{round}"), "round {round}");
        assert_eq!(now["enabled"], enabled, "round {round}");
        assert_eq!(now["stdio"]["env_masked"], created["stdio"]["env_masked"]);
    }
}

#[tokio::test]
async fn the_routes_and_codes_are_in_the_openapi_document() {
    let server = spawn_app().await;
    let doc = server.get_without_key("/openapi.json").await.body;
    for (path, methods) in [
        ("/mcp/servers", &["get", "post"][..]),
        ("/mcp/servers/{id}", &["get", "patch", "delete"][..]),
        ("/mcp/servers/{id}/toggle", &["patch"][..]),
    ] {
        for method in methods {
            assert!(
                doc["paths"][path][method].is_object(),
                "{method} {path} is not documented"
            );
        }
    }
    let codes = doc["components"]["schemas"]["ErrorCode"].to_string();
    for code in [
        "mcp_server_conflict",
        "mcp_server_disabled",
        "mcp_runtime_not_attached",
        "mcp_runtime_unavailable",
    ] {
        assert!(codes.contains(code), "{code} is not in the ErrorCode table");
    }
}

/// A request of the smoke run, checked against the statuses it accepts.
async fn smoke_step(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
    accepted: &[u16],
) -> Reply {
    let reply = server.send(method.clone(), path, body).await;
    assert!(
        accepted.contains(&reply.status.as_u16()),
        "{method} {path}: {} is not one of {accepted:?}: {reply:?}",
        reply.status
    );
    reply
}

/// The configuration steps of TavernHeadless's `smoke-mcp.ts`, in its order,
/// with exactly the statuses and assertions it accepts; its runtime steps run
/// when `/mcp/statuses` answers 200, as the script decides.
#[tokio::test]
async fn the_tavernheadless_smoke_sequence_passes() {
    let server = spawn_app().await;
    let run = "smoke1";
    let stdio = smoke_step(
        &server,
        Method::POST,
        "/mcp/servers",
        Some(json!({
            "name": format!("{run}-mcp-stdio"), "transport": "stdio",
            "stdio": {"command": "node", "args": ["fake-server.js"]},
            "tool_prefix": "smoke_", "connect_timeout_ms": 5000, "call_timeout_ms": 10000,
            "default_side_effect_level": "none"
        })),
        &[201],
    )
    .await;
    let stdio_id = id_of(&stdio.body["data"]);
    assert_eq!(stdio.body["data"]["transport"], "stdio");
    assert_eq!(stdio.body["data"]["enabled"], true);
    let http = smoke_step(
        &server,
        Method::POST,
        "/mcp/servers",
        Some(json!({
            "name": format!("{run}-mcp-http"), "transport": "http",
            "http": {"url": "http://localhost:19999/mcp"}, "enabled": false
        })),
        &[201],
    )
    .await;
    let http_id = id_of(&http.body["data"]);
    smoke_step(
        &server,
        Method::POST,
        "/mcp/servers",
        Some(json!({
            "name": format!("{run}-mcp-stdio"), "transport": "stdio", "stdio": {"command": "echo"}
        })),
        &[409],
    )
    .await;
    let list = smoke_step(&server, Method::GET, "/mcp/servers", None, &[200]).await;
    assert!(list.body["data"].as_array().unwrap().len() >= 2);
    let one = smoke_step(
        &server,
        Method::GET,
        &format!("/mcp/servers/{stdio_id}"),
        None,
        &[200],
    )
    .await;
    assert_eq!(one.body["data"]["id"], stdio_id.as_str());
    smoke_step(
        &server,
        Method::PATCH,
        &format!("/mcp/servers/{stdio_id}"),
        Some(json!({
            "name": format!("{run}-mcp-renamed"), "connect_timeout_ms": 8000
        })),
        &[200],
    )
    .await;
    let off = smoke_step(
        &server,
        Method::PATCH,
        &format!("/mcp/servers/{stdio_id}/toggle"),
        Some(json!({"enabled": false})),
        &[200],
    )
    .await;
    assert_eq!(off.body["data"]["enabled"], false);
    let on = smoke_step(
        &server,
        Method::PATCH,
        &format!("/mcp/servers/{stdio_id}/toggle"),
        Some(json!({"enabled": true})),
        &[200],
    )
    .await;
    assert_eq!(on.body["data"]["enabled"], true);

    let probe = smoke_step(&server, Method::GET, "/mcp/statuses", None, &[200, 404]).await;
    if probe.status == StatusCode::OK {
        smoke_runtime_steps(&server, &probe, &stdio_id, &format!("{run}-mcp-renamed")).await;
    }

    smoke_step(
        &server,
        Method::GET,
        "/mcp/servers/nonexistent",
        None,
        &[404],
    )
    .await;
    smoke_step(
        &server,
        Method::DELETE,
        "/mcp/servers/nonexistent",
        None,
        &[404],
    )
    .await;
    smoke_step(
        &server,
        Method::DELETE,
        &format!("/mcp/servers/{http_id}"),
        None,
        &[200],
    )
    .await;
    smoke_step(
        &server,
        Method::GET,
        &format!("/mcp/servers/{http_id}"),
        None,
        &[404],
    )
    .await;
    smoke_step(
        &server,
        Method::DELETE,
        &format!("/mcp/servers/{stdio_id}"),
        None,
        &[200],
    )
    .await;
    // The script's cleanups run after it and accept both answers.
    for id in [&stdio_id, &http_id] {
        smoke_step(
            &server,
            Method::DELETE,
            &format!("/mcp/servers/{id}"),
            None,
            &[200, 404],
        )
        .await;
    }
}

/// The smoke run's runtime steps, with its assertions.
async fn smoke_runtime_steps(server: &TestServer, probe: &Reply, id: &str, name: &str) {
    assert!(probe.body["data"].is_array(), "{probe:?}");
    let status = smoke_step(
        server,
        Method::GET,
        &format!("/mcp/servers/{id}/status"),
        None,
        &[200],
    )
    .await;
    let status = &status.body["data"];
    assert_eq!(status["server_id"], id);
    assert_eq!(status["server_name"], name);
    assert_eq!(status["transport"], "stdio");
    assert_eq!(status["attached"], true);
    assert_eq!(status["reason"], Value::Null);
    let states = [
        "disconnected",
        "connecting",
        "connected",
        "reconnect_required",
        "error",
    ];
    assert!(
        states.contains(&status["state"].as_str().unwrap_or_default()),
        "{status}"
    );
    let tools = smoke_step(
        server,
        Method::GET,
        &format!("/mcp/servers/{id}/tools"),
        None,
        &[200, 409, 503],
    )
    .await;
    if tools.status == StatusCode::OK {
        assert!(tools.body["data"].is_array());
    } else {
        assert!(
            ["mcp_runtime_not_attached", "mcp_runtime_unavailable"].contains(&tools.code()),
            "{tools:?}"
        );
    }
    let disconnect = smoke_step(
        server,
        Method::POST,
        &format!("/mcp/servers/{id}/disconnect"),
        None,
        &[200, 409],
    )
    .await;
    if disconnect.status == StatusCode::OK {
        assert_eq!(disconnect.body["data"]["server_id"], id);
    } else {
        assert_eq!(disconnect.code(), "mcp_runtime_not_attached");
    }
}

/// A server response without its `live_status`, which follows the connection.
fn config_of(server: &Value) -> Value {
    let mut config = server.clone();
    if let Some(fields) = config.as_object_mut() {
        fields.remove("live_status");
    }
    config
}

/// A stdio server's command runs as the server's own user, so only the admin
/// account may run one, unless the server is started to let every account.
#[tokio::test]
async fn only_the_admin_runs_stdio_servers_unless_every_account_may() {
    // The tenant's http server is on loopback, which this flag allows.
    let server = spawn_with(SpawnOptions {
        args: vec!["--mcp-private-urls-for-all-accounts".into()],
        ..Default::default()
    })
    .await;
    let tenant = server.create_account("tenant").await;
    let as_tenant = |method: Method, path: String, body: Value| {
        let tenant = tenant.clone();
        let server = &server;
        async move { server.send_as(&tenant, method, &path, Some(body)).await }
    };
    let refused = as_tenant(Method::POST, "/mcp/servers".into(), stdio_body("theirs")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{refused:?}");
    assert_eq!(refused.code(), "forbidden");
    // A disabled one runs nothing; enabling it, or making an http one stdio, is refused.
    let mut disabled = stdio_body("parked");
    disabled["enabled"] = json!(false);
    let parked = as_tenant(Method::POST, "/mcp/servers".into(), disabled).await;
    assert_eq!(parked.status, StatusCode::CREATED, "{parked:?}");
    let parked = id_of(&parked.body["data"]);
    let enable = as_tenant(
        Method::PATCH,
        format!("/mcp/servers/{parked}/toggle"),
        json!({"enabled": true}),
    )
    .await;
    assert_eq!(enable.status, StatusCode::FORBIDDEN, "{enable:?}");
    // Testing it would run its command just the same.
    let test = as_tenant(
        Method::POST,
        format!("/mcp/servers/{parked}/test"),
        json!({}),
    )
    .await;
    assert_eq!(test.status, StatusCode::FORBIDDEN, "{test:?}");
    let http = as_tenant(Method::POST, "/mcp/servers".into(), secret_http_body("web")).await;
    assert_eq!(http.status, StatusCode::CREATED, "{http:?}");
    let http = id_of(&http.body["data"]);
    let switch = as_tenant(
        Method::PATCH,
        format!("/mcp/servers/{http}"),
        json!({"transport": "stdio", "stdio": {"command": "toolgate-test-no-such-mcp-server"}}),
    )
    .await;
    assert_eq!(switch.status, StatusCode::FORBIDDEN, "{switch:?}");
    let unchanged = server
        .send_as(&tenant, Method::GET, &format!("/mcp/servers/{http}"), None)
        .await;
    assert_eq!(unchanged.body["data"]["transport"], "http", "{unchanged:?}");
    // The admin may.
    create(&server, stdio_body("ours")).await;

    let mut open = spawn_with(SpawnOptions {
        args: vec!["--mcp-private-urls-for-all-accounts".into()],
        env: vec![("TOOLGATE_MCP_STDIO_FOR_ALL_ACCOUNTS".into(), "true".into())],
        ..Default::default()
    })
    .await;
    let tenant = open.create_account("tenant").await;
    let allowed = open
        .send_as(
            &tenant,
            Method::POST,
            "/mcp/servers",
            Some(stdio_body("theirs")),
        )
        .await;
    assert_eq!(allowed.status, StatusCode::CREATED, "{allowed:?}");
    // Stored while every account was allowed, it is not started once that
    // is no longer so.
    open.restart_with_env(Vec::new()).await;
    open.log_containing("not starting a stdio MCP server of an account other than the admin")
        .await;
    let id = id_of(&allowed.body["data"]);
    let connect = open
        .send_as(
            &tenant,
            Method::POST,
            &format!("/mcp/servers/{id}/connect"),
            Some(json!({})),
        )
        .await;
    assert_eq!(connect.status, StatusCode::FORBIDDEN, "{connect:?}");
}

#[tokio::test]
async fn a_damaged_key_check_is_written_again_when_the_key_opens_the_stored_secrets() {
    let mut server = spawn_app().await;
    let sealed = create(&server, secret_stdio_body("sealed")).await;
    server.stop().await;
    server
        .execute_sql("UPDATE secrets_key_check SET sealed = (SELECT secrets FROM mcp_servers WHERE name = 'sealed')")
        .await;
    // The right key still opens the stored secrets: the check was damaged.
    server.restart().await;
    let read = data(
        &server
            .get(&format!("/mcp/servers/{}", id_of(&sealed)))
            .await,
        StatusCode::OK,
        "get",
    );
    assert_eq!(read["secrets_error"], Value::Null);
    server
        .log_containing("secrets key check did not open")
        .await;
    // Written again: another key is still refused.
    server.stop().await;
    let refused = server
        .start_refused(vec![("TOOLGATE_SECRETS_KEY".into(), OTHER_KEY.into())])
        .await;
    assert_refused_for_its_key(&refused);
    // Without a stored secret to judge by, a check that does not open is refused.
    server
        .execute_sql("UPDATE secrets_key_check SET sealed = (SELECT secrets FROM mcp_servers WHERE name = 'sealed')")
        .await;
    server
        .execute_sql("DELETE FROM mcp_servers WHERE name = 'sealed'")
        .await;
    assert_refused_for_its_key(&server.start_refused(Vec::new()).await);
}

/// An account holds at most 64 MCP servers (each enabled one a connection,
/// a child process for stdio), counted and written in one step: creates
/// racing at the cap do not pass it together.
#[tokio::test]
async fn an_account_holds_at_most_64_mcp_servers_even_when_creates_race() {
    let server = spawn_app().await;
    let disabled = |name: String| {
        let mut body = stdio_body(&name);
        body["enabled"] = json!(false);
        body
    };
    let mut first = String::new();
    for n in 0..63 {
        let created = create(&server, disabled(format!("s{n}"))).await;
        if n == 0 {
            first = id_of(&created);
        }
    }
    let racing = (0..5).map(|n| server.post("/mcp/servers", disabled(format!("last{n}"))));
    let replies = futures::future::join_all(racing).await;
    common::assert_one_created_rest_over_limit(&replies, "64");
    let list = server.get("/mcp/servers?limit=1").await;
    assert_eq!(list.body["meta"]["total"], 64, "{list:?}");
    // Another account's place is its own; a delete makes room.
    let other = server.create_account("other").await;
    let theirs = server
        .send_as(
            &other,
            Method::POST,
            "/mcp/servers",
            Some(disabled("theirs".into())),
        )
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{theirs:?}");
    let deleted = server.delete(&format!("/mcp/servers/{first}")).await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    create(&server, disabled("again".into())).await;
}
