//! The callback client: one pooled HTTP client for every remote tool, speaking the
//! callback contract of `runtime-tools-api.txt`.
//!
//! Callbacks are loopback-only, so the client never uses a proxy, resolves
//! `localhost` to loopback addresses itself (never through system DNS), refuses to
//! resolve any other name, and never follows redirects (a redirect could leave the
//! loopback interface).
//!
//! It is hyper-util's pooled client with hyper-rustls for `https` callbacks,
//! not reqwest: reqwest's redirect layer re-parses every request's URL even
//! when redirects are off, and its request building copies what this client
//! sends as is (about 5 % of a remote call's instructions, BENCHMARKS.md,
//! issue 20, thirteenth pass).

use std::future::Ready;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde_json::Value;

use super::RemoteTool;
use crate::call::{Attempt, ToolCall, ToolOutcome};
use crate::domain::tool::SideEffectLevel;
use crate::reason::ReasonCode;

/// How long opening a connection may take. Loopback connects either succeed or
/// are refused at once; a slow one means the plugin is wedged.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of an HTTP error body is quoted back to the model.
const ERROR_SNIPPET_BYTES: usize = 512;
/// How long an unused pooled connection to a callback stays open.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Unused pooled connections kept per callback origin.
const POOL_MAX_IDLE_PER_ORIGIN: usize = 32;

/// What one exchange means for the plugin eviction rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureEffect {
    /// Connection refused or connect timeout: counts towards eviction.
    Count,
    /// The callback answered (any status, any body) or timed out while reading:
    /// the streak ends.
    Reset,
    /// The exchange broke in a way that is neither (e.g. a connection dropped
    /// mid-response): the streak is left as it is.
    Neutral,
}

/// The outcome the model sees, and what it means for eviction.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub outcome: ToolOutcome,
    pub effect: FailureEffect,
}

/// Resolves `localhost` (and names under it) to loopback addresses only; an
/// address in the URL itself never reaches a resolver.
#[derive(Debug, Clone, Copy)]
struct LoopbackResolver;

impl tower::Service<Name> for LoopbackResolver {
    type Response = std::array::IntoIter<SocketAddr, 2>;
    type Error = String;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = name.as_str().trim_end_matches('.');
        std::future::ready(if host.eq_ignore_ascii_case("localhost") {
            Ok([
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0),
            ]
            .into_iter())
        } else {
            Err(format!(
                "refusing to resolve {host:?}: callbacks are loopback-only"
            ))
        })
    }
}

type Connector = hyper_rustls::HttpsConnector<HttpConnector<LoopbackResolver>>;

/// The shared HTTP client of every remote tool.
#[derive(Debug, Clone)]
pub struct CallbackClient {
    http: Client<Connector, Full<Bytes>>,
    response_limit: usize,
}

/// Why a callback request brought no answer.
enum SendError {
    /// The whole exchange passed the tool's timeout.
    TimedOut,
    Transport(hyper_util::client::legacy::Error),
}

impl CallbackClient {
    pub fn new(response_limit: usize) -> anyhow::Result<Self> {
        let mut tcp = HttpConnector::new_with_resolver(LoopbackResolver);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // `https` callbacks go through the TLS layer, which hands plain `http`
        // ones back to this connector.
        tcp.enforce_http(false);
        // The fallible form: a platform verifier that cannot start is a
        // start-up error, not the panic of `with_platform_verifier`.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .try_with_platform_verifier()?
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_ORIGIN)
            .build(connector);
        Ok(Self {
            http,
            response_limit,
        })
    }

    /// Sends one call to the tool's callback and interprets the answer.
    pub async fn call(
        &self,
        tool: &RemoteTool,
        call: &ToolCall,
        attempt: Attempt<'_>,
        args: &Value,
    ) -> Exchange {
        let started = Instant::now();
        let exchange = match callback_request(tool, call, attempt, args) {
            Ok(request) => {
                // The tool's timeout covers the whole exchange, body included.
                tokio::time::timeout(tool.timeout(), self.exchange(request))
                    .await
                    .unwrap_or_else(|_| Err(SendError::TimedOut))
                    .unwrap_or_else(|err| failed_request(tool, err))
            }
            Err(err) => Exchange {
                outcome: ToolOutcome::not_started(
                    ReasonCode::RemoteRequestFailed,
                    format!("the callback request could not be built: {err}"),
                ),
                effect: FailureEffect::Neutral,
            },
        };
        // Debug, not info: the journal is the record of calls, and a line per
        // call at info is most of a busy server's log.
        tracing::debug!(
            tool = ?tool.name,
            source = ?tool.source,
            origin = %tool.callback_url.origin(),
            call_id = %call.call_id,
            effect = ?exchange.effect,
            is_error = !matches!(exchange.outcome, ToolOutcome::Success(_)),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "remote tool callback finished"
        );
        exchange
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<Exchange, SendError> {
        let response = self
            .http
            .request(request)
            .await
            .map_err(SendError::Transport)?;
        Ok(self.read_answer(response).await)
    }

    async fn read_answer(&self, response: http::Response<Incoming>) -> Exchange {
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .map(|value| format!(" to {value}"))
                .unwrap_or_default();
            return answered(ToolOutcome::error(
                ReasonCode::RemoteRedirectRefused,
                format!(
                    "the callback answered with a redirect (HTTP {status}){location}; redirects are not followed"
                ),
            ));
        }
        if !status.is_success() {
            let snippet = match read_capped(response.into_body(), ERROR_SNIPPET_BYTES, true).await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
                Err(_) => String::new(),
            };
            return answered(ToolOutcome::error(
                ReasonCode::RemoteHttpError,
                http_error_message(status, &snippet),
            ));
        }
        match read_capped(response.into_body(), self.response_limit, false).await {
            Ok(bytes) => answered(interpret_body(&bytes)),
            Err(BodyError::TooLarge) => answered(ToolOutcome::error(
                ReasonCode::RemoteResponseTooLarge,
                format!(
                    "the callback's response exceeds the limit of {} bytes and was discarded",
                    self.response_limit
                ),
            )),
            Err(BodyError::Transport(err)) => Exchange {
                outcome: ToolOutcome::error(
                    ReasonCode::RemoteResponseInterrupted,
                    format!(
                        "reading the callback's response failed: {}",
                        error_chain(&err)
                    ),
                ),
                effect: FailureEffect::Neutral,
            },
        }
    }
}

/// The callback request of one call: the contract's body and headers, and
/// the caller's trace context (a plugin's own trace joins the call's).
fn callback_request(
    tool: &RemoteTool,
    call: &ToolCall,
    attempt: Attempt<'_>,
    args: &Value,
) -> serde_json::Result<Request<Full<Bytes>>> {
    let body = serde_json::to_vec(&CallbackBody {
        name: &tool.name,
        arguments: args,
        call_id: &call.call_id,
        raw_arguments: &call.arguments.raw,
    })?;
    let mut request = Request::new(Full::new(Bytes::from(body)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = tool.callback_url.uri().clone();
    let headers = request.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    attempt_headers(attempt, headers);
    crate::telemetry::inject_current(headers);
    Ok(request)
}

/// The callback contract's request body.
#[derive(serde::Serialize)]
struct CallbackBody<'a> {
    name: &'a str,
    arguments: &'a Value,
    call_id: &'a str,
    raw_arguments: &'a str,
}

const USER_AGENT: &str = concat!("toolgate/", env!("CARGO_PKG_VERSION"));

/// The callback contract's delivery headers (README, "Callback contract"):
/// the execution id as `Idempotency-Key`, the hand-over count as
/// `X-Toolgate-Attempt`.
fn attempt_headers(attempt: Attempt<'_>, headers: &mut HeaderMap) {
    // Execution ids are ULID-based ASCII, always a valid header value.
    if let Ok(key) = HeaderValue::from_str(attempt.idempotency_key) {
        headers.insert(IDEMPOTENCY_KEY, key);
    }
    headers.insert(ATTEMPT, HeaderValue::from(attempt.number));
}

/// The header that names the execution a callback request delivers.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header that counts the hand-overs of that execution, from 1.
pub const ATTEMPT: &str = "x-toolgate-attempt";

fn answered(outcome: ToolOutcome) -> Exchange {
    Exchange {
        outcome,
        effect: FailureEffect::Reset,
    }
}

/// A callback that did not answer in time: the code says whether it may have
/// acted, as `settle` decides from the same side-effect level.
fn timed_out(tool: &RemoteTool) -> ToolOutcome {
    let reason = if tool.metadata().side_effect_level == SideEffectLevel::None {
        ReasonCode::RemoteTimeout
    } else {
        ReasonCode::RemoteTimeoutUncertain
    };
    ToolOutcome::timeout(
        reason,
        format!(
            "the callback of {} did not answer within {} seconds",
            tool.name, tool.timeout_seconds
        ),
    )
}

fn failed_request(tool: &RemoteTool, err: SendError) -> Exchange {
    let err = match err {
        SendError::TimedOut => {
            return Exchange {
                outcome: timed_out(tool),
                effect: FailureEffect::Reset,
            };
        }
        SendError::Transport(err) => err,
    };
    // A connect timeout is a connection-level failure (the tool never ran):
    // the connector reports it as a connect error.
    if err.is_connect() {
        return Exchange {
            outcome: ToolOutcome::not_started(
                ReasonCode::RemoteConnectionFailed,
                format!(
                    "could not connect to the callback at {}: {}",
                    tool.callback_url.origin(),
                    error_chain(&err)
                ),
            ),
            effect: FailureEffect::Count,
        };
    }
    Exchange {
        outcome: ToolOutcome::error(
            ReasonCode::RemoteRequestFailed,
            format!("the callback request failed: {}", error_chain(&err)),
        ),
        effect: FailureEffect::Neutral,
    }
}

fn http_error_message(status: StatusCode, snippet: &str) -> String {
    if snippet.is_empty() {
        format!("the callback failed with HTTP {status}")
    } else {
        format!("the callback failed with HTTP {status}: {snippet}")
    }
}
/// The callback contract: `{"is_error": true, "error": ...}` is a tool error,
/// an object whose `is_error` is neither a boolean nor null is a broken answer,
/// `{"output": ...}` is the output, any other JSON value is the output itself, and
/// a body that is not JSON is passed through as text.
pub(crate) fn interpret_body(bytes: &[u8]) -> ToolOutcome {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return ToolOutcome::Success(Value::String(String::from_utf8_lossy(bytes).into_owned()));
    };
    let Value::Object(mut map) = value else {
        return ToolOutcome::Success(value);
    };
    match map.get("is_error") {
        Some(Value::Bool(true)) => {
            let message = match map.remove("error") {
                Some(Value::String(message)) => message,
                Some(Value::Null) | None => match map.remove("output") {
                    Some(Value::String(message)) => message,
                    Some(Value::Null) | None => "the tool reported an error".to_owned(),
                    Some(other) => other.to_string(),
                },
                Some(other) => other.to_string(),
            };
            ToolOutcome::error(ReasonCode::RemoteToolError, message)
        }
        Some(Value::Bool(false) | Value::Null) | None => match map.remove("output") {
            Some(output) => ToolOutcome::Success(output),
            None => ToolOutcome::Success(Value::Object(map)),
        },
        // An answer that says something other than yes or no about failing
        // must not pass as a success the model and the journal believe.
        Some(other) => ToolOutcome::error(
            ReasonCode::RemoteInvalidAnswer,
            format!(
                "the callback answered an is_error that is {}, not a boolean",
                crate::schema::json_kind(other)
            ),
        ),
    }
}

enum BodyError {
    TooLarge,
    Transport(hyper::Error),
}

/// Reads at most `limit` bytes. Past the limit the body is either cut (`truncate`,
/// for quoting error bodies) or refused.
async fn read_capped(
    mut body: Incoming,
    limit: usize,
    truncate: bool,
) -> Result<Vec<u8>, BodyError> {
    // A declared length is the body's exact size hint.
    if !truncate && body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame.map_err(BodyError::Transport)?.into_data() else {
            continue; // trailers
        };
        if bytes.len() + chunk.len() > limit {
            if truncate {
                bytes.extend_from_slice(&chunk[..limit - bytes.len()]);
                return Ok(bytes);
            }
            return Err(BodyError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The error with its causes, which is where the useful part is kept
/// ("Connection refused (os error 111)").
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn output(outcome: ToolOutcome) -> (bool, Value) {
        match outcome {
            ToolOutcome::Success(value) => (false, value),
            ToolOutcome::Error { reason, message } => {
                assert_eq!(reason, ReasonCode::RemoteToolError);
                (true, Value::String(message))
            }
            other => panic!("the body alone never gives {other:?}"),
        }
    }

    #[test]
    fn follows_the_callback_contract() {
        assert_eq!(
            output(interpret_body(
                br#"{"output": {"temperature_c": 28}, "is_error": false}"#
            )),
            (false, json!({"temperature_c": 28}))
        );
        assert_eq!(
            output(interpret_body(
                br#"{"error": "location not found", "is_error": true}"#
            )),
            (true, json!("location not found"))
        );
        assert_eq!(
            output(interpret_body(b"plain words")),
            (false, json!("plain words"))
        );
        assert_eq!(output(interpret_body(b"[1,2]")), (false, json!([1, 2])));
        assert_eq!(
            output(interpret_body(br#"{"output": null}"#)),
            (false, Value::Null)
        );
        assert_eq!(
            output(interpret_body(br#"{"is_error": true}"#)),
            (true, json!("the tool reported an error"))
        );
        assert_eq!(
            output(interpret_body(br#"{"output": 1, "is_error": null}"#)),
            (false, json!(1))
        );
    }

    #[test]
    fn an_is_error_that_is_no_boolean_is_a_broken_answer() {
        for body in [
            &br#"{"is_error": "yes", "error": "no luck"}"#[..],
            br#"{"is_error": "false", "output": 1}"#,
            br#"{"is_error": 1}"#,
            br#"{"is_error": [true]}"#,
        ] {
            match interpret_body(body) {
                ToolOutcome::Error { reason, message } => {
                    assert_eq!(reason, ReasonCode::RemoteInvalidAnswer);
                    assert!(message.contains("not a boolean"), "{message}");
                }
                other => panic!("{} gave {other:?}", String::from_utf8_lossy(body)),
            }
        }
    }
}
