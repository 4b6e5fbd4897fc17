//! The OpenAI-compatible chat-completions client the generation loop talks
//! to the model through (OpenAI, DeepSeek, vLLM, llama.cpp, Ollama, …).
//!
//! One [`LlmClient::complete`] is one model request: streamed when the
//! endpoint streams, else read whole, retried with backoff on 429, 5xx and
//! network failures as long as no token has reached the caller.

mod failure;
mod stream;
mod types;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use types::{ChatAnswer, ChatMessage, ChatRequest, LlmError, ModelToolCall};

use failure::{Failure, Retry};

/// Where the model is, from the settings.
#[derive(Clone)]
pub struct LlmConfig {
    /// The API root, e.g. `http://127.0.0.1:8080/v1`; `/chat/completions` is appended.
    pub base_url: url::Url,
    /// Sent as `Authorization: Bearer`; never printed.
    pub api_key: Option<String>,
    pub model: String,
    /// What the first step of a turn asks of the model's tool use.
    pub first_tool_choice: crate::config::FirstToolChoice,
}

impl LlmConfig {
    /// The configured endpoint; None unless both a usable base URL and a model
    /// are set. An unusable URL is logged (the startup check is
    /// [`LlmConfig::try_from_settings`]).
    pub fn from_settings(settings: &crate::config::Settings) -> Option<Self> {
        match Self::try_from_settings(settings) {
            Ok(config) => config,
            Err(error) => {
                tracing::error!(error = %error, "the model endpoint is not usable; generation is off");
                None
            }
        }
    }

    /// Like [`LlmConfig::from_settings`], but a base URL that is not an
    /// http(s) URL is an error instead of no endpoint.
    pub fn try_from_settings(settings: &crate::config::Settings) -> anyhow::Result<Option<Self>> {
        let (Some(base), Some(model)) = (&settings.llm_base_url, &settings.llm_model) else {
            return Ok(None);
        };
        let base_url = url::Url::parse(base)
            .map_err(|e| anyhow::anyhow!("--llm-base-url is not a URL: {e}"))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            anyhow::bail!("--llm-base-url must be an http or https URL");
        }
        Ok(Some(Self {
            base_url,
            api_key: settings.llm_api_key.as_ref().map(|k| k.expose().to_owned()),
            model: model.clone(),
            first_tool_choice: settings.llm_first_tool_choice,
        }))
    }

    /// `<base_url>/chat/completions`, with or without a trailing slash on the base.
    fn endpoint(&self) -> url::Url {
        let mut url = self.base_url.clone();
        let path = format!("{}/chat/completions", url.path().trim_end_matches('/'));
        url.set_path(&path);
        url
    }
}

impl fmt::Debug for LlmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmConfig")
            .field("base_url", &self.base_url.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("first_tool_choice", &self.first_tool_choice)
            .finish()
    }
}

/// Timeouts, retries and caps of the client; [`Tuning::default`] is what the
/// server uses, tests shorten it.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub connect_timeout: Duration,
    /// Longest silence between two chunks of an answer (and before its head):
    /// a stalled stream ends. Keep-alive events that carry no text, tool call,
    /// reasoning or finish count as silence.
    pub idle_timeout: Duration,
    /// Longest one model request may take, retries included: a provider that
    /// keeps a stream going without end cannot hold a run (and shutdown) for
    /// ever.
    pub answer_timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first backoff wait, doubled for each next retry.
    pub backoff: Duration,
    /// The most a `Retry-After` is honoured for.
    pub retry_after_cap: Duration,
    /// Text plus tool names and arguments of one answer.
    pub max_answer_bytes: usize,
    pub max_tool_calls: usize,
    /// The largest request body sent: a turn resends its whole conversation
    /// at every step, so without it a model answering every step at the
    /// answer limit (or a long history) grows each request, and the memory
    /// that builds it, without bound.
    pub max_request_bytes: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            // Four attempts at 5 s plus 3.5 s of backoff: a provider that
            // refuses connections ends the run within 30 s. One that accepts
            // them and never answers is held to the idle limit per attempt
            // and to the answer limit in all.
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            // Long reasoning answers take minutes; none takes ten.
            answer_timeout: Duration::from_secs(600),
            max_retries: 3,
            backoff: Duration::from_millis(500),
            retry_after_cap: Duration::from_secs(10),
            max_answer_bytes: 4 * 1024 * 1024,
            max_tool_calls: 128,
            // Far past any model's context window in text.
            max_request_bytes: 16 * 1024 * 1024,
        }
    }
}

/// A chat-completions client; clones share one connection pool.
#[derive(Debug, Clone)]
pub struct LlmClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: LlmConfig,
    endpoint: url::Url,
    tuning: Tuning,
}

impl LlmClient {
    /// The `tool_choice` of a turn's first request that offers tools: None
    /// lets the model decide.
    pub fn first_tool_choice(&self) -> Option<serde_json::Value> {
        match self.inner.config.first_tool_choice {
            crate::config::FirstToolChoice::Auto => None,
            crate::config::FirstToolChoice::Required => Some(serde_json::json!("required")),
        }
    }

    /// A client with the server's timeouts, retries and caps.
    pub fn new(config: LlmConfig) -> anyhow::Result<Self> {
        Self::with_tuning(config, Tuning::default())
    }

    /// A client with other timeouts, retries or caps (tests, benchmarks).
    pub fn with_tuning(config: LlmConfig, tuning: Tuning) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(tuning.connect_timeout)
            // A redirect would carry the key to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .user_agent(concat!("toolgate/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let endpoint = config.endpoint();
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                config,
                endpoint,
                tuning,
            }),
        })
    }

    /// The configured model (a request may override it).
    pub fn model(&self) -> &str {
        &self.inner.config.model
    }

    /// One chat completion: streamed (`stream: true`) when the endpoint
    /// streams, else the plain JSON answer. `on_token` gets every text delta in
    /// order. Retries only before the first token.
    pub async fn complete(
        &self,
        request: &ChatRequest,
        on_token: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatAnswer, LlmError> {
        let started = std::time::Instant::now();
        let mut deltas = 0u64;
        let mut counted = |token: &str| {
            deltas += 1;
            on_token(token);
        };
        let answer_timeout = self.inner.tuning.answer_timeout;
        let result = tokio::time::timeout(
            answer_timeout,
            self.complete_with_retries(request, &mut counted),
        )
        .await
        .unwrap_or_else(|_| {
            Err(LlmError {
                status: None,
                message: format!(
                    "the model did not finish its answer within {} s",
                    answer_timeout.as_secs_f64()
                ),
            })
        });
        let outcome = if result.is_ok() { "success" } else { "error" };
        crate::metrics::metrics().record_model_request(outcome, deltas, started.elapsed());
        result
    }

    async fn complete_with_retries(
        &self,
        request: &ChatRequest,
        on_token: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatAnswer, LlmError> {
        let tuning = &self.inner.tuning;
        let body = wire::request_body(request, self.model());
        if body.len() > tuning.max_request_bytes {
            return Err(LlmError {
                status: None,
                message: format!(
                    "the request was not sent: its body is {} bytes, over the {} a request may have (the session's history and this turn's answers and tool results grew too long)",
                    body.len(),
                    tuning.max_request_bytes
                ),
            });
        }
        let mut retries = 0;
        loop {
            let mut emitted = false;
            let result = {
                let mut tracked = |token: &str| {
                    emitted = true;
                    on_token(token);
                };
                self.attempt(&body, &mut tracked).await
            };
            let failure = match result {
                Ok(answer) => return Ok(answer),
                Err(failure) => failure,
            };
            if emitted || failure.retry == Retry::No || retries >= tuning.max_retries {
                return Err(failure.error);
            }
            retries += 1;
            let wait = failure::wait(
                failure.retry,
                retries,
                tuning.backoff,
                tuning.retry_after_cap,
            );
            tracing::warn!(
                status = ?failure.error.status,
                kind = failure.kind,
                attempt = retries,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "the model provider failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }

    async fn attempt(
        &self,
        body: &bytes::Bytes,
        on_token: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChatAnswer, Failure> {
        let inner = &*self.inner;
        let mut request = inner
            .http
            .post(inner.endpoint.clone())
            .header(
                reqwest::header::ACCEPT,
                "text/event-stream, application/json",
            )
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(key) = &inner.config.api_key {
            request = request.bearer_auth(key);
        }
        let response = tokio::time::timeout(inner.tuning.idle_timeout, request.send())
            .await
            .map_err(|_| Failure::unreachable("no answer within the idle timeout"))?
            .map_err(Failure::from_reqwest)?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(failure::parse_retry_after);
            let message = wire::error_message(response, inner.tuning.idle_timeout).await;
            return Err(Failure::status(status.as_u16(), message, retry_after));
        }
        let streams = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        if streams {
            stream::read_stream(response, &inner.tuning, on_token).await
        } else {
            wire::read_whole(response, &inner.tuning, on_token).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base: &str) -> LlmConfig {
        LlmConfig {
            base_url: url::Url::parse(base).unwrap(),
            api_key: Some("sk-secret-123".into()),
            model: "m".into(),
            first_tool_choice: Default::default(),
        }
    }

    #[test]
    fn the_endpoint_joins_with_or_without_a_trailing_slash() {
        for base in ["http://h:1/v1", "http://h:1/v1/"] {
            assert_eq!(
                config(base).endpoint().as_str(),
                "http://h:1/v1/chat/completions"
            );
        }
        assert_eq!(
            config("http://h:1").endpoint().as_str(),
            "http://h:1/chat/completions"
        );
    }

    #[test]
    fn debug_never_prints_the_key() {
        let text = format!("{:?}", config("http://h:1/v1"));
        assert!(!text.contains("sk-secret-123"), "{text}");
        assert!(text.contains("redacted"), "{text}");
        let client = LlmClient::new(config("http://h:1/v1")).unwrap();
        let text = format!("{client:?}");
        assert!(!text.contains("sk-secret-123"), "{text}");
    }

    #[test]
    fn settings_give_a_config_only_with_url_and_model() {
        let dir = std::env::temp_dir();
        let mut settings = crate::config::Settings::for_data_dir(&dir);
        assert!(LlmConfig::from_settings(&settings).is_none());
        settings.llm_base_url = Some("http://127.0.0.1:9/v1".into());
        assert!(LlmConfig::from_settings(&settings).is_none(), "no model");
        settings.llm_model = Some("qwen".into());
        settings.llm_api_key = Some("k".into());
        let config = LlmConfig::from_settings(&settings).expect("configured");
        assert_eq!(
            (config.model.as_str(), config.api_key.as_deref()),
            ("qwen", Some("k"))
        );
        settings.llm_base_url = Some("ftp://x/".into());
        assert!(LlmConfig::try_from_settings(&settings).is_err());
        assert!(LlmConfig::from_settings(&settings).is_none());
    }
}
