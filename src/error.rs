//! The domain error: every failure below the HTTP layer is one of these, each with a
//! stable machine-readable code. The API layer maps them to status codes.

use std::fmt;

/// A failure in the domain or storage layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller sent something that does not satisfy the contract.
    #[error("{0}")]
    Validation(String),
    /// The named thing does not exist (or belongs to another account: the two are
    /// deliberately indistinguishable).
    #[error("{0}")]
    NotFound(String),
    /// A uniqueness rule was violated; `code` names which (e.g. `character_conflict`).
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// The caller is authenticated but not allowed to do this; `code` names the rule.
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    /// The server cannot do this now but may soon (e.g. it is shutting down);
    /// `retry_after_seconds` is when the caller should try again.
    #[error("{message}")]
    Unavailable {
        code: &'static str,
        message: String,
        retry_after_seconds: u64,
    },
    /// Opening a run would repeat executions that are not replay-safe; the client
    /// must confirm them (`confirmed_execution_ids`).
    #[error("regenerating this floor would repeat {} tool execution(s) that are not replay-safe; resend with confirmed_execution_ids listing them", .0.len())]
    ReplayConfirmationRequired(Vec<crate::store::BlockingExecution>),
    /// Something the caller cannot fix went wrong; the cause is logged, never shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn validation(message: impl fmt::Display) -> Self {
        Error::Validation(message.to_string())
    }

    pub fn not_found(what: impl fmt::Display) -> Self {
        Error::NotFound(format!("{what} not found"))
    }

    /// The stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Validation(_) => "validation_error",
            Error::NotFound(_) => "not_found",
            Error::Conflict { code, .. }
            | Error::Forbidden { code, .. }
            | Error::Unavailable { code, .. } => code,
            Error::ReplayConfirmationRequired(_) => "tool_replay_confirmation_required",
            Error::Internal(_) => "internal_error",
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        Error::Internal(anyhow::Error::new(err).context("database operation failed"))
    }
}

/// Shorthand for results in the domain and storage layers.
pub type Result<T, E = Error> = std::result::Result<T, E>;
