//! The boot id: one value for every answer of one server process (`/healthz` and
//! every `/api/tools` answer), a new one after a restart, so a plugin knows its
//! registrations are gone without diffing listings.

mod common;

use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn health_boot_id(server: &TestServer) -> String {
    let reply = server.get_without_key("/healthz").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["status"], "ok", "{reply:?}");
    boot_id_of(&reply.body)
}

fn boot_id_of(body: &Value) -> String {
    let boot_id = body["boot_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no boot_id in {body}"));
    assert!(boot_id.starts_with("boot_"), "{boot_id}");
    boot_id.to_owned()
}

/// Every `/api/tools` route once, checking the contract's own fields are still
/// there beside `boot_id`; returns the boot id each answer carried.
async fn tools_api_boot_ids(server: &TestServer) -> Vec<String> {
    let register = server
        .post_without_key(
            "/api/tools/register",
            json!({"name": "probe", "callback_url": "http://127.0.0.1:9/probe", "source": "plugin:boot"}),
        )
        .await;
    assert_eq!(register.status, StatusCode::OK, "{register:?}");
    assert_eq!(register.body["registered"], "probe");
    assert_eq!(register.body["affected_roles"], json!(["Lanlan"]));
    let list = server.get_without_key("/api/tools").await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    assert_eq!(list.body["ok"], true);
    assert_eq!(list.body["tools_by_role"]["Lanlan"][0]["name"], "probe");
    let unregister = server
        .post_without_key("/api/tools/unregister", json!({"name": "probe"}))
        .await;
    assert_eq!(unregister.body["removed"], true, "{unregister:?}");
    let clear = server
        .post_without_key("/api/tools/clear", json!({"source": "plugin:boot"}))
        .await;
    assert_eq!(clear.body["removed"], 0, "{clear:?}");
    [register, list, unregister, clear]
        .iter()
        .map(|reply| boot_id_of(&reply.body))
        .collect()
}

#[tokio::test]
async fn one_boot_id_per_start_in_health_and_every_tools_answer() {
    let mut server = spawn_app().await;
    let first = health_boot_id(&server).await;
    assert_eq!(health_boot_id(&server).await, first, "stable within a run");
    assert_eq!(tools_api_boot_ids(&server).await, vec![first.clone(); 4]);

    server.restart().await;
    let second = health_boot_id(&server).await;
    assert_ne!(second, first, "a restart must change the boot id");
    assert_eq!(tools_api_boot_ids(&server).await, vec![second.clone(); 4]);

    // A crash too: SIGKILL, then a start on the same data directory.
    server.kill().await;
    server.restart().await;
    let third = health_boot_id(&server).await;
    assert!(
        third != first && third != second,
        "{first} {second} {third}"
    );
}

#[tokio::test]
async fn the_openapi_document_describes_the_boot_id() {
    let server = spawn_app().await;
    let doc = server.get_without_key("/openapi.json").await.body;
    for schema in [
        "RegisterToolResponse",
        "UnregisterToolResponse",
        "ClearToolsResponse",
        "ListToolsResponse",
    ] {
        let properties = &doc["components"]["schemas"][schema]["properties"];
        assert_eq!(
            properties["boot_id"]["type"], "string",
            "{schema}: {properties}"
        );
    }
}
