//! Each request's span and its two log lines, around the handler only.
//!
//! `tower_http`'s `TraceLayer` did this before, and it also held the span
//! over the response body: every frame of every body was polled inside it.
//! An event stream's frames are its events, so a registration into every role
//! entered and left a span per live model session (a few thousand
//! instructions each, BENCHMARKS.md issue 20). Nothing a body's frames run
//! logs, so the span now covers the request until its response head.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// Runs the request inside its span (a child of the caller's trace when it
/// sends a `traceparent`), logging its start, and its end with the status and
/// latency: at `debug`, at `warn` for a 503 (a state to wait out), or at
/// `error` for any other server error.
pub async fn trace_request(request: Request, next: Next) -> Response {
    let span =
        crate::telemetry::request_span(request.method(), request.uri().path(), request.headers());
    async move {
        let started = Instant::now();
        tracing::debug!("started processing request");
        let response = next.run(request).await;
        let status = response.status().as_u16();
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        if response.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE {
            // Every 503 of the error-code table is a state the client is
            // told to wait out (shutting down, not ready, no model, an MCP
            // server away), not a failure of this request's handling.
            tracing::warn!(status, latency_ms, "service unavailable");
        } else if status == crate::error::ErrorCode::McpSelfConnection.status() {
            // A refusal of this deployment's own MCP client, already logged
            // at warn with its reason; not a failure of the server.
            tracing::debug!(status, latency_ms, "own MCP client refused");
        } else if response.status().is_server_error() {
            tracing::error!(status, latency_ms, "response failed");
        } else {
            tracing::debug!(status, latency_ms, "finished processing request");
        }
        response
    }
    .instrument(span)
    .await
}
