//! The HTTP layer: routes, extractors and the error envelope. Handlers translate
//! between HTTP and the domain; no business rule lives here.

mod accounts;
mod auth;
mod browser_guard;
mod catalog;
mod characters;
mod definitions;
pub mod envelope;
pub mod error;
mod events;
mod executions;
pub mod extract;
mod jobs;
mod memories;
mod permissions;
mod runs;
mod runtime_tools;
mod sessions;
mod tool_calls;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use self::error::ApiError;
use crate::error::ErrorCode;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "toolgate",
        description = "Tool runtime for AI character chat servers"
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail, ErrorCode))
)]
struct ApiDoc;

/// The API's routes and its generated OpenAPI document.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let routes = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(accounts::router())
        .merge(characters::router())
        .merge(sessions::router())
        .merge(tool_calls::router())
        .merge(executions::router())
        .merge(runs::router())
        .merge(jobs::router())
        .merge(catalog::router())
        .merge(permissions::router())
        .merge(memories::router())
        .merge(runtime_tools::router())
        .merge(events::router())
        .merge(definitions::router())
        .split_for_parts();
    let (router, mut openapi) = routes;
    describe_error_codes(&mut openapi);
    (router, openapi)
}

/// Puts the error-code table (every code, its status and meaning) into the
/// `ErrorCode` schema's description, so the document carries the whole table.
fn describe_error_codes(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{RefOr, schema::Schema};
    let Some(components) = openapi.components.as_mut() else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(schema))) = components.schemas.get_mut("ErrorCode") {
        schema.description = Some(format!(
            "The error-code table: every code the API answers with, its HTTP status and meaning.\n\n{}",
            error::error_code_table_markdown()
        ));
    }
}

/// The whole HTTP application for `state`.
pub fn router(state: AppState) -> Router {
    let (api, openapi) = routes();
    let openapi = std::sync::Arc::new(openapi);
    let request_id = HeaderName::from_static("x-request-id");
    api.route(
        "/healthz",
        get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
    )
    .route(
        "/openapi.json",
        get(move || {
            let openapi = openapi.clone();
            async move { axum::Json((*openapi).clone()) }
        }),
    )
    .fallback(|| async { ApiError::not_found("no such route") })
    .method_not_allowed_fallback(|| async {
        ApiError::new(
            ErrorCode::MethodNotAllowed,
            "this route does not accept that method",
        )
    })
    .layer(DefaultBodyLimit::max(
        state.runtime.settings.body_limit_bytes,
    ))
    .layer(CatchPanicLayer::custom(|_panic| {
        tracing::error!("a request handler panicked");
        ApiError::new(
            ErrorCode::InternalError,
            "the server failed to handle this request; the cause is in its log",
        )
        .into_response()
    }))
    .layer(tower_http::timeout::TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        Duration::from_secs(600),
    ))
    .layer(TraceLayer::new_for_http())
    .layer(PropagateRequestIdLayer::new(request_id.clone()))
    .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
    .with_state(state)
}
