//! toolgate's vocabulary in MCP's: a catalog entry as an MCP tool (its
//! annotations derived from the tool's metadata), a call result as a
//! `tools/call` result, a domain error as a JSON-RPC error.

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, Tool, ToolAnnotations};
use serde_json::{Value, json};

use crate::call::ToolCallResult;
use crate::catalog::CatalogEntry;
use crate::domain::tool::SideEffectLevel;
use crate::error::Error;

/// The entry as MCP lists it. `readOnlyHint` for a tool without side
/// effects, `destructiveHint` for an irreversible one; `idempotentHint` when
/// repeating it is safe (its replay safety).
pub fn tool(entry: &CatalogEntry) -> Tool {
    let spec = &entry.spec;
    let schema = spec.validator.object_form(&spec.parameters);
    let level = spec.metadata.side_effect_level;
    let annotations = ToolAnnotations::new()
        .read_only(level == SideEffectLevel::None)
        .destructive(level == SideEffectLevel::Irreversible)
        .idempotent(spec.metadata.replay_safety == crate::domain::tool::ReplaySafety::Safe);
    Tool::new(spec.name.clone(), spec.description.clone(), schema).with_annotations(annotations)
}

/// The call's result as MCP answers it. A refusal or failure is an
/// `isError` result whose text says why (the model reads it, as it reads the
/// output of `POST /sessions/{id}/tool-calls`); `_meta` names the journal
/// row, its status and reason code.
pub fn call_result(result: &ToolCallResult) -> CallToolResult {
    let text = match &result.output {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let mut answer = if result.is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else if result.output.is_object() {
        let mut answer = CallToolResult::structured(result.output.clone());
        answer.content = vec![ContentBlock::text(text)];
        answer
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    let meta = json!({
        "toolgate/execution_id": result.execution_id,
        "toolgate/status": result.status,
        "toolgate/execution_reason_code": result.execution_reason_code,
    });
    if let Value::Object(meta) = meta {
        answer.meta = Some(rmcp::model::MetaObject(meta));
    }
    answer
}

/// A domain error as a JSON-RPC error: the caller's mistakes are invalid
/// requests with the message; a server failure says only that (its cause is
/// logged here, never sent).
pub fn mcp_error(error: Error) -> McpError {
    match error {
        Error::Internal(cause) => {
            tracing::error!(error = %cause, "an MCP request failed");
            McpError::internal_error("the server failed; the cause is in its log", None)
        }
        other => McpError::invalid_request(
            other.to_string(),
            Some(json!({"code": other.code().as_str()})),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::ExecutionStatus;
    use crate::reason::ReasonCode;

    fn result(output: Value, is_error: bool) -> ToolCallResult {
        ToolCallResult {
            call_id: "c".into(),
            name: "t".into(),
            output,
            is_error,
            status: if is_error {
                ExecutionStatus::Denied
            } else {
                ExecutionStatus::Success
            },
            execution_reason_code: is_error.then_some(ReasonCode::PermissionSlotOnDenyList),
            execution_id: "tool_exec_1".into(),
            provider_type: None,
        }
    }

    #[test]
    fn refusals_are_error_results_with_the_reason_in_text() {
        let answer = call_result(&result(json!("denied because"), true));
        assert_eq!(answer.is_error, Some(true));
        assert_eq!(answer.content[0].as_text().unwrap().text, "denied because");
        let meta = answer.meta.unwrap();
        assert_eq!(meta.0["toolgate/status"], "denied");
        assert_eq!(meta.0["toolgate/execution_id"], "tool_exec_1");
    }

    #[test]
    fn every_listing_of_a_tool_shares_one_copy_of_its_schema() {
        use crate::domain::tool::ToolMetadata;
        let metadata = ToolMetadata::declared(SideEffectLevel::None, vec![], None);
        let entry = crate::catalog::testing::entry("t", "p", metadata);
        // Another catalog's entry of the same tool: a copy of the spec.
        let again = CatalogEntry::available((*entry.spec).clone(), entry.handler.clone());
        let (first, second) = (tool(&entry), tool(&again));
        assert_eq!(
            *first.input_schema,
            entry.spec.parameters.as_object().unwrap().clone()
        );
        assert!(std::sync::Arc::ptr_eq(
            &first.input_schema,
            &second.input_schema
        ));
    }

    #[test]
    fn object_outputs_are_structured_and_text() {
        let answer = call_result(&result(json!({"a": 1}), false));
        assert_eq!(answer.is_error, Some(false));
        assert_eq!(answer.structured_content, Some(json!({"a": 1})));
        assert_eq!(answer.content[0].as_text().unwrap().text, r#"{"a":1}"#);
    }
}
