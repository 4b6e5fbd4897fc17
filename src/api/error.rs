//! The HTTP error: one envelope `{"error":{"code","message"}}` for every failure,
//! its code from the error-code table (`crate::error::ErrorCode`), which also
//! fixes its status.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::error::{Error, ErrorCode};

/// How long a client should wait before retrying a `shutting_down` refusal
/// (a restarting server is usually back within this).
const SHUTDOWN_RETRY_AFTER_SECONDS: u32 = 5;

/// An error as the client sees it: a status, a stable code and a readable message,
/// optionally with extra fields inside the `error` object.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    pub extra: Map<String, Value>,
}

impl ApiError {
    /// An error with `code`, answered with the code's status from the table.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(code.status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationError, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorCode::PayloadTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    /// The same error answered with another status, where a contract says so
    /// (the runtime tools API answers schema errors with 422).
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn with_extra(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        match err {
            Error::ReplayConfirmationRequired {
                ref blocking_executions,
                ..
            } => {
                let blocking = blocking_executions.clone();
                Self::new(err.code(), err.to_string()).with_extra("blocking_executions", blocking)
            }
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                Self::new(
                    ErrorCode::InternalError,
                    "the server failed to handle this request; the cause is in its log",
                )
            }
            other => Self::new(other.code(), other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        error.extend(self.extra);
        let mut response = (self.status, Json(json!({ "error": error }))).into_response();
        if self.code == ErrorCode::ShuttingDown {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(SHUTDOWN_RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

/// The error envelope as documented in the OpenAPI document.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// `code` is stable and machine-readable (one of the error-code table);
/// `message` is for people.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

/// The error-code table as the OpenAPI document describes it: every code with
/// its status and meaning, in the `ErrorCode` schema's description.
pub fn error_code_table_markdown() -> String {
    let mut table = String::from("| code | status | meaning |\n|---|---|---|\n");
    for code in ErrorCode::ALL {
        table.push_str(&format!(
            "| `{}` | {} | {} |\n",
            code.as_str(),
            code.status(),
            code.meaning()
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_answer_500_without_their_cause() {
        let cause = anyhow::anyhow!("disk I/O error at /secret/path/toolgate.db");
        let api = ApiError::from(Error::Internal(cause.context("inserting a row")));
        assert_eq!(api.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(api.code, ErrorCode::InternalError);
        assert!(!api.message.contains("secret"), "{}", api.message);
        assert!(!api.message.contains("inserting"), "{}", api.message);
    }

    #[test]
    fn domain_codes_keep_their_status() {
        let cases = [
            (Error::validation("x"), StatusCode::BAD_REQUEST),
            (Error::not_found("session"), StatusCode::NOT_FOUND),
            (
                Error::refused(ErrorCode::CharacterConflict, "dup"),
                StatusCode::CONFLICT,
            ),
            (
                Error::refused(ErrorCode::ToolScriptHandlerDisabled, "off"),
                StatusCode::FORBIDDEN,
            ),
            (
                Error::refused(ErrorCode::ShuttingDown, "bye"),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ];
        for (error, status) in cases {
            let code = error.code();
            let api = ApiError::from(error);
            assert_eq!((api.status, api.code), (status, code));
        }
    }

    #[test]
    fn shutting_down_says_when_to_retry() {
        let response = ApiError::new(ErrorCode::ShuttingDown, "bye").into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    }
}
