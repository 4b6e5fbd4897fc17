//! The sessions list, a session's page, its permission form and its live
//! journal stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::auth::SignedIn;
use super::guard::ConsolePost;
use super::render::{
    ConsoleError, ConsoleResult, JournalPageQuery, Notice, html, redirect_with_notice,
};
use crate::console::forms::{PERMISSIONS_VERSION, permissions_body, permissions_version};
use crate::console::views::catalog::catalog_json;
use crate::console::views::journal::journal_row_json;
use crate::console::views::session::{SessionView, session_page};
use crate::console::views::sessions::sessions_page;
use crate::journal::query::{ExecutionQuery, ExecutionQueryParams};
use crate::permissions::ToolPermissions;
use crate::state::AppState;

/// Rows per page of the console's lists.
pub const PAGE_ROWS: i64 = 50;
/// Floors the session page lists (the newest).
const SHOWN_FLOORS: usize = 100;
/// Longest search text accepted.
const MAX_SEARCH_CHARS: usize = 200;

/// Query of the sessions list.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    offset: i64,
}

/// `GET /console/sessions`.
pub async fn list(
    State(state): State<AppState>,
    viewer: SignedIn,
    Query(query): Query<ListQuery>,
) -> ConsoleResult {
    let text: String = query.q.trim().chars().take(MAX_SEARCH_CHARS).collect();
    let offset = query.offset.max(0);
    let (sessions, total) = state
        .runtime
        .store
        .search_sessions(viewer.account_id(), &text, PAGE_ROWS, offset)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?;
    Ok(html(
        StatusCode::OK,
        sessions_page(&viewer.nav, &text, &sessions, offset, PAGE_ROWS, total),
    ))
}

/// The newest journal rows of a session, `offset` rows in.
pub async fn journal_page(
    state: &AppState,
    account_id: &str,
    params: ExecutionQueryParams,
) -> crate::error::Result<crate::domain::Page<crate::journal::ExecutionRecord>> {
    let query = ExecutionQuery::parse(ExecutionQueryParams {
        limit: Some(PAGE_ROWS),
        sort_by: Some("started_at".into()),
        sort_order: Some("desc".into()),
        ..params
    })?;
    state
        .runtime
        .store
        .query_executions(account_id, query)
        .await
}

/// How far the pager's "older" link steps from a journal page: past the
/// rows shown, which are fewer than [`PAGE_ROWS`] on a page that ended at
/// the journal's byte bound with rows left.
pub fn journal_step<T>(page: &crate::domain::Page<T>) -> i64 {
    if page.has_more() {
        (page.items.len() as i64).clamp(1, PAGE_ROWS)
    } else {
        PAGE_ROWS
    }
}

/// `GET /console/sessions/{id}`.
pub async fn page_of(
    state: &AppState,
    viewer: &SignedIn,
    id: &str,
    query: JournalPageQuery,
) -> crate::error::Result<Response> {
    let runtime = &state.runtime;
    let account_id = viewer.account_id();
    let session = runtime.store.session(account_id, id).await?;
    let catalog = runtime.offered_catalog(&session, None).await?;
    let tools: Vec<serde_json::Value> = catalog
        .entries
        .iter()
        .map(crate::catalog::CatalogEntry::summary_json)
        .collect();
    let mcp_servers = runtime.mcp.catalog_servers(&session.account_id);
    let permissions = ToolPermissions::from_metadata(&session.metadata)?;
    let newest = crate::domain::PageRequest {
        limit: SHOWN_FLOORS as i64,
        offset: 0,
        sort_by: "seq",
        sort_order: crate::domain::SortOrder::Desc,
    };
    let (floors, _) = runtime
        .store
        .floors_page(account_id, &session.id, &newest)
        .await?;
    let offset = query.offset.max(0);
    let params = ExecutionQueryParams {
        session_id: Some(session.id.clone()),
        offset: Some(offset),
        ..Default::default()
    };
    let journal = journal_page(state, account_id, params).await?;
    let view = SessionView {
        session: &session,
        tools: &tools,
        mcp_servers: &mcp_servers,
        permissions: &permissions,
        floors: &floors,
        journal: &journal.items,
        journal_offset: offset,
        journal_limit: journal_step(&journal),
        journal_total: journal.total,
        journal_total_is_estimate: journal.total_is_estimate == Some(true),
        notice: Notice::text_of(query.notice.as_deref()),
    };
    Ok(html(StatusCode::OK, session_page(&viewer.nav, &view)))
}

/// `GET /console/sessions/{id}`.
pub async fn page(
    State(state): State<AppState>,
    viewer: SignedIn,
    Path(id): Path<String>,
    Query(query): Query<JournalPageQuery>,
) -> ConsoleResult {
    page_of(&state, &viewer, &id, query)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))
}

/// `POST /console/sessions/{id}/permissions`: merges the fields the form
/// shows as `PATCH /sessions/{id}/tool-permissions` does (live model sessions
/// get `catalog_changed`), unless the stored permissions changed after the
/// form was drawn, then shows the session again.
pub async fn save_permissions(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let nav = post.signed_in.nav.clone();
    let saved = async {
        let body = permissions_body(&post.fields)?;
        super::super::permissions::save(&state, post.signed_in.account_id(), &id, |metadata| {
            // Read once the session is found: another account's id is a 404
            // whatever the form holds.
            let drawn_from = post.fields.required(PERMISSIONS_VERSION)?;
            let current = ToolPermissions::from_metadata(metadata)?;
            // Checked in the same write that stores the change: nothing can
            // come between.
            if permissions_version(&current.to_json()) != drawn_from {
                return Err(crate::error::Error::refused(
                    crate::error::ErrorCode::PermissionsChanged,
                    "the permissions changed after this page was drawn (in the API or another tab); nothing was saved: reload the page",
                ));
            }
            current.patched(&body)
        })
        .await
        .map(drop)
        .map_err(|err| crate::error::Error::refused(err.code, err.message))
    };
    saved
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&nav))?;
    Ok(redirect_with_notice(
        &format!("/console/sessions/{id}"),
        Notice::PermissionsSaved,
    ))
}

/// Comment lines keep idle streams (and proxies) from timing out.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /console/sessions/{id}/events`: the session's journal rows as they
/// are written (`journal` events, each a row as the page renders it) and its
/// catalog after every change to it (`catalog` events, the table's rows), from
/// the model-session hub: no polling.
pub async fn events(
    State(state): State<AppState>,
    viewer: SignedIn,
    Path(id): Path<String>,
) -> ConsoleResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let account_id = viewer.account_id().to_owned();
    let session = state
        .runtime
        .store
        .session(&account_id, &id)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?;
    let per_account = crate::api::events::streams_allowed(&state, &viewer.session.account);
    let subscription = state
        .runtime
        .model_sessions
        .observe(session.clone(), per_account)?;
    let runtime = state.runtime.clone();
    // The sign-in was checked when the stream opened; it ends with the
    // sign-in (sign-out, expiry) rather than outliving it.
    let signed_out = viewer.session.clone().over();
    let stream = subscription
        .take_until(signed_out)
        .filter_map(move |event| {
            let runtime = runtime.clone();
            let session = session.clone();
            async move {
                let catalog_moved =
                    event.kind == "catalog_changed" || event.kind.starts_with("mcp.");
                let event = if catalog_moved {
                    catalog_event(&runtime, &session).await?
                } else {
                    journal_event(&runtime, &session.account_id, &event.data.to_value()).await?
                };
                Some(Ok(event))
            }
        })
        .boxed();
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// The journal row an event names, as the page renders it.
async fn journal_event(
    runtime: &crate::runtime::ToolRuntime,
    account_id: &str,
    data: &serde_json::Value,
) -> Option<Event> {
    let execution_id = data["execution_id"].as_str()?;
    let record = runtime
        .store
        .execution(account_id, execution_id)
        .await
        .ok()??;
    Some(
        Event::default()
            .event("journal")
            .data(journal_row_json(&record).to_string()),
    )
}

/// The session's catalog as it is now (permissions included), as the page's
/// table rows.
async fn catalog_event(
    runtime: &crate::runtime::ToolRuntime,
    session: &crate::store::Session,
) -> Option<Event> {
    // Read again: the permissions in the session's metadata may be what changed.
    let fresh = async {
        let session = runtime
            .store
            .session(&session.account_id, &session.id)
            .await?;
        runtime.offered_catalog(&session, None).await
    };
    let catalog = match fresh.await {
        Ok(catalog) => catalog,
        Err(err) => {
            tracing::warn!(session_id = ?session.id, error = %err, "console: the changed catalog could not be assembled");
            return None;
        }
    };
    let tools: Vec<serde_json::Value> = catalog
        .entries
        .iter()
        .map(crate::catalog::CatalogEntry::summary_json)
        .collect();
    Some(
        Event::default()
            .event("catalog")
            .data(catalog_json(&tools).to_string()),
    )
}
