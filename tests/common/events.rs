//! An SSE subscriber of `GET /sessions/{id}/events`: a live model session, as
//! tests see it.

use std::time::Duration;

use reqwest::header;
use serde_json::Value;

use super::TestServer;

/// An open event stream.
pub struct Events {
    pub response: reqwest::Response,
    buffer: String,
    /// Data of the `ready` event that opened the stream.
    pub ready: Value,
}

/// One event of the stream.
#[derive(Debug, Clone)]
pub struct Sse {
    pub kind: String,
    pub data: Value,
}

impl Events {
    pub async fn open(server: &TestServer, session: &str) -> Self {
        Self::open_path(server, &format!("/sessions/{session}/events")).await
    }

    /// Opens the stream at `path` (e.g. with a `?slot=` query).
    pub async fn open_path(server: &TestServer, path: &str) -> Self {
        Self::open_path_as(server, &server.token, path).await
    }

    /// Opens the session's stream with another account's API key.
    #[allow(dead_code)]
    pub async fn open_as(server: &TestServer, key: &str, session: &str) -> Self {
        Self::open_path_as(server, key, &format!("/sessions/{session}/events")).await
    }

    async fn open_path_as(server: &TestServer, key: &str, path: &str) -> Self {
        let response = server
            .client
            .get(server.url(path))
            .bearer_auth(key)
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .expect("open event stream");
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()[header::CONTENT_TYPE.as_str()]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        // Caches and proxies must pass each event on, not keep the stream.
        assert_eq!(
            response.headers()[header::CACHE_CONTROL.as_str()],
            "no-cache"
        );
        let mut events = Self::of_response(response);
        let ready = events.next().await;
        assert_eq!(ready.kind, "ready", "{ready:?}");
        events.ready = ready.data;
        events
    }

    /// Reads the events of an open stream's answer (one that sends no `ready`,
    /// like the console's).
    pub fn of_response(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
            ready: Value::Null,
        }
    }

    /// Reads what is left until the server ends the stream; fails when it is
    /// still open after `timeout`. Answers the kinds of the events read.
    pub async fn until_ended(&mut self, timeout: Duration) -> Vec<String> {
        let read = tokio::time::timeout(timeout, async {
            while let Some(chunk) = self.response.chunk().await.expect("read event stream") {
                self.buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "the event stream is still open after {timeout:?}"
        );
        self.buffer
            .lines()
            .filter_map(|line| line.strip_prefix("event:"))
            .map(|kind| kind.trim().to_owned())
            .collect()
    }

    /// The next event (comments and keep-alives skipped); fails after 10 s.
    pub async fn next(&mut self) -> Sse {
        self.next_within(Duration::from_secs(10)).await
    }

    /// The next event (comments and keep-alives skipped); fails after `timeout`
    /// (a real model may think longer than the stand-in's 10 s).
    pub async fn next_within(&mut self, timeout: Duration) -> Sse {
        tokio::time::timeout(timeout, async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut kind = "message".to_owned();
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(value) = line.strip_prefix("event:") {
                            kind = value.trim().to_owned();
                        } else if let Some(value) = line.strip_prefix("data:") {
                            data.push_str(value.trim_start());
                        }
                    }
                    if data.is_empty() {
                        continue;
                    }
                    return Sse {
                        kind,
                        data: serde_json::from_str(&data).expect("event data is JSON"),
                    };
                }
                let chunk = self
                    .response
                    .chunk()
                    .await
                    .expect("read event stream")
                    .expect("event stream ended");
                self.buffer.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no event within {timeout:?}"))
    }

    /// The next event of `kind`, skipping the others; fails after `timeout`.
    pub async fn next_of(&mut self, kind: &str, timeout: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let event = tokio::time::timeout(left, self.next())
                .await
                .unwrap_or_else(|_| panic!("no {kind} event within {timeout:?}"));
            if event.kind == kind {
                return event.data;
            }
        }
    }

    /// The next `catalog_changed` event.
    pub async fn changed(&mut self) -> Value {
        let event = self.next().await;
        assert_eq!(event.kind, "catalog_changed", "{event:?}");
        event.data
    }
}
