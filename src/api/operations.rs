//! What operators and their tooling poll: `/metrics` (Prometheus, the admin
//! key as a bearer token; or keyless on `--metrics-listen`) and `/readyz`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::CurrentAccount;
use super::error::{ApiError, ApiResult};
use crate::error::ErrorCode;
use crate::runtime::NotReady;
use crate::state::AppState;

/// `GET /metrics` on the main listener: the admin account only.
pub async fn metrics_for_admin(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
) -> ApiResult<Response> {
    if !account.is_admin {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "metrics are for the admin account's key",
        ));
    }
    metrics_text(&state).await
}

/// `GET /metrics` on the private metrics listener: no key.
pub async fn metrics_text(state: &AppState) -> ApiResult<Response> {
    let snapshot = state.runtime.scrape_snapshot().await?;
    let text = crate::metrics::render(&snapshot);
    Ok(([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// `GET /readyz`: 200 when the database answers and the job worker runs.
pub async fn readyz(State(state): State<AppState>) -> ApiResult<axum::Json<serde_json::Value>> {
    match state.runtime.readiness().await {
        Ok(()) => Ok(axum::Json(serde_json::json!({"status": "ready"}))),
        Err(NotReady::Database) => Err(ApiError::new(
            ErrorCode::NotReady,
            "the database does not answer",
        )),
        Err(NotReady::JobWorkers) => Err(ApiError::new(
            ErrorCode::NotReady,
            "the job worker is not running",
        )),
    }
}

/// Counts every request of a matched route by route template, method and
/// status class, with its latency.
pub async fn track_http(request: Request, next: Next) -> Response {
    let metrics = crate::metrics::metrics();
    if !metrics.enabled() {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = static_method(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.record_http(
        &route,
        method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The method as a closed set of label values.
fn static_method(method: &axum::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}
