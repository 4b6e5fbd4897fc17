//! Event streams of chat sessions that no longer exist are closed by the
//! instance that deletes the session and, on a shared database, by the others
//! when they hear of it. Neither covers a stream that joined while the delete
//! ran (its open read the session just before the row went) nor an instance
//! that missed the announcement (its listener was reconnecting): such a
//! stream would stay open for ever and keep its place under the account's
//! cap. The sweeper looks for them now and then, and closes them.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ToolRuntime;

/// How often the sweeper compares the live streams' sessions with the
/// database: one read per 256 sessions with live streams, none without.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Closes the streams of deleted sessions until `shutdown` is cancelled.
pub async fn run_gone_session_sweeper(runtime: ToolRuntime, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(SWEEP_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures =
        crate::failure_log::FailureLog::new("closing the event streams of deleted sessions");
    loop {
        tokio::select! {
            _ = ticker.tick() => match close_streams_of_gone_sessions(&runtime).await {
                Ok(()) => failures.succeeded(),
                Err(err) => failures.failed(&err),
            },
            () = shutdown.cancelled() => break,
        }
    }
}

/// One sweep: the sessions with live streams here that the database no
/// longer holds have their streams closed.
async fn close_streams_of_gone_sessions(runtime: &ToolRuntime) -> crate::error::Result<()> {
    let live = runtime.model_sessions.chat_sessions();
    if live.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = live.iter().map(|(_, session)| session.as_str()).collect();
    let existing = runtime.store.existing_session_ids(&ids).await?;
    for (character_id, session_id) in &live {
        if !existing.contains(session_id) {
            tracing::warn!(
                session_id = ?session_id,
                "a deleted session still had event streams here (deleted while one opened, or on another instance unheard); closing them"
            );
            runtime
                .model_sessions
                .close_chat_session(character_id, session_id);
        }
    }
    Ok(())
}
