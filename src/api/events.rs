//! `GET /sessions/{id}/events`: a Server-Sent Events stream that is, while open, a
//! live model session of the session's character. It starts with `ready` and
//! receives `catalog_changed` whenever that character's catalog changes.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::error::ApiResult;
use super::extract::Path;
use crate::model_sessions::ModelProvider;
use crate::state::AppState;

/// Comment lines keep idle connections (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(session_events))
}

/// Subscribe to a session's events as a live model session.
#[utoipa::path(get, path = "/sessions/{id}/events", tag = "sessions",
    params(("id" = String, Path)),
    responses(
        (status = 200, content_type = "text/event-stream",
            description = "events `ready` then `catalog_changed` (JSON data: role, added, updated, removed, accepted, error, tools)"),
        (status = 404, description = "no such session for this account"),
        (status = 503, description = "`shutting_down`: the server is stopping; retry after `Retry-After` seconds"),
    ))]
async fn session_events(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(id): Path<String>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let session = state.store.session(&account.id, &id).await?;
    let subscription = state
        .runtime
        .model_sessions
        .open(&state.runtime, session, ModelProvider::OpenAiCompatible)
        .await?;
    let stream = subscription.map(|event| {
        Ok(Event::default()
            .event(event.kind)
            .data(event.data.to_string()))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}
