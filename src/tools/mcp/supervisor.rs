//! One task per attached server: connects, lists the tools (and stores them as
//! the server's snapshot), watches the connection (MCP `ping`, the transport
//! ending, `tools/list_changed`, the refresh interval) and reconnects through
//! the breaker when it is lost.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::backoff::Breaker;
use super::connection::{Connection, Notice};
use super::status::ConnectionState;
use super::{Command, Shared, Slot, Snapshot, build_listed, diff, names};
use crate::catalog::mutate_with;
use crate::ids::now_ms;

/// How often a connected server is pinged.
const PING_INTERVAL: Duration = Duration::from_secs(4);
/// Least time between two listings a server's `tools/list_changed` asks for.
const LIST_CHANGED_GAP: Duration = Duration::from_millis(500);
/// How long a ping may take before the connection counts as lost.
const PING_TIMEOUT: Duration = Duration::from_secs(4);

/// How a connected period ended.
enum End {
    /// The hub stopped the slot (disable, delete, config change, shutdown).
    Stop,
    /// The management API disconnected it; wait for `Connect`.
    Disconnected,
    /// A call timed out on it, or `Connect` asked for a fresh one: reconnect now.
    Recycled,
    /// The server stopped answering or hung up.
    Lost(String),
    /// As `Lost`, already recorded (before its connection was closed).
    LostRecorded,
}

/// Runs the server's connection until the slot is stopped.
pub(super) async fn supervise(
    slot: Arc<Slot>,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    if let Some(error) = &slot.server.secrets_error {
        // Run without its env or headers, it would be misconfigured.
        record_failure(&slot, &shared, error, "mcp.error");
        slot.stop.cancelled().await;
        return;
    }
    let mut breaker = Breaker::default();
    let mut idle = false;
    loop {
        if idle && !wait_for_connect(&slot, &mut commands).await {
            return;
        }
        idle = false;
        let delay = match connect_and_run(&slot, &shared, &mut commands).await {
            End::Stop => return,
            End::Disconnected => {
                idle = true;
                continue;
            }
            End::Recycled => {
                breaker.success();
                continue;
            }
            End::Lost(error) => {
                record_failure(&slot, &shared, &error, "mcp.disconnected");
                breaker.failure(&slot.server.id)
            }
            End::LostRecorded => breaker.failure(&slot.server.id),
        };
        tokio::select! {
            _ = slot.stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
            command = commands.recv() => match command {
                None => return,
                Some(Command::Disconnect) => idle = true,
                Some(Command::Connect | Command::Recycle) => breaker.success(),
            },
        }
    }
}

/// After a manual disconnect: waits for `Connect`; `false` when stopped.
async fn wait_for_connect(slot: &Slot, commands: &mut mpsc::UnboundedReceiver<Command>) -> bool {
    slot.update(|state| {
        state.connection = ConnectionState::Disconnected;
        state.peer = None;
    });
    loop {
        tokio::select! {
            _ = slot.stop.cancelled() => return false,
            command = commands.recv() => match command {
                None => return false,
                Some(Command::Connect) => return true,
                Some(_) => continue,
            },
        }
    }
}

/// One connection: open, list, watch. Failures to connect count as lost.
async fn connect_and_run(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> End {
    let config = &slot.server.config;
    slot.update(|state| {
        if state.connection != ConnectionState::ReconnectRequired {
            state.connection = ConnectionState::Connecting;
        }
        state.peer = None;
    });
    let (notices, mut notice_rx) = mpsc::channel(1);
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let opened = tokio::select! {
        _ = slot.stop.cancelled() => return End::Stop,
        opened = tokio::time::timeout(timeout, async {
            let reach = shared.reach(&slot.server);
            let mark = shared.store.deployment_mark();
            let connection =
                Connection::open(config, &slot.server.id, notices, reach, mark).await?;
            let tools = connection.list_tools().await;
            match tools {
                Ok(tools) => Ok((connection, tools)),
                Err(error) => {
                    connection.close().await;
                    Err(error)
                }
            }
        }) => opened,
    };
    let (connection, tools) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(error)) => return End::Lost(error),
        Err(_) => {
            return End::Lost(format!(
                "no connection within connect_timeout_ms = {}",
                config.connect_timeout_ms
            ));
        }
    };
    let connected_at = now_ms();
    publish_tools(slot, shared, tools, Some(&connection), connected_at).await;
    tracing::info!(server_id = %slot.server.id, server = ?config.name, "MCP server connected");
    let end = match watch(slot, shared, &connection, commands, &mut notice_rx).await {
        // Said before the close, which may wait seconds for the server's
        // session to end (and the status and events should not).
        End::Lost(error) => {
            record_failure(slot, shared, &error, "mcp.disconnected");
            End::LostRecorded
        }
        end => end,
    };
    slot.update(|state| state.peer = None);
    connection.close().await;
    end
}

/// Watches a live connection until it ends.
async fn watch(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    connection: &Connection,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    notices: &mut mpsc::Receiver<Notice>,
) -> End {
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.reset();
    let refresh_ms = slot.server.config.tool_refresh_interval_ms;
    let mut refresh = tokio::time::interval(Duration::from_millis(refresh_ms.max(1_000)));
    refresh.reset();
    let ended = connection.ended();
    tokio::pin!(ended);
    let flooded = connection.flooded();
    tokio::pin!(flooded);
    // A changed list is listed again at most once per LIST_CHANGED_GAP; the
    // notices in between are one change.
    let mut listed_at = tokio::time::Instant::now();
    let mut list_changed = false;
    loop {
        tokio::select! {
            _ = slot.stop.cancelled() => return End::Stop,
            _ = &mut ended => return End::Lost("the server closed the connection".to_owned()),
            _ = &mut flooded => {
                return End::Lost(format!(
                    "the server sent more than {} requests in a second; the connection was dropped",
                    super::connection::MAX_SERVER_REQUESTS_PER_SECOND
                ));
            }
            command = commands.recv() => match command {
                None => return End::Stop,
                Some(Command::Disconnect) => return End::Disconnected,
                Some(Command::Connect | Command::Recycle) => {
                    slot.update(|state| state.connection = ConnectionState::ReconnectRequired);
                    return End::Recycled;
                }
            },
            Some(Notice::ToolListChanged) = notices.recv(), if !list_changed => {
                list_changed = true;
            }
            () = tokio::time::sleep_until(listed_at + LIST_CHANGED_GAP), if list_changed => {
                list_changed = false;
                listed_at = tokio::time::Instant::now();
                if let Err(error) = refresh_tools(slot, shared, connection).await {
                    return End::Lost(error);
                }
            }
            _ = refresh.tick(), if refresh_ms > 0 => {
                if let Err(error) = refresh_tools(slot, shared, connection).await {
                    return End::Lost(error);
                }
            }
            _ = ping.tick() => {
                if let Err(error) = connection.ping(PING_TIMEOUT).await {
                    return End::Lost(error);
                }
            }
        }
    }
}

async fn refresh_tools(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    connection: &Connection,
) -> Result<(), String> {
    let tools = tokio::time::timeout(
        Duration::from_millis(slot.server.config.call_timeout_ms),
        connection.list_tools(),
    )
    .await
    .map_err(|_| "tools/list unanswered".to_owned())??;
    let connected_at = slot.state().connected_at.unwrap_or_else(now_ms);
    publish_tools(slot, shared, tools, Some(connection), connected_at).await;
    Ok(())
}

/// Makes a fresh listing the server's tools: stored as its snapshot, offered
/// to the account's live model sessions as one catalog change.
async fn publish_tools(
    slot: &Arc<Slot>,
    shared: &Arc<Shared>,
    tools: Vec<rmcp::model::Tool>,
    connection: Option<&Connection>,
    connected_at: i64,
) {
    let at = now_ms();
    let tools = Arc::new(tools);
    let listed = build_listed(shared, &slot.server, tools.clone(), at).await;
    let count = listed.tools.len();
    let was_connected = slot.state().is_live();
    if !was_connected && slot.state().connected_at.is_some() {
        crate::metrics::metrics().mcp_reconnects.inc();
    }
    let update = async {
        let before = names(&slot.state());
        slot.update(|state| {
            state.listed = Some(listed);
            state.connection = ConnectionState::Connected;
            state.peer = connection.map(Connection::live_peer);
            state.connected_at = Some(connected_at);
            state.error = None;
        });
        let after = names(&slot.state());
        let change = diff(&slot.server.account_id, &before, &after, false);
        let changed = !change.added.is_empty() || !change.removed.is_empty();
        ((), if changed { vec![change] } else { Vec::new() })
    };
    match shared.listener.get() {
        Some(listener) => {
            mutate_with(listener.catalog_events(), update).await;
        }
        None => {
            update.await;
        }
    }
    let previous = shared.snapshots.lock().expect("snapshots lock").insert(
        slot.server.id.clone(),
        Snapshot {
            tools: tools.clone(),
            at,
        },
    );
    // A refresh that lists the same tools (every poll, every reconnect) has
    // nothing new to store.
    if previous.is_none_or(|previous| previous.tools != tools) {
        let stored = serde_json::to_value(tools.as_ref()).unwrap_or_default();
        if let Err(error) = shared
            .store
            .save_mcp_snapshot(&slot.server.id, &stored, at)
            .await
        {
            tracing::warn!(server_id = %slot.server.id, %error, "could not store an MCP tool snapshot");
        }
    }
    if !was_connected {
        publish(
            slot,
            shared,
            "mcp.connected",
            json!({"tool_count": count, "toolCount": count}),
        );
    }
}

/// Records a lost or failed connection: the tools read `cached` from now on.
fn record_failure(slot: &Slot, shared: &Shared, error: &str, event: &'static str) {
    let was_connected = slot.update(|state| {
        let was = state.connection == ConnectionState::Connected;
        state.connection = ConnectionState::Error;
        state.peer = None;
        state.error = Some(error.to_owned());
        was
    });
    tracing::warn!(server_id = %slot.server.id, server = ?slot.server.config.name, error = ?error, "MCP server connection failed");
    let name = if was_connected { event } else { "mcp.error" };
    publish(slot, shared, name, json!({"error": error}));
}

/// Sends an `mcp.*` event to the account's event streams.
fn publish(slot: &Slot, shared: &Shared, name: &'static str, mut data: serde_json::Value) {
    let Some(listener) = shared.listener.get() else {
        return;
    };
    if let Some(fields) = data.as_object_mut() {
        fields.insert("server_id".into(), json!(slot.server.id));
        fields.insert("serverId".into(), json!(slot.server.id));
        fields.insert("server_name".into(), json!(slot.server.config.name));
        fields.insert("serverName".into(), json!(slot.server.config.name));
    }
    listener.publish(&slot.server.account_id, name, data);
}
