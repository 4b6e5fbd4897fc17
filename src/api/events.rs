//! `GET /sessions/{id}/events`: a Server-Sent Events stream that is, while open, a
//! live model session of the session's character. It starts with `ready` and
//! receives `catalog_changed` whenever that character's catalog changes.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::error::ApiResult;
use super::event_frames::EventFrames;
use super::extract::{Path, Query};
use crate::domain::tool::Slot;
use crate::model_sessions::ModelProvider;
use crate::state::AppState;

/// Query of `GET /sessions/{id}/events`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsParams {
    /// The slot whose permissions decide what this model session is offered
    /// (`director` | `memory` | `narrator` | `verifier`); calls default to
    /// `narrator`, and so does this.
    pub slot: Option<String>,
}

/// Comment lines keep idle connections (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(session_events))
}

/// Subscribe to a session's events as a live model session.
#[utoipa::path(get, path = "/sessions/{id}/events", tag = "sessions",
    params(("id" = String, Path), EventsParams),
    responses(
        (status = 200, content_type = "text/event-stream",
            description = "events `ready` then `catalog_changed` (JSON data: role, added, updated, removed, accepted, error, tools)"),
        (status = 404, description = "no such session for this account"),
        (status = 409, description = "`limit_exceeded`: the account (not the admin) already holds `max_event_streams_per_account` streams"),
        (status = 503, description = "`shutting_down`: the server is stopping; retry after `Retry-After` seconds"),
    ))]
async fn session_events(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
    Query(params): Query<EventsParams>,
) -> ApiResult<impl IntoResponse> {
    let slot = match params.slot.as_deref() {
        Some(raw) => Slot::parse(raw)?,
        None => Slot::Narrator,
    };
    let session = state.runtime.store.session(&account.id, &id).await?;
    let per_account = streams_allowed(&state, &account);
    let subscription = state
        .runtime
        .model_sessions
        .open(
            &state.runtime,
            session,
            slot,
            ModelProvider::OpenAiCompatible,
            per_account,
        )
        .await?;
    let headers = [
        (header::CONTENT_TYPE, "text/event-stream"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    let body = Body::from_stream(EventFrames::new(subscription, KEEP_ALIVE));
    Ok((headers, body))
}

/// How many live event streams `account` may hold, model sessions and console
/// observers together: the admin is the operator and has no cap; any other
/// account may not take every connection of the server with streams.
pub(crate) fn streams_allowed(state: &AppState, account: &crate::store::Account) -> Option<usize> {
    (!account.is_admin).then_some(state.runtime.settings.max_event_streams_per_account)
}
