//! The console's runtime-tools and MCP-servers pages.

use axum::extract::State;
use axum::http::StatusCode;

use super::auth::SignedIn;
use super::render::{ConsoleError, ConsoleResult, html};
use crate::console::views::mcp::{McpRow, mcp_page};
use crate::console::views::runtime_tools::{RuntimeToolRow, runtime_tools_page};
use crate::domain::PageRequest;
use crate::state::AppState;
use crate::store::McpServerFilter;
use crate::tools::remote::EVICTION_THRESHOLD;

/// Most MCP servers the page lists.
const SHOWN_SERVERS: i64 = 200;

/// `GET /console/runtime-tools`: the `/api/tools` registry of the account's
/// characters, as `GET /api/tools` lists it by role.
pub async fn runtime_tools(State(state): State<AppState>, viewer: SignedIn) -> ConsoleResult {
    let runtime = &state.runtime;
    let characters = runtime
        .store
        .all_characters()
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?;
    let failures = runtime.remote.failures();
    let rows: Vec<RuntimeToolRow> = characters
        .iter()
        .filter(|character| character.account_id == viewer.account_id())
        .flat_map(|character| runtime.remote.list(&character.id))
        .map(|tool| RuntimeToolRow {
            role: tool.role.clone(),
            name: tool.name.clone(),
            source: tool.source.clone(),
            callback_url: shown_callback_url(&tool.callback_url, viewer.session.account.is_admin),
            timeout_seconds: tool.timeout_seconds,
            side_effect_level: serde_json::to_value(tool.metadata().side_effect_level)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            failure_streak: failures.streak(tool.callback_url.origin(), &tool.source),
            eviction_threshold: EVICTION_THRESHOLD,
            evictable: tool.is_plugin(),
        })
        .collect();
    Ok(html(StatusCode::OK, runtime_tools_page(&viewer.nav, &rows)))
}

/// A callback URL as the console shows it: whole to the admin (the machine's
/// operator, who runs the plugins), its origin only to other accounts. A
/// plugin's path may hold its token, and a registration for every character
/// reaches every account's characters.
fn shown_callback_url(url: &crate::domain::CallbackUrl, viewer_is_admin: bool) -> String {
    if viewer_is_admin {
        url.as_str().to_owned()
    } else {
        format!("{}/…", url.origin())
    }
}

/// `GET /console/mcp`: the account's MCP servers with `live_status`, as
/// `GET /mcp/servers` answers them.
pub async fn mcp_servers(State(state): State<AppState>, viewer: SignedIn) -> ConsoleResult {
    let runtime = &state.runtime;
    let listed = async {
        let page = PageRequest::parse(Some(SHOWN_SERVERS), None, None, None, &["created_at"])?;
        runtime
            .store
            .list_mcp_servers(viewer.account_id(), McpServerFilter::default(), page)
            .await
    };
    let servers = listed
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?;
    let rows: Vec<McpRow> = servers
        .items
        .iter()
        .map(|server| McpRow {
            id: server.id.clone(),
            name: server.config.name.clone(),
            transport: server.config.transport.as_str().to_owned(),
            enabled: server.config.enabled,
            live_status: runtime.mcp.live_status(server),
        })
        .collect();
    Ok(html(StatusCode::OK, mcp_page(&viewer.nav, &rows)))
}

/// `GET /console/activity`: the account's last hour of calls, per provider.
pub async fn activity(State(state): State<AppState>, viewer: SignedIn) -> ConsoleResult {
    use crate::console::activity::{MINUTES, Sample, summarise};
    let now = crate::ids::now_ms();
    let since = now - MINUTES as i64 * 60_000;
    let samples: Vec<Sample> = state
        .runtime
        .store
        .activity_samples(viewer.account_id(), since)
        .await
        .map_err(|err| ConsoleError::from(err).with_nav(&viewer.nav))?
        .into_iter()
        .map(|(provider_id, started_at, duration_ms)| Sample {
            provider_id,
            started_at,
            duration_ms,
        })
        .collect();
    // Up to 200,000 samples sorted by minute: CPU work, off the async workers.
    let providers = tokio::task::spawn_blocking(move || summarise(&samples, now))
        .await
        .map_err(|err| {
            ConsoleError::from(crate::error::Error::Internal(anyhow::anyhow!(
                "summarising the activity failed: {err}"
            )))
            .with_nav(&viewer.nav)
        })?;
    Ok(html(
        StatusCode::OK,
        crate::console::views::activity::activity_page(&viewer.nav, &providers),
    ))
}
