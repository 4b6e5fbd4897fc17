//! Signing in and out of the console, and the extractor that finds the
//! signed-in account from the session cookie alone (no header is trusted to
//! say who the viewer is).

use std::sync::Arc;

use axum::extract::{Extension, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use cookie::{Cookie, SameSite};

use super::Console;
use super::guard::{ConsolePost, read_form};
use super::render::{ConsoleError, ConsoleResult, html, status_of};
use crate::console::csrf::LOGIN_BINDING;
use crate::console::sessions::{ConsoleSession, SESSION_TTL};
use crate::console::views::Nav;
use crate::console::views::login::login_page;
use crate::console::{COOKIE_NAME, COOKIE_PATH};
use crate::state::AppState;

/// The signed-in viewer: the console session and the navigation of its pages.
pub struct SignedIn {
    pub session: ConsoleSession,
    pub nav: Nav,
}

impl SignedIn {
    pub fn account_id(&self) -> &str {
        &self.session.account.id
    }
}

/// The CSRF binding of a signed-in session's forms.
pub fn session_binding(session: &ConsoleSession) -> String {
    format!("session:{}", session.key)
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|cookie| cookie.name() == COOKIE_NAME)
        .map(|cookie| cookie.value().to_owned())
}

impl FromRequestParts<AppState> for SignedIn {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> ConsoleResult<Self> {
        let console = parts
            .extensions
            .get::<Arc<Console>>()
            .cloned()
            .ok_or(ConsoleError::SignIn)?;
        let session = cookie_value(&parts.headers)
            .and_then(|value| console.sessions.get(&value))
            .ok_or(ConsoleError::SignIn)?;
        let nav = Nav {
            account_name: session.account.name.clone(),
            csrf: console.csrf.issue(&session_binding(&session)),
        };
        Ok(SignedIn { session, nav })
    }
}

/// Whether the request reached us over TLS (directly, or as a TLS-terminating
/// proxy says): the cookie is then `Secure`. The header can only make the
/// cookie stricter, so it is safe to honour.
pub(super) fn over_tls(parts: &HeaderMap, uri: &axum::http::Uri) -> bool {
    uri.scheme_str() == Some("https")
        || parts
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|proto| proto.eq_ignore_ascii_case("https"))
}

fn session_cookie(value: String, secure: bool, max_age: time::Duration) -> HeaderValue {
    let cookie = Cookie::build((COOKIE_NAME, value))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path(COOKIE_PATH)
        .max_age(max_age)
        .secure(secure)
        .build();
    HeaderValue::from_str(&cookie.to_string()).expect("a cookie of hex and ASCII attributes")
}

/// `GET /console/login`: the sign-in form.
pub async fn login_form(Extension(console): Extension<Arc<Console>>) -> Response {
    let csrf = console.csrf.issue(LOGIN_BINDING);
    html(StatusCode::OK, login_page(&csrf, None))
}

/// The TCP peer's address (never a header: a client could claim any).
fn peer_address(request: &Request) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|axum::extract::ConnectInfo(addr)| addr.ip())
}

/// The sign-in form again, 429 with `Retry-After`: this address failed too
/// often.
fn throttled(console: &Console, wait: std::time::Duration) -> Response {
    let seconds = wait.as_secs().max(1);
    let code = crate::error::ErrorCode::TooManySignIns;
    tracing::warn!(%code, retry_after_s = seconds, "console sign-in refused: too many failed sign-ins from this address");
    let csrf = console.csrf.issue(LOGIN_BINDING);
    let message = format!("Too many failed sign-ins from this address; try again in {seconds} s.");
    let mut response = html(status_of(code), login_page(&csrf, Some(&message)));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// `POST /console/login`: a known key signs in (cookie, then the sessions
/// page); a wrong one gets the form again with 401 and no cookie; an address
/// with too many failures gets it with 429 and `Retry-After`.
pub async fn login(
    State(state): State<AppState>,
    Extension(console): Extension<Arc<Console>>,
    request: Request,
) -> ConsoleResult {
    let secure = over_tls(request.headers(), request.uri());
    let peer = peer_address(&request);
    let now = std::time::Instant::now();
    // Every attempt counts as failed until it signs in: checked and counted
    // in one step, before the form is read.
    if let Some(wait) = peer.and_then(|peer| console.throttle.reserve(peer, now)) {
        return Ok(throttled(&console, wait));
    }
    // The browser's cookie is about to be replaced: the sign-in it names
    // ends too, rather than staying valid unseen until it expires.
    let replaced = cookie_value(request.headers()).and_then(|value| console.sessions.get(&value));
    let fields = read_form(request, &state, &console, LOGIN_BINDING).await?;
    let key = fields.get("api_key").unwrap_or("").trim();
    let account = if key.is_empty() {
        None
    } else {
        state.runtime.store.account_by_api_key(key).await?
    };
    let Some(account) = account else {
        tracing::info!("console sign-in refused: unknown API key");
        let csrf = console.csrf.issue(LOGIN_BINDING);
        return Ok(html(
            StatusCode::UNAUTHORIZED,
            login_page(&csrf, Some("That API key is not valid.")),
        ));
    };
    if let Some(peer) = peer {
        console.throttle.refund(peer);
    }
    tracing::info!(account = %account.id, "console sign-in");
    if let Some(replaced) = replaced {
        console.sessions.end(&replaced.key);
    }
    let value = console.sessions.create(account);
    let max_age = time::Duration::seconds(SESSION_TTL.as_secs() as i64);
    let mut response = Redirect::to("/console/sessions").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session_cookie(value, secure, max_age));
    Ok(response)
}

/// `POST /console/logout`: ends the console session and clears the cookie.
pub async fn logout(post: ConsolePost) -> Response {
    post.console.sessions.end(&post.signed_in.session.key);
    let mut response = Redirect::to("/console/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(String::new(), post.secure, time::Duration::ZERO),
    );
    response
}
