//! The HTTP layer: routes, extractors and the error envelope. Handlers translate
//! between HTTP and the domain; no business rule lives here.

mod accounts;
mod approvals;
mod auth;
mod browser_guard;
mod catalog;
mod characters;
mod console;
mod definitions;
pub mod envelope;
pub mod error;
mod event_frames;
mod events;
mod executions;
pub mod extract;
mod finish_on_hangup;
mod jobs;
mod mcp;
mod mcp_messages;
mod mcp_runtime;
mod mcp_sessions;
mod memories;
pub mod operations;
mod permissions;
mod request_trace;
mod runs;
mod runtime_tools;
mod sessions;
mod tool_calls;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use utoipa::{Modify, OpenApi};
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
        .merge(approvals::router())
        .merge(runs::router())
        .merge(jobs::router())
        .merge(catalog::router())
        .merge(permissions::router())
        .merge(memories::router())
        .merge(runtime_tools::router())
        .merge(events::router())
        .merge(definitions::router())
        .merge(mcp::router())
        .merge(mcp_runtime::router())
        .split_for_parts();
    let (router, mut openapi) = routes;
    describe_error_codes(&mut openapi);
    DocumentContract.modify(&mut openapi);
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

/// Name of the security scheme of the platform API: the account's API key as
/// `Authorization: Bearer <api key>` (see `auth.rs`).
const BEARER_SCHEME: &str = "api_key";

/// The routes that take no API key: health, the OpenAPI document, and the
/// loopback-only runtime tools API (its peer check guards it instead).
fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/openapi.json" | "/api/tools"
    ) || path.starts_with("/api/tools/")
}

/// What every operation shares and its annotation does not spell out, applied
/// to the merged document (after `split_for_parts`, so it sees every route):
///
/// - the bearer scheme in `components.securitySchemes`, required (`security`)
///   by every operation outside [`is_public`], each of which also documents its
///   401 `unauthorized`;
/// - every error response (4xx, 5xx and the `default` one every operation gets
///   for the errors it does not list) is the error envelope [`error::ErrorBody`];
///   a 503 also carries `Retry-After`;
/// - every response is described: an error by its code from the table (a bare
///   code is expanded to its meaning; a status only one code has gets that code),
///   anything else by its status's reason.
struct DocumentContract;

impl Modify for DocumentContract {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("API key")
            .description(Some(
                "The account's API key (`tg_...`) as `Authorization: Bearer <api key>`; \
                 a missing or unknown key is answered 401 `unauthorized`.",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER_SCHEME, SecurityScheme::Http(scheme));
        for (path, item) in openapi.paths.paths.iter_mut() {
            let public = is_public(path);
            for operation in operations_mut(item) {
                if !public {
                    require_api_key(operation);
                }
                complete_responses(&mut operation.responses);
            }
        }
    }
}

/// Every operation of a path item, whatever its method.
fn operations_mut(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
        &mut item.query,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
    .chain(item.additional_operations.values_mut())
}

fn require_api_key(operation: &mut utoipa::openapi::path::Operation) {
    use utoipa::openapi::security::SecurityRequirement;
    operation.security.get_or_insert_with(|| {
        vec![SecurityRequirement::new(
            BEARER_SCHEME,
            Vec::<String>::new(),
        )]
    });
    operation
        .responses
        .responses
        .entry("401".to_owned())
        .or_insert_with(|| utoipa::openapi::Response::new(ErrorCode::Unauthorized.as_str()).into());
}

fn complete_responses(responses: &mut utoipa::openapi::Responses) {
    use utoipa::openapi::{Content, Ref, RefOr, Response};
    responses
        .responses
        .entry("default".to_owned())
        .or_insert_with(|| {
            Response::new(
                "Any other failure (for example `validation_error`, `payload_too_large` or \
                 `internal_error`): the error envelope, its `code` from the ErrorCode table, \
                 which also fixes the status.",
            )
            .into()
        });
    for (status, response) in responses.responses.iter_mut() {
        // A reference names a shared response, complete where it is defined.
        let RefOr::T(response) = response else {
            continue;
        };
        if status == "default" || status.starts_with(['4', '5']) {
            response.description = error_description(status, &response.description);
            if response.content.is_empty() {
                let envelope = Content::new(Some(Ref::from_schema_name("ErrorBody")));
                response
                    .content
                    .insert("application/json".to_owned(), envelope.into());
            }
            if status == "503" {
                response
                    .headers
                    .entry("Retry-After".to_owned())
                    .or_insert_with(|| retry_after_header().into());
            }
        } else if response.description.trim().is_empty() {
            response.description = status_reason(status);
        }
    }
}

/// The description of an error response: a bare code becomes the code with its
/// meaning; a status only one code has is prefixed with that code.
fn error_description(status: &str, given: &str) -> String {
    let given = given.trim();
    if let Some(code) = ErrorCode::ALL.iter().find(|code| code.as_str() == given) {
        return format!("`{code}`: {}", code.meaning());
    }
    let status_number = status.parse::<u16>().ok();
    let codes: Vec<ErrorCode> = ErrorCode::ALL
        .iter()
        .copied()
        .filter(|code| status_number == Some(code.status()))
        .collect();
    let names_a_code = ErrorCode::ALL
        .iter()
        .any(|code| given.contains(&format!("`{code}`")));
    match (codes.as_slice(), given.is_empty()) {
        ([code], true) => format!("`{code}`: {}", code.meaning()),
        ([code], false) if !names_a_code => format!("`{code}`: {given}"),
        (_, false) => given.to_owned(),
        ([], true) => status_reason(status),
        (codes, true) => {
            let names: Vec<String> = codes.iter().map(|code| format!("`{code}`")).collect();
            format!("{}: {}", status_reason(status), names.join(" or "))
        }
    }
}

/// The canonical reason of a status ("Created" for 201).
fn status_reason(status: &str) -> String {
    status
        .parse::<u16>()
        .ok()
        .and_then(|status| StatusCode::from_u16(status).ok())
        .and_then(|status| status.canonical_reason())
        .map_or_else(|| format!("HTTP {status}"), str::to_owned)
}

fn retry_after_header() -> utoipa::openapi::header::Header {
    use utoipa::openapi::schema::{Object, Type};
    let mut header = utoipa::openapi::header::Header::new(Object::with_type(Type::Integer));
    header.description = Some("Seconds to wait before retrying, on the server's successor.".into());
    header
}

/// Serves the keyless metrics listener (`GET /metrics` only) until the task
/// is dropped or aborted.
pub async fn serve_metrics(listener: tokio::net::TcpListener, state: AppState) {
    let router = Router::new()
        .route(
            "/metrics",
            get(
                |axum::extract::State(state): axum::extract::State<AppState>| async move {
                    operations::metrics_text(&state).await
                },
            ),
        )
        .fallback(|| async { ApiError::not_found("this listener serves /metrics only") })
        .with_state(state);
    if let Err(error) = axum::serve(listener, router).await {
        tracing::error!(%error, "the metrics listener failed");
    }
}

/// `GET /healthz`: up, and which start of the server answers (`boot_id`, see
/// [`AppState::boot_id`]), so a plugin polling it notices a restart.
async fn health(State(state): State<AppState>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"status": "ok", "boot_id": &*state.boot_id}))
}

/// The whole HTTP application for `state`: the routes, inside the layers
/// every request passes through.
///
/// The layers wrap the router once, as one service, instead of going through
/// `Router::layer`, which wraps every route in each of them: each such layer
/// boxed the request's future again, a heap allocation and a copy of the
/// future per layer per request (BENCHMARKS.md, issue 20, fifteenth pass).
/// Outermost first: the request id is set, then echoed, then the request's
/// span and log lines, its time limit, the panic guard, a change's guard
/// against hang-ups (and the time limit), the body limit.
pub fn router(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    let body_limit = state.runtime.settings.body_limit_bytes;
    let layered = tower::ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
        .layer(PropagateRequestIdLayer::new(request_id))
        .layer(axum::middleware::from_fn(request_trace::trace_request))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(600),
        ))
        .layer(CatchPanicLayer::custom(|_panic| {
            tracing::error!("a request handler panicked");
            ApiError::new(
                ErrorCode::InternalError,
                "the server failed to handle this request; the cause is in its log",
            )
            .into_response()
        }))
        .layer(finish_on_hangup::FinishOnHangupLayer::new(
            state.runtime.clone(),
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .service(routed(state));
    // Still a `Router` for `listener::serve` and the tests: every request
    // reaches the stack as this empty router's fallback, one box in all.
    Router::new().fallback_service(layered)
}

/// Every route, the fallbacks and the per-route metrics, without the layers
/// of [`router`].
fn routed(state: AppState) -> Router {
    let (api, openapi) = routes();
    let openapi = std::sync::Arc::new(openapi);
    api.merge(console::router())
        .merge(mcp_sessions::router(&state))
        .route_layer(axum::middleware::from_fn(operations::track_http))
        .route("/metrics", get(operations::metrics_for_admin))
        .route("/readyz", get(operations::readyz))
        .route("/healthz", get(health))
        .route(
            "/openapi.json",
            get(move || {
                let openapi = openapi.clone();
                async move { axum::Json((*openapi).clone()) }
            }),
        )
        .fallback(|request: axum::extract::Request| async move {
            runtime_tools::refuse_a_remote_peer(&request)
                .unwrap_or_else(|| ApiError::not_found("no such route"))
        })
        .method_not_allowed_fallback(|request: axum::extract::Request| async move {
            if console::is_console_path(request.uri().path()) {
                return console::method_not_allowed();
            }
            runtime_tools::refuse_a_remote_peer(&request)
                .unwrap_or_else(|| {
                    ApiError::new(
                        ErrorCode::MethodNotAllowed,
                        "this route does not accept that method",
                    )
                })
                .into_response()
        })
        .with_state(state)
}
