//! `/console`: the web console's routes. Pages are rendered by
//! `crate::console::views` from the same store and runtime calls the API's
//! handlers make; a console session (cookie) stands in for the API key.
//! Every response under `/console` carries the console's strict
//! Content-Security-Policy.

mod auth;
mod definitions;
mod executions;
mod floors;
mod guard;
mod render;
mod sessions;
mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Extension, Path};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::console::csrf::CsrfKey;
use crate::console::sessions::ConsoleSessions;
use crate::console::throttle::SignInThrottle;
use crate::state::AppState;

/// What the console keeps besides the runtime: its sign-ins, CSRF key and
/// failed sign-in counts.
#[derive(Debug, Default)]
pub struct Console {
    pub sessions: ConsoleSessions,
    pub csrf: CsrfKey,
    pub throttle: SignInThrottle,
}

/// The console's routes, ready to merge into the application router.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::to("/console/sessions") }),
        )
        .route(
            "/console/",
            get(|| async { Redirect::to("/console/sessions") }),
        )
        .route("/console/assets/{name}", get(asset))
        .route("/console/login", get(auth::login_form).post(auth::login))
        .route("/console/logout", post(auth::logout))
        .route("/console/sessions", get(sessions::list))
        .route("/console/sessions/{id}", get(sessions::page))
        .route(
            "/console/sessions/{id}/permissions",
            post(sessions::save_permissions),
        )
        .route("/console/sessions/{id}/events", get(sessions::events))
        .route("/console/executions/{id}", get(executions::page))
        .route("/console/floors/{id}", get(floors::page_handler))
        .route("/console/floors/{id}/runs", post(floors::open_run))
        .route("/console/runs/{id}/commit", post(floors::commit))
        .route("/console/runs/{id}/discard", post(floors::discard))
        .route(
            "/console/definitions",
            get(definitions::list).post(definitions::create),
        )
        .route("/console/definitions/new", get(definitions::new_form))
        .route(
            "/console/definitions/{id}",
            get(definitions::page).post(definitions::save),
        )
        .route(
            "/console/definitions/{id}/toggle",
            post(definitions::toggle),
        )
        .route("/console/definitions/{id}/try", post(definitions::try_it))
        .route("/console/runtime-tools", get(tools::runtime_tools))
        .route("/console/mcp", get(tools::mcp_servers))
        .route("/console/activity", get(tools::activity))
        .route("/console/{*rest}", get(not_found).post(not_found))
        .layer(axum::middleware::map_response(console_error_pages))
        .layer(axum::middleware::map_response(security_headers))
        .layer(Extension(Arc::new(Console::default())))
}

/// An answer under `/console` that is not a console page (axum's refusal of
/// a path or query value a page cannot read) is drawn as one, so a browser
/// never lands on bare text ([`method_not_allowed`] does the same for 405).
async fn console_error_pages(response: Response) -> Response {
    let status = response.status();
    let is_page = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/html"));
    if is_page || status != StatusCode::BAD_REQUEST {
        return response;
    }
    render::ConsoleError::Page {
        code: crate::error::ErrorCode::ValidationError,
        message: "the page's address holds a value the page cannot read (a path part or a query parameter)".to_owned(),
        nav: None,
    }
    .into_response()
}

/// Headers every console response carries: the CSP, no sniffing, no framing,
/// no referrer leaving the origin, and no caching of pages showing data.
async fn security_headers(response: Response) -> Response {
    with_security_headers(response)
}

/// The 405 page of a console path: the router answers it outside the
/// console's layers, so it carries their headers itself.
pub fn method_not_allowed() -> Response {
    with_security_headers(
        render::ConsoleError::Page {
            code: crate::error::ErrorCode::MethodNotAllowed,
            message: "this console page does not accept that method".to_owned(),
            nav: None,
        }
        .into_response(),
    )
}

/// Whether `path` is the console's.
pub fn is_console_path(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::console::CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn asset(Path(name): Path<String>) -> Response {
    match crate::console::assets::asset(&name) {
        Some(asset) => (
            [
                (header::CONTENT_TYPE, asset.content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            asset.body,
        )
            .into_response(),
        None => render::ConsoleError::not_found("no such console asset").into_response(),
    }
}

async fn not_found(_signed_in: auth::SignedIn) -> render::ConsoleError {
    render::ConsoleError::not_found("no such console page")
}
