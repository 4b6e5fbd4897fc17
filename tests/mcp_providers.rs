//! MCP servers as tool providers, through the real binary and the repository's
//! test MCP server: live listing and metadata, calls and their reason codes,
//! timeouts, crashes and supervised restarts, `list_changed`, cached snapshots
//! across outages and restarts, unreachable and disabled servers.

mod common;

use std::time::{Duration, Instant};

use common::mcp::{
    HttpMcp, allow_irreversible, call, catalog, create_server, dead_url, http_body,
    processes_running, server_entry, stdio_body, tool, wait_for_source,
};
use common::spawn_app;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Long enough for a cold child start on a loaded 2-core machine.
const CONNECTED: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_stdio_server_is_listed_live_with_prefix_provider_and_basis_fields() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let trusted = create_server(
        &server,
        stdio_body(
            "trusted",
            json!({
                "tool_prefix": "t",
                "trust_annotations": true,
                "tool_overrides": {"echo": {"side_effect_level": "none", "allowed_slots": ["narrator"]}},
            }),
        ),
    )
    .await;
    let defaulted = create_server(
        &server,
        stdio_body(
            "defaulted",
            json!({"tool_prefix": "d", "default_side_effect_level": "sandbox"}),
        ),
    )
    .await;
    wait_for_source(&server, &session, &trusted, "live", CONNECTED).await;
    let listed = wait_for_source(&server, &session, &defaulted, "live", CONNECTED).await;

    let echo = tool(&listed, "t_echo").expect("t_echo listed");
    assert_eq!(echo["provider_type"], "mcp");
    assert_eq!(echo["provider_id"], format!("mcp:{trusted}"));
    assert_eq!(echo["source"], "mcp");
    assert_eq!(echo["catalog_source"], "live");
    assert_eq!(echo["side_effect_level"], "none");
    assert_eq!(echo["side_effect_level_basis"], "account_override");
    assert_eq!(echo["allowed_slots"], json!(["narrator"]));
    assert_eq!(echo["allowed_slots_basis"], "account_override");
    assert_eq!(
        echo["metadata_basis_detail"]["side_effect_level"]["basis"],
        "account_override"
    );

    let lookup = tool(&listed, "t_lookup").expect("t_lookup listed");
    assert_eq!(lookup["side_effect_level"], "none");
    assert_eq!(lookup["side_effect_level_basis"], "tool_declared");
    let destroy = tool(&listed, "t_destroy").expect("t_destroy listed");
    assert_eq!(destroy["side_effect_level"], "irreversible");
    assert_eq!(destroy["side_effect_level_basis"], "tool_declared");
    assert_eq!(destroy["replay_safety"], "never_auto_replay");

    let untrusted = tool(&listed, "d_lookup").expect("d_lookup listed");
    assert_eq!(untrusted["side_effect_level"], "sandbox");
    assert_eq!(untrusted["side_effect_level_basis"], "server_default");
    assert_eq!(untrusted["allowed_slots_basis"], "platform_default");
    let with_ref = tool(&listed, "d_with_ref").expect("d_with_ref listed");
    assert_eq!(
        with_ref["parameter_schema_basis"],
        "shallow_schema_projection"
    );
    assert!(!with_ref["parameters"].to_string().contains("$ref"));
    assert_eq!(
        tool(&listed, "d_echo").unwrap()["parameter_schema_basis"],
        "tool_declared"
    );

    let entry = server_entry(&listed, &trusted).unwrap();
    assert_eq!(entry["name"], "trusted");
    assert!(entry["tool_count"].as_u64().unwrap() >= 8, "{entry}");
    assert!(entry["snapshot_at"].is_i64(), "{entry}");

    let tools = server.get(&format!("/mcp/servers/{trusted}/tools")).await;
    assert_eq!(tools.status, StatusCode::OK, "{tools:?}");
    assert!(
        tools.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "t_echo")
    );
    let status = server.get(&format!("/mcp/servers/{trusted}/status")).await;
    assert_eq!(status.body["data"]["state"], "connected", "{status:?}");
    assert_eq!(status.body["data"]["attached"], true);
    assert_eq!(status.body["data"]["transport"], "stdio");
}

#[tokio::test]
async fn calls_answer_with_status_and_reason_codes() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(
        &server,
        stdio_body("calls", json!({"default_side_effect_level": "none"})),
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let echoed = call(&server, &session, "echo", json!({"text": "hi"})).await;
    assert_eq!(echoed["is_error"], false, "{echoed}");
    assert_eq!(echoed["status"], "success");
    assert_eq!(
        echoed["output"],
        json!({"echo": "hi"}),
        "structuredContent is preferred"
    );
    assert_eq!(echoed["execution_reason_code"], Value::Null);
    let shouted = call(&server, &session, "shout", json!({"text": "hi"})).await;
    assert_eq!(
        shouted["output"], "HI",
        "text content when there is no structuredContent"
    );

    let failed = call(&server, &session, "fail", json!({"message": "no luck"})).await;
    assert_eq!(failed["is_error"], true, "{failed}");
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["execution_reason_code"], "mcp_remote_error");
    assert!(
        failed["output"].as_str().unwrap().contains("no luck"),
        "{failed}"
    );

    // Invalid arguments never reach the server.
    let invalid = call(&server, &session, "echo", json!({"text": 5})).await;
    assert_eq!(invalid["is_error"], true, "{invalid}");
    let seen = call(&server, &session, "calls", json!({})).await;
    let seen = seen["output"].to_string();
    assert_eq!(seen.matches("echo").count(), 1, "the server saw: {seen}");

    let row = server
        .get(&format!(
            "/tool-executions/{}",
            failed["execution_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        row.body["data"]["execution_reason_code"], "mcp_remote_error",
        "{row:?}"
    );
    assert_eq!(row.body["data"]["provider_type"], "mcp");
}

#[tokio::test]
async fn an_irreversible_tool_is_refused_until_allowed() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(
        &server,
        stdio_body("risky", json!({"trust_annotations": true})),
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    let refused = call(&server, &session, "destroy", json!({"target": "castle"})).await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(refused["status"], "denied");
    allow_irreversible(&server, &session).await;
    let done = call(&server, &session, "destroy", json!({"target": "castle"})).await;
    assert_eq!(done["status"], "success", "{done}");
    assert_eq!(done["output"], "destroyed castle");
}

#[tokio::test]
async fn a_hung_call_is_uncertain_at_the_timeout_and_the_server_recovers() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    allow_irreversible(&server, &session).await;
    let id = create_server(
        &server,
        stdio_body("slow", json!({"call_timeout_ms": 1500})),
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let started = Instant::now();
    let hung = call(&server, &session, "hang", json!({})).await;
    let took = started.elapsed();
    assert_eq!(hung["status"], "uncertain", "{hung}");
    assert_eq!(hung["is_error"], true);
    assert_eq!(hung["execution_reason_code"], "mcp_call_timeout_uncertain");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
        "answered after {took:?}"
    );
    let status = server.get(&format!("/mcp/servers/{id}/status")).await;
    assert!(
        status.body["data"]["last_timeout_at"].is_i64(),
        "{status:?}"
    );

    // The connection is recycled; the server is usable again afterwards.
    let deadline = Instant::now() + CONNECTED;
    loop {
        let echoed = call(&server, &session, "echo", json!({"text": "again"})).await;
        if echoed["status"] == "success" {
            break;
        }
        let code = echoed["execution_reason_code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(code.starts_with("mcp_"), "{echoed}");
        assert!(
            Instant::now() < deadline,
            "the server never came back: {echoed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_crash_mid_call_is_followed_by_a_supervised_restart() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    allow_irreversible(&server, &session).await;
    let id = create_server(&server, stdio_body("crashy", json!({}))).await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let crashed = call(&server, &session, "crash", json!({})).await;
    assert_eq!(crashed["is_error"], true, "{crashed}");
    assert_eq!(
        crashed["execution_reason_code"], "mcp_transport_error",
        "{crashed}"
    );
    assert_eq!(
        crashed["status"], "uncertain",
        "it may have acted: {crashed}"
    );

    // Tools stay listed (cached) while the child is restarted, then live again.
    let listed = catalog(&server, &session).await;
    assert!(tool(&listed, "echo").is_some(), "{listed:#}");
    // The crash may not have been noticed yet, and the old connection would
    // still read as live: wait for the restart's connection (the counter is
    // raised as it publishes its tools), then for it to be live.
    common::wait_until(
        Duration::from_secs(30),
        "the supervised restart",
        || async {
            let text = common::metrics::scrape(&server).await;
            common::metrics::sample(&text, "toolgate_mcp_reconnects_total") >= 1.0
        },
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    let echoed = call(&server, &session, "echo", json!({"text": "back"})).await;
    assert_eq!(echoed["status"], "success", "{echoed}");

    // Operators see the crash, the restart and the state in /metrics.
    use common::metrics::{sample, scrape};
    let text = scrape(&server).await;
    assert!(
        sample(&text, "toolgate_mcp_reconnects_total") >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"toolgate_mcp_servers{state="connected"}"#),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"toolgate_tool_calls_total{provider_type="mcp",status="uncertain"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn list_changed_makes_a_new_tool_appear() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    allow_irreversible(&server, &session).await;
    let id = create_server(&server, stdio_body("growing", json!({"tool_prefix": "g"}))).await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    let mut events = common::events::Events::open(&server, &session).await;

    let added = call(&server, &session, "g_add_tool", json!({"name": "fresh"})).await;
    assert_eq!(added["status"], "success", "{added}");
    let changed = events
        .next_of("catalog_changed", Duration::from_secs(20))
        .await;
    assert!(changed.to_string().contains("g_fresh"), "{changed}");
    let listed = catalog(&server, &session).await;
    assert!(tool(&listed, "g_fresh").is_some(), "{listed:#}");
    let fresh = call(&server, &session, "g_fresh", json!({"text": "new"})).await;
    assert_eq!(fresh["status"], "success", "{fresh}");
}

#[tokio::test]
async fn an_http_server_that_goes_down_stays_cached_across_a_restart_and_comes_back_live() {
    let mut server = spawn_app().await;
    let session = server.create_session().await;
    let mut mcp = HttpMcp::start().await;
    let id = create_server(
        &server,
        http_body(
            "remote",
            &mcp.url,
            json!({"tool_prefix": "r", "default_side_effect_level": "none"}),
        ),
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    let mut events = common::events::Events::open(&server, &session).await;

    mcp.kill().await;
    // Noticed without any call: ping or the stream ending (a ping every 4 s
    // with a 4 s timeout; the deadline leaves room for a loaded machine).
    let cached = wait_for_source(&server, &session, &id, "cached", Duration::from_secs(30)).await;
    assert_eq!(tool(&cached, "r_echo").unwrap()["catalog_source"], "cached");
    let disconnected = events
        .next_of("mcp.disconnected", Duration::from_secs(5))
        .await;
    assert_eq!(disconnected["server_id"], id.as_str(), "{disconnected}");
    let refused = call(&server, &session, "r_echo", json!({"text": "x"})).await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(
        refused["execution_reason_code"], "mcp_not_connected",
        "{refused}"
    );
    let tools = server.get(&format!("/mcp/servers/{id}/tools")).await;
    assert_eq!(tools.status, StatusCode::SERVICE_UNAVAILABLE, "{tools:?}");
    assert_eq!(tools.code(), "mcp_runtime_unavailable");

    // The snapshot is in the database: a restart still lists the tools.
    server.restart().await;
    let after = catalog(&server, &session).await;
    let entry = server_entry(&after, &id).expect("listed after restart");
    assert_eq!(entry["catalog_source"], "cached", "{after:#}");
    assert!(tool(&after, "r_echo").is_some(), "{after:#}");

    let _back = HttpMcp::start_on(&format!("127.0.0.1:{}", mcp.port)).await;
    wait_for_source(&server, &session, &id, "live", Duration::from_secs(30)).await;
    let echoed = call(&server, &session, "r_echo", json!({"text": "x"})).await;
    assert_eq!(echoed["status"], "success", "{echoed}");
}

#[tokio::test]
async fn a_server_never_reached_is_unavailable_with_a_reason_and_disable_removes_tools() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut events = common::events::Events::open(&server, &session).await;
    let (unreachable, _held) = dead_url();
    let dead = create_server(&server, http_body("dead", &unreachable, json!({}))).await;
    // From the very first response: no snapshot and no connection.
    let first = catalog(&server, &session).await;
    let entry = server_entry(&first, &dead).expect("an entry for every enabled server");
    assert_eq!(entry["catalog_source"], "unavailable", "{first:#}");
    assert!(
        entry["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{entry}"
    );
    assert_eq!(entry["tool_count"], 0);
    let failed = events.next_of("mcp.error", Duration::from_secs(20)).await;
    assert_eq!(failed["server_id"], dead.as_str(), "{failed}");
    assert!(
        failed["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{failed}"
    );
    let status = server.get(&format!("/mcp/servers/{dead}/status")).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.body["data"]["attached"], true, "{status:?}");

    let live = create_server(&server, stdio_body("live", json!({"tool_prefix": "l"}))).await;
    wait_for_source(&server, &session, &live, "live", CONNECTED).await;
    let toggled = server
        .patch(
            &format!("/mcp/servers/{live}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(toggled.status, StatusCode::OK, "{toggled:?}");
    let listed = catalog(&server, &session).await;
    assert!(tool(&listed, "l_echo").is_none(), "{listed:#}");
    assert!(server_entry(&listed, &live).is_none(), "{listed:#}");
    let tools = server.get(&format!("/mcp/servers/{live}/tools")).await;
    assert_eq!(tools.status, StatusCode::CONFLICT);
    assert_eq!(tools.code(), "mcp_server_disabled");
    let connect = server
        .post(&format!("/mcp/servers/{live}/connect"), json!({}))
        .await;
    assert_eq!(connect.status, StatusCode::CONFLICT);
    assert_eq!(connect.code(), "mcp_server_disabled");
}

#[tokio::test]
async fn disconnect_connect_and_test_leave_the_real_connection_alone() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(
        &server,
        stdio_body("manual", json!({"default_side_effect_level": "none"})),
    )
    .await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let tested = server
        .post(&format!("/mcp/servers/{id}/test"), json!({}))
        .await;
    assert_eq!(tested.status, StatusCode::OK, "{tested:?}");
    assert_eq!(tested.body["data"]["success"], true, "{tested:?}");
    assert!(tested.body["data"]["tool_count"].as_u64().unwrap() >= 8);
    assert!(tested.body["data"]["duration_ms"].is_u64());
    assert_eq!(
        call(&server, &session, "echo", json!({"text": "still"})).await["status"],
        "success"
    );

    let disconnected = server
        .post(&format!("/mcp/servers/{id}/disconnect"), json!({}))
        .await;
    assert_eq!(disconnected.status, StatusCode::OK, "{disconnected:?}");
    assert_eq!(disconnected.body["data"]["server_id"], id.as_str());
    assert_eq!(disconnected.body["data"]["state"], "disconnected");
    let refused = call(&server, &session, "echo", json!({"text": "x"})).await;
    assert_eq!(
        refused["execution_reason_code"], "mcp_not_connected",
        "{refused}"
    );
    let statuses = server.get("/mcp/statuses").await;
    assert_eq!(statuses.status, StatusCode::OK);
    assert!(
        statuses.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["server_id"] == id.as_str())
    );

    let connect = server
        .post(&format!("/mcp/servers/{id}/connect"), json!({}))
        .await;
    assert_eq!(connect.status, StatusCode::OK, "{connect:?}");
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let (unreachable, _held) = dead_url();
    let dead = create_server(
        &server,
        http_body("dead", &unreachable, json!({"connect_timeout_ms": 2000})),
    )
    .await;
    let tested = server
        .post(&format!("/mcp/servers/{dead}/test"), json!({}))
        .await;
    assert_eq!(tested.status, StatusCode::OK, "{tested:?}");
    assert_eq!(tested.body["data"]["success"], false);
    assert!(tested.body["data"]["error"].is_string());
}

#[tokio::test]
async fn another_accounts_servers_and_tools_are_invisible() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(&server, stdio_body("mine", json!({"tool_prefix": "m"}))).await;
    wait_for_source(&server, &session, &id, "live", CONNECTED).await;

    let other_key = server.create_account("other").await;
    let as_other = |method: Method, path: String, body: Option<Value>| {
        let server = &server;
        let key = other_key.clone();
        async move { server.send_as(&key, method, &path, body).await }
    };
    let character = as_other(
        Method::POST,
        "/characters".into(),
        Some(json!({"name": "Other"})),
    )
    .await;
    assert_eq!(character.status, StatusCode::CREATED, "{character:?}");
    let theirs = as_other(
        Method::POST,
        "/sessions".into(),
        Some(json!({"character": "Other"})),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{theirs:?}");
    let their_session = theirs.body["data"]["id"].as_str().unwrap().to_owned();
    let their_catalog = as_other(
        Method::GET,
        format!("/sessions/{their_session}/tools/runtime"),
        None,
    )
    .await
    .body["data"]
        .clone();
    assert!(
        tool(&their_catalog, "m_echo").is_none(),
        "{their_catalog:#}"
    );
    assert_eq!(their_catalog["mcp_servers"], json!([]));
    for path in ["status", "tools"] {
        let reply = as_other(Method::GET, format!("/mcp/servers/{id}/{path}"), None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}: {reply:?}");
    }
    for path in ["connect", "disconnect", "test"] {
        let reply = as_other(Method::POST, format!("/mcp/servers/{id}/{path}"), None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}: {reply:?}");
    }
    assert_eq!(
        as_other(Method::GET, "/mcp/statuses".into(), None)
            .await
            .body["data"],
        json!([])
    );
}

#[tokio::test]
async fn a_deferred_mcp_call_runs_as_a_runtime_job() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(
        &server,
        stdio_body(
            "deferred",
            json!({
                "default_side_effect_level": "none",
                "tool_overrides": {"echo": {"async_capability": "deferred_ok", "default_delivery_mode": "async_job"}},
            }),
        ),
    )
    .await;
    let listed = wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    assert_eq!(
        tool(&listed, "echo").unwrap()["result_visibility"],
        "deferred_receipt"
    );

    let receipt = call(&server, &session, "echo", json!({"text": "later"})).await;
    assert_eq!(receipt["status"], "queued", "{receipt}");
    let job = receipt["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let server_ref = &server;
    common::wait_until(Duration::from_secs(30), "the MCP job to succeed", || {
        let job = job.clone();
        async move {
            let reply = server_ref.get(&format!("/runtime-jobs/{job}")).await;
            reply.body["data"]["state"] == "succeeded"
        }
    })
    .await;
    let results = server
        .get(&format!("/sessions/{session}/tool-results"))
        .await;
    assert!(results.text.contains("later"), "{results:?}");
}

#[tokio::test]
async fn a_stdio_servers_process_group_dies_with_it_and_its_stderr_is_logged() {
    let mut server = spawn_app().await;
    let session = server.create_session().await;
    let pid = std::process::id();
    let (deleted, kept) = (
        format!("{}1", 7_000_000 + pid),
        format!("{}2", 7_000_000 + pid),
    );
    let first = create_server(
        &server,
        common::mcp::grouped_stdio_body("grouped", &deleted),
    )
    .await;
    wait_for_source(&server, &session, &first, "live", CONNECTED).await;
    assert_eq!(
        processes_running(&["sleep", &deleted]).len(),
        1,
        "the group's sleeper runs"
    );

    let reply = server.delete(&format!("/mcp/servers/{first}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    common::wait_until(
        Duration::from_secs(10),
        "the deleted server's group to die",
        || async { processes_running(&["sleep", &deleted]).is_empty() },
    )
    .await;
    // The child's stderr is in the log.
    server.log_containing("toolgate-test-mcp started").await;

    let second = create_server(&server, common::mcp::grouped_stdio_body("kept", &kept)).await;
    wait_for_source(&server, &session, &second, "live", CONNECTED).await;
    assert_eq!(processes_running(&["sleep", &kept]).len(), 1);
    server.stop().await;
    common::wait_until(
        Duration::from_secs(10),
        "shutdown to kill the group",
        || async { processes_running(&["sleep", &kept]).is_empty() },
    )
    .await;
}

#[tokio::test]
async fn secrets_reach_the_servers_but_never_the_log() {
    let server = common::spawn_with(common::SpawnOptions {
        // rmcp's own lines too: they are off unless RUST_LOG names rmcp.
        env: vec![("RUST_LOG".into(), "debug,rmcp=debug".into())],
        ..Default::default()
    })
    .await;
    let session = server.create_session().await;
    let http = HttpMcp::start().await;
    let (env_secret, header_secret) = ("env-secret-9f8e7d6c", "hdr-secret-1a2b3c4d");
    let stdio = create_server(
        &server,
        stdio_body(
            "with-env",
            json!({
                "tool_prefix": "s",
                "default_side_effect_level": "none",
                "stdio": {"command": common::mcp::test_server_bin(), "args": ["stdio"], "env": {"MCP_SECRET_ENV": env_secret}},
            }),
        ),
    )
    .await;
    let remote = create_server(
        &server,
        json!({
            "name": "with-header", "transport": "http", "tool_prefix": "h",
            "default_side_effect_level": "none",
            "http": {"url": http.url, "headers": {"X-Secret-Header": header_secret}},
        }),
    )
    .await;
    wait_for_source(&server, &session, &stdio, "live", CONNECTED).await;
    wait_for_source(&server, &session, &remote, "live", CONNECTED).await;
    let log = server.log_containing("MCP server connected").await;
    assert!(!log.contains(env_secret), "an env secret is in the log");
    assert!(
        !log.contains(header_secret),
        "a header secret is in the log"
    );

    let env = call(
        &server,
        &session,
        "s_env",
        json!({"name": "MCP_SECRET_ENV"}),
    )
    .await;
    assert_eq!(env["output"], env_secret, "{env}");
    let header = call(
        &server,
        &session,
        "h_header",
        json!({"name": "x-secret-header"}),
    )
    .await;
    assert_eq!(header["output"], header_secret, "{header}");
    let leaked = call(
        &server,
        &session,
        "s_env",
        json!({"name": "TOOLGATE_ADMIN_TOKEN"}),
    )
    .await;
    assert_eq!(
        leaked["is_error"], true,
        "the child inherits no TOOLGATE_ setting: {leaked}"
    );
}

#[tokio::test]
async fn a_config_change_sends_catalog_changed_and_pagination_is_followed() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_server(
        &server,
        stdio_body(
            "paged",
            json!({"tool_prefix": "a", "stdio": {"command": common::mcp::test_server_bin(), "args": ["stdio", "--page-size", "2"]}}),
        ),
    )
    .await;
    let listed = wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    let count = server_entry(&listed, &id).unwrap()["tool_count"]
        .as_u64()
        .unwrap();
    assert!(count >= 8, "every page is listed: {count}");
    let mut events = common::events::Events::open(&server, &session).await;
    let patched = server
        .patch(&format!("/mcp/servers/{id}"), json!({"tool_prefix": "b"}))
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let changed = events
        .next_of("catalog_changed", Duration::from_secs(20))
        .await;
    let text = changed.to_string();
    assert!(
        text.contains("a_echo"),
        "the old names are removed: {changed}"
    );
    let relisted = wait_for_source(&server, &session, &id, "live", CONNECTED).await;
    assert!(tool(&relisted, "b_echo").is_some() && tool(&relisted, "a_echo").is_none());
    let connected = events
        .next_of("mcp.connected", Duration::from_secs(20))
        .await;
    assert_eq!(connected["server_id"], id.as_str(), "{connected}");
}
