//! Operators' view through the real binary: `/metrics` counts calls by
//! provider type and journal status with histogram counts, evictions and
//! connect failures, stays bounded over many remote tool names, is for the
//! admin key (or keyless on `--metrics-listen`); waits for a pooled database
//! connection are a histogram; `/readyz` follows the database.

mod common;

use std::time::Duration;

use common::metrics::{sample, scrape};
use common::{SpawnOptions, TestServer, register_remote, spawn_app, spawn_with, wait_until};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A loopback plugin: `/ok` answers its arguments, `/fail` answers an
/// error, `/hang` never answers.
async fn plugin() -> String {
    let app = axum::Router::new()
        .route(
            "/ok",
            axum::routing::post(|body: axum::Json<Value>| async move {
                axum::Json(json!({"output": body.0["arguments"].clone(), "is_error": false}))
            }),
        )
        .route(
            "/fail",
            axum::routing::post(|| async {
                axum::Json(json!({"output": "the plugin failed", "is_error": true}))
            }),
        )
        .route(
            "/hang",
            axum::routing::post(|| async {
                std::future::pending::<()>().await;
                "never"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

async fn call(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    let reply = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": name, "arguments": arguments, "call_id": format!("c-{name}")}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

#[tokio::test]
async fn calls_are_counted_by_provider_type_and_journal_status() {
    let base = plugin().await;
    let server = spawn_app().await;
    for (name, path, timeout) in [
        ("ok_tool", "ok", 5),
        ("failing_tool", "fail", 5),
        ("hanging_tool", "hang", 1),
    ] {
        register_remote(
            &server,
            json!({"name": name, "callback_url": format!("{base}/{path}"), "timeout_seconds": timeout, "side_effect_level": "none"}),
        )
        .await;
    }
    let session = server.create_session().await;
    let permissions = server
        .patch(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["roll_dice"]}}),
        )
        .await;
    assert_eq!(permissions.status, StatusCode::OK, "{permissions:?}");
    assert_eq!(
        call(&server, &session, "ok_tool", json!({"x": 1})).await["status"],
        "success"
    );
    assert_eq!(
        call(&server, &session, "failing_tool", json!({})).await["status"],
        "error"
    );
    assert_eq!(
        call(&server, &session, "hanging_tool", json!({})).await["status"],
        "timeout"
    );
    assert_eq!(
        call(&server, &session, "roll_dice", json!({"sides": 6})).await["status"],
        "denied"
    );
    assert_eq!(
        call(&server, &session, "get_time", json!({})).await["status"],
        "success"
    );

    let text = scrape(&server).await;
    for (labels, expected) in [
        (r#"provider_type="remote",status="success""#, 1.0),
        (r#"provider_type="remote",status="error""#, 1.0),
        (r#"provider_type="remote",status="timeout""#, 1.0),
        (r#"provider_type="builtin",status="denied""#, 1.0),
        (r#"provider_type="builtin",status="success""#, 1.0),
    ] {
        let series = format!("toolgate_tool_calls_total{{{labels}}}");
        assert_eq!(sample(&text, &series), expected, "{series} in\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            r#"toolgate_tool_call_duration_seconds_count{provider_type="remote"}"#
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"toolgate_builtin_call_duration_seconds_count{tool="get_time"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(&text, r#"toolgate_open_tool_calls_total{tool="ok_tool"}"#),
        1.0
    );
    assert_eq!(
        sample(&text, r#"toolgate_remote_tools{role="Lanlan"}"#),
        3.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"toolgate_http_requests_total{route="/sessions/{id}/tool-calls",method="POST",status_class="2xx"}"#
        ) >= 5.0,
        "{text}"
    );
    assert!(sample(&text, "toolgate_journal_batch_rows_count") >= 1.0);
}

#[tokio::test]
async fn waits_for_a_pooled_database_connection_are_a_histogram() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let count = "toolgate_db_pool_acquire_duration_seconds_count";
    let before = sample(&scrape(&server).await, count);
    assert!(before >= 1.0, "start-up and the scrape took connections");
    for _ in 0..5 {
        // A call of its own each time (no call_id), not a replay.
        let called = common::mcp::call(&server, &session, "get_time", json!({})).await;
        assert_eq!(called["status"], "success", "{called}");
        // Two reads, each on a pooled connection (journal pages on SQLite
        // read on connections of their own, so they are not among them).
        for path in ["tool-results", "floors"] {
            let listed = server.get(&format!("/sessions/{session}/{path}")).await;
            assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
        }
    }
    let text = scrape(&server).await;
    let after = sample(&text, count);
    assert!(after >= before + 10.0, "{before} -> {after}\n{text}");
    assert!(
        text.contains("# TYPE toolgate_db_pool_acquire_duration_seconds histogram"),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"toolgate_db_pool_acquire_duration_seconds_bucket{le="+Inf"}"#
        ),
        after
    );
    assert!(sample(&text, "toolgate_db_pool_acquire_duration_seconds_sum") > 0.0);
}

#[tokio::test]
async fn metrics_need_the_admin_key_or_the_private_listener() {
    let server = spawn_with(SpawnOptions {
        args: vec!["--metrics-listen".into(), "127.0.0.1:0".into()],
        ..Default::default()
    })
    .await;
    let anonymous = server.get_without_key("/metrics").await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{anonymous:?}");
    let key = server.create_account("tenant").await;
    let tenant = server
        .client
        .get(server.url("/metrics"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(tenant.status(), StatusCode::FORBIDDEN);
    let private = server
        .metrics_url
        .clone()
        .expect("the metrics listener's address");
    let text = reqwest::get(&private).await.unwrap().text().await.unwrap();
    assert!(text.contains("toolgate_db_connections"), "{text}");
    let elsewhere = reqwest::get(private.replace("/metrics", "/sessions"))
        .await
        .unwrap();
    assert_eq!(
        elsewhere.status(),
        StatusCode::NOT_FOUND,
        "only /metrics there"
    );
}

#[tokio::test]
async fn evictions_and_connect_failures_are_counted_by_source() {
    let server = spawn_app().await;
    // Nothing listens on port 1: every callback is refused.
    register_remote(
        &server,
        json!({"name": "gone_tool", "callback_url": "http://127.0.0.1:1/cb", "source": "plugin:gone"}),
    )
    .await;
    let session = server.create_session().await;
    for _ in 0..3 {
        call(&server, &session, "gone_tool", json!({})).await;
    }
    let text = scrape(&server).await;
    assert_eq!(
        sample(
            &text,
            r#"toolgate_callback_connect_failures_total{source="plugin:gone"}"#
        ),
        3.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"toolgate_plugin_evictions_total{source="plugin:gone"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn a_thousand_remote_tool_names_add_fewer_than_a_hundred_lines() {
    let base = plugin().await;
    let server = spawn_app().await;
    let session = server.create_session().await;
    register_remote(
        &server,
        json!({"name": "warm_up", "callback_url": format!("{base}/ok")}),
    )
    .await;
    call(&server, &session, "warm_up", json!({})).await;
    let before = scrape(&server).await.lines().count();
    for batch in 0..10 {
        let calls = (0..100).map(|i| {
            let name = format!("tool_{batch}_{i}");
            let (server, session, base) = (&server, &session, &base);
            async move {
                register_remote(
                    server,
                    json!({"name": name, "callback_url": format!("{base}/ok")}),
                )
                .await;
                call(server, session, &name, json!({})).await;
                server
                    .post_without_key("/api/tools/unregister", json!({"name": name}))
                    .await;
            }
        });
        futures::future::join_all(calls).await;
    }
    let text = scrape(&server).await;
    let after = text.lines().count();
    assert!(after < before + 100, "{before} lines before, {after} after");
    assert!(
        sample(&text, r#"toolgate_open_tool_calls_total{tool="other"}"#) > 900.0,
        "{text}"
    );
}

#[tokio::test]
async fn readiness_follows_the_database() {
    let server = spawn_app().await;
    let ready = server.get_without_key("/readyz").await;
    assert_eq!(
        ready.status,
        StatusCode::OK,
        "ready as soon as the server answers: {ready:?}"
    );
    if server.on_postgres() {
        // Another process holding the write lock every write transaction takes.
        let mut blocker = <sqlx::PgConnection as sqlx::Connection>::connect(&server.database_url())
            .await
            .unwrap();
        sqlx::query("SELECT pg_advisory_lock(8390047142196114533)")
            .execute(&mut blocker)
            .await
            .unwrap();
        let blocked = server.get_without_key("/readyz").await;
        assert_eq!(
            blocked.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{blocked:?}"
        );
        assert!(blocked.body.to_string().contains("database"), "{blocked:?}");
        sqlx::query("SELECT pg_advisory_unlock(8390047142196114533)")
            .execute(&mut blocker)
            .await
            .unwrap();
        wait_until(Duration::from_secs(20), "ready again", || {
            let server = &server;
            async move { server.get_without_key("/readyz").await.status == StatusCode::OK }
        })
        .await;
        return;
    }
    // Another process holding the write lock: the database takes no write.
    let url = format!("sqlite://{}", server.data_dir.join("toolgate.db").display());
    let mut blocker = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let blocked = server.get_without_key("/readyz").await;
    assert_eq!(
        blocked.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{blocked:?}"
    );
    assert_eq!(blocked.code(), "not_ready");
    assert!(blocked.body.to_string().contains("database"), "{blocked:?}");
    let health = server.get_without_key("/healthz").await;
    assert_eq!(health.status, StatusCode::OK, "liveness is not readiness");
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    wait_until(Duration::from_secs(20), "ready again", || {
        let server = &server;
        async move { server.get_without_key("/readyz").await.status == StatusCode::OK }
    })
    .await;
}

#[test]
fn the_grafana_dashboard_parses_and_uses_only_documented_series() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for target in panels.iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let Some(series) = word.strip_prefix("toolgate_").map(|_| word) else {
                continue;
            };
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| series.strip_suffix(suffix))
                .unwrap_or(series);
            assert!(
                readme.contains(&format!("`{base}")),
                "{base} (in {expr}) is not in the README's metrics table"
            );
        }
    }
}

#[tokio::test]
async fn script_runs_limits_and_model_requests_are_counted() {
    let stand_in =
        common::model::StandIn::start(vec![common::model::text_answer(&["a", "b", "c"])]).await;
    let mut env = stand_in.env();
    env.push(("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into()));
    env.push(("TOOLGATE_SCRIPT_TIMEOUT_MS".into(), "100".into()));
    let server = spawn_with(SpawnOptions {
        env,
        ..Default::default()
    })
    .await;
    for (name, script) in [("quick", "return 1;"), ("spin", "while (true) {}")] {
        let defined = server
            .post(
                "/tools/definitions",
                json!({"name": name, "handler_type": "script", "handler": {"script": script}}),
            )
            .await;
        assert_eq!(defined.status, StatusCode::CREATED, "{defined:?}");
    }
    let session = server.create_session().await;
    assert_eq!(
        call(&server, &session, "quick", json!({})).await["status"],
        "success"
    );
    call(&server, &session, "spin", json!({})).await;
    let mut events = common::events::Events::open(&server, &session).await;
    common::model::turn(&server, &session, "hi").await;
    common::model::until_run_ends(&mut events).await;

    let text = scrape(&server).await;
    assert_eq!(sample(&text, "toolgate_script_runs_total"), 2.0, "{text}");
    assert_eq!(
        sample(&text, r#"toolgate_script_limit_hits_total{kind="time"}"#),
        1.0
    );
    assert_eq!(
        sample(&text, r#"toolgate_model_requests_total{outcome="success"}"#),
        1.0
    );
    assert_eq!(sample(&text, "toolgate_model_stream_deltas_total"), 3.0);
    assert_eq!(
        sample(&text, "toolgate_model_request_duration_seconds_count"),
        1.0
    );
}
