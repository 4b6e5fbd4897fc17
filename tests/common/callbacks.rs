//! Loopback callback servers for remote tools: one that counts the calls it
//! receives (a test that must start no provider reads the count), one that
//! keeps every request as the plugin saw it, and one that holds every call
//! until the test releases it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Request, State};
use axum::routing::post;
use serde_json::{Value, json};

/// A running callback server; `/ok` answers every call with a success.
#[derive(Clone)]
pub struct CountingCallbacks {
    pub base: String,
    hits: Arc<AtomicUsize>,
}

impl CountingCallbacks {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new()
            .route(
                "/ok",
                post(
                    |State(hits): State<Arc<AtomicUsize>>, Json(body): Json<Value>| async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        Json(json!({"output": {"echo": body["arguments"]}, "is_error": false}))
                    },
                ),
            )
            .with_state(hits.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, hits }
    }

    /// The callback URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// How many calls the server has received.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// One callback request as the plugin saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    /// Path and query, as the request line carried them.
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Null` when it was not JSON).
    pub body: Value,
}

impl Received {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A running callback server that keeps every request, on any path, and
/// answers each with `{"output": {"ok": true}}`.
#[derive(Clone)]
pub struct RecordingCallbacks {
    pub port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

impl RecordingCallbacks {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Self {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let app = axum::Router::new()
            .fallback(post(
                |State(log): State<Arc<Mutex<Vec<Received>>>>, request: Request| async move {
                    let (parts, body) = request.into_parts();
                    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                    log.lock().unwrap().push(Received {
                        method: parts.method.to_string(),
                        target: parts.uri.to_string(),
                        headers: parts
                            .headers
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_owned()))
                            .collect(),
                        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    });
                    Json(json!({"output": {"ok": true}}))
                },
            ))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { port, received }
    }

    /// The callback URL of `path` on this server, by loopback address.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A running callback server whose `/hold` answers a call only once released
/// (then every call, held or later, at once); counts the calls that arrived.
#[derive(Clone)]
pub struct HoldingCallbacks {
    base: String,
    hits: Arc<AtomicUsize>,
    release: Arc<tokio::sync::watch::Sender<bool>>,
}

impl HoldingCallbacks {
    pub async fn start() -> Self {
        let (release, _) = tokio::sync::watch::channel(false);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hold = HoldingCallbacks {
            base: format!("http://{}", listener.local_addr().unwrap()),
            hits: Default::default(),
            release: Arc::new(release),
        };
        let app = axum::Router::new()
            .route(
                "/hold",
                post(|State(h): State<HoldingCallbacks>| async move {
                    h.hits.fetch_add(1, Ordering::SeqCst);
                    let mut released = h.release.subscribe();
                    let _ = released.wait_for(|r| *r).await;
                    Json(json!({"output": "held result", "is_error": false}))
                }),
            )
            .with_state(hold.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        hold
    }

    /// The holding callback's URL.
    pub fn url(&self) -> String {
        format!("{}/hold", self.base)
    }

    /// Answers every call held now and every later one.
    pub fn release(&self) {
        self.release.send_replace(true);
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Waits (up to 20 s) until `n` calls have arrived.
    pub async fn wait_hits(&self, n: usize) {
        let this = self.clone();
        super::wait_until(
            std::time::Duration::from_secs(20),
            "the callback to be called",
            || {
                let this = this.clone();
                async move { this.hits() >= n }
            },
        )
        .await;
    }
}
