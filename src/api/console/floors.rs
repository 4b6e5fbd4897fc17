//! A floor's runs and pages: commit, discard, open a run through the replay
//! guard and confirm what it would repeat.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::auth::SignedIn;
use super::guard::ConsolePost;
use super::render::{
    ConsoleError, ConsoleResult, JournalPageQuery, Notice, html, redirect_with_notice,
};
use super::sessions::journal_page;
use crate::console::views::Nav;
use crate::console::views::floor::{FloorView, floor_page};
use crate::error::{Error, Result};
use crate::journal::query::ExecutionQueryParams;
use crate::state::AppState;

async fn render(
    state: &AppState,
    nav: &Nav,
    account_id: &str,
    floor_id: &str,
    blocking: Option<&Value>,
    query: &JournalPageQuery,
) -> Result<Response> {
    let store = &state.runtime.store;
    let floor = store.floor(account_id, floor_id).await?;
    let runs = store.runs_of_floor(account_id, &floor.id).await?;
    let offset = query.offset.max(0);
    let params = ExecutionQueryParams {
        floor_id: Some(floor.id.clone()),
        offset: Some(offset),
        ..Default::default()
    };
    let executions = journal_page(state, account_id, params).await?;
    let view = FloorView {
        floor: &floor,
        runs: &runs,
        executions: &executions.items,
        journal_offset: offset,
        journal_limit: super::sessions::journal_step(&executions),
        journal_total: executions.total,
        journal_total_is_estimate: executions.total_is_estimate == Some(true),
        blocking,
        notice: Notice::text_of(query.notice.as_deref()),
    };
    let status = if blocking.is_some() {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    Ok(html(status, floor_page(nav, &view)))
}

/// `GET /console/floors/{id}`.
pub async fn page_handler(
    State(state): State<AppState>,
    viewer: SignedIn,
    Path(id): Path<String>,
    Query(query): Query<JournalPageQuery>,
) -> ConsoleResult {
    render(&state, &viewer.nav, viewer.account_id(), &id, None, &query)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))
}

/// `POST /console/floors/{id}/runs`: opens a run as `POST /floors/{id}/runs`
/// does, with the ticked `confirmed_execution_ids`; the replay guard's refusal
/// is shown as the confirmation form.
pub async fn open_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let nav = &post.signed_in.nav;
    let account_id = post.signed_in.account_id();
    let confirmed: Vec<String> = post
        .fields
        .all("confirmed_execution_ids")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let opened = state.runtime.open_run(account_id, &id, confirmed).await;
    let result = match opened {
        Ok(run) => Ok(back_to_floor(&run.floor_id, Notice::RunOpened)),
        Err(Error::ReplayConfirmationRequired {
            blocking_executions,
            ..
        }) => {
            render(
                &state,
                nav,
                account_id,
                &id,
                Some(&blocking_executions),
                &JournalPageQuery::default(),
            )
            .await
        }
        Err(err) => Err(err),
    };
    result.map_err(|err| ConsoleError::from(err).with_nav(nav))
}

fn back_to_floor(floor_id: &str, notice: Notice) -> Response {
    redirect_with_notice(&format!("/console/floors/{floor_id}"), notice)
}

/// Back to the floor of a committed or discarded run, or the refusal.
fn settled(run: Result<crate::store::Run>, post: &ConsolePost, notice: Notice) -> ConsoleResult {
    match run {
        Ok(run) => Ok(back_to_floor(&run.floor_id, notice)),
        Err(err) => Err(ConsoleError::from(err).with_nav(&post.signed_in.nav)),
    }
}

/// `POST /console/runs/{id}/commit`, as `POST /runs/{id}/commit`.
pub async fn commit(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let run = state
        .runtime
        .commit_run(post.signed_in.account_id(), &id, None)
        .await;
    settled(run, &post, Notice::RunCommitted)
}

/// `POST /console/runs/{id}/discard`, as `POST /runs/{id}/discard`.
pub async fn discard(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let run = state
        .runtime
        .discard_run(post.signed_in.account_id(), &id)
        .await;
    settled(run, &post, Notice::RunDiscarded)
}
