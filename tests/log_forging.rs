//! Request-supplied text cannot forge log lines: at `RUST_LOG=debug`, nothing
//! the server writes contains a raw ESC or NUL byte, and a newline inside a
//! tool name or source never starts a line of the caller's choosing.

mod common;

use common::{SpawnOptions, TestServer, spawn_with};
use serde_json::json;

const HOSTILE: &str = "x\nFORGED level=ERROR \u{1b}[31mred\r";
/// U+0000 cannot be stored (PostgreSQL refuses it in text): requests carrying
/// it are refused, on either backend, and never reach the log raw either.
const WITH_NUL: &str = "x\u{0}\nFORGED level=ERROR";

async fn send_hostile_requests(server: &TestServer) {
    // A registration whose source and name carry line breaks and controls.
    for body in [
        json!({"name": "ok_tool", "source": format!("plugin:{HOSTILE}"),
               "callback_url": "http://127.0.0.1:9/cb"}),
        json!({"name": HOSTILE, "callback_url": "http://127.0.0.1:9/cb"}),
    ] {
        server.post_without_key("/api/tools/register", body).await;
    }
    let session = server.create_session().await;
    // A call of an unknown tool (journalled and logged as refused), and calls of
    // the registered one, whose callback cannot be reached.
    for name in [HOSTILE, "ok_tool"] {
        let reply = server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": name, "arguments": {"q": HOSTILE}, "call_id": HOSTILE}),
            )
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    let reply = server
        .post(
            "/tools/definitions",
            json!({"name": "lookup", "description": HOSTILE}),
        )
        .await;
    assert!(reply.status.is_success(), "{reply:?}");
    for (path, body) in [
        (
            format!("/sessions/{session}/tool-calls"),
            json!({"name": "get_time", "arguments": {}, "call_id": WITH_NUL}),
        ),
        (
            format!("/sessions/{session}/tool-calls"),
            json!({"name": "get_time", "arguments": {"q": WITH_NUL}}),
        ),
        (
            "/tools/definitions".to_owned(),
            json!({"name": "nul", "description": WITH_NUL}),
        ),
    ] {
        let reply = server.post(&path, body).await;
        assert_eq!(reply.status, 400, "{reply:?}");
        assert_eq!(reply.code(), "validation_error", "{reply:?}");
        assert!(reply.text.contains("U+0000"), "{reply:?}");
    }
    let reply = server
        .post_without_key(
            "/api/tools/register",
            json!({"name": WITH_NUL, "callback_url": "http://127.0.0.1:9/cb"}),
        )
        .await;
    assert!(reply.status.is_client_error(), "{reply:?}");
    assert!(reply.text.contains("U+0000"), "{reply:?}");
    let reply = server.get("/sessions/sess%00x").await;
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.code(), "validation_error", "{reply:?}");
}

async fn log_of_a_run(format: &str) -> Vec<u8> {
    let mut server = spawn_with(SpawnOptions {
        env: vec![("RUST_LOG".into(), "debug".into())],
        args: vec!["--log-format".into(), format.into()],
        ..Default::default()
    })
    .await;
    send_hostile_requests(&server).await;
    assert!(server.stop().await.success());
    std::fs::read(server.data_dir.join("..").join("server.log")).expect("server.log")
}

#[tokio::test]
async fn text_logs_at_debug_cannot_be_forged() {
    let log = log_of_a_run("text").await;
    assert!(!log.contains(&0x1b), "raw ESC in the log");
    assert!(!log.contains(&0), "raw NUL in the log");
    let text = String::from_utf8_lossy(&log);
    assert!(
        text.contains("FORGED"),
        "the hostile text was never logged: {text}"
    );
    for line in text.lines() {
        // Every line the formatter starts begins with its timestamp.
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()) || line.trim().is_empty(),
            "a line not started by the formatter: {line:?}"
        );
        assert!(!line.contains('\r'), "raw CR in {line:?}");
    }
}

#[tokio::test]
async fn json_logs_at_debug_stay_one_object_per_line() {
    let log = log_of_a_run("json").await;
    assert!(!log.contains(&0x1b) && !log.contains(&0));
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("FORGED"), "the hostile text was never logged");
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|err| panic!("not one JSON object ({err}): {line:?}"));
    }
}
