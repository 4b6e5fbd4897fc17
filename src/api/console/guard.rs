//! What every state-changing console form passes before its handler runs: the
//! post is not cross-site (Origin / Referer / Sec-Fetch-Site), and its CSRF
//! token is valid for this form's binding. Either failure is 403.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, header};

use super::Console;
use super::auth::{SignedIn, session_binding};
use super::render::{ConsoleError, ConsoleResult};
use crate::console::forms::{Fields, is_cross_site};
use crate::state::AppState;

/// A checked post of a signed-in viewer: its fields, its console, and whether
/// it came over TLS.
pub struct ConsolePost {
    pub signed_in: SignedIn,
    pub fields: Fields,
    pub console: Arc<Console>,
    pub secure: bool,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Reads a form post after the same-site and CSRF checks for `binding`.
pub async fn read_form(
    request: Request,
    state: &AppState,
    console: &Console,
    binding: &str,
) -> ConsoleResult<Fields> {
    let headers = request.headers();
    if is_cross_site(
        header(headers, header::HOST.as_str()),
        header(headers, header::ORIGIN.as_str()),
        header(headers, header::REFERER.as_str()),
        header(headers, "sec-fetch-site"),
    ) {
        tracing::warn!(
            origin = ?header(headers, header::ORIGIN.as_str()),
            referer = ?header(headers, header::REFERER.as_str()),
            "console post refused: cross-site"
        );
        return Err(ConsoleError::forbidden(
            "this form was posted from another site",
        ));
    }
    let body = super::super::extract::body_bytes(request, state)
        .await
        .map_err(|err| ConsoleError::new(err.code, err.message))?;
    let fields = Fields::parse(&body)?;
    let token = fields.get("csrf_token").unwrap_or("");
    if let Err(refusal) = console.csrf.verify(binding, token) {
        tracing::warn!(refusal = ?refusal, "console post refused: CSRF token");
        return Err(ConsoleError::forbidden(
            "the form's CSRF token is missing, expired or not this session's; reload the page and try again",
        ));
    }
    Ok(fields)
}

impl FromRequest<AppState> for ConsolePost {
    type Rejection = ConsoleError;

    async fn from_request(request: Request, state: &AppState) -> ConsoleResult<Self> {
        let (mut parts, body) = request.into_parts();
        let signed_in = SignedIn::from_request_parts(&mut parts, state).await?;
        let console = parts
            .extensions
            .get::<Arc<Console>>()
            .cloned()
            .ok_or(ConsoleError::SignIn)?;
        let secure = super::auth::over_tls(&parts.headers, &parts.uri);
        let request = Request::from_parts(parts, body);
        let binding = session_binding(&signed_in.session);
        let fields = read_form(request, state, &console, &binding)
            .await
            .map_err(|err| err.with_nav(&signed_in.nav))?;
        Ok(ConsolePost {
            signed_in,
            fields,
            console,
            secure,
        })
    }
}
