//! TavernHeadless's own MCP smoke run (`../shared/reference/tavernheadless-smoke-mcp.ts`),
//! request by request and with the statuses it accepts, against the real
//! server: a TavernHeadless client must work against toolgate unchanged. The
//! runtime routes answer (`/mcp/statuses` is 200), so the runtime steps run too.

mod common;

use common::spawn_app;
use serde_json::json;

#[tokio::test]
async fn the_mcp_smoke_sequence_answers_as_tavernheadless_expects() {
    let server = spawn_app().await;
    let run_id = "smoke42";

    // A stdio server whose command does not exist, as in the smoke run.
    let stdio = server
        .post(
            "/mcp/servers",
            json!({
                "name": format!("{run_id}-mcp-stdio"),
                "transport": "stdio",
                "stdio": {"command": "node", "args": ["fake-server.js"]},
                "tool_prefix": "smoke_",
                "connect_timeout_ms": 5000,
                "call_timeout_ms": 10000,
                "default_side_effect_level": "none",
            }),
        )
        .await;
    assert_eq!(stdio.status, 201, "{stdio:?}");
    let stdio_id = stdio.body["data"]["id"].as_str().unwrap().to_owned();
    assert_eq!(stdio.body["data"]["transport"], "stdio");
    assert_eq!(stdio.body["data"]["enabled"], true);

    let http = server
        .post(
            "/mcp/servers",
            json!({
                "name": format!("{run_id}-mcp-http"),
                "transport": "http",
                "http": {"url": "http://localhost:19999/mcp"},
                "enabled": false,
            }),
        )
        .await;
    assert_eq!(http.status, 201, "{http:?}");
    let http_id = http.body["data"]["id"].as_str().unwrap().to_owned();

    let duplicate = server
        .post(
            "/mcp/servers",
            json!({"name": format!("{run_id}-mcp-stdio"), "transport": "stdio", "stdio": {"command": "echo"}}),
        )
        .await;
    assert_eq!(duplicate.status, 409, "{duplicate:?}");

    let listed = server.get("/mcp/servers").await;
    assert_eq!(listed.status, 200);
    assert!(listed.body["data"].as_array().unwrap().len() >= 2);

    let got = server.get(&format!("/mcp/servers/{stdio_id}")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["data"]["id"], stdio_id.as_str());

    let patched = server
        .patch(
            &format!("/mcp/servers/{stdio_id}"),
            json!({"name": format!("{run_id}-mcp-renamed"), "connect_timeout_ms": 8000}),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");

    for enabled in [false, true] {
        let toggled = server
            .patch(
                &format!("/mcp/servers/{stdio_id}/toggle"),
                json!({"enabled": enabled}),
            )
            .await;
        assert_eq!(toggled.status, 200, "{toggled:?}");
        assert_eq!(toggled.body["data"]["enabled"], enabled);
    }

    let statuses = server.get("/mcp/statuses").await;
    assert_eq!(statuses.status, 200, "the runtime routes are available");
    assert!(statuses.body["data"].is_array());

    let status = server.get(&format!("/mcp/servers/{stdio_id}/status")).await;
    assert_eq!(status.status, 200, "{status:?}");
    let data = &status.body["data"];
    assert_eq!(data["server_id"], stdio_id.as_str());
    assert_eq!(data["server_name"], format!("{run_id}-mcp-renamed"));
    assert_eq!(data["transport"], "stdio");
    assert_eq!(data["attached"], true);
    assert_eq!(data["reason"], serde_json::Value::Null);
    let state = data["state"].as_str().unwrap();
    assert!(
        [
            "disconnected",
            "connecting",
            "connected",
            "reconnect_required",
            "error"
        ]
        .contains(&state),
        "{state}"
    );

    let tools = server.get(&format!("/mcp/servers/{stdio_id}/tools")).await;
    assert!(
        [200, 409, 503].contains(&tools.status.as_u16()),
        "{tools:?}"
    );
    if tools.status != 200 {
        assert!(
            ["mcp_runtime_not_attached", "mcp_runtime_unavailable"].contains(&tools.code()),
            "{tools:?}"
        );
    }

    let disconnected = server
        .post(&format!("/mcp/servers/{stdio_id}/disconnect"), json!({}))
        .await;
    assert!(
        [200, 409].contains(&disconnected.status.as_u16()),
        "{disconnected:?}"
    );
    if disconnected.status == 200 {
        assert_eq!(disconnected.body["data"]["server_id"], stdio_id.as_str());
    } else {
        assert_eq!(disconnected.code(), "mcp_runtime_not_attached");
    }

    assert_eq!(server.get("/mcp/servers/nonexistent").await.status, 404);
    assert_eq!(server.delete("/mcp/servers/nonexistent").await.status, 404);

    assert_eq!(
        server
            .delete(&format!("/mcp/servers/{http_id}"))
            .await
            .status,
        200
    );
    assert_eq!(
        server.get(&format!("/mcp/servers/{http_id}")).await.status,
        404
    );
    assert_eq!(
        server
            .delete(&format!("/mcp/servers/{stdio_id}"))
            .await
            .status,
        200
    );
}
