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

/// What a form did, as the page it redirects to says it. The redirect names
/// it by code; a page shows only these lines, never text taken from its URL
/// (a link could otherwise make a trusted page say anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    DefinitionCreated,
    DefinitionSaved,
    DefinitionEnabled,
    DefinitionDisabled,
    RunOpened,
    RunCommitted,
    RunDiscarded,
    PermissionsSaved,
}

impl Notice {
    const ALL: [Notice; 8] = [
        Notice::DefinitionCreated,
        Notice::DefinitionSaved,
        Notice::DefinitionEnabled,
        Notice::DefinitionDisabled,
        Notice::RunOpened,
        Notice::RunCommitted,
        Notice::RunDiscarded,
        Notice::PermissionsSaved,
    ];

    /// The code the redirect's `notice` parameter carries.
    pub fn code(self) -> &'static str {
        match self {
            Notice::DefinitionCreated => "definition_created",
            Notice::DefinitionSaved => "definition_saved",
            Notice::DefinitionEnabled => "definition_enabled",
            Notice::DefinitionDisabled => "definition_disabled",
            Notice::RunOpened => "run_opened",
            Notice::RunCommitted => "run_committed",
            Notice::RunDiscarded => "run_discarded",
            Notice::PermissionsSaved => "permissions_saved",
        }
    }

    /// The line the page shows.
    pub fn text(self) -> &'static str {
        match self {
            Notice::DefinitionCreated => "definition created",
            Notice::DefinitionSaved => "definition saved",
            Notice::DefinitionEnabled => "definition enabled",
            Notice::DefinitionDisabled => "definition disabled",
            Notice::RunOpened => "run opened",
            Notice::RunCommitted => "run committed",
            Notice::RunDiscarded => "run discarded",
            Notice::PermissionsSaved => "permissions saved",
        }
    }

    /// The line of a `notice` parameter: none for a code not in the list.
    pub fn text_of(code: Option<&str>) -> Option<&'static str> {
        let code = code?;
        Self::ALL
            .into_iter()
            .find(|notice| notice.code() == code)
            .map(Notice::text)
    }
}

/// After a form did what it asked: back to `path`, with a line saying what
/// happened.
pub fn redirect_with_notice(path: &str, notice: Notice) -> Response {
    Redirect::to(&format!("{path}?notice={}", notice.code())).into_response()
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

/// Query of a page with a journal listing: how far in, and what a form did.
#[derive(Debug, Default, serde::Deserialize)]
pub struct JournalPageQuery {
    #[serde(default)]
    pub offset: i64,
    pub notice: Option<String>,
}

/// A console handler's result.
pub type ConsoleResult<T = Response> = Result<T, ConsoleError>;
