//! Black-box tests of the browser guard on `/api/tools` (cross-site requests and
//! DNS rebinding are refused before the body is read, plugin clients are not) and
//! of colour-free logs when stderr is not a terminal.

mod common;

use std::time::Duration;

use common::{Reply, SpawnOptions, TestServer, read_reply, register_remote, spawn_app, spawn_with};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOOL: &str = r#"{"name": "sneaky", "callback_url": "http://127.0.0.1:9/x"}"#;

/// A POST through reqwest with the given extra headers; reqwest sets a loopback
/// Host from the URL.
async fn post(
    server: &TestServer,
    path: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut request = server
        .client
        .post(server.url(path))
        .header("content-type", content_type)
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    read_reply(request.send().await.expect("request")).await
}

/// One HTTP/1.1 request written by hand, so the Host header is exactly `head`'s.
async fn raw(server: &TestServer, head: &str, body: &str) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let request = format!(
        "{head}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut response))
        .await
        .expect("response within 30s")
        .expect("read");
    let response = String::from_utf8(response).expect("UTF-8 response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null);
    (status, body)
}

/// Names registered for the default character.
async fn registered(server: &TestServer) -> Vec<String> {
    let reply = server.get_without_key("/api/tools").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body["tools_by_role"]["Lanlan"]
        .as_array()
        .expect("Lanlan's tools")
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_forbidden(reply: &Reply) {
    assert_eq!(reply.status, 403, "{reply:?}");
    assert_eq!(reply.code(), "forbidden", "{reply:?}");
}

#[tokio::test]
async fn a_text_plain_register_from_a_foreign_origin_is_refused() {
    let server = spawn_app().await;
    let reply = post(
        &server,
        "/api/tools/register",
        "text/plain",
        &[("origin", "http://evil.example")],
        TOOL,
    )
    .await;
    assert_forbidden(&reply);
    assert!(registered(&server).await.is_empty());
}

#[tokio::test]
async fn a_cross_site_clear_is_refused_and_registrations_survive() {
    let server = spawn_app().await;
    register_remote(
        &server,
        json!({"name": "kept", "callback_url": "http://127.0.0.1:9/x", "source": "plugin:kept"}),
    )
    .await;
    for body in ["{}", r#"{"source": "plugin:kept"}"#] {
        let reply = post(
            &server,
            "/api/tools/clear",
            "application/json",
            &[("sec-fetch-site", "cross-site")],
            body,
        )
        .await;
        assert_forbidden(&reply);
    }
    assert_eq!(registered(&server).await, ["kept"]);
}

#[tokio::test]
async fn a_null_origin_is_refused() {
    let server = spawn_app().await;
    let reply = post(
        &server,
        "/api/tools/register",
        "application/json",
        &[("origin", "null")],
        TOOL,
    )
    .await;
    assert_forbidden(&reply);
    assert!(registered(&server).await.is_empty());
}

#[tokio::test]
async fn invalid_json_from_a_foreign_origin_is_403_not_a_body_error() {
    let server = spawn_app().await;
    let reply = post(
        &server,
        "/api/tools/register",
        "application/json",
        &[("origin", "http://evil.example")],
        "{not json",
    )
    .await;
    assert_forbidden(&reply);
}

#[tokio::test]
async fn a_rebinding_host_is_refused() {
    let server = spawn_app().await;
    let port = server.addr.port();
    let (status, body) = raw(
        &server,
        &format!("POST /api/tools/register HTTP/1.1\r\nHost: evil.example:{port}"),
        TOOL,
    )
    .await;
    assert_eq!((status, &body["error"]["code"]), (403, &json!("forbidden")));
    let (status, body) = raw(&server, "GET /api/tools HTTP/1.1\r\nHost: evil.example", "").await;
    assert_eq!((status, &body["error"]["code"]), (403, &json!("forbidden")));
    // No Host at all cannot prove the request is meant for loopback.
    let (status, body) = raw(&server, "POST /api/tools/register HTTP/1.1", TOOL).await;
    assert_eq!((status, &body["error"]["code"]), (403, &json!("forbidden")));
    assert!(registered(&server).await.is_empty());

    // The same hand-written request with a loopback Host goes through.
    let (status, body) = raw(
        &server,
        &format!("POST /api/tools/register HTTP/1.1\r\nHost: localhost:{port}"),
        TOOL,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(registered(&server).await, ["sneaky"]);
}

#[tokio::test]
async fn loopback_pages_and_plugin_clients_are_admitted() {
    let server = spawn_app().await;
    let port = server.addr.port();
    let loopback_127 = format!("http://127.0.0.1:{port}");
    let loopback_name = format!("http://localhost:{port}");
    let cases: [(&str, Vec<(&str, &str)>); 4] = [
        // Like N.E.K.O.'s httpx client: no Origin, no Sec-Fetch-*.
        ("plain", vec![]),
        ("origin_127", vec![("origin", loopback_127.as_str())]),
        ("origin_localhost", vec![("origin", loopback_name.as_str())]),
        (
            "same_origin",
            vec![
                ("origin", loopback_127.as_str()),
                ("sec-fetch-site", "same-origin"),
            ],
        ),
    ];
    for (name, headers) in &cases {
        let body = json!({"name": name, "callback_url": "http://127.0.0.1:9/x"}).to_string();
        let reply = post(
            &server,
            "/api/tools/register",
            "application/json",
            headers,
            &body,
        )
        .await;
        assert_eq!(reply.status, 200, "{name}: {reply:?}");
    }
    let mut names = registered(&server).await;
    names.sort();
    assert_eq!(
        names,
        ["origin_127", "origin_localhost", "plain", "same_origin"]
    );
}

// ---------------------------------------------------------------------------
// Logs on a pipe or in a file carry no ANSI escape codes.
// ---------------------------------------------------------------------------

/// Runs the binary with stderr on a pipe, sends one refused request (which logs
/// at info), stops it and returns everything it wrote to stderr.
async fn stderr_of_a_run(extra_args: &[&str]) -> Vec<u8> {
    let mut server = spawn_with(SpawnOptions {
        args: extra_args.iter().map(|arg| (*arg).to_owned()).collect(),
        piped_stderr: true,
        ..Default::default()
    })
    .await;
    let mut stderr = server.take_stderr();
    let collected = tokio::spawn(async move {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes).await;
        bytes
    });

    let response = reqwest::Client::new()
        .get(server.url("/api/tools"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 403);

    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
    collected.await.expect("stderr reader")
}

fn assert_colourless_log_of_a_refusal(log: &[u8]) {
    let text = String::from_utf8_lossy(log);
    assert!(
        text.contains("refused"),
        "the refusal was not logged: {text}"
    );
    assert!(
        !log.contains(&0x1b),
        "ANSI escape codes in a non-terminal log: {text:?}"
    );
}

#[tokio::test]
async fn text_and_json_logs_on_a_pipe_carry_no_colour() {
    assert_colourless_log_of_a_refusal(&stderr_of_a_run(&[]).await);
    assert_colourless_log_of_a_refusal(&stderr_of_a_run(&["--log-format", "json"]).await);
}

#[tokio::test]
async fn logs_in_a_file_carry_no_colour() {
    let mut server = spawn_app().await;
    let reply = post(
        &server,
        "/api/tools/register",
        "text/plain",
        &[("origin", "http://evil.example")],
        TOOL,
    )
    .await;
    assert_forbidden(&reply);
    let status = server.stop().await;
    // The helpers send stderr to this file.
    let log = std::fs::read(server.data_dir.join("..").join("server.log")).expect("server.log");
    assert!(
        status.success(),
        "{status:?}; server.log:\n{}",
        String::from_utf8_lossy(&log)
    );
    assert_colourless_log_of_a_refusal(&log);
}
