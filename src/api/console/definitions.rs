//! The definitions pages: list, create, edit, enable/disable and "try it",
//! each through the same functions as `/tools/definitions` and
//! `POST /sessions/{id}/tool-calls`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::auth::SignedIn;
use super::guard::ConsolePost;
use super::render::{
    ConsoleError, ConsoleResult, Notice, NoticeQuery, html, redirect_with_notice, status_of,
};
use super::sessions::PAGE_ROWS;
use crate::call::{CallArguments, ToolCall};
use crate::console::definition_form::{definition_changes, try_call};
use crate::console::views::Nav;
use crate::console::views::definitions::{
    DefinitionView, FormValues, TryValues, definition_page, definitions_page, new_definition_page,
};
use crate::domain::PageRequest;
use crate::error::{Error, Result};
use crate::state::AppState;
use crate::store::DefinitionFilter;

/// Sessions the "try it" form offers (the account's newest).
const TRY_SESSIONS: i64 = 50;

/// Query of the definitions list.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    offset: i64,
}

/// `GET /console/definitions`.
pub async fn list(
    State(state): State<AppState>,
    viewer: SignedIn,
    Query(query): Query<ListQuery>,
) -> ConsoleResult {
    let offset = query.offset.max(0);
    let listed = async {
        let page = PageRequest::parse(Some(PAGE_ROWS), Some(offset), None, None, &["updated_at"])?;
        state
            .runtime
            .store
            .list_definitions(viewer.account_id(), &DefinitionFilter::default(), page)
            .await
    };
    let page = listed
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?;
    Ok(html(
        StatusCode::OK,
        definitions_page(&viewer.nav, &page.items, offset, PAGE_ROWS, page.total),
    ))
}

/// `GET /console/definitions/new`.
pub async fn new_form(viewer: SignedIn) -> Response {
    html(
        StatusCode::OK,
        new_definition_page(&viewer.nav, &FormValues::new_definition(), None),
    )
}

/// A refusal the form is shown again for (with what was posted), rather than
/// an error page: the author fixes the field and posts again.
fn shown_on_form(err: &Error) -> bool {
    let status = err.code().status();
    (400..500).contains(&status) && status != 404
}

/// `POST /console/definitions`: creates as `POST /tools/definitions` does.
pub async fn create(State(state): State<AppState>, post: ConsolePost) -> ConsoleResult {
    let nav = &post.signed_in.nav;
    let created = async {
        let changes = definition_changes(&post.fields, true)?;
        super::super::definitions::create(&state, post.signed_in.account_id(), changes).await
    };
    match created.await {
        Ok(definition) => Ok(to_definition(&definition.id, Notice::DefinitionCreated)),
        Err(err) if shown_on_form(&err) => Ok(html(
            status_of(err.code()),
            new_definition_page(
                nav,
                &FormValues::posted(&post.fields),
                Some(&err.to_string()),
            ),
        )),
        Err(err) => Err(ConsoleError::from(err).with_nav(nav)),
    }
}

fn to_definition(id: &str, notice: Notice) -> Response {
    redirect_with_notice(&format!("/console/definitions/{id}"), notice)
}

/// A definition's page, its form holding `values` (the stored definition's
/// when None).
/// What a refused post had typed into the page's forms, shown again.
#[derive(Default)]
struct Typed {
    /// The definition form's fields.
    definition: Option<FormValues>,
    /// The "try it" form's fields.
    tried: Option<TryValues>,
}

async fn render(
    state: &AppState,
    nav: &Nav,
    account_id: &str,
    id: &str,
    typed: Typed,
    error: Option<&Error>,
    notice: Option<&str>,
) -> Result<Response> {
    let store = &state.runtime.store;
    let definition = store.definition(account_id, id).await?;
    let (sessions, _) = store
        .search_sessions(account_id, "", TRY_SESSIONS, 0)
        .await?;
    let values = typed
        .definition
        .unwrap_or_else(|| FormValues::of(&definition));
    let message = error.map(ToString::to_string);
    let tried = typed.tried.unwrap_or_default();
    let view = DefinitionView {
        definition: &definition,
        values: &values,
        tried: &tried,
        sessions: &sessions,
        error: message.as_deref(),
        notice,
    };
    let status = error.map_or(StatusCode::OK, |err| status_of(err.code()));
    Ok(html(status, definition_page(nav, &view)))
}

/// `GET /console/definitions/{id}`.
pub async fn page(
    State(state): State<AppState>,
    viewer: SignedIn,
    Path(id): Path<String>,
    Query(query): Query<NoticeQuery>,
) -> ConsoleResult {
    let notice = Notice::text_of(query.notice.as_deref());
    render(
        &state,
        &viewer.nav,
        viewer.account_id(),
        &id,
        Typed::default(),
        None,
        notice,
    )
    .await
    .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))
}

/// Shows a definition's page again after `outcome`: a redirect with `notice`
/// on success, the page with the refusal (and, for the edit form, what was
/// posted) when the author can fix it.
async fn after(
    state: &AppState,
    post: &ConsolePost,
    id: &str,
    outcome: Result<Response>,
    typed: Typed,
) -> ConsoleResult {
    let nav = &post.signed_in.nav;
    let shown = match outcome {
        Ok(response) => Ok(response),
        Err(err) if shown_on_form(&err) => {
            let account_id = post.signed_in.account_id();
            render(state, nav, account_id, id, typed, Some(&err), None).await
        }
        Err(err) => Err(err),
    };
    shown.map_err(|err| ConsoleError::from(err).with_nav(nav))
}

/// `POST /console/definitions/{id}`: saves the form as
/// `PATCH /tools/definitions/{id}` does.
pub async fn save(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let saved = async {
        let changes = definition_changes(&post.fields, false)?;
        super::super::definitions::update(&state, post.signed_in.account_id(), &id, changes)
            .await?;
        Ok(to_definition(&id, Notice::DefinitionSaved))
    };
    let outcome = saved.await;
    after(
        &state,
        &post,
        &id,
        outcome,
        Typed {
            definition: Some(FormValues::posted(&post.fields)),
            tried: None,
        },
    )
    .await
}

/// `POST /console/definitions/{id}/toggle`: `enabled=true|false`, as
/// `PATCH /tools/definitions/{id}/toggle` takes it.
pub async fn toggle(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let toggled = async {
        let enabled = match post.fields.required("enabled")? {
            "true" => true,
            "false" => false,
            _ => return Err(Error::validation("enabled must be true or false")),
        };
        let account_id = post.signed_in.account_id();
        let saved = super::super::definitions::toggle(&state, account_id, &id, enabled).await?;
        let notice = if saved.enabled {
            Notice::DefinitionEnabled
        } else {
            Notice::DefinitionDisabled
        };
        Ok(to_definition(&id, notice))
    };
    let outcome = toggled.await;
    after(&state, &post, &id, outcome, Typed::default()).await
}

/// `POST /console/definitions/{id}/try`: calls the definition's tool in the
/// chosen session as its model would (`POST /sessions/{id}/tool-calls`), then
/// opens the execution.
pub async fn try_it(
    State(state): State<AppState>,
    Path(id): Path<String>,
    post: ConsolePost,
) -> ConsoleResult {
    let account_id = post.signed_in.account_id();
    let called = async {
        let definition = state.runtime.store.definition(account_id, &id).await?;
        let asked = try_call(&post.fields)?;
        let call = ToolCall {
            name: definition.name.clone(),
            arguments: CallArguments::from_json(Some(asked.arguments)),
            call_id: crate::ids::new_id("call"),
            caller_slot: asked.caller_slot,
            floor_id: None,
            run_id: None,
            step: None,
        };
        let result = state
            .runtime
            .call(account_id, &asked.session_id, call)
            .await?;
        tracing::info!(definition = %definition.id, execution = %result.execution_id, "definition tried from the console");
        Ok(Redirect::to(&format!("/console/executions/{}", result.execution_id)).into_response())
    };
    let outcome = called.await;
    let typed = Typed {
        definition: None,
        tried: Some(TryValues::posted(&post.fields)),
    };
    after(&state, &post, &id, outcome, typed).await
}
