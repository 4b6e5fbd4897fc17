//! `/api/tools`: the loopback-only Runtime Tools API through which local plugins
//! register HTTP callbacks as model-callable tools (`runtime-tools-api.txt`).
//!
//! It keeps the contract's own shapes and status codes: bodies are
//! `{"ok": ..., ...}` rather than `{"data": ...}`, schema errors are 422, unknown
//! roles 404 and non-loopback callers 403. No API key is needed: the TCP peer
//! address is the credential.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequestParts, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ApiResult};
use super::extract::{body_bytes, parse_json_object};
use crate::domain::callback_url::is_loopback_ip;
use crate::domain::tool::{AsyncCapability, DeliveryMode, ReplaySafety, SideEffectLevel, Slot};
use crate::error::{Error, ErrorCode};
use crate::state::AppState;
use crate::tools::remote::{
    DeclaredMetadata, FailedRole, ListingCache, ListingKey, MutationReport, NewRemoteTool,
    RegistrationInput, RemoteTool, Role, Target,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_tool))
        .routes(routes!(unregister_tool))
        .routes(routes!(clear_tools))
        .routes(routes!(list_tools))
        .route_layer(axum::middleware::from_fn(
            super::browser_guard::refuse_browser_requests,
        ))
}

/// Admits loopback peers only, judged by the TCP peer address. Forwarding headers
/// are deliberately ignored: anyone can send them.
pub struct LoopbackClient;

impl<S: Send + Sync> FromRequestParts<S> for LoopbackClient {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match peer_refusal(&parts.extensions, parts.uri.path()) {
            None => Ok(LoopbackClient),
            Some(refusal) => Err(refusal),
        }
    }
}

/// The refusal of a non-loopback peer, or None for a loopback one.
fn peer_refusal(extensions: &axum::http::Extensions, path: &str) -> Option<ApiError> {
    let peer = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr);
    if peer.is_some_and(|addr| is_loopback_ip(addr.ip())) {
        return None;
    }
    tracing::warn!(peer = ?peer, path = %path, "refused a non-loopback caller of /api/tools");
    Some(ApiError::new(
        ErrorCode::LoopbackOnly,
        "the runtime tools API accepts loopback clients only",
    ))
}

/// For a request no route took (unknown path or method): the loopback-only
/// refusal when it is under `/api/tools` from another peer, so that such a
/// caller learns nothing of the API's routes and methods.
pub(super) fn refuse_a_remote_peer(request: &Request) -> Option<ApiError> {
    let path = request.uri().path();
    let under_api = path == "/api/tools" || path.starts_with("/api/tools/");
    if under_api {
        peer_refusal(request.extensions(), path)
    } else {
        None
    }
}

/// The contract answers schema errors with 422.
fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::validation(message).with_status(StatusCode::UNPROCESSABLE_ENTITY)
}

fn from_domain(err: Error) -> ApiError {
    match err {
        Error::Validation(message) => unprocessable(message),
        other => other.into(),
    }
}

async fn read_body<T: DeserializeOwned>(request: Request, state: &AppState) -> ApiResult<T> {
    let bytes = body_bytes(request, state).await?;
    parse_json_object(&bytes).map_err(unprocessable)
}

/// Body of `POST /api/tools/register`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterToolBody {
    /// Tool name, 1–64 characters.
    pub name: String,
    /// Shown to the model; default "".
    pub description: Option<String>,
    /// JSON Schema object of the arguments; default `{"type":"object","properties":{}}`.
    #[schema(value_type = Object)]
    pub parameters: Option<Value>,
    /// Loopback http(s) URL: localhost, 127.0.0.0/8, ::1 or IPv4-mapped loopback.
    pub callback_url: String,
    /// Existing character name; null or "" targets every current character.
    pub role: Option<String>,
    /// Lifecycle tag used by clear; plugins use `plugin:<id>`. Default "external".
    pub source: Option<String>,
    /// Greater than 0 and at most 300; default 30.
    pub timeout_seconds: Option<f64>,
    /// Optional extension; default `none` (platform default).
    pub side_effect_level: Option<SideEffectLevel>,
    /// Optional extension: the slots that may call the tool; absent or empty:
    /// every slot.
    pub allowed_slots: Option<Vec<Slot>>,
    /// Optional extension; inferred from the side-effect level when absent.
    pub replay_safety: Option<ReplaySafety>,
    /// Optional extension; default `inline_only`.
    pub async_capability: Option<AsyncCapability>,
    /// Optional extension; `async_job` needs `async_capability: deferred_ok`.
    /// Default `inline`.
    pub default_delivery_mode: Option<DeliveryMode>,
}

/// Answer of `POST /api/tools/register`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RegisterToolResponse {
    /// False only when no role accepted the registration.
    pub ok: bool,
    pub registered: String,
    pub affected_roles: Vec<String>,
    pub failed_roles: Vec<FailedRole>,
    /// This start of the server (new at every start): a plugin that sees it
    /// change registers again, since registrations do not survive a restart.
    pub boot_id: String,
}

/// Register or replace a remote model-callable tool.
#[utoipa::path(post, path = "/api/tools/register", tag = "runtime-tools",
    request_body = RegisterToolBody,
    responses(
        (status = 200, description = "registered (or replaced), with the roles that took it", body = RegisterToolResponse),
        (status = 403, description = "`loopback_only`: the caller is not on loopback; `forbidden`: a browser cross-site or rebinding request"),
        (status = 404, description = "unknown role"),
        (status = 409, description = "limit_exceeded: a runtime tool limit is reached"),
        (status = 422, description = "`validation_error`: a schema error, or parameters and description over max_tool_schema_bytes"),
    ))]
async fn register_tool(
    State(state): State<AppState>,
    _loopback: LoopbackClient,
    request: Request,
) -> ApiResult<axum::Json<RegisterToolResponse>> {
    let body: RegisterToolBody = read_body(request, &state).await?;
    let tool = RegistrationInput {
        name: body.name,
        description: body.description,
        parameters: body.parameters,
        callback_url: body.callback_url,
        source: body.source,
        timeout_seconds: body.timeout_seconds,
        declared: DeclaredMetadata {
            side_effect_level: body.side_effect_level,
            allowed_slots: body.allowed_slots,
            replay_safety: body.replay_safety,
            async_capability: body.async_capability,
            default_delivery_mode: body.default_delivery_mode,
        },
    }
    .validate(state.runtime.remote.limits().max_schema_bytes)
    .map_err(from_domain)?;
    let registered = tool.name.clone();
    let MutationReport {
        affected_roles,
        failed_roles,
    } = state
        .runtime
        .remote
        .register_into(
            &state.runtime,
            &state.runtime.store,
            Target::from_role(body.role.as_deref()),
            tool,
        )
        .await
        .map_err(from_domain)?;
    Ok(axum::Json(RegisterToolResponse {
        ok: !affected_roles.is_empty(),
        registered,
        affected_roles,
        failed_roles,
        boot_id: state.boot_id.to_string(),
    }))
}

/// Body of `POST /api/tools/unregister`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UnregisterToolBody {
    pub name: String,
    /// Existing character name; null or "" means every current character.
    pub role: Option<String>,
}

/// Answer of `POST /api/tools/unregister`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UnregisterToolResponse {
    /// False only when the tool was removed somewhere but no role took the change.
    pub ok: bool,
    /// Whether any target registry held the name.
    pub removed: bool,
    pub affected_roles: Vec<String>,
    pub failed_roles: Vec<FailedRole>,
    /// This start of the server (new at every start): a plugin that sees it
    /// change registers again, since registrations do not survive a restart.
    pub boot_id: String,
}

/// Remove a tool by name.
#[utoipa::path(post, path = "/api/tools/unregister", tag = "runtime-tools",
    request_body = UnregisterToolBody,
    responses(
        (status = 200, description = "whether the name was removed, with the roles that took the change", body = UnregisterToolResponse),
        (status = 403, description = "`loopback_only`: the caller is not on loopback; `forbidden`: a browser cross-site or rebinding request"),
        (status = 404, description = "unknown role"),
        (status = 422, description = "`validation_error` (answered 422 here, as the contract says): the body is not a JSON object of the contract's shape"),
    ))]
async fn unregister_tool(
    State(state): State<AppState>,
    _loopback: LoopbackClient,
    request: Request,
) -> ApiResult<axum::Json<UnregisterToolResponse>> {
    let body: UnregisterToolBody = read_body(request, &state).await?;
    // The rule registrations follow: no other name can be held, and a name
    // of any length would otherwise go whole into the log line.
    check_chars("name", &body.name, NewRemoteTool::MAX_NAME_CHARS)?;
    let (removed, report) = state
        .runtime
        .remote
        .unregister_from(
            &state.runtime,
            &state.runtime.store,
            Target::from_role(body.role.as_deref()),
            &body.name,
        )
        .await
        .map_err(from_domain)?;
    Ok(axum::Json(UnregisterToolResponse {
        ok: mutation_ok(&report),
        removed,
        affected_roles: report.affected_roles,
        failed_roles: report.failed_roles,
        boot_id: state.boot_id.to_string(),
    }))
}

/// Body of `POST /api/tools/clear`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearToolsBody {
    /// Remove every tool carrying this source tag.
    pub source: String,
    /// Existing character name; null or "" means every current character.
    pub role: Option<String>,
}

/// Answer of `POST /api/tools/clear`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClearToolsResponse {
    /// False only when tools were removed but no role took the change.
    pub ok: bool,
    /// How many registrations were removed, over all target roles.
    pub removed: usize,
    pub affected_roles: Vec<String>,
    pub failed_roles: Vec<FailedRole>,
    /// This start of the server (new at every start): a plugin that sees it
    /// change registers again, since registrations do not survive a restart.
    pub boot_id: String,
}

/// Remove every tool carrying a given source tag.
#[utoipa::path(post, path = "/api/tools/clear", tag = "runtime-tools",
    request_body = ClearToolsBody,
    responses(
        (status = 200, description = "how many registrations were removed, with the roles that took the change", body = ClearToolsResponse),
        (status = 403, description = "`loopback_only`: the caller is not on loopback; `forbidden`: a browser cross-site or rebinding request"),
        (status = 404, description = "unknown role"),
        (status = 422, description = "`validation_error` (answered 422 here, as the contract says): the body is not a JSON object of the contract's shape"),
    ))]
async fn clear_tools(
    State(state): State<AppState>,
    _loopback: LoopbackClient,
    request: Request,
) -> ApiResult<axum::Json<ClearToolsResponse>> {
    let body: ClearToolsBody = read_body(request, &state).await?;
    check_chars("source", &body.source, NewRemoteTool::MAX_SOURCE_CHARS)?;
    let (removed, report) = state
        .runtime
        .remote
        .clear_from(
            &state.runtime,
            &state.runtime.store,
            Target::from_role(body.role.as_deref()),
            &body.source,
        )
        .await
        .map_err(from_domain)?;
    Ok(axum::Json(ClearToolsResponse {
        ok: mutation_ok(&report),
        removed,
        affected_roles: report.affected_roles,
        failed_roles: report.failed_roles,
        boot_id: state.boot_id.to_string(),
    }))
}

/// Refuses a `field` of no characters or more than `max`, as registration does.
fn check_chars(field: &str, value: &str, max: usize) -> ApiResult<()> {
    let chars = value.chars().count();
    if chars == 0 || chars > max {
        return Err(unprocessable(format!(
            "{field} must be 1-{max} characters, got {chars}"
        )));
    }
    Ok(())
}

/// A removal that changed nothing is not a failure; one whose every change was
/// refused by the roles' model sessions is.
fn mutation_ok(report: &MutationReport) -> bool {
    !report.affected_roles.is_empty() || report.failed_roles.is_empty()
}

/// One registration as `GET /api/tools` shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListedTool {
    pub name: String,
    pub description: String,
    pub source: String,
    pub callback_url: String,
    /// Always true: these are remote callbacks.
    pub is_remote: bool,
    /// The registration's schema, shared, not copied, while the answer is built.
    #[schema(value_type = Object)]
    pub parameters: Arc<Value>,
    pub timeout_seconds: f64,
    pub side_effect_level: SideEffectLevel,
    /// Empty: every slot.
    pub allowed_slots: Vec<Slot>,
    pub replay_safety: ReplaySafety,
    pub async_capability: AsyncCapability,
    pub default_delivery_mode: DeliveryMode,
}

impl From<&RemoteTool> for ListedTool {
    fn from(tool: &RemoteTool) -> Self {
        Self {
            name: tool.name.clone(),
            description: tool.description().to_owned(),
            source: tool.source.clone(),
            callback_url: tool.callback_url.as_str().to_owned(),
            is_remote: true,
            parameters: tool.parameters().clone(),
            timeout_seconds: tool.timeout_seconds,
            side_effect_level: tool.metadata().side_effect_level,
            allowed_slots: tool.metadata().allowed_slots.clone(),
            replay_safety: tool.metadata().replay_safety,
            async_capability: tool.metadata().async_capability,
            default_delivery_mode: tool.metadata().default_delivery_mode,
        }
    }
}

/// Answer of `GET /api/tools`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListToolsResponse {
    pub ok: bool,
    /// Every current role (or the one asked for), each with its registrations.
    pub tools_by_role: BTreeMap<String, Vec<ListedTool>>,
    /// This start of the server (new at every start): a plugin that sees it
    /// change registers again, since registrations do not survive a restart.
    pub boot_id: String,
}

/// List current registrations, per role.
#[utoipa::path(get, path = "/api/tools", tag = "runtime-tools",
    params(("role" = Option<String>, Query, description = "only this role; 404 when it does not exist")),
    responses(
        (status = 200, description = "the registrations of every role (or of the one asked for)", body = ListToolsResponse),
        (status = 403, description = "`loopback_only`: the caller is not on loopback; `forbidden`: a browser cross-site or rebinding request"),
        (status = 404, description = "unknown role"),
    ))]
async fn list_tools(
    State(state): State<AppState>,
    _loopback: LoopbackClient,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let role = query.as_deref().and_then(|query| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == "role")
            .map(|(_, value)| value.into_owned())
    });
    let mut roles = state
        .runtime
        .remote
        .list_roles(&state.runtime.store, Target::from_role(role.as_deref()))
        .await
        .map_err(from_domain)?;
    roles.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name));
    let json = [(header::CONTENT_TYPE, "application/json")];
    let cache = state.runtime.remote.listing_cache();
    if let Some(body) = cache.get(&roles) {
        return Ok((json, Body::from(body)).into_response());
    }
    // Joined whole while it stays within the cache's bound (and kept), else
    // streamed on from what was joined so far.
    let key = ListingKey::of(&roles);
    let mut chunks = listing_chunks(&state.boot_id, roles);
    let mut whole = Vec::new();
    while whole.len() <= ListingCache::MAX_BYTES {
        let Some(chunk) = chunks.next() else {
            let body = Bytes::from(whole);
            cache.put(key, body.clone());
            return Ok((json, Body::from(body)).into_response());
        };
        whole.extend_from_slice(&chunk);
    }
    let rest = std::iter::once(whole).chain(chunks);
    let chunks = futures::stream::iter(rest.map(Ok::<_, Infallible>));
    Ok((json, Body::from_stream(chunks)).into_response())
}

/// Bytes the listing hands the connection at a time: whole tools, batched,
/// rather than one write per tool.
const LISTING_CHUNK_BYTES: usize = 32 * 1024;

/// A [`ListToolsResponse`] written a batch of tools at a time as the client
/// reads it, so that a listing of every role's large schemas (tools × roles)
/// is never held whole in memory; each tool's JSON is its registration's,
/// serialised once ([`RemoteTool::listing`]).
fn listing_chunks(
    boot_id: &str,
    roles: Vec<(Role, Vec<Arc<RemoteTool>>)>,
) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
    let mut head = br#"{"ok":true,"boot_id":"#.to_vec();
    append_json(&mut head, &boot_id);
    head.extend_from_slice(br#","tools_by_role":{"#);
    let pieces = roles
        .into_iter()
        .enumerate()
        .flat_map(|(i, (role, tools))| {
            let mut open = if i == 0 { Vec::new() } else { b",".to_vec() };
            append_json(&mut open, &role.name);
            open.extend_from_slice(b":[");
            let listed = tools.into_iter().enumerate().map(move |(j, tool)| {
                let json = tool.listing.get_or_init(|| {
                    let mut json = Vec::new();
                    append_json(&mut json, &ListedTool::from(&*tool));
                    json.into_boxed_slice()
                });
                let mut piece = Vec::with_capacity(json.len() + 1);
                if j > 0 {
                    piece.push(b',');
                }
                piece.extend_from_slice(json);
                piece
            });
            std::iter::once(open)
                .chain(listed)
                .chain(std::iter::once(b"]".to_vec()))
        });
    let pieces = std::iter::once(head)
        .chain(pieces)
        .chain(std::iter::once(b"}}".to_vec()));
    batched(pieces, LISTING_CHUNK_BYTES)
}

/// Joins consecutive pieces into chunks of about `size` bytes.
fn batched(
    mut pieces: impl Iterator<Item = Vec<u8>> + Send + 'static,
    size: usize,
) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
    std::iter::from_fn(move || {
        let mut chunk = pieces.next()?;
        while chunk.len() < size {
            match pieces.next() {
                Some(piece) => chunk.extend_from_slice(&piece),
                None => break,
            }
        }
        Some(chunk)
    })
}

fn append_json<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    serde_json::to_writer(out, value).expect("listed values always serialize")
}

#[cfg(test)]
mod tests {
    use super::batched;

    #[test]
    fn batches_keep_every_byte_in_order_and_reach_their_size() {
        let pieces: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 7]).collect();
        let whole: Vec<u8> = pieces.concat();
        let chunks: Vec<Vec<u8>> = batched(pieces.into_iter(), 50).collect();
        assert_eq!(chunks.concat(), whole);
        let (last, full) = chunks.split_last().unwrap();
        assert!(
            full.iter()
                .all(|chunk| chunk.len() >= 50 && chunk.len() < 57)
        );
        assert!(!last.is_empty());
        assert_eq!(batched(std::iter::empty(), 50).count(), 0);
    }
}
