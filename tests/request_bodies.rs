//! A JSON request body is exactly one JSON object: anything but whitespace after
//! it is refused (400 `validation_error`, 422 on `/api/tools`), never ignored,
//! and so is any other kind of value, an array read field by field included.

mod common;

use common::{TestServer, read_reply, spawn_app};
use reqwest::StatusCode;
use serde_json::json;

async fn post_raw(server: &TestServer, path: &str, body: &str, key: bool) -> common::Reply {
    let mut request = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if key {
        request = request.bearer_auth(&server.token);
    }
    read_reply(request.send().await.expect("request")).await
}

fn assert_refused(reply: &common::Reply, status: StatusCode, body: &str) {
    assert_eq!(reply.status, status, "{body:?} -> {reply:?}");
    assert_eq!(reply.code(), "validation_error", "{body:?} -> {reply:?}");
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("exactly one JSON value"),
        "{body:?} -> {message}"
    );
}

#[tokio::test]
async fn trailing_bytes_after_a_platform_body_are_refused() {
    let server = spawn_app().await;
    for body in [
        r#"{"name":"Mio"}{"name":"Aoi"}"#,
        r#"{"name":"Mio"} {"name":"Aoi"}"#,
        r#"{"name":"Mio"}x"#,
        r#"{"name":"Mio"},"#,
        "{\"name\":\"Mio\"}\n[]",
    ] {
        let reply = post_raw(&server, "/characters", body, true).await;
        assert_refused(&reply, StatusCode::BAD_REQUEST, body);
    }
    assert_eq!(
        server.get("/characters/Mio").await.status,
        StatusCode::NOT_FOUND
    );
    // Whitespace after the value is fine.
    let reply = post_raw(&server, "/characters", "{\"name\":\"Mio\"} \r\n\t\n", true).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");

    // A tool call followed by a second object runs neither.
    let session = server.create_session().await;
    let path = format!("/sessions/{session}/tool-calls");
    let body = r#"{"name":"roll_dice","arguments":{}}{"name":"roll_dice","arguments":{}}"#;
    let reply = post_raw(&server, &path, body, true).await;
    assert_refused(&reply, StatusCode::BAD_REQUEST, body);
    let journal_path = format!("/tool-executions?session_id={session}");
    let journal = server.get(&journal_path).await;
    assert_eq!(journal.status, StatusCode::OK, "{journal:?}");
    assert_eq!(journal.body["meta"]["total"], 0, "{journal:?}");
    // The first object alone is a call that runs and is journalled.
    let single = r#"{"name":"roll_dice","arguments":{}}"#;
    let reply = post_raw(&server, &path, &format!("{single}\n"), true).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let journal = server.get(&journal_path).await;
    assert_eq!(journal.body["meta"]["total"], 1, "{journal:?}");
}

#[tokio::test]
async fn trailing_bytes_after_a_runtime_tools_body_are_422() {
    let server = spawn_app().await;
    let register = json!({"name": "weather", "callback_url": "http://127.0.0.1:9/weather"});
    for body in [
        format!(
            "{register}{}",
            json!({"name": "other", "callback_url": "http://127.0.0.1:9/x"})
        ),
        format!("{register} true"),
        format!("{register}}}"),
    ] {
        let reply = post_raw(&server, "/api/tools/register", &body, false).await;
        assert_refused(&reply, StatusCode::UNPROCESSABLE_ENTITY, &body);
    }
    let listing = server.get_without_key("/api/tools").await;
    assert_eq!(listing.status, StatusCode::OK, "{listing:?}");
    assert!(
        !listing.text.contains("weather"),
        "nothing is registered: {listing:?}"
    );
    let reply = post_raw(
        &server,
        "/api/tools/register",
        &format!("{register}\n"),
        false,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["ok"], true, "{reply:?}");
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_refused_whatever_its_kind() {
    let server = spawn_app().await;
    let kinds = [
        (r#"["Lanlan","via an array"]"#, "an array"),
        (r#""Lanlan""#, "a string"),
        ("true", "a boolean"),
        (" 7", "a number"),
        ("null", "null"),
    ];
    let routes = [
        ("/sessions", true, StatusCode::BAD_REQUEST),
        ("/accounts", true, StatusCode::BAD_REQUEST),
        ("/characters", true, StatusCode::BAD_REQUEST),
        (
            "/api/tools/register",
            false,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (path, key, status) in routes {
        for (body, kind) in kinds {
            let reply = post_raw(&server, path, body, key).await;
            assert_eq!(reply.status, status, "{path} {body:?} -> {reply:?}");
            assert_eq!(
                reply.code(),
                "validation_error",
                "{path} {body:?} -> {reply:?}"
            );
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert_eq!(
                message,
                format!("request body must be a JSON object, got {kind}"),
                "{path} {body:?}"
            );
        }
    }
    // Nothing was made of them.
    let sessions = server.get("/sessions").await;
    assert_eq!(sessions.body["meta"]["total"], 0, "{sessions:?}");
}

/// Writes a whole request (head and a body over the 1 MiB limit) on a fresh
/// connection, as a client that does not wait for `100 Continue` does, then
/// reads the answer to its end.
async fn write_whole_then_read(server: &TestServer, chunked: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = vec![b'x'; 3 * 1024 * 1024];
    let framing = if chunked {
        "transfer-encoding: chunked".to_owned()
    } else {
        format!("content-length: {}", body.len())
    };
    let head = format!(
        "POST /characters HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\n{framing}\r\n\r\n",
        server.addr, server.token
    );
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let written = if chunked {
        let mut written = Ok(());
        for chunk in body.chunks(64 * 1024) {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
            written = stream.write_all(&framed).await;
            if written.is_err() {
                break;
            }
        }
        written.and(Ok(()))
    } else {
        stream.write_all(&body).await
    };
    written.unwrap_or_else(|err| panic!("the body could not be written whole: {err}"));
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .unwrap_or_else(|err| panic!("the answer could not be read: {err}"));
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client that sends a body over the limit whole before it reads reads the
/// 413 and its envelope, not a reset: the server keeps reading (and
/// dropping) what it still sends before it closes. Before, most such
/// clients got a broken pipe.
#[tokio::test]
async fn a_client_writing_a_body_over_the_limit_whole_reads_the_413() {
    let server = spawn_app().await;
    for attempt in 0..12 {
        let answer = write_whole_then_read(&server, attempt % 2 == 1).await;
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {answer:.300}"
        );
        assert!(
            answer.contains("\"code\":\"payload_too_large\""),
            "attempt {attempt}: {answer:.300}"
        );
    }
    // The server goes on answering.
    let listed = server.get("/characters").await;
    assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
}
