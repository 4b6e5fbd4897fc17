//! One execution's detail page.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::SignedIn;
use super::render::{ConsoleError, ConsoleResult, html};
use crate::console::views::execution::execution_page;
use crate::state::AppState;

/// `GET /console/executions/{id}`: the row as `GET /tool-executions/{id}`
/// answers it; another account's id is not found.
pub async fn page(
    State(state): State<AppState>,
    viewer: SignedIn,
    Path(id): Path<String>,
) -> ConsoleResult {
    let record = state
        .runtime
        .store
        .execution(viewer.account_id(), &id)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?
        .ok_or_else(|| {
            ConsoleError::not_found(format!("tool execution {id:?}")).with_nav(&viewer.nav)
        })?;
    Ok(html(StatusCode::OK, execution_page(&viewer.nav, &record)))
}
