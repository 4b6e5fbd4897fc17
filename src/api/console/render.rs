//! Console answers: an HTML page with its status, and the error page every
//! refusal renders (the same statuses as the API's error-code table).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};

use crate::console::views::{Nav, error_page};
use crate::error::{Error, ErrorCode};

/// A rendered page.
pub fn html(status: StatusCode, html: String) -> Response {
    (status, Html(html)).into_response()
}

/// The HTTP status of an error code (the one table says it).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// After a form did what it asked: back to `path`, with a line saying what
/// happened.
pub fn redirect_with_notice(path: &str, notice: &str) -> Response {
    let notice: String = form_urlencoded::byte_serialize(notice.as_bytes()).collect();
    Redirect::to(&format!("{path}?notice={notice}")).into_response()
}

/// Why a console request was not answered with its page.
#[derive(Debug)]
pub enum ConsoleError {
    /// Not signed in (or the sign-in expired): go to the sign-in page.
    SignIn,
    /// A refusal shown as a page; `nav` when the viewer is signed in.
    Page {
        code: ErrorCode,
        message: String,
        nav: Option<Nav>,
    },
}

impl ConsoleError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ConsoleError::Page {
            code,
            message: message.into(),
            nav: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    /// The same error shown with the signed-in navigation.
    pub fn with_nav(self, with: &Nav) -> Self {
        match self {
            ConsoleError::Page { code, message, .. } => ConsoleError::Page {
                code,
                message,
                nav: Some(with.clone()),
            },
            other => other,
        }
    }
}

impl From<Error> for ConsoleError {
    fn from(err: Error) -> Self {
        let code = err.code();
        let message = if code == ErrorCode::InternalError {
            tracing::error!(error = ?err, "console request failed");
            "the server failed to handle this request; the cause is in its log".to_owned()
        } else {
            err.to_string()
        };
        Self::new(code, message)
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        match self {
            ConsoleError::SignIn => Redirect::to("/console/login").into_response(),
            ConsoleError::Page { code, message, nav } => {
                let status = status_of(code);
                html(
                    status,
                    error_page(nav.as_ref(), code.status(), code.as_str(), &message),
                )
            }
        }
    }
}

/// Query of a page that a form redirected to: what the form did.
#[derive(Debug, Default, serde::Deserialize)]
pub struct NoticeQuery {
    pub notice: Option<String>,
}

/// A console handler's result.
pub type ConsoleResult<T = Response> = Result<T, ConsoleError>;
