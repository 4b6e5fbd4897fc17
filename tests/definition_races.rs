//! Concurrent writes to one tool definition through the real server: a PATCH and a
//! toggle racing each other must both land (no lost update), the later of two
//! writes must see the earlier one, and the runtime catalog (served from the
//! definition cache) must show what was last written.

mod common;

use common::{Reply, TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Rounds per test. Each round is one burst of concurrent writes; the old
/// read-merge-write code lost an update in a sizeable share of them.
const ROUNDS: usize = 40;

async fn create_definition(server: &TestServer) -> String {
    let reply = server
        .post(
            "/tools/definitions",
            json!({"name": "raced", "description": "start"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["id"].as_str().expect("id").to_owned()
}

fn parameters_for(round: usize) -> Value {
    json!({
        "type": "object",
        "properties": {format!("p{round}"): {"type": "string"}}
    })
}

fn ok(reply: &Reply, what: &str) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{what}: {reply:?}");
    reply.body["data"].clone()
}

/// The entry for the definition in the session's runtime catalog, if listed.
async fn catalog_entry(server: &TestServer, session: &str) -> Option<Value> {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    ok(&reply, "runtime catalog")["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|tool| tool["name"] == "raced")
        .cloned()
}

/// Each round sends, at once, a PATCH of `description`, a PATCH of `parameters`
/// and a toggle, plus a catalog read that races them into the definition cache.
/// Afterwards every one of the three changes must be in the stored definition and
/// in the catalog.
#[tokio::test]
async fn concurrent_patches_and_toggles_of_different_fields_all_land() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let id = create_definition(&server).await;
    let path = format!("/tools/definitions/{id}");
    let toggle_path = format!("{path}/toggle");
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let description = format!("d{round}");
        let parameters = parameters_for(round);
        // Alternate, so that every round's toggle changes the stored value.
        let enabled = round % 2 == 1;
        let (described, parametrized, toggled, _) = tokio::join!(
            server.patch(&path, json!({"description": description})),
            server.patch(&path, json!({"parameters": parameters})),
            server.patch(&toggle_path, json!({"enabled": enabled})),
            catalog_entry(&server, &session),
        );
        ok(&described, "description PATCH");
        ok(&parametrized, "parameters PATCH");
        ok(&toggled, "toggle");

        let stored = ok(&server.get(&path).await, "GET");
        let mut missing = Vec::new();
        if stored["description"] != json!(description) {
            missing.push("description");
        }
        if stored["parameters"] != parameters {
            missing.push("parameters");
        }
        if stored["enabled"] != json!(enabled) {
            missing.push("enabled");
        }
        if !missing.is_empty() {
            lost.push(format!("round {round} lost {missing:?}"));
        }

        // The catalog must not serve a definition cached before these writes.
        let listed = catalog_entry(&server, &session).await;
        if stored["enabled"] == json!(true) {
            let entry = listed.unwrap_or_else(|| {
                panic!("round {round}: enabled definition missing from the catalog")
            });
            assert_eq!(entry["description"], stored["description"], "round {round}");
        } else {
            assert!(
                listed.is_none(),
                "round {round}: disabled definition still in the catalog: {listed:?}"
            );
        }
    }
    assert!(
        lost.is_empty(),
        "lost updates in {} of {ROUNDS} rounds: {lost:#?}",
        lost.len()
    );
}

/// A PATCH that sets `description` and `enabled: false` races a toggle to
/// `enabled: true`. Writes are serialized, so the later one read what the earlier
/// one wrote, and its response is exactly what is stored afterwards. Which one was
/// later shows in the toggle's response: it carries the round's description only
/// if the PATCH committed before it read.
#[tokio::test]
async fn the_later_of_a_patch_and_a_toggle_sees_the_earlier_and_wins() {
    let server = spawn_app().await;
    let id = create_definition(&server).await;
    let path = format!("/tools/definitions/{id}");
    let toggle_path = format!("{path}/toggle");
    let mut wrong = Vec::new();
    let mut toggle_later = 0;
    for round in 0..ROUNDS {
        let description = format!("d{round}");
        let (patched, toggled) = tokio::join!(
            server.patch(&path, json!({"description": description, "enabled": false})),
            server.patch(&toggle_path, json!({"enabled": true})),
        );
        let patched = ok(&patched, "PATCH");
        let toggled = ok(&toggled, "toggle");
        assert_eq!(patched["enabled"], false, "round {round}");
        assert_eq!(toggled["enabled"], true, "round {round}");
        let later = if toggled["description"] == json!(description) {
            toggle_later += 1;
            &toggled
        } else {
            &patched
        };
        let stored = ok(&server.get(&path).await, "GET");
        if &stored != later {
            wrong.push(format!(
                "round {round}: stored {stored} but the later write answered {later}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the stored definition differs from the later write in {} of {ROUNDS} rounds \
         (toggle later in {toggle_later}): {wrong:#?}",
        wrong.len()
    );
}
