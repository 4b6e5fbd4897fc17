//! An MCP message read and checked before rmcp sees it.
//!
//! rmcp answers a body it cannot read as a message with HTTP 415 and a line
//! of plain text, and a standard request whose `params` do not fit (say
//! `tools/call` with `"params": null`) with JSON-RPC -32601, "method not
//! found". A client then cannot tell its own mistake from a missing
//! feature. Here the JSON-RPC 2.0 codes are given instead:
//! - not JSON: HTTP 400 with a -32700 parse error;
//! - a batch (an array; MCP 2025-06-18 dropped batching) or an object that is
//!   no JSON-RPC message: HTTP 400 with -32600, the request's id when it has
//!   one;
//! - a standard request with `params` that do not fit: -32602 with the
//!   request's id, answered as JSON (a well-formed request gets its error as
//!   a JSON-RPC response, not an HTTP error).
//!
//! The body is read whole here, under the API's size limit and body
//! deadline, before the endpoint takes any lock.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestMethod, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest,
    CompleteRequestMethod, ConstString, ErrorData, GetPromptRequestMethod, InitializeRequestParams,
    InitializeResultMethod, JsonRpcError, JsonRpcMessage, JsonRpcVersion2_0,
    ListPromptsRequestMethod, ListResourceTemplatesRequestMethod, ListResourcesRequestMethod,
    ListToolsRequestMethod, NumberOrString, PingRequestMethod, ReadResourceRequestMethod,
    SetLevelRequestMethod, SubscribeRequestMethod, UnsubscribeRequestMethod,
};
use serde_json::Value;

use super::extract::body_bytes;
use crate::state::AppState;

/// The standard client requests: one of these read as a custom request only
/// because its `params` did not fit.
const STANDARD_REQUESTS: [&str; 13] = [
    InitializeResultMethod::VALUE,
    PingRequestMethod::VALUE,
    CompleteRequestMethod::VALUE,
    SetLevelRequestMethod::VALUE,
    GetPromptRequestMethod::VALUE,
    ListPromptsRequestMethod::VALUE,
    ListResourcesRequestMethod::VALUE,
    ListResourceTemplatesRequestMethod::VALUE,
    ReadResourceRequestMethod::VALUE,
    SubscribeRequestMethod::VALUE,
    UnsubscribeRequestMethod::VALUE,
    CallToolRequestMethod::VALUE,
    ListToolsRequestMethod::VALUE,
];

/// The request, its body read and found to be an MCP message rmcp can take;
/// or the JSON-RPC (or size, or deadline) error that answers it.
///
/// Every body is read here, whatever its method and content type: the
/// endpoint holds a lock while rmcp answers an `initialize`, and rmcp reading
/// a slow body under it would hold up every account's MCP traffic.
pub async fn checked(request: Request, state: &AppState) -> Result<Checked, Response> {
    let (parts, body) = request.into_parts();
    let bytes = body_bytes(Request::from_parts(parts.clone(), body), state)
        .await
        .map_err(IntoResponse::into_response)?;
    let request = Request::from_parts(parts, Body::from(bytes.clone()));
    // A body rmcp will not read as a message gets rmcp's own 415 (or, for
    // streams and ends, no reading at all).
    if request.method() != Method::POST || !declares_json(&request) {
        return Ok(Checked {
            request,
            request_id: None,
        });
    }
    let request_id = message_id(&bytes).map_err(|refusal| *refusal)?;
    Ok(Checked {
        request,
        request_id,
    })
}

/// A request read and checked, and the JSON-RPC id it asks to be answered
/// under (a request's; notifications and responses have none to answer).
pub struct Checked {
    pub request: Request,
    pub request_id: Option<NumberOrString>,
}

/// The answer to a request whose id another request of the same MCP session
/// still in flight uses: rmcp routes answers by id, so the two would get each
/// other's result (or one none at all).
pub fn id_in_flight(id: NumberOrString) -> Response {
    let error = ErrorData::invalid_request(
        "this id is already used by a request of this MCP session that is still in flight: give every request its own id",
        None,
    );
    answer(StatusCode::CONFLICT, Some(id), error)
}

/// Whether the body is declared JSON as rmcp judges it: the media type's
/// essence, compared without regard to case (media types are
/// case-insensitive, and a client may write `Application/JSON`).
fn declares_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case("application/json")
        })
}

/// The id of a message rmcp can take (a request's; None for a notification
/// or a response), or the answer to a body that is no such message.
fn message_id(bytes: &Bytes) -> Result<Option<NumberOrString>, Box<Response>> {
    let message = match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(message) => message,
        Err(_) => return Err(Box::new(unreadable(bytes))),
    };
    let JsonRpcMessage::Request(request) = message else {
        return Ok(None);
    };
    let ClientRequest::CustomRequest(custom) = &request.request else {
        return Ok(Some(request.id));
    };
    if !STANDARD_REQUESTS.contains(&custom.method.as_str()) {
        // Truly unknown: rmcp's "method not found" is the right answer.
        return Ok(Some(request.id));
    }
    let error = ErrorData::invalid_params(
        format!(
            "the params of {} do not fit the MCP schema: {}",
            custom.method,
            params_problem(&custom.method, custom.params.as_ref())
        ),
        None,
    );
    Err(Box::new(answer(StatusCode::OK, Some(request.id), error)))
}

/// Why `params` do not fit `method`, as serde says it for the two requests
/// clients build by hand most.
fn params_problem(method: &str, params: Option<&Value>) -> String {
    let params = params.cloned().unwrap_or(Value::Null);
    let problem = match method {
        CallToolRequestMethod::VALUE => serde_json::from_value::<CallToolRequestParams>(params)
            .err()
            .map(|err| err.to_string()),
        InitializeResultMethod::VALUE => serde_json::from_value::<InitializeRequestParams>(params)
            .err()
            .map(|err| err.to_string()),
        _ => None,
    };
    problem.unwrap_or_else(|| "params must be an object of the method's fields".to_owned())
}

/// A body rmcp could not read as a message: not JSON, a batch, or JSON that
/// is no JSON-RPC message.
fn unreadable(bytes: &Bytes) -> Response {
    let value = match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => value,
        Err(err) => {
            let error = ErrorData::parse_error(format!("the body is not JSON: {err}"), None);
            return answer(StatusCode::BAD_REQUEST, None, error);
        }
    };
    let unreadable_id = value.get("id").is_some_and(|id| {
        !id.is_null() && serde_json::from_value::<NumberOrString>(id.clone()).is_err()
    });
    let error = if value.is_array() {
        ErrorData::invalid_request(
            "a batch (JSON array) of messages is not accepted: send one JSON-RPC message per POST (MCP 2025-06-18)",
            None,
        )
    } else if unreadable_id {
        ErrorData::invalid_request(
            "\"id\" must be a string or an integer from -2^63 to 2^63-1",
            None,
        )
    } else {
        ErrorData::invalid_request(
            "not a JSON-RPC 2.0 request, notification or response: it needs \"jsonrpc\": \"2.0\" and a \"method\" (with an \"id\" for a request) or a \"result\" or \"error\"",
            None,
        )
    };
    let id = value
        .get("id")
        .cloned()
        .and_then(|id| serde_json::from_value::<NumberOrString>(id).ok());
    answer(StatusCode::BAD_REQUEST, id, error)
}

fn answer(status: StatusCode, id: Option<NumberOrString>, error: ErrorData) -> Response {
    let body = JsonRpcError {
        jsonrpc: JsonRpcVersion2_0,
        id,
        error,
    };
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(bytes: &str) -> Option<(StatusCode, i32)> {
        let response = *message_id(&Bytes::from(bytes.to_owned())).err()?;
        let status = response.status();
        let body = futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
            .expect("body");
        let value: Value = serde_json::from_slice(&body).expect("JSON");
        Some((
            status,
            value["error"]["code"].as_i64().expect("code") as i32,
        ))
    }

    #[test]
    fn each_kind_of_bad_message_gets_its_json_rpc_code() {
        assert_eq!(code_of("{bad"), Some((StatusCode::BAD_REQUEST, -32700)));
        assert_eq!(
            code_of(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Some((StatusCode::BAD_REQUEST, -32600))
        );
        assert_eq!(
            code_of(r#"{"id":1,"method":"ping"}"#),
            Some((StatusCode::BAD_REQUEST, -32600))
        );
        for id in ["18446744073709551615", "1e30", "1.5", "true", "{}"] {
            let message = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let response = *message_id(&Bytes::from(message)).expect_err(id);
            let body =
                futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
                    .expect("body");
            let text = String::from_utf8_lossy(&body);
            assert!(
                text.contains("must be a string or an integer"),
                "{id}: {text}"
            );
        }
        assert_eq!(
            code_of(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#),
            Some((StatusCode::OK, -32602))
        );
        assert_eq!(
            code_of(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":"y"}}"#
            ),
            Some((StatusCode::OK, -32602))
        );
    }

    #[test]
    fn good_and_unknown_messages_pass_to_rmcp() {
        for passes in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"vendor/thing","params":{"a":1}}"#,
        ] {
            assert_eq!(code_of(passes), None, "{passes}");
        }
    }
}
