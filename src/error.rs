//! The domain error and the one table of error codes. Every failure below the
//! HTTP layer is an [`Error`]; every error the API answers carries an
//! [`ErrorCode`] from the table, whose entry fixes its HTTP status and says what
//! it means. A new code is added to the table, never written as a literal.

use std::fmt;

macro_rules! error_codes {
    ($($variant:ident => ($text:literal, $status:literal, $meaning:literal),)+) => {
        /// Every stable, machine-readable error code the API answers with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $(#[doc = $meaning] $variant,)+
        }

        impl ErrorCode {
            /// The whole table, in order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),+];

            /// The code as clients see it.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $text),+ }
            }

            /// The HTTP status this code is answered with.
            pub fn status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status),+ }
            }

            /// What the code means, in one line.
            pub fn meaning(self) -> &'static str {
                match self { $(ErrorCode::$variant => $meaning),+ }
            }
        }
    };
}

error_codes! {
    ValidationError => ("validation_error", 400, "The request does not satisfy the contract (the message says how); 422 on /api/tools, as its contract says."),
    Unauthorized => ("unauthorized", 401, "No valid API key was given."),
    Forbidden => ("forbidden", 403, "The caller may not do this (not the admin account, or a browser cross-site or rebinding request to /api/tools)."),
    LoopbackOnly => ("loopback_only", 403, "The runtime tools API accepts loopback TCP peers only."),
    ToolScriptHandlerDisabled => ("tool_script_handler_disabled", 403, "Script handlers are off on this server (ENABLE_UNSAFE_SCRIPT_HANDLER is not true)."),
    NotFound => ("not_found", 404, "The thing does not exist, or belongs to another account."),
    MethodNotAllowed => ("method_not_allowed", 405, "The route does not accept that method."),
    RequestTimeout => ("request_timeout", 408, "The request took longer than the server allows."),
    AccountConflict => ("account_conflict", 409, "An account with that API key exists (account names need not be unique)."),
    CharacterConflict => ("character_conflict", 409, "A character with that name exists in the account."),
    ToolDefinitionConflict => ("tool_definition_conflict", 409, "A definition with that identity (source, source_id, name) exists in the account."),
    McpServerConflict => ("mcp_server_conflict", 409, "An MCP server with that name exists in the account."),
    McpServerDisabled => ("mcp_server_disabled", 409, "The MCP server is disabled; enable it (PATCH /mcp/servers/{id}/toggle) before connecting it or listing its tools."),
    McpRuntimeNotAttached => ("mcp_runtime_not_attached", 409, "The MCP server is enabled but not attached to the MCP runtime (not loaded yet, or its configuration cannot be used); its status says why."),
    RunNotOpen => ("run_not_open", 409, "The run was committed or discarded; open a new run."),
    ApprovalNotPending => ("approval_not_pending", 409, "The execution is not awaiting approval (already decided, timed out, cancelled, or never needed one); nothing was changed."),
    ToolReplayConfirmationRequired => ("tool_replay_confirmation_required", 409, "Regenerating would repeat executions that are not replay-safe; resend with confirmed_execution_ids."),
    LimitExceeded => ("limit_exceeded", 409, "Holding one more would pass a server limit (the message names it and its value, e.g. max_runtime_tools); the same request succeeds once some are removed."),
    TooManySignIns => ("too_many_sign_ins", 429, "Too many failed console sign-ins from this address; the console refuses its sign-ins until the Retry-After delay has passed."),
    PayloadTooLarge => ("payload_too_large", 413, "The request body is over the server's limit."),
    InternalError => ("internal_error", 500, "The server failed; the cause is in its log, never in the answer."),
    McpRuntimeUnavailable => ("mcp_runtime_unavailable", 503, "The MCP runtime knows the server but cannot reach it now (connecting, disconnected or failing); retry later, or read its status."),
    ShuttingDown => ("shutting_down", 503, "The server is shutting down; retry after the Retry-After delay, on its successor."),
    GenerationInProgress => ("generation_in_progress", 409, "The session's previous turn is still generating; wait for run_finished or cancel the run."),
    NotReady => ("not_ready", 503, "The server is up but not ready: its database does not answer or its job worker is not running (the message says which); /readyz answers 200 again once both hold."),
    PermissionsChanged => ("permissions_changed", 409, "The session's permissions changed after the console's form was drawn; nothing was saved: reload the page and save again."),
    McpSelfConnection => ("mcp_self_connection", 508, "The MCP client is this toolgate deployment itself (an MCP server configured with the deployment's own /mcp/sessions endpoint): its tools would feed its own catalog, so the request is refused."),
    ModelNotConfigured => ("model_not_configured", 503, "No model endpoint is configured (TOOLGATE_LLM_BASE_URL, TOOLGATE_LLM_MODEL); the floor is stored without a run."),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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
    /// A rule of the table refused the request (a conflict, a switch that is
    /// off, a closed run, a server shutting down).
    #[error("{message}")]
    Refused { code: ErrorCode, message: String },
    /// Opening a run would repeat executions that are not replay-safe; the client
    /// must confirm them (`confirmed_execution_ids`). `blocking_executions` is
    /// the list the client is shown.
    #[error(
        "regenerating this floor would repeat {count} tool execution(s) that are not replay-safe; resend with confirmed_execution_ids listing them"
    )]
    ReplayConfirmationRequired {
        count: usize,
        blocking_executions: serde_json::Value,
    },
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

    /// A refusal with `code` from the table.
    pub fn refused(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Refused {
            code,
            message: message.into(),
        }
    }

    /// The code of this error in the table.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Validation(_) => ErrorCode::ValidationError,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::Refused { code, .. } => *code,
            Error::ReplayConfirmationRequired { .. } => ErrorCode::ToolReplayConfirmationRequired,
            Error::Internal(_) => ErrorCode::InternalError,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            let serialized = serde_json::to_value(code).unwrap();
            assert_eq!(serialized, code.as_str());
            assert!((400..600).contains(&code.status()), "{code}");
            assert!(!code.meaning().is_empty());
        }
        assert_eq!(ErrorCode::ShuttingDown.status(), 503);
    }
}
