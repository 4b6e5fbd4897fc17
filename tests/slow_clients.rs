//! Slow and idle clients cannot exhaust the server: a request head must arrive
//! within the header read timeout and its body within the request body
//! timeout, a body declared over the limit is refused before it is read, idle
//! keep-alive connections are closed after the idle timeout, connections over
//! the cap are closed at once, and the open-file limit is raised to its hard
//! limit. Raw TCP against the real binary.

mod common;

use std::time::Duration;

use common::{SpawnOptions, spawn_with};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The short timeout the tests configure, and how long past it a close may take.
const TIMEOUT_MS: u64 = 500;
const MARGIN: Duration = Duration::from_secs(5);
/// Long enough never to fire during a test.
const NEVER_MS: &str = "120000";

fn args(pairs: &[(&str, &str)]) -> SpawnOptions {
    SpawnOptions {
        args: pairs
            .iter()
            .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
            .collect(),
        ..Default::default()
    }
}

async fn connect(server: &common::TestServer) -> TcpStream {
    TcpStream::connect(server.addr).await.expect("connect")
}

/// Reads (and discards) until the server closes the connection; the time that
/// took, or None when it is still open after `limit`. A reset counts as closed.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// Reads one whole `/healthz` response off a keep-alive connection.
async fn read_health_response(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(MARGIN, async {
        // The body is `{"boot_id":"boot_…","status":"ok"}`: keys in order.
        while !seen.ends_with(br#","status":"ok"}"#) {
            let n = stream.read(&mut buf).await.expect("read response");
            assert!(
                n > 0,
                "closed before the response: {:?}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a /healthz response");
    assert!(
        seen.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

const HEALTH_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// `/healthz` on a fresh connection closed after the answer: true when answered 200.
async fn health_on_fresh_connection(server: &common::TestServer) -> bool {
    let Ok(mut stream) = TcpStream::connect(server.addr).await else {
        return false;
    };
    let request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request).await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    match tokio::time::timeout(MARGIN, stream.read_to_end(&mut answer)).await {
        Ok(Ok(_)) => answer.starts_with(b"HTTP/1.1 200"),
        _ => false,
    }
}

/// `GET /characters` with the key on a new client (a new connection): true on 200.
async fn characters_answer(server: &common::TestServer) -> bool {
    let reply = reqwest::Client::new()
        .get(server.url("/characters"))
        .bearer_auth(&server.token)
        .send()
        .await;
    matches!(reply, Ok(reply) if reply.status() == StatusCode::OK)
}

/// True while the server has neither closed `stream` nor sent anything on it.
fn still_open_and_silent(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(stream.try_read(&mut buf), Err(err) if err.kind() == std::io::ErrorKind::WouldBlock)
}

fn assert_closed_after_timeout(what: &str, elapsed: Option<Duration>) {
    let elapsed = elapsed.unwrap_or_else(|| {
        panic!("{what}: still open {MARGIN:?} past the {TIMEOUT_MS} ms timeout")
    });
    assert!(
        elapsed >= Duration::from_millis(TIMEOUT_MS * 4 / 5),
        "{what}: closed after {elapsed:?}, before the {TIMEOUT_MS} ms timeout"
    );
}

#[tokio::test]
async fn a_request_head_that_does_not_arrive_in_time_is_closed() {
    let timeout = TIMEOUT_MS.to_string();
    let server = spawn_with(args(&[
        ("--header-read-timeout-ms", &timeout),
        ("--idle-timeout-ms", NEVER_MS),
    ]))
    .await;

    // Half a head, then nothing.
    let mut half = connect(&server).await;
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // Nothing at all.
    let mut silent = connect(&server).await;
    let (half_closed, silent_closed) = tokio::join!(
        closed_within(&mut half, Duration::from_millis(TIMEOUT_MS) + MARGIN),
        closed_within(&mut silent, Duration::from_millis(TIMEOUT_MS) + MARGIN),
    );
    assert_closed_after_timeout("half a head", half_closed);
    assert_closed_after_timeout("a silent connection", silent_closed);

    // A head dripped a byte at a time never completes: the timeout counts from
    // its first byte, not from the last one.
    let mut drip = connect(&server).await;
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_millis(TIMEOUT_MS) + MARGIN, async {
        let mut buf = [0u8; 64];
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: ".iter().cycle() {
            tokio::select! {
                read = drip.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => panic!("answered a head that never ended"),
                },
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    let _ = drip.write_all(&[*byte]).await;
                }
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a dripped head was kept open past the timeout"
    );
    assert_closed_after_timeout("a dripped head", Some(started.elapsed()));

    // On a keep-alive connection the next head gets the same time, even though
    // idle connections are kept far longer.
    let mut keep_alive = connect(&server).await;
    keep_alive.write_all(HEALTH_HEAD).await.unwrap();
    read_health_response(&mut keep_alive).await;
    keep_alive
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let elapsed = closed_within(&mut keep_alive, Duration::from_millis(TIMEOUT_MS) + MARGIN).await;
    assert_closed_after_timeout("half of a second head", elapsed);

    // The server kept answering throughout.
    assert!(health_on_fresh_connection(&server).await);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let timeout = TIMEOUT_MS.to_string();
    let server = spawn_with(args(&[
        ("--idle-timeout-ms", &timeout),
        ("--header-read-timeout-ms", NEVER_MS),
    ]))
    .await;
    let mut stream = connect(&server).await;
    // Keep-alive works: two requests on one connection.
    for _ in 0..2 {
        stream.write_all(HEALTH_HEAD).await.unwrap();
        read_health_response(&mut stream).await;
    }
    let elapsed = closed_within(&mut stream, Duration::from_millis(TIMEOUT_MS) + MARGIN).await;
    assert_closed_after_timeout("an idle keep-alive connection", elapsed);

    // A response still being sent is not idle: an open event stream outlives the
    // idle timeout several times over.
    let session = server.create_session().await;
    let mut events = common::events::Events::open(&server, &session).await;
    let waited = tokio::time::timeout(
        Duration::from_millis(TIMEOUT_MS * 3),
        events.response.chunk(),
    )
    .await;
    assert!(
        waited.is_err(),
        "the event stream ended while its response was in flight: {waited:?}"
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_slots_come_back() {
    const CAP: usize = 50;
    let cap = CAP.to_string();
    let mut server = spawn_with(args(&[
        ("--max-connections", &cap),
        ("--header-read-timeout-ms", NEVER_MS),
        ("--idle-timeout-ms", NEVER_MS),
    ]))
    .await;
    // The listen backlog is first in, first out: these are accepted first.
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(connect(&server).await);
    }
    let mut extra = Vec::new();
    for _ in 0..10 {
        extra.push(connect(&server).await);
    }
    for (i, stream) in extra.iter_mut().enumerate() {
        let elapsed = closed_within(stream, MARGIN).await;
        let elapsed =
            elapsed.unwrap_or_else(|| panic!("connection {i} over the cap was kept open"));
        assert!(
            elapsed < Duration::from_secs(2),
            "connection {i} over the cap closed only after {elapsed:?}"
        );
    }
    // The held ones were accepted before those, and are still open.
    for (i, stream) in held.iter().enumerate() {
        assert!(
            still_open_and_silent(stream),
            "held connection {i} was closed"
        );
    }
    // While the cap is full, a probe is refused like any client (documented).
    assert!(!health_on_fresh_connection(&server).await);

    // A freed slot is usable again as soon as the server sees the close.
    held.truncate(CAP - 1);
    common::wait_until(MARGIN, "/healthz on a freed slot", || {
        health_on_fresh_connection(&server)
    })
    .await;
    // A real request too, while the others are still held.
    held.truncate(CAP - 5);
    common::wait_until(MARGIN, "an authenticated request on a freed slot", || {
        characters_answer(&server)
    })
    .await;
    for (i, stream) in held.iter().enumerate() {
        assert!(
            still_open_and_silent(stream),
            "held connection {i} was closed"
        );
    }

    // Connections that never sent a byte do not hold up a graceful stop.
    server.terminate();
    let status = server
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the server did not exit within 10 s of SIGTERM while idle connections were held");
    assert!(status.success(), "{status:?}");
}

/// Reads until the server closes the connection; what it sent, or None when
/// it is still open after `limit`.
async fn answer_then_close(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(String::from_utf8_lossy(&answer).into_owned())
}

/// A head declaring `length` body bytes, followed by `sent` of them.
fn post_head(path: &str, token: Option<&str>, length: usize, sent: &str) -> Vec<u8> {
    let auth = token.map_or(String::new(), |token| {
        format!("Authorization: Bearer {token}\r\n")
    });
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n{sent}"
    )
    .into_bytes()
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_frees_its_slot() {
    let timeout = TIMEOUT_MS.to_string();
    let server = spawn_with(args(&[
        ("--max-connections", "2"),
        ("--request-body-timeout-ms", &timeout),
        ("--header-read-timeout-ms", NEVER_MS),
        ("--idle-timeout-ms", NEVER_MS),
    ]))
    .await;
    // Both slots: the keyless loopback API and a platform route with a key.
    let token = server.token.clone();
    let mut stalled = Vec::new();
    for (path, token) in [
        ("/api/tools/register", None),
        ("/sessions", Some(token.as_str())),
    ] {
        let mut stream = connect(&server).await;
        stream
            .write_all(&post_head(path, token, 50, "{"))
            .await
            .unwrap();
        stalled.push((path, Instant::now(), stream));
    }
    for (path, sent_at, mut stream) in stalled {
        let answer = answer_then_close(&mut stream, MARGIN)
            .await
            .unwrap_or_else(|| panic!("{path}: a stalled body still holds its connection"));
        let elapsed = sent_at.elapsed();
        assert!(
            elapsed >= Duration::from_millis(TIMEOUT_MS * 4 / 5),
            "{path}: answered after {elapsed:?}, before the {TIMEOUT_MS} ms body timeout"
        );
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains(r#""code":"request_timeout""#),
            "{path}: {answer}"
        );
    }
    // The two slots are free again.
    common::wait_until(MARGIN, "/healthz after the stalled bodies", || {
        health_on_fresh_connection(&server)
    })
    .await;
}

#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_it_is_sent() {
    let server = spawn_with(args(&[("--request-body-timeout-ms", NEVER_MS)])).await;
    let token = server.token.clone();
    for (path, token) in [
        ("/api/tools/register", None),
        ("/sessions", Some(token.as_str())),
    ] {
        let mut stream = connect(&server).await;
        stream
            .write_all(&post_head(path, token, 100_000_000, ""))
            .await
            .unwrap();
        let answer = answer_then_close(&mut stream, MARGIN)
            .await
            .unwrap_or_else(|| panic!("{path}: no answer while the body was never sent"));
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains(r#""code":"payload_too_large""#),
            "{path}: {answer}"
        );
    }
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_limit() {
    use rlimit::Resource;
    // Start the server with a low soft limit (children inherit it), so that the
    // test sees the raise wherever the hard limit allows one.
    let (soft, hard) = Resource::NOFILE.get().unwrap();
    let lowered = hard.min(1024);
    Resource::NOFILE.set(lowered, hard).unwrap();
    let server = spawn_with(SpawnOptions::default()).await;
    Resource::NOFILE.set(soft, hard).unwrap();

    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid())).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file line in {limits}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (server_soft, server_hard) = (fields[3], fields[4]);
    assert_eq!(server_soft, server_hard, "{line}");
    assert_eq!(server_hard, hard.to_string(), "{line}");
    // The raise is logged with what it was before.
    let log = server.log_containing(&format!("after={hard}")).await;
    assert!(log.contains(&format!("before={lowered}")), "{log}");
    assert!(health_on_fresh_connection(&server).await);
}
