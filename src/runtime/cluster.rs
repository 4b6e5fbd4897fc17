//! Catalog changes made on other instances sharing the database reach this
//! instance's live model sessions as `catalog_changed`, as if made here. The
//! store has already dropped what it cached of the changed rows when the
//! event arrives (the writer announced its rows before its catalog change).
//! An MCP server created, changed or deleted on another instance is
//! attached, re-attached or detached here too: every instance keeps its own
//! connections to every stored server.

use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use crate::catalog::{CatalogChange, CatalogEvents};

/// The announcement topic of catalog changes.
const TOPIC: &str = "catalog";
/// The announcement topic of MCP server configuration changes.
const MCP_TOPIC: &str = "mcp_servers";
/// The announcement topic of a cancel asked of a run another instance generates.
const RUN_CANCEL_TOPIC: &str = "run_cancel";
/// The announcement topic of a deleted chat session, whose event streams
/// every instance closes.
const SESSION_DELETED_TOPIC: &str = "session_deleted";
/// How often an instance looks for generations that dead instances left
/// running (an instance is taken for dead after [`crate::store::STALE_AFTER_MS`]).
const DEAD_GENERATION_SWEEP: std::time::Duration = std::time::Duration::from_secs(5);

/// Tells the instance generating `run_id` that a client asked to cancel it
/// (recorded in the run too, for an instance that missed the news).
pub(super) async fn announce_run_cancel(runtime: &ToolRuntime, run_id: &str) {
    runtime
        .store
        .announce(
            RUN_CANCEL_TOPIC,
            serde_json::Value::String(run_id.to_owned()),
        )
        .await;
}

/// Tells the other instances that a chat session was deleted: they close its
/// event streams, as this instance did.
pub(super) async fn announce_session_deleted(
    runtime: &ToolRuntime,
    character_id: &str,
    session_id: &str,
) {
    let data = serde_json::json!({"character_id": character_id, "session_id": session_id});
    runtime.store.announce(SESSION_DELETED_TOPIC, data).await;
}

/// After announcements may have been missed: stops this instance's
/// generations that another instance asked to cancel or ended.
async fn catch_up_on_cancels(runtime: &ToolRuntime) {
    match runtime
        .store
        .runs_to_stop(&runtime.runs_generating_here())
        .await
    {
        Ok(stop) => {
            for run_id in stop {
                runtime.cancel_here(&run_id);
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "could not read the cancels asked of this instance's runs")
        }
    }
}

/// This instance was taken for dead (paused past the heartbeat's limit):
/// the others have swept its calls and may have discarded its generations
/// and taken over their sessions, so it stops every generation it drives.
fn stop_every_generation(runtime: &ToolRuntime) {
    let runs = runtime.runs_generating_here();
    for run_id in &runs {
        runtime.cancel_here(run_id);
    }
    if !runs.is_empty() {
        tracing::warn!(
            stopped = runs.len(),
            "this instance was taken for dead; its generations were stopped"
        );
    }
}

/// Discards the generations dead instances left running, so that their
/// sessions' runs can be closed without waiting for some instance to start.
async fn sweep_dead_generations(
    runtime: &ToolRuntime,
    failures: &mut crate::failure_log::FailureLog,
) {
    match runtime.discard_interrupted_generations().await {
        Ok(discarded) => {
            failures.succeeded();
            if discarded > 0 {
                tracing::warn!(
                    discarded,
                    "generations left running by a dead instance were discarded"
                );
            }
        }
        Err(err) => failures.failed(&err),
    }
}

/// Tells the other instances about a catalog change made here.
pub(super) async fn announce_catalog_change(runtime: &ToolRuntime, change: &CatalogChange) {
    if !runtime.store.shared_database() {
        return;
    }
    match serde_json::to_value(change) {
        Ok(data) => runtime.store.announce(TOPIC, data).await,
        Err(err) => {
            tracing::warn!(error = %err, "could not encode a catalog change for the other instances")
        }
    }
}

/// Tells the other instances that the account's MCP server `server_id` was
/// created, changed or deleted (they read which from the database).
pub async fn announce_mcp_server(runtime: &ToolRuntime, account_id: &str, server_id: &str) {
    if runtime.store.shared_database() {
        let data = serde_json::json!({"account_id": account_id, "server_id": server_id});
        runtime.store.announce(MCP_TOPIC, data).await;
    }
}

/// Attaches the server as it is stored now, or detaches it if it is gone.
async fn follow_mcp_server(runtime: &ToolRuntime, data: &serde_json::Value) {
    let (Some(account_id), Some(server_id)) =
        (data["account_id"].as_str(), data["server_id"].as_str())
    else {
        tracing::warn!("ignoring an unreadable MCP server change of another instance");
        return;
    };
    match runtime.store.mcp_server(account_id, server_id).await {
        Ok(server) => runtime.mcp.upsert(server).await,
        Err(crate::error::Error::NotFound(_)) => runtime.mcp.remove(account_id, server_id).await,
        Err(err) => {
            tracing::warn!(error = %format_args!("{err:#}"), server_id = ?server_id, "could not read an MCP server another instance changed")
        }
    }
}

/// Closes this instance's event streams of a session another instance deleted.
fn close_deleted_session(runtime: &ToolRuntime, data: &serde_json::Value) {
    if let (Some(character_id), Some(session_id)) =
        (data["character_id"].as_str(), data["session_id"].as_str())
    {
        runtime
            .model_sessions
            .close_chat_session(character_id, session_id);
    }
}

/// Offers other instances' catalog changes to this instance's live model
/// sessions until `stop` is cancelled.
pub async fn follow_other_instances(
    runtime: ToolRuntime,
    mut events: tokio::sync::broadcast::Receiver<crate::store::ClusterEvent>,
    stop: CancellationToken,
) {
    let mut sweep = tokio::time::interval(DEAD_GENERATION_SWEEP);
    let mut sweep_failures =
        crate::failure_log::FailureLog::new("sweeping dead instances' generations");
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => {
                sweep_dead_generations(&runtime, &mut sweep_failures).await;
                continue;
            }
            event = events.recv() => event,
        };
        let event = match event {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "missed catalog changes of other instances");
                catch_up_on_cancels(&runtime).await;
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        match event.topic.as_str() {
            MCP_TOPIC => {
                follow_mcp_server(&runtime, &event.data).await;
                continue;
            }
            RUN_CANCEL_TOPIC => {
                if let Some(run_id) = event.data.as_str() {
                    runtime.cancel_here(run_id);
                }
                continue;
            }
            SESSION_DELETED_TOPIC => {
                close_deleted_session(&runtime, &event.data);
                continue;
            }
            "resync" => {
                catch_up_on_cancels(&runtime).await;
                // A server created, changed, disabled or deleted while
                // nothing listened.
                if let Err(err) = runtime.reattach_mcp_servers().await {
                    tracing::warn!(error = %format_args!("{err:#}"), "could not read the stored MCP servers again");
                }
            }
            crate::store::TAKEN_FOR_DEAD => {
                stop_every_generation(&runtime);
                continue;
            }
            _ => {}
        }
        if event.topic != TOPIC {
            continue;
        }
        let change = match serde_json::from_value::<CatalogChange>(event.data) {
            Ok(change) => change,
            Err(err) => {
                tracing::warn!(error = %err, "ignoring an unreadable catalog change of another instance");
                continue;
            }
        };
        tracing::debug!(scope = ?change.scope, "catalog change from another instance");
        let results = runtime.mutate(Box::pin(async move { vec![change] })).await;
        for error in results.into_iter().filter_map(Result::err) {
            tracing::warn!(%error, "a live model session refused another instance's catalog change");
        }
    }
}
