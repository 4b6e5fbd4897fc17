//! A loopback callback server for remote tools that counts the calls it
//! receives: a test that must start no provider reads the count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Json;
use axum::extract::State;
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
