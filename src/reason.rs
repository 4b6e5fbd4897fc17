//! The one table of execution reason codes: why a tool call did not succeed, as
//! a stable word an operator or a client can act on without reading messages.
//! Every failed call result and journal row carries one
//! (`execution_reason_code`, null on success); a new failure path adds its code
//! to the table, never a literal.
//!
//! Refusals written by the dispatcher reuse the words of the matching
//! [`crate::error::ErrorCode`] where one exists; provider outcomes are named
//! after their provider (`remote_*`, `script_*`, `builtin_*`, `mcp_*`).

macro_rules! reason_codes {
    ($($variant:ident => ($text:literal, $meaning:literal),)+) => {
        /// Every stable reason a tool call did not succeed. The OpenAPI
        /// document carries the whole table in the schema's description.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash,
            serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        #[serde(rename_all = "snake_case")]
        #[schema(description = concat!(
            "Why a tool call did not succeed: `execution_reason_code` on call results and journal rows, null on success. The table:\n\n",
            $("- `", $text, "`: ", $meaning, "\n",)+
        ))]
        pub enum ReasonCode {
            $(#[doc = $meaning] $variant,)+
        }

        impl ReasonCode {
            /// The whole table, in order.
            pub const ALL: &'static [ReasonCode] = &[$(ReasonCode::$variant),+];

            /// The code as clients and the journal see it.
            pub fn as_str(self) -> &'static str {
                match self { $(ReasonCode::$variant => $text),+ }
            }

            /// What the code means, in one line.
            pub fn meaning(self) -> &'static str {
                match self { $(ReasonCode::$variant => $meaning),+ }
            }
        }
    };
}

reason_codes! {
    // Refusals by the dispatcher (nothing was run).
    ToolNotFound => ("tool_not_found", "The name is not in the session's catalog (denied)."),
    ToolNameConflict => ("tool_name_conflict", "Several providers offer the name, so none is called (denied)."),
    ToolUnavailable => ("tool_unavailable", "The catalog lists the tool as unavailable; the message gives its availability_reason (denied)."),
    PermissionToolsDisabled => ("permission_tools_disabled", "The session's tool permissions have enabled = false (denied)."),
    PermissionSlotNotAllowedByTool => ("permission_slot_not_allowed_by_tool", "The tool's allowed_slots do not include the caller's slot (denied)."),
    PermissionSlotNotOnAllowList => ("permission_slot_not_on_allow_list", "The caller's slot has an allow list without the tool (denied)."),
    PermissionSlotOnDenyList => ("permission_slot_on_deny_list", "The tool is on the caller's slot deny list (denied)."),
    PermissionIrreversibleNotAllowed => ("permission_irreversible_not_allowed", "The tool is irreversible and the session has allow_irreversible = false (denied)."),
    PermissionMaxCallsPerTurnExceeded => ("permission_max_calls_per_turn_exceeded", "The run (or the floor outside runs) has used its max_calls_per_turn (denied)."),
    PermissionMaxStepsPerGenerationExceeded => ("permission_max_steps_per_generation_exceeded", "The call would open a step past max_steps_per_generation (blocked)."),
    ValidationError => ("validation_error", "The arguments are not a JSON object or do not satisfy the tool's schema; the model can fix them (error, never started)."),
    ArgumentValidationTimeout => ("argument_validation_timeout", "Validating the arguments took longer than --argument-validation-timeout-ms (error, never started)."),
    InternalError => ("internal_error", "The server failed before running the call; the cause is in its log (error, never started)."),
    ToolReplayConfirmationRequired => ("tool_replay_confirmation_required", "The call repeats a non-replay-safe execution of an earlier attempt that was not confirmed (blocked, commit_outcome replay_blocked)."),

    // Remote callbacks (/api/tools registrations).
    RemoteConnectionFailed => ("remote_connection_failed", "The callback could not be reached (connection refused, connect timeout); it never received the call, and the failure counts toward plugin eviction."),
    RemotePluginEvicted => ("remote_plugin_evicted", "The callback could not be reached, and this was the consecutive connection failure that unregistered the plugin's tools at its origin."),
    RemoteTimeout => ("remote_timeout", "A callback without side effects did not answer within its timeout_seconds (timeout)."),
    RemoteTimeoutUncertain => ("remote_timeout_uncertain", "A side-effecting callback did not answer within its timeout_seconds; it may have acted (uncertain, never retried)."),
    RemoteHttpError => ("remote_http_error", "The callback answered with an HTTP 4xx or 5xx status."),
    RemoteRedirectRefused => ("remote_redirect_refused", "The callback answered with a redirect, which is never followed."),
    RemoteResponseTooLarge => ("remote_response_too_large", "The callback's response was over --callback-response-limit-bytes and was discarded."),
    RemoteResponseInterrupted => ("remote_response_interrupted", "The callback's response broke off while it was being read."),
    RemoteRequestFailed => ("remote_request_failed", "The callback request failed after the connection was made and before any answer (e.g. the connection was dropped)."),
    RemoteToolError => ("remote_tool_error", "The callback answered is_error: true; its error is the output."),
    RemoteInvalidAnswer => ("remote_invalid_answer", "The callback answered a JSON object whose is_error is neither a boolean nor null; the answer is refused, as neither a success nor the tool's own error."),

    // Script handlers (tool definitions).
    ScriptHandlerDisabled => ("script_handler_disabled", "Script handlers are off on this server (ENABLE_UNSAFE_SCRIPT_HANDLER is not true); never started."),
    ScriptHandlerMissing => ("script_handler_missing", "The definition has no handler, so there is nothing to run; never started."),
    ScriptSandboxBusy => ("script_sandbox_busy", "Every script slot stayed busy for the queue wait; never started, the message says when to retry."),
    ScriptThrew => ("script_threw", "The script threw (syntax errors and missing host APIs included)."),
    ScriptPromiseRejected => ("script_promise_rejected", "The promise the script returned was rejected."),
    ScriptNeverSettled => ("script_never_settled", "The promise the script returned could never settle."),
    ScriptTimeLimit => ("script_time_limit", "The script ran past --script-timeout-ms and was interrupted (timeout, or uncertain for a side-effecting tool)."),
    ScriptMemoryLimit => ("script_memory_limit", "The script exceeded --script-memory-limit-bytes and was stopped."),
    ScriptStackLimit => ("script_stack_limit", "The script exceeded its stack limit (recursion too deep) and was stopped."),
    ScriptOutputLimit => ("script_output_limit", "The script's result was over the output limit as JSON."),
    ScriptResultNotSerializable => ("script_result_not_serializable", "The script's result has no JSON form (undefined, a function, a cycle, a BigInt, …)."),
    ScriptInvalid => ("script_invalid", "The script body does not form a function."),
    ScriptEngineError => ("script_engine_error", "The script engine itself failed; the cause is in the server log."),

    // Builtin tools.
    BuiltinInvalidArguments => ("builtin_invalid_arguments", "The builtin refused its arguments on its own check."),
    BuiltinToolError => ("builtin_tool_error", "The builtin answered an error the model can act on (e.g. bad dice, a missing resource)."),
    BuiltinInternalError => ("builtin_internal_error", "The builtin failed because of a server error; the cause is in the server log."),

    // MCP servers.
    McpNotConnected => ("mcp_not_connected", "The MCP server is not connected; the call was not sent."),
    McpConnectionReconnectRequired => ("mcp_connection_reconnect_required", "The MCP server's connection must be re-established before calls are sent; the call was not sent."),
    McpCallTimeoutUncertain => ("mcp_call_timeout_uncertain", "An MCP tool that is not read-only did not answer within call_timeout_ms; it may have acted (uncertain, never retried)."),
    McpCallTimeout => ("mcp_call_timeout", "A read-only MCP tool did not answer within call_timeout_ms (timeout)."),
    McpRemoteError => ("mcp_remote_error", "The MCP server answered the call with isError; its text is the output."),
    McpTransportError => ("mcp_transport_error", "The MCP connection failed while the call was in flight."),
    McpProviderError => ("mcp_provider_error", "toolgate's MCP client failed to make the call or read its answer (protocol or internal failure)."),
    McpServerUnavailable => ("mcp_server_unavailable", "The MCP server is disabled, deleted or not attached to this runtime."),
    McpInvalidProviderId => ("mcp_invalid_provider_id", "The tool's provider id does not name an MCP server of the account."),

    // Runtime jobs (deferred calls).
    JobRunDiscarded => ("job_run_discarded", "The run was discarded before its deferred call started; the job was cancelled and never ran (blocked)."),
    JobLeaseLost => ("job_lease_lost", "The worker running the job lost its lease (or the server stopped); its outcome is unknown and, as its tool is not replay-safe (or it used its 3 hand-overs), it is never re-run (uncertain)."),
    ApprovalRejected => ("approval_rejected", "An operator rejected the call that awaited approval; it never ran (denied; the message carries their reason)."),
    ApprovalTimeout => ("approval_timeout", "Nobody decided the call within approval_timeout_seconds; it never ran (denied)."),
    ApprovalCancelled => ("approval_cancelled", "The run was committed or discarded while the call awaited approval; it never ran (blocked)."),
    ApprovalUnavailable => ("approval_unavailable", "The call needs approval, but its tool cannot be held for it (only callbacks and MCP tools can); it never ran (denied)."),
    JobInvocationUnreadable => ("job_invocation_unreadable", "The job's stored invocation could not be read; never started."),
    JobProviderMissing => ("job_provider_missing", "No provider of the job's kind exists on this server; never started."),
    JobSnapshotInvalid => ("job_snapshot_invalid", "The provider could not rebuild the tool from the job's snapshot; never started."),
    JobSessionGone => ("job_session_gone", "The job's session no longer exists; never started."),

    // Start-up.
    InterruptedByRestart => ("interrupted_by_restart", "The server stopped while the call was running (crash or kill); at start-up its outcome is unknown (uncertain)."),
    InstanceLost => ("instance_lost", "The instance running the call renewed no heartbeat for 10 s (killed, or paused) and another instance on the shared database settled the call: its outcome is unknown (uncertain). An instance that was only paused may still finish the call; the journal keeps uncertain."),
}

impl ReasonCode {
    /// The code whose wire word is `text`, if any (rows written by a newer
    /// version may carry codes this one does not know).
    pub fn parse(text: &str) -> Option<ReasonCode> {
        ReasonCode::ALL
            .iter()
            .copied()
            .find(|code| code.as_str() == text)
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_snake_case(text: &str) -> bool {
        !text.is_empty()
            && text.starts_with(|c: char| c.is_ascii_lowercase())
            && !text.ends_with('_')
            && !text.contains("__")
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }

    #[test]
    fn every_wire_word_is_unique_and_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for code in ReasonCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} twice");
            assert!(is_snake_case(text), "{text} is not snake_case");
            assert!(!code.meaning().is_empty(), "{text} has no meaning");
        }
    }

    #[test]
    fn serde_and_the_table_agree() {
        for code in ReasonCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str(), "{code:?}");
            let back: ReasonCode = serde_json::from_value(json).unwrap();
            assert_eq!(back, *code);
            assert_eq!(ReasonCode::parse(code.as_str()), Some(*code));
        }
        assert_eq!(ReasonCode::parse("exploded"), None);
        assert!(serde_json::from_value::<ReasonCode>("exploded".into()).is_err());
    }

    #[test]
    fn the_snake_case_check_refuses_what_it_should() {
        for bad in [
            "",
            "Camel",
            "trailing_",
            "double__under",
            "_lead",
            "with-dash",
        ] {
            assert!(!is_snake_case(bad), "{bad:?}");
        }
        assert!(is_snake_case("mcp_call_timeout"));
    }

    #[test]
    fn refusals_reuse_the_error_code_words() {
        use crate::error::ErrorCode;
        for (reason, error) in [
            (ReasonCode::ValidationError, ErrorCode::ValidationError),
            (ReasonCode::InternalError, ErrorCode::InternalError),
            (
                ReasonCode::ToolReplayConfirmationRequired,
                ErrorCode::ToolReplayConfirmationRequired,
            ),
        ] {
            assert_eq!(reason.as_str(), error.as_str());
        }
    }

    #[test]
    fn the_mcp_codes_exist() {
        for text in [
            "mcp_not_connected",
            "mcp_connection_reconnect_required",
            "mcp_call_timeout_uncertain",
            "mcp_call_timeout",
            "mcp_remote_error",
            "mcp_transport_error",
            "mcp_provider_error",
            "mcp_server_unavailable",
            "mcp_invalid_provider_id",
        ] {
            assert!(ReasonCode::parse(text).is_some(), "{text}");
        }
    }
}
