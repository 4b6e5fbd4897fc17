//! `GET /api/tools` answers from one kept buffer while what it lists is
//! unchanged (issue 20): every change of what it lists — a registration, a
//! replaced registration, a removal, a renamed, new or deleted character —
//! shows in the next answer, and an unchanged listing is answered byte for
//! byte the same, with its length declared.

mod common;

use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The listing's body as sent, and its declared length.
async fn listing(server: &TestServer) -> (Vec<u8>, Option<u64>) {
    let response = reqwest::Client::new()
        .get(server.url("/api/tools"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let length = response.content_length();
    (response.bytes().await.unwrap().to_vec(), length)
}

async fn listed(server: &TestServer) -> Value {
    let (body, length) = listing(server).await;
    assert_eq!(
        length,
        Some(body.len() as u64),
        "a kept listing declares its length"
    );
    serde_json::from_slice::<Value>(&body).unwrap()["tools_by_role"].clone()
}

fn names(by_role: &Value, role: &str) -> Vec<String> {
    by_role[role]
        .as_array()
        .unwrap_or_else(|| panic!("no role {role} in {by_role}"))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn every_change_of_what_is_listed_shows_in_the_next_listing() {
    let server = spawn_app().await;
    let register = |name: &str, description: &str, role: Option<&str>| {
        json!({"name": name, "description": description, "role": role,
               "callback_url": "http://127.0.0.1:9333/cb"})
    };
    common::register_remote(&server, register("alpha", "first", Some("Lanlan"))).await;
    let first = listing(&server).await;
    assert_eq!(
        listing(&server).await,
        first,
        "unchanged, answered the same"
    );
    assert_eq!(names(&listed(&server).await, "Lanlan"), ["alpha"]);

    common::register_remote(&server, register("beta", "second", Some("Lanlan"))).await;
    assert_eq!(names(&listed(&server).await, "Lanlan"), ["alpha", "beta"]);

    // Replaced under the same name: the new description is listed.
    common::register_remote(&server, register("alpha", "replaced", Some("Lanlan"))).await;
    let by_role = listed(&server).await;
    assert_eq!(by_role["Lanlan"][0]["description"], "replaced", "{by_role}");

    let removed = server
        .post(
            "/api/tools/unregister",
            json!({"name": "beta", "role": "Lanlan"}),
        )
        .await;
    assert_eq!(removed.status, StatusCode::OK, "{removed:?}");
    assert_eq!(names(&listed(&server).await, "Lanlan"), ["alpha"]);

    // A character renamed, added or deleted changes the roles listed, with
    // no registration changing.
    let renamed = server
        .patch("/characters/Lanlan", json!({"name": "Lanlan2"}))
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{renamed:?}");
    let by_role = listed(&server).await;
    assert!(by_role.get("Lanlan").is_none(), "{by_role}");
    assert_eq!(names(&by_role, "Lanlan2"), ["alpha"]);

    let created = server.post("/characters", json!({"name": "Mika"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(names(&listed(&server).await, "Mika"), Vec::<String>::new());

    let deleted = server.delete("/characters/Mika").await;
    assert!(deleted.status.is_success(), "{deleted:?}");
    let by_role = listed(&server).await;
    assert!(by_role.get("Mika").is_none(), "{by_role}");

    // One role asked for, then all again: each its own listing.
    let one = server.get("/api/tools?role=Lanlan2").await;
    assert_eq!(one.status, StatusCode::OK, "{one:?}");
    assert_eq!(names(&one.body["tools_by_role"], "Lanlan2"), ["alpha"]);
    assert_eq!(names(&listed(&server).await, "Lanlan2"), ["alpha"]);
}

/// A registration into every role is held once for all of them (issue 20):
/// each role lists it whole, and a later registration for one role replaces
/// only that role's, never what the other roles list.
#[tokio::test]
async fn every_role_lists_a_shared_registration_whole_and_one_role_replaces_only_its_own() {
    let server = spawn_app().await;
    let created = server.post("/characters", json!({"name": "Mika"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let register = |description: &str, role: Option<&str>| {
        json!({"name": "weather", "description": description, "role": role,
               "source": "plugin:weather", "timeout_seconds": 7.5,
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
               "callback_url": "http://127.0.0.1:9333/cb"})
    };
    let every = common::register_remote(&server, register("shared", None)).await;
    assert_eq!(
        every.body["affected_roles"],
        json!(["Lanlan", "Mika"]),
        "{every:?}"
    );
    let by_role = listed(&server).await;
    assert_eq!(by_role["Lanlan"], by_role["Mika"], "{by_role}");
    let entry = &by_role["Lanlan"][0];
    assert_eq!(entry["description"], "shared", "{by_role}");
    assert_eq!(entry["source"], "plugin:weather", "{by_role}");
    assert_eq!(entry["timeout_seconds"], 7.5, "{by_role}");
    assert_eq!(
        entry["parameters"]["properties"]["city"]["type"], "string",
        "{by_role}"
    );

    common::register_remote(&server, register("Mika's own", Some("Mika"))).await;
    let by_role = listed(&server).await;
    assert_eq!(by_role["Mika"][0]["description"], "Mika's own", "{by_role}");
    assert_eq!(by_role["Lanlan"][0]["description"], "shared", "{by_role}");
}
