//! The HTTP error: one envelope `{"error":{"code","message"}}` for every failure.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::error::Error;

/// An error as the client sees it: a status, a stable code and a readable message,
/// optionally with extra fields inside the `error` object.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub extra: Map<String, Value>,
    /// Sent as `Retry-After` when the client should come back later.
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
            retry_after_seconds: None,
        }
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "validation_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn with_extra(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_owned(), value);
        self
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let status = match &err {
            Error::Validation(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Conflict { .. } => StatusCode::CONFLICT,
            Error::Forbidden { .. } => StatusCode::FORBIDDEN,
            Error::Unavailable {
                retry_after_seconds,
                ..
            } => {
                let mut api =
                    Self::new(StatusCode::SERVICE_UNAVAILABLE, err.code(), err.to_string());
                api.retry_after_seconds = Some(*retry_after_seconds);
                return api;
            }
            Error::ReplayConfirmationRequired(blocking) => {
                let blocking = serde_json::to_value(blocking).unwrap_or_default();
                return Self::new(StatusCode::CONFLICT, err.code(), err.to_string())
                    .with_extra("blocking_executions", blocking);
            }
            Error::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "internal error");
                return Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the server failed to handle this request; the cause is in its log",
                );
            }
        };
        Self::new(status, err.code(), err.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code));
        error.insert("message".into(), json!(self.message));
        error.extend(self.extra);
        let mut response = (self.status, Json(json!({ "error": error }))).into_response();
        if let Some(seconds) = self.retry_after_seconds {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
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

/// `code` is stable and machine-readable; `message` is for people.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_answer_500_without_their_cause() {
        let cause = anyhow::anyhow!("disk I/O error at /secret/path/toolgate.db");
        let api = ApiError::from(Error::Internal(cause.context("inserting a row")));
        assert_eq!(api.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(api.code, "internal_error");
        assert!(!api.message.contains("secret"), "{}", api.message);
        assert!(!api.message.contains("inserting"), "{}", api.message);
    }

    #[test]
    fn domain_codes_keep_their_status() {
        let cases = [
            (
                Error::validation("x"),
                StatusCode::BAD_REQUEST,
                "validation_error",
            ),
            (
                Error::not_found("session"),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                Error::Conflict {
                    code: "character_conflict",
                    message: "dup".into(),
                },
                StatusCode::CONFLICT,
                "character_conflict",
            ),
            (
                Error::Forbidden {
                    code: "tool_script_handler_disabled",
                    message: "off".into(),
                },
                StatusCode::FORBIDDEN,
                "tool_script_handler_disabled",
            ),
        ];
        for (error, status, code) in cases {
            let api = ApiError::from(error);
            assert_eq!((api.status, api.code), (status, code));
        }
    }

    #[test]
    fn unavailable_is_503_with_retry_after() {
        let api = ApiError::from(Error::Unavailable {
            code: "shutting_down",
            message: "bye".into(),
            retry_after_seconds: 5,
        });
        assert_eq!(
            (api.status, api.code),
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
        );
        let response = api.into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    }
}
