//! Builtin tools through the real server: the `/tools/builtin` listing, and every
//! builtin's happy and bad-argument paths via `POST /sessions/{id}/tool-calls`.

mod common;

use std::collections::BTreeSet;

use common::{Reply, TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Calls a tool as the narrator and returns the `data` of the answer.
async fn call(server: &TestServer, session: &str, name: &str, arguments: Value) -> Value {
    call_with(
        server,
        session,
        json!({"name": name, "arguments": arguments}),
    )
    .await
}

async fn call_with(server: &TestServer, session: &str, body: Value) -> Value {
    let reply = server
        .post(&format!("/sessions/{session}/tool-calls"), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"].clone()
}

fn assert_success(result: &Value) -> &Value {
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["status"], "success", "{result}");
    &result["output"]
}

/// A tool error the model can act on: an error status and a message naming `hint`.
fn assert_tool_error(result: &Value, hint: &str) {
    assert_eq!(result["is_error"], true, "{result}");
    assert_eq!(result["status"], "error", "{result}");
    let message = result["output"].as_str().unwrap_or_default();
    assert!(
        message.contains(hint),
        "expected the error to mention {hint:?}: {result}"
    );
}

#[tokio::test]
async fn builtin_listing_has_exactly_the_context_free_tools() {
    let server = spawn_app().await;
    let reply = server.get("/tools/builtin").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let tools = reply.body["data"].as_array().expect("data array");
    let names: BTreeSet<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "roll_dice",
            "random_choice",
            "get_time",
            "get_character_info"
        ])
    );
    assert_eq!(tools.len(), 4);
    for tool in tools {
        let keys: BTreeSet<&str> = tool
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from([
                "name",
                "description",
                "parameters",
                "side_effect_level",
                "allowed_slots",
                "source"
            ]),
            "{tool}"
        );
        assert!(!tool["description"].as_str().unwrap().is_empty(), "{tool}");
        assert_eq!(tool["parameters"]["type"], "object", "{tool}");
        assert!(tool["parameters"]["properties"].is_object(), "{tool}");
        assert_eq!(tool["side_effect_level"], "none", "{tool}");
        assert_eq!(tool["allowed_slots"], json!([]), "{tool}");
        assert_eq!(tool["source"], "builtin", "{tool}");
    }
    let dice = tools.iter().find(|t| t["name"] == "roll_dice").unwrap();
    let properties = &dice["parameters"]["properties"];
    assert_eq!(properties["sides"]["type"], "integer");
    assert_eq!(properties["sides"]["default"], 6);
    assert_eq!(properties["count"]["default"], 1);
    assert!(properties["count"]["maximum"].as_u64().unwrap() <= 1000);

    let anonymous = server
        .client
        .get(server.url("/tools/builtin"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn roll_dice_rolls_and_refuses_bad_dice() {
    let server = spawn_app().await;
    let session = server.create_session().await;

    let result = call(
        &server,
        &session,
        "roll_dice",
        json!({"sides": 20, "count": 3}),
    )
    .await;
    let output = assert_success(&result);
    let rolls: Vec<u64> = output["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_u64().unwrap())
        .collect();
    assert_eq!(rolls.len(), 3);
    assert!(rolls.iter().all(|r| (1..=20).contains(r)), "{output}");
    assert_eq!(output["total"].as_u64().unwrap(), rolls.iter().sum::<u64>());

    // Defaults: one six-sided die. The raw argument string a model sends works too.
    let output = call(&server, &session, "roll_dice", json!({})).await;
    let rolls = assert_success(&output)["results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(rolls.len(), 1);
    assert!((1..=6).contains(&rolls[0].as_u64().unwrap()));
    let result = call(
        &server,
        &session,
        "roll_dice",
        json!("{\"sides\": 4, \"count\": 2}"),
    )
    .await;
    assert_eq!(
        assert_success(&result)["results"].as_array().unwrap().len(),
        2
    );

    assert_tool_error(
        &call(&server, &session, "roll_dice", json!({"sides": 0})).await,
        "sides",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "roll_dice",
            json!({"count": 1_000_000_000u64}),
        )
        .await,
        "count",
    );
    assert_tool_error(
        &call(&server, &session, "roll_dice", json!({"count": 0})).await,
        "count",
    );
    assert_tool_error(
        &call(&server, &session, "roll_dice", json!({"sides": "six"})).await,
        "sides",
    );
    assert_tool_error(
        &call(&server, &session, "roll_dice", json!({"dice": 2})).await,
        "dice",
    );
    assert_tool_error(
        &call(&server, &session, "roll_dice", json!("{not json")).await,
        "JSON",
    );
}

#[tokio::test]
async fn random_choice_picks_distinct_options() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let options = ["tea", "coffee", "juice"];
    let result = call(
        &server,
        &session,
        "random_choice",
        json!({"options": options, "count": 2}),
    )
    .await;
    let output = assert_success(&result);
    let choices: Vec<&str> = output["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(choices.len(), 2);
    assert_ne!(choices[0], choices[1]);
    assert!(choices.iter().all(|c| options.contains(c)), "{output}");
    assert_eq!(output["choice"], choices[0]);

    let result = call(
        &server,
        &session,
        "random_choice",
        json!({"options": ["only"]}),
    )
    .await;
    assert_eq!(assert_success(&result)["choice"], "only");

    assert_tool_error(
        &call(
            &server,
            &session,
            "random_choice",
            json!({"options": ["a", "b"], "count": 3}),
        )
        .await,
        "only 2 options",
    );
    assert_tool_error(
        &call(&server, &session, "random_choice", json!({"options": []})).await,
        "options",
    );
    assert_tool_error(
        &call(&server, &session, "random_choice", json!({})).await,
        "options",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "random_choice",
            json!({"options": "a,b"}),
        )
        .await,
        "options",
    );
}

#[tokio::test]
async fn get_time_tells_the_time_at_an_offset() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let before = now_ms();
    let result = call(&server, &session, "get_time", json!({})).await;
    let after = now_ms();
    let output = assert_success(&result);
    let unix_ms = output["unix_ms"].as_i64().unwrap();
    assert!(before <= unix_ms && unix_ms <= after, "{output}");
    let iso = output["iso8601"].as_str().unwrap();
    assert!(iso.ends_with('Z'), "{iso}");
    assert!(
        iso.starts_with(output["date"].as_str().unwrap()),
        "{output}"
    );

    let result = call(
        &server,
        &session,
        "get_time",
        json!({"utc_offset": "+08:00"}),
    )
    .await;
    let output = assert_success(&result);
    assert!(
        output["iso8601"].as_str().unwrap().ends_with("+08:00"),
        "{output}"
    );
    assert_eq!(output["utc_offset"], "+08:00");
    // The local wall-clock time is eight hours after UTC's.
    let utc_hour = (output["unix_ms"].as_i64().unwrap() / 3_600_000) % 24;
    let local_hour: i64 = output["time"].as_str().unwrap()[..2].parse().unwrap();
    assert_eq!(local_hour, (utc_hour + 8) % 24, "{output}");

    for bad in ["+25:00", "Asia/Shanghai", "8"] {
        assert_tool_error(
            &call(&server, &session, "get_time", json!({"utc_offset": bad})).await,
            "utc_offset",
        );
    }
}

#[tokio::test]
async fn get_character_info_describes_the_sessions_character() {
    let server = spawn_app().await;
    let reply = server
        .post(
            "/characters",
            json!({"name": "Mira", "description": "A cartographer of dreams.", "persona": "Curious and kind."}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let reply = server.post("/sessions", json!({"character": "Mira"})).await;
    let session = reply.body["data"]["id"].as_str().unwrap().to_owned();
    let result = call(&server, &session, "get_character_info", json!({})).await;
    assert_eq!(
        assert_success(&result),
        &json!({"name": "Mira", "description": "A cartographer of dreams.", "persona": "Curious and kind."})
    );
    let other = server.create_session().await;
    let result = call(&server, &other, "get_character_info", json!(null)).await;
    assert_eq!(assert_success(&result)["name"], "Lanlan");
    assert_tool_error(
        &call(
            &server,
            &session,
            "get_character_info",
            json!({"name": "Lanlan"}),
        )
        .await,
        "name",
    );
}

#[tokio::test]
async fn variables_persist_across_calls_and_restarts() {
    let mut server = spawn_app().await;
    let session = server.create_session().await;
    let other = server.create_session().await;

    let unset = call(
        &server,
        &session,
        "get_variable",
        json!({"name": "affection"}),
    )
    .await;
    assert_eq!(
        assert_success(&unset),
        &json!({"name": "affection", "exists": false, "value": null})
    );
    let value = json!({"level": 3, "tags": ["friend", "好感"], "ok": true});
    let set = call(
        &server,
        &session,
        "set_variable",
        json!({"name": "affection", "value": value}),
    )
    .await;
    assert_success(&set);
    let set = call(
        &server,
        &session,
        "set_variable",
        json!({"name": "turns", "value": 1}),
    )
    .await;
    assert_success(&set);
    let set = call(
        &server,
        &session,
        "set_variable",
        json!({"name": "turns", "value": 2}),
    )
    .await;
    assert_success(&set);

    let got = call(
        &server,
        &session,
        "get_variable",
        json!({"name": "affection"}),
    )
    .await;
    assert_eq!(assert_success(&got)["value"], value);
    let got = call(&server, &session, "get_variable", json!({"name": "turns"})).await;
    assert_eq!(assert_success(&got)["value"], 2);
    // Another session has its own variables.
    let got = call(
        &server,
        &other,
        "get_variable",
        json!({"name": "affection"}),
    )
    .await;
    assert_eq!(assert_success(&got)["exists"], false);

    server.restart().await;
    let got = call(
        &server,
        &session,
        "get_variable",
        json!({"name": "affection"}),
    )
    .await;
    assert_eq!(assert_success(&got)["value"], value);
    let got = call(&server, &session, "get_variable", json!({"name": "turns"})).await;
    assert_eq!(assert_success(&got)["value"], 2);

    assert_tool_error(
        &call(&server, &session, "get_variable", json!({"name": ""})).await,
        "name",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "set_variable",
            json!({"name": "x".repeat(65), "value": 1}),
        )
        .await,
        "name",
    );
    assert_tool_error(
        &call(&server, &session, "set_variable", json!({"name": "x"})).await,
        "value",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "set_variable",
            json!({"name": " padded", "value": 1}),
        )
        .await,
        "whitespace",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "set_variable",
            json!({"name": "big", "value": "x".repeat(20_000)}),
        )
        .await,
        "bytes",
    );
    let got = call(&server, &session, "get_variable", json!({"name": "big"})).await;
    assert_eq!(assert_success(&got)["exists"], false);
}

async fn append_floor(server: &TestServer, session: &str, content: &str) -> String {
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": content}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    reply.body["data"]["id"].as_str().unwrap().to_owned()
}

/// A text repeating the searched word in every place is the worst case of a
/// passage search that scores every match against every other (FTS5's
/// `snippet()`: 33 s of CPU for one such floor in a release build, probe I).
/// The search must answer with a bounded passage; the detector only catches
/// a search gone quadratic again (the old search took 18 s a floor in the
/// test build), it does not time the search.
#[tokio::test]
async fn query_memory_over_long_texts_repeating_the_word_answers_a_bounded_passage() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let repeated = "ember ".repeat(256 * 1024 / 6 - 1);
    for _ in 0..6 {
        append_floor(&server, &session, &repeated).await;
    }
    let dragon = append_floor(&server, &session, "the dragon sleeps by the ember").await;
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        call(
            &server,
            &session,
            "query_memory",
            json!({"query": "ember dragon", "limit": 10}),
        ),
    )
    .await
    .expect("a search over six 256 KiB floors of one word must not take a minute");
    let output = assert_success(&result);
    let hits = output["results"].as_array().unwrap();
    assert_eq!(hits.len(), 7, "{output}");
    assert_eq!(hits[0]["id"], dragon.as_str(), "{output}");
    let snippet = hits[0]["snippet"].as_str().unwrap();
    assert!(
        snippet.contains("[dragon] sleeps by the [ember]"),
        "{snippet}"
    );
    for hit in &hits[1..] {
        let snippet = hit["snippet"].as_str().unwrap();
        assert!(snippet.starts_with("[ember] [ember]"), "{snippet}");
        assert!(snippet.chars().count() <= 260, "{snippet}");
        let content = hit["content"].as_str().unwrap();
        assert_eq!(
            content.chars().count(),
            1001,
            "cut to 1,000 characters and …"
        );
    }
}

#[tokio::test]
async fn query_memory_finds_and_ranks_floor_content() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let other = server.create_session().await;
    let both = append_floor(
        &server,
        &session,
        "The dragon sleeps inside the old castle on the hill.",
    )
    .await;
    let dragon_only =
        append_floor(&server, &session, "A dragon flew over the village at dawn.").await;
    let unrelated = append_floor(&server, &session, "We bought fresh bread at the market.").await;
    append_floor(
        &server,
        &other,
        "Another castle with a dragon, in another chat.",
    )
    .await;
    let reply = server
        .post(
            &format!("/sessions/{session}/memories"),
            json!({"content": "The user is afraid of castles."}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let memory_id = reply.body["data"]["id"].as_str().unwrap().to_owned();

    let result = call(
        &server,
        &session,
        "query_memory",
        json!({"query": "dragon castle"}),
    )
    .await;
    let output = assert_success(&result);
    let hits = output["results"].as_array().unwrap();
    let ids: Vec<&str> = hits.iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids[0], both,
        "the text with both words ranks first: {output}"
    );
    assert!(ids.contains(&dragon_only.as_str()), "{output}");
    assert!(
        ids.contains(&memory_id.as_str()),
        "stored memories are searched: {output}"
    );
    assert!(!ids.contains(&unrelated.as_str()), "{output}");
    assert_eq!(ids.len(), 3, "other sessions' floors never match: {output}");
    let scores: Vec<f64> = hits.iter().map(|h| h["score"].as_f64().unwrap()).collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "best first: {scores:?}"
    );
    assert_eq!(hits[0]["source"], "floor");
    assert_eq!(hits[0]["floor_seq"], 1);
    assert!(
        hits[0]["snippet"].as_str().unwrap().contains("[dragon]"),
        "{output}"
    );
    assert_eq!(output["count"], 3);

    // Stemming: "dragons" finds "dragon"; the limit bounds the answer.
    let result = call(
        &server,
        &session,
        "query_memory",
        json!({"query": "dragons", "limit": 1}),
    )
    .await;
    let output = assert_success(&result);
    assert_eq!(output["results"].as_array().unwrap().len(), 1, "{output}");
    let result = call(&server, &session, "query_memory", json!({"query": "bread"})).await;
    assert_eq!(
        assert_success(&result)["results"][0]["id"],
        unrelated.as_str()
    );
    let result = call(
        &server,
        &session,
        "query_memory",
        json!({"query": "submarine"}),
    )
    .await;
    assert_eq!(assert_success(&result)["count"], 0);

    assert_tool_error(
        &call(&server, &session, "query_memory", json!({"query": ""})).await,
        "query",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "query_memory",
            json!({"query": "?! ..."}),
        )
        .await,
        "no word",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "query_memory",
            json!({"query": "dragon", "limit": 0}),
        )
        .await,
        "limit",
    );
    assert_tool_error(
        &call(&server, &session, "query_memory", json!({})).await,
        "query",
    );
}

#[tokio::test]
async fn resource_tools_create_read_update_and_delete() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    assert_eq!(list(&server, &session).await["count"], 0);

    let written = call(
        &server,
        &session,
        "write_resource",
        json!({"name": "quest_log", "content": "Find the lost ring."}),
    )
    .await;
    assert_eq!(
        assert_success(&written),
        &json!({"name": "quest_log", "kind": "text", "created": true})
    );
    let read = call(
        &server,
        &session,
        "read_resource",
        json!({"name": "quest_log"}),
    )
    .await;
    let output = assert_success(&read);
    assert_eq!(output["content"], "Find the lost ring.");
    assert_eq!(output["kind"], "text");

    let map = json!({"rooms": ["hall", "crypt"], "doors": 3});
    let written = call(
        &server,
        &session,
        "write_resource",
        json!({"name": "map", "content": map}),
    )
    .await;
    assert_eq!(assert_success(&written)["kind"], "json");
    let written = call(
        &server,
        &session,
        "write_resource",
        json!({"name": "quest_log", "content": "Ring found.", "kind": "text"}),
    )
    .await;
    assert_eq!(assert_success(&written)["created"], false);
    let read = call(
        &server,
        &session,
        "read_resource",
        json!({"name": "quest_log"}),
    )
    .await;
    assert_eq!(assert_success(&read)["content"], "Ring found.");
    let read = call(&server, &session, "read_resource", json!({"name": "map"})).await;
    assert_eq!(assert_success(&read)["content"], map);
    // A string stored explicitly as JSON stays a JSON value.
    let written = call(
        &server,
        &session,
        "write_resource",
        json!({"name": "motto", "content": "be brave", "kind": "json"}),
    )
    .await;
    assert_eq!(assert_success(&written)["kind"], "json");

    let listed = list(&server, &session).await;
    let names: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["map", "motto", "quest_log"]);
    assert_eq!(listed["resources"][2]["bytes"], "Ring found.".len());

    let deleted = call(&server, &session, "delete_resource", json!({"name": "map"})).await;
    assert_eq!(
        assert_success(&deleted),
        &json!({"name": "map", "deleted": true})
    );
    assert_eq!(list(&server, &session).await["count"], 2);
    assert_tool_error(
        &call(&server, &session, "read_resource", json!({"name": "map"})).await,
        "list_resources",
    );
    assert_tool_error(
        &call(&server, &session, "delete_resource", json!({"name": "map"})).await,
        "no resource",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "write_resource",
            json!({"name": "x", "content": {"a": 1}, "kind": "text"}),
        )
        .await,
        "string",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "write_resource",
            json!({"name": "x", "content": "a", "kind": "yaml"}),
        )
        .await,
        "kind",
    );
    assert_tool_error(
        &call(
            &server,
            &session,
            "write_resource",
            json!({"name": "huge", "content": "x".repeat(70_000)}),
        )
        .await,
        "bytes",
    );
    assert_tool_error(
        &call(&server, &session, "write_resource", json!({"name": "x"})).await,
        "content",
    );
    assert_tool_error(
        &call(&server, &session, "read_resource", json!({})).await,
        "name",
    );

    // Resources belong to their session.
    let other = server.create_session().await;
    let result = call(&server, &other, "list_resources", json!({})).await;
    assert_eq!(assert_success(&result)["count"], 0);
}

#[tokio::test]
async fn memories_api_validates_and_lists() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/memories");
    let reply: Reply = server.post(&path, json!({"content": "   "})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.code(), "validation_error");
    let reply = server
        .post(&path, json!({"content": "Likes rainy days."}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let reply = server.get(&path).await;
    assert_eq!(reply.body["data"][0]["content"], "Likes rainy days.");
    let reply = server.get("/sessions/sess_missing/memories").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    // Listed by page as every list is (probe J: `limit` was ignored and a
    // session's 1,000 memories of 16 KB went out whole, 16 MB a request).
    for n in 2..=5 {
        let reply = server
            .post(&path, json!({"content": format!("Memory {n}.")}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let contents = |reply: &Reply| -> Vec<String> {
        reply.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = server.get(&format!("{path}?limit=2")).await;
    assert_eq!(contents(&first), ["Likes rainy days.", "Memory 2."]);
    assert_eq!(first.body["meta"]["total"], 5);
    assert_eq!(first.body["meta"]["has_more"], true);
    let newest = server.get(&format!("{path}?limit=2&sort_order=desc")).await;
    assert_eq!(contents(&newest), ["Memory 5.", "Memory 4."]);
    let last = server.get(&format!("{path}?limit=2&offset=4")).await;
    assert_eq!(contents(&last), ["Memory 5."]);
    assert_eq!(last.body["meta"]["has_more"], false);
    for bad in [
        "limit=0",
        "limit=201",
        "offset=-1",
        "sort_order=up",
        "sort_by=content",
    ] {
        let reply = server.get(&format!("{path}?{bad}")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}: {reply:?}");
    }
}

async fn list(server: &TestServer, session: &str) -> Value {
    let result = call(server, session, "list_resources", json!({})).await;
    assert_success(&result).clone()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
