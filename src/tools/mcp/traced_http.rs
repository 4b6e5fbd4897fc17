//! The HTTP client of streamable-HTTP MCP connections: reqwest, plus W3C
//! trace context on every request. rmcp sends from its own worker task, where
//! the calling `tool_call` span is not current; so a `tools/call` carries its
//! caller's context in its `_meta` (SEP-414, written by the provider at call
//! time) and this client lifts it into the `traceparent` header. Requests
//! without a caller (initialize, tools/list, ping, notifications, the event
//! stream, the session's DELETE) get a fresh root of their own.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, GetMeta, JsonRpcMessage, RequestParamsMeta,
};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use crate::domain::mcp_rules::Reach;

/// What rmcp's client methods answer.
type Answer<T> = Result<T, StreamableHttpError<reqwest::Error>>;

/// Most redirects one request follows.
const MAX_REDIRECTS: usize = 10;

/// The header in which toolgate's MCP client names its deployment
/// ([`SecretsKey::deployment_mark`](crate::secrets::SecretsKey::deployment_mark)):
/// the deployment's own MCP endpoint refuses requests that carry its mark.
pub const DEPLOYMENT_HEADER: &str = "toolgate-deployment";

/// reqwest's streamable-HTTP client with `traceparent` on every request.
#[derive(Clone, Debug)]
pub struct TracedHttpClient {
    inner: reqwest::Client,
}

impl TracedHttpClient {
    /// The client rmcp would build itself: no idle connection pool (its
    /// answer to delayed-ACK stalls on reused connections) and same-origin
    /// 307/308 redirects only, so a redirect never replays the session id
    /// or the configured headers to another host, nor turns a POST into a GET.
    /// Every request carries `deployment_mark` in [`DEPLOYMENT_HEADER`].
    pub fn new(reach: Reach, deployment_mark: &str) -> Result<Self, String> {
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            let keeps_body = matches!(
                attempt.status(),
                reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
            );
            let same_origin = attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() == attempt.url().origin());
            if !keeps_body || !same_origin {
                attempt.stop()
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        let mark = HeaderValue::try_from(deployment_mark)
            .map_err(|_| "the deployment mark is no header value".to_owned())?;
        let inner = reqwest::Client::builder()
            .default_headers(http::HeaderMap::from_iter([(
                HeaderName::from_static(DEPLOYMENT_HEADER),
                mark,
            )]))
            .pool_max_idle_per_host(0)
            .redirect(redirects)
            .dns_resolver(Arc::new(Reachable(reach)))
            .build()
            .map_err(|err| format!("the MCP HTTP client could not be built: {err}"))?;
        Ok(Self { inner })
    }
}

/// The system resolver, less every address the connection may not reach:
/// a host name an account configured (or one it redirects to on the same
/// origin) must not lead a connection to a cloud metadata service, nor, for
/// [`Reach::PublicOnly`], to loopback or a private network. IP-literal URLs
/// never reach a resolver; they are checked when configured and again at
/// connect time.
struct Reachable(Reach);

impl reqwest::dns::Resolve for Reachable {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        let reach = self.0;
        Box::pin(async move {
            let found: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = allowed_addresses(found, reach);
            if allowed.is_empty() {
                return Err(format!(
                    "{host} resolves to no address this MCP connection may reach ({})",
                    reach.refusal()
                )
                .into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The addresses a connection may go to, in the resolver's order.
fn allowed_addresses(found: Vec<std::net::SocketAddr>, reach: Reach) -> Vec<std::net::SocketAddr> {
    found
        .into_iter()
        .filter(|address| reach.allows(address.ip()))
        .collect()
}

/// The SEP-414 trace context a message names in its `_meta`, if any.
fn carried(message: &ClientJsonRpcMessage) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    let JsonRpcMessage::Request(request) = message else {
        return fields;
    };
    let envelope = request.request.get_meta();
    let params = match &request.request {
        ClientRequest::CallToolRequest(call) => call.params.meta(),
        _ => None,
    };
    // The envelope's `_meta` is read last: on the wire it wins over the
    // params' (rmcp merges them so), and so it does here.
    for meta in [params.map(|meta| &**meta), Some(&**envelope)]
        .into_iter()
        .flatten()
    {
        if let Some(parent) = meta.get_traceparent() {
            fields.insert("traceparent".to_owned(), parent.to_owned());
            if let Some(state) = meta.get_tracestate() {
                fields.insert("tracestate".to_owned(), state.to_owned());
            }
        }
    }
    fields
}

/// `headers` plus the trace context: `carried` when valid, else a new root.
fn traced(
    carried: &HashMap<String, String>,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let mut trace = http::HeaderMap::new();
    crate::telemetry::inject_carried_or_root(carried, &mut trace);
    for (name, value) in trace {
        if let Some(name) = name {
            headers.insert(name, value);
        }
    }
    headers
}

/// rmcp's worker sends every POST through `post_message_with_response_limits`
/// and opens every stream through `get_stream_with_max_sse_event_size`; the
/// other methods are the trait's required ones.
impl StreamableHttpClient for TracedHttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Answer<StreamableHttpPostResponse> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Answer<StreamableHttpPostResponse> {
        let headers = traced(&carried(&message), custom_headers);
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Answer<()> {
        let headers = traced(&HashMap::new(), custom_headers);
        self.inner
            .delete_session(uri, session_id, auth_header, headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Answer<BoxStream<'static, Result<Sse, SseError>>> {
        let headers = traced(&HashMap::new(), custom_headers);
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Answer<BoxStream<'static, Result<Sse, SseError>>> {
        let headers = traced(&HashMap::new(), custom_headers);
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::dns::Resolve;

    #[test]
    fn resolved_addresses_out_of_reach_are_dropped() {
        let found = [
            "169.254.169.254:0",
            "127.0.0.1:0",
            "[fe80::1]:0",
            "[::1]:0",
            "10.0.0.1:0",
            "93.184.216.34:0",
        ]
        .map(|address| address.parse().unwrap());
        let allowed = |reach| -> Vec<String> {
            allowed_addresses(found.to_vec(), reach)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            allowed(Reach::Any),
            ["127.0.0.1:0", "[::1]:0", "10.0.0.1:0", "93.184.216.34:0"]
        );
        assert_eq!(allowed(Reach::PublicOnly), ["93.184.216.34:0"]);
    }

    #[tokio::test]
    async fn loopback_names_resolve_only_for_any_reach() {
        let name = || "localhost".parse::<reqwest::dns::Name>().unwrap();
        let found: Vec<_> = Reachable(Reach::Any)
            .resolve(name())
            .await
            .unwrap()
            .collect();
        assert!(
            found.iter().all(|address| address.ip().is_loopback()),
            "{found:?}"
        );
        assert!(!found.is_empty());
        assert!(Reachable(Reach::PublicOnly).resolve(name()).await.is_err());
    }
}
