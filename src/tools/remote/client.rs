//! The callback client: one pooled HTTP client for every remote tool, speaking the
//! callback contract of `runtime-tools-api.txt`.
//!
//! Callbacks are loopback-only, so the client never uses a proxy, resolves
//! `localhost` to loopback addresses itself (never through system DNS), refuses to
//! resolve any other name, and never follows redirects (a redirect could leave the
//! loopback interface).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use super::RemoteTool;
use crate::call::{Attempt, ToolCall, ToolOutcome};
use crate::domain::tool::SideEffectLevel;
use crate::reason::ReasonCode;

/// How long opening a connection may take. Loopback connects either succeed or
/// are refused at once; a slow one means the plugin is wedged.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much of an HTTP error body is quoted back to the model.
const ERROR_SNIPPET_BYTES: usize = 512;

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

/// Resolves `localhost` (and names under it) to loopback addresses only.
#[derive(Debug)]
struct LoopbackResolver;

impl Resolve for LoopbackResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        Box::pin(async move {
            if host == "localhost" {
                let addrs: Addrs = Box::new(
                    [
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0),
                    ]
                    .into_iter(),
                );
                Ok(addrs)
            } else {
                Err(format!("refusing to resolve {host:?}: callbacks are loopback-only").into())
            }
        })
    }
}

/// The shared HTTP client of every remote tool.
#[derive(Debug, Clone)]
pub struct CallbackClient {
    http: reqwest::Client,
    response_limit: usize,
}

impl CallbackClient {
    pub fn new(response_limit: usize) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(LoopbackResolver)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(32)
            .tcp_nodelay(true)
            .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
            .build()?;
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
        let body = json!({
            "name": tool.name,
            "arguments": args,
            "call_id": call.call_id,
            "raw_arguments": call.arguments.raw,
        });
        // The plugin's own trace joins the call's (W3C trace context).
        let mut headers = attempt_headers(attempt);
        crate::telemetry::inject_current(&mut headers);
        let exchange = match self
            .http
            .post(tool.callback_url.url().clone())
            .headers(headers)
            .timeout(tool.timeout())
            .json(&body)
            .send()
            .await
        {
            Ok(response) => self.read_answer(tool, response).await,
            Err(err) => failed_request(tool, &err),
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

    async fn read_answer(&self, tool: &RemoteTool, response: Response) -> Exchange {
        let status = response.status();
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
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
            let snippet = match read_capped(response, ERROR_SNIPPET_BYTES, true).await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
                Err(_) => String::new(),
            };
            return answered(ToolOutcome::error(
                ReasonCode::RemoteHttpError,
                http_error_message(status, &snippet),
            ));
        }
        match read_capped(response, self.response_limit, false).await {
            Ok(bytes) => answered(interpret_body(&bytes)),
            Err(BodyError::TooLarge) => answered(ToolOutcome::error(
                ReasonCode::RemoteResponseTooLarge,
                format!(
                    "the callback's response exceeds the limit of {} bytes and was discarded",
                    self.response_limit
                ),
            )),
            Err(BodyError::Transport(err)) if err.is_timeout() => Exchange {
                outcome: timed_out(tool),
                effect: FailureEffect::Reset,
            },
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

/// The callback contract's delivery headers (README, "Callback contract"):
/// the execution id as `Idempotency-Key`, the hand-over count as
/// `X-Toolgate-Attempt`.
fn attempt_headers(attempt: Attempt<'_>) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::with_capacity(4);
    // Execution ids are ULID-based ASCII, always a valid header value.
    if let Ok(key) = reqwest::header::HeaderValue::from_str(attempt.idempotency_key) {
        headers.insert(IDEMPOTENCY_KEY, key);
    }
    headers.insert(ATTEMPT, reqwest::header::HeaderValue::from(attempt.number));
    headers
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

fn failed_request(tool: &RemoteTool, err: &reqwest::Error) -> Exchange {
    // A connect timeout is a connection-level failure (the tool never ran), so
    // `is_connect` is checked before `is_timeout`.
    if err.is_connect() {
        return Exchange {
            outcome: ToolOutcome::not_started(
                ReasonCode::RemoteConnectionFailed,
                format!(
                    "could not connect to the callback at {}: {}",
                    tool.callback_url.origin(),
                    error_chain(err)
                ),
            ),
            effect: FailureEffect::Count,
        };
    }
    if err.is_timeout() {
        return Exchange {
            outcome: timed_out(tool),
            effect: FailureEffect::Reset,
        };
    }
    Exchange {
        outcome: ToolOutcome::error(
            ReasonCode::RemoteRequestFailed,
            format!("the callback request failed: {}", error_chain(err)),
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
/// `{"output": ...}` is the output, any other JSON value is the output itself, and
/// a body that is not JSON is passed through as text.
pub(crate) fn interpret_body(bytes: &[u8]) -> ToolOutcome {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return ToolOutcome::Success(Value::String(String::from_utf8_lossy(bytes).into_owned()));
    };
    match value {
        Value::Object(mut map) if map.get("is_error") == Some(&Value::Bool(true)) => {
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
        Value::Object(mut map) if map.contains_key("output") => {
            ToolOutcome::Success(map.remove("output").unwrap_or(Value::Null))
        }
        other => ToolOutcome::Success(other),
    }
}

enum BodyError {
    TooLarge,
    Transport(reqwest::Error),
}

/// Reads at most `limit` bytes. Past the limit the body is either cut (`truncate`,
/// for quoting error bodies) or refused.
async fn read_capped(
    mut response: Response,
    limit: usize,
    truncate: bool,
) -> Result<Vec<u8>, BodyError> {
    if !truncate
        && response
            .content_length()
            .is_some_and(|len| len > limit as u64)
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            if truncate {
                body.extend_from_slice(&chunk[..limit - body.len()]);
                return Ok(body);
            }
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error with its causes, which is where reqwest keeps the useful part
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
    }
}
