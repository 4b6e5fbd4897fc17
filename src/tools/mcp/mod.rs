//! MCP servers as tool providers: one supervised connection per enabled server,
//! the tools each one lists (live, or the stored snapshot when it is down), and
//! the calls made to them.

mod backoff;
mod connection;
mod provider;
mod status;
mod supervisor;
pub mod tools;
mod traced_http;

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rmcp::model::Tool;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::catalog::{CatalogChange, CatalogEvents, CatalogScope, mutate_with};
use crate::domain::mcp::McpServer;
use crate::fast_map::FastMap;
use crate::store::Store;

pub use provider::McpProvider;
pub use status::{CatalogServer, ConnectionState, LiveStatus};
use status::{Listed, SlotState};
use tools::CatalogTool;
pub use traced_http::DEPLOYMENT_HEADER;

/// The answer of `POST /mcp/servers/{id}/test`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestReport {
    pub success: bool,
    pub tool_count: usize,
    pub duration_ms: u64,
    pub error: Option<String>,
}

/// Where the hub reports what it changed: catalog changes for live model
/// sessions, and `mcp.*` events for an account's event streams.
pub trait McpListener: Send + Sync {
    fn catalog_events(&self) -> &dyn CatalogEvents;
    /// Sends event `name` with `data` to the live model sessions of `account_id`.
    fn publish(&self, account_id: &str, name: &'static str, data: Value);
}

/// What the management API asks a server's supervisor to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// Connect now (after a manual disconnect, or skipping the backoff).
    Connect,
    /// Close the connection and stay disconnected until `Connect`.
    Disconnect,
    /// Close and reopen the connection (a call timed out on it).
    Recycle,
}

/// The tools a server listed last, as the server sent them (rebuilt into catalog
/// tools whenever the server's config changes).
#[derive(Debug, Clone)]
struct Snapshot {
    tools: Arc<Vec<Tool>>,
    at: i64,
}

/// One attached (enabled) server: its config, its connection's state, and how
/// to reach its supervisor.
pub(crate) struct Slot {
    server: McpServer,
    state: Mutex<SlotState>,
    commands: mpsc::UnboundedSender<Command>,
    stop: CancellationToken,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Slot {
    fn state(&self) -> SlotState {
        self.state.lock().expect("mcp slot lock").clone()
    }

    fn update<T>(&self, change: impl FnOnce(&mut SlotState) -> T) -> T {
        change(&mut self.state.lock().expect("mcp slot lock"))
    }

    fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }
}

/// What every supervisor shares.
struct Shared {
    store: Store,
    max_schema_bytes: usize,
    /// Largest tool result kept (the callback response limit).
    max_result_bytes: usize,
    listener: OnceLock<Arc<dyn McpListener>>,
    snapshots: Mutex<FastMap<String, Snapshot>>,
    /// The admin account, known from `start`: its servers may reach
    /// loopback and private networks.
    admin_account_id: OnceLock<Option<String>>,
    /// `--mcp-private-urls-for-all-accounts`.
    private_urls_for_all_accounts: bool,
}

impl Shared {
    /// Where `server`'s HTTP connections may go.
    fn reach(&self, server: &McpServer) -> crate::domain::mcp_rules::Reach {
        let admin = self.admin_account_id.get().and_then(Option::as_deref);
        crate::domain::mcp_rules::Reach::of_owner(
            admin == Some(server.account_id.as_str()),
            self.private_urls_for_all_accounts,
        )
    }
}

/// Every MCP server the runtime has attached, and the connection of each.
pub struct McpHub {
    shared: Arc<Shared>,
    slots: RwLock<FastMap<String, Arc<Slot>>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let attached = self.slots.read().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("McpHub")
            .field("attached", &attached)
            .finish()
    }
}

impl McpHub {
    pub fn new(
        store: Store,
        max_schema_bytes: usize,
        max_result_bytes: usize,
        private_urls_for_all_accounts: bool,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                max_schema_bytes,
                max_result_bytes,
                listener: OnceLock::new(),
                snapshots: Mutex::new(FastMap::default()),
                admin_account_id: OnceLock::new(),
                private_urls_for_all_accounts,
            }),
            slots: RwLock::new(FastMap::default()),
        }
    }

    /// Loads the stored snapshots and attaches every enabled server; each
    /// connects in the background (start-up never waits on a server).
    pub async fn start(
        &self,
        listener: Arc<dyn McpListener>,
        admin_account_id: Option<String>,
        may_start: impl Fn(&McpServer) -> bool,
    ) -> crate::error::Result<()> {
        let _ = self.shared.listener.set(listener);
        let _ = self.shared.admin_account_id.set(admin_account_id);
        for stored in self.shared.store.mcp_snapshots().await? {
            let tools: Vec<Tool> = match serde_json::from_value(stored.tools) {
                Ok(tools) => tools,
                Err(error) => {
                    tracing::warn!(server_id = %stored.server_id, %error, "an MCP tool snapshot could not be read; ignoring it");
                    continue;
                }
            };
            self.shared
                .snapshots
                .lock()
                .expect("snapshots lock")
                .insert(
                    stored.server_id,
                    Snapshot {
                        tools: Arc::new(tools),
                        at: stored.snapshot_at,
                    },
                );
        }
        let servers = self.shared.store.enabled_mcp_servers().await?;
        tracing::info!(servers = servers.len(), "attaching MCP servers");
        for server in servers {
            if !may_start(&server) {
                tracing::warn!(
                    server_id = %server.id,
                    account_id = %server.account_id,
                    "not starting a stdio MCP server of an account other than the admin (--mcp-stdio-for-all-accounts allows it)"
                );
                continue;
            }
            self.upsert(server).await;
        }
        Ok(())
    }

    /// Takes a created or changed server into the runtime: an enabled one is
    /// (re)connected in the background, a disabled one is detached. Never waits
    /// on the server. The account's live model sessions get the new catalog.
    pub async fn upsert(&self, server: McpServer) {
        if let Some(current) = self.slot(&server.id)
            && current.server == server
        {
            return;
        }
        let (replacement, receiver) = if server.config.enabled {
            let (slot, receiver) = self.new_slot(server.clone()).await;
            (Some(slot), Some(receiver))
        } else {
            (None, None)
        };
        let old = self
            .swap(
                &server.account_id,
                &server.id,
                server.updated_at,
                replacement.clone(),
            )
            .await;
        if let Some(old) = old {
            stop(old).await;
        }
        if let (Some(slot), Some(receiver)) = (replacement, receiver) {
            let handle = tokio::spawn(supervisor::supervise(
                slot.clone(),
                self.shared.clone(),
                receiver,
            ));
            *slot.supervisor.lock().expect("supervisor lock") = Some(handle);
        }
    }

    /// Forgets a deleted server: its connection is closed and its child killed.
    pub async fn remove(&self, account_id: &str, server_id: &str) {
        self.shared
            .snapshots
            .lock()
            .expect("snapshots lock")
            .remove(server_id);
        if let Some(old) = self.swap(account_id, server_id, i64::MAX, None).await {
            stop(old).await;
        }
    }

    /// Detaches every server and waits for their connections to close (at
    /// shutdown: stdio children are killed with their process groups).
    pub async fn shutdown(&self) {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .write()
            .expect("mcp slots lock")
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        futures::future::join_all(slots.into_iter().map(stop)).await;
    }

    /// The runtime state of `server`, as `live_status` shows it.
    pub fn live_status(&self, server: &McpServer) -> LiveStatus {
        if !server.config.enabled {
            return LiveStatus::detached("disabled");
        }
        match self.slot(&server.id) {
            Some(slot) => slot.state().live_status(),
            None => LiveStatus::detached("not_attached"),
        }
    }

    /// Connects an enabled server now: attaches it if it is not, or skips the
    /// backoff (and ends a manual disconnect) if it is.
    pub async fn connect(&self, server: McpServer) -> LiveStatus {
        match self.slot(&server.id) {
            Some(slot) if slot.server == server => slot.send(Command::Connect),
            _ => self.upsert(server.clone()).await,
        }
        self.live_status(&server)
    }

    /// Closes an attached server's connection until the next connect; `None`
    /// when it is not attached. Calls are refused from this moment on.
    pub fn disconnect(&self, server: &McpServer) -> Option<LiveStatus> {
        let slot = self.slot(&server.id)?;
        slot.update(|state| {
            state.connection = ConnectionState::Disconnected;
            state.peer = None;
            state.error = None;
        });
        slot.send(Command::Disconnect);
        Some(slot.state().live_status())
    }

    /// The statuses of the account's attached servers.
    pub fn statuses(&self, account_id: &str) -> Vec<(McpServer, LiveStatus)> {
        let mut statuses: Vec<(McpServer, LiveStatus)> = self
            .account_slots(account_id)
            .into_iter()
            .map(|slot| (slot.server.clone(), slot.state().live_status()))
            .collect();
        statuses.sort_by_key(|(server, _)| server.created_at);
        statuses
    }

    /// How many attached servers are in each connection state (for metrics).
    pub fn state_counts(&self) -> Vec<(String, u64)> {
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for slot in self.slots.read().expect("mcp slots lock").values() {
            let state = slot.state().live_status().state;
            *counts.entry(state.as_str().to_owned()).or_default() += 1;
        }
        counts.into_iter().collect()
    }

    /// The tools an attached server offers now, with where they come from.
    pub fn server_tools(
        &self,
        server_id: &str,
    ) -> Option<(crate::catalog::CatalogSource, Vec<CatalogTool>)> {
        let slot = self.slot(server_id)?;
        let state = slot.state();
        let tools = state
            .listed
            .as_ref()
            .map(|l| l.tools.as_ref().clone())
            .unwrap_or_default();
        Some((state.catalog_source(), tools))
    }

    /// Opens a temporary connection to `server`, lists its tools and closes it,
    /// leaving the supervised connection alone.
    pub async fn test(&self, server: &McpServer) -> TestReport {
        let started = std::time::Instant::now();
        let timeout = std::time::Duration::from_millis(server.config.connect_timeout_ms);
        let (notices, _ignored) = mpsc::channel(1);
        let attempt = tokio::time::timeout(timeout, async {
            let connection = connection::Connection::open(
                &server.config,
                &server.id,
                notices,
                self.shared.reach(server),
                self.shared.store.deployment_mark(),
            )
            .await?;
            let listed = connection.list_tools().await;
            connection.close().await;
            listed
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within connect_timeout_ms = {}",
                server.config.connect_timeout_ms
            ))
        });
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match attempt {
            Ok(tools) => TestReport {
                success: true,
                tool_count: tools.len(),
                duration_ms,
                error: None,
            },
            Err(error) => TestReport {
                success: false,
                tool_count: 0,
                duration_ms,
                error: Some(error),
            },
        }
    }

    /// One entry per enabled server of `account_id`, for the runtime catalog.
    pub fn catalog_servers(&self, account_id: &str) -> Vec<CatalogServer> {
        let mut servers: Vec<CatalogServer> = self
            .account_slots(account_id)
            .into_iter()
            .map(|slot| {
                let state = slot.state();
                CatalogServer {
                    server_id: slot.server.id.clone(),
                    name: slot.server.config.name.clone(),
                    catalog_source: state.catalog_source().as_str(),
                    reason: state.reason(),
                    tool_count: state.listed.as_ref().map_or(0, |l| l.tools.len()),
                    snapshot_at: state.listed.as_ref().map(|l| l.at),
                }
            })
            .collect();
        servers.sort_by(|a, b| a.name.cmp(&b.name));
        servers
    }

    /// Every attached server, as it was when attached.
    pub fn attached(&self) -> Vec<McpServer> {
        self.slots
            .read()
            .expect("mcp slots lock")
            .values()
            .map(|slot| slot.server.clone())
            .collect()
    }

    fn slot(&self, server_id: &str) -> Option<Arc<Slot>> {
        self.slots
            .read()
            .expect("mcp slots lock")
            .get(server_id)
            .cloned()
    }

    fn account_slots(&self, account_id: &str) -> Vec<Arc<Slot>> {
        self.slots
            .read()
            .expect("mcp slots lock")
            .values()
            .filter(|slot| slot.server.account_id == account_id)
            .cloned()
            .collect()
    }

    /// A slot for `server`, with the tools of its last snapshot rebuilt for its
    /// config, not yet supervised.
    async fn new_slot(&self, server: McpServer) -> (Arc<Slot>, mpsc::UnboundedReceiver<Command>) {
        let snapshot = self
            .shared
            .snapshots
            .lock()
            .expect("snapshots lock")
            .get(&server.id)
            .cloned();
        let listed = match snapshot {
            Some(snapshot) => {
                Some(build_listed(&self.shared, &server, snapshot.tools.clone(), snapshot.at).await)
            }
            None => None,
        };
        let (commands, receiver) = mpsc::unbounded_channel();
        let slot = Arc::new(Slot {
            server,
            state: Mutex::new(SlotState::starting(listed)),
            commands,
            stop: CancellationToken::new(),
            supervisor: Mutex::new(None),
        });
        (slot, receiver)
    }

    /// Replaces the slot of `server_id` (or removes it) as one catalog
    /// mutation, so live model sessions see the change; answers the slot to
    /// stop. Two changes of one server racing each other end with the newer
    /// config (`version`, its `updated_at`) attached.
    async fn swap(
        &self,
        account_id: &str,
        server_id: &str,
        version: i64,
        replacement: Option<Arc<Slot>>,
    ) -> Option<Arc<Slot>> {
        let mutation = async {
            let old = {
                let mut slots = self.slots.write().expect("mcp slots lock");
                let newer_attached = slots
                    .get(server_id)
                    .is_some_and(|current| current.server.updated_at > version);
                if newer_attached {
                    return (replacement, Vec::new());
                }
                match &replacement {
                    Some(slot) => slots.insert(server_id.to_owned(), slot.clone()),
                    None => slots.remove(server_id),
                }
            };
            let before = old.as_ref().map(|s| names(&s.state())).unwrap_or_default();
            let after = replacement
                .as_ref()
                .map(|s| names(&s.state()))
                .unwrap_or_default();
            let change = diff(account_id, &before, &after, true);
            (old, vec![change])
        };
        match self.shared.listener.get() {
            Some(listener) => mutate_with(listener.catalog_events(), mutation).await.0,
            None => mutation.await.0,
        }
    }
}

/// Stops a slot's supervisor and waits for its connection to close.
async fn stop(slot: Arc<Slot>) {
    slot.stop.cancel();
    let handle = slot.supervisor.lock().expect("supervisor lock").take();
    if let Some(handle) = handle {
        let _ = handle.await;
    }
}

/// The catalog names a slot offers now.
fn names(state: &SlotState) -> Vec<String> {
    state
        .listed
        .as_ref()
        .map(|l| l.tools.iter().map(|t| t.spec.name.clone()).collect())
        .unwrap_or_default()
}

/// The change from `before` to `after` for an account's sessions; with
/// `all_updated`, names in both count as updated (their config changed).
fn diff(account_id: &str, before: &[String], after: &[String], all_updated: bool) -> CatalogChange {
    let mut change = CatalogChange::new(CatalogScope::Account(account_id.to_owned()));
    change.added = after
        .iter()
        .filter(|n| !before.contains(n))
        .cloned()
        .collect();
    change.removed = before
        .iter()
        .filter(|n| !after.contains(n))
        .cloned()
        .collect();
    if all_updated {
        change.updated = after
            .iter()
            .filter(|n| before.contains(n))
            .cloned()
            .collect();
    }
    change
}

/// Tools left out of one listing that are logged one by one.
const MAX_SKIPPED_LOGGED: usize = 10;

/// Builds catalog tools from listed tools, off the async workers (schemas are
/// checked), logging the tools left out.
async fn build_listed(
    shared: &Shared,
    server: &McpServer,
    tools: Arc<Vec<Tool>>,
    at: i64,
) -> Listed {
    let server_for_build = server.clone();
    let max = shared.max_schema_bytes;
    let built =
        tokio::task::spawn_blocking(move || tools::catalog_tools(&server_for_build, &tools, max))
            .await;
    let (catalog, skipped) = match built {
        Ok(built) => built,
        Err(error) => {
            tracing::error!(server_id = %server.id, %error, "building an MCP server's catalog failed");
            (Vec::new(), Vec::new())
        }
    };
    // A server may list a thousand bad tools: a few lines say what is wrong.
    for (tool, why) in skipped.iter().take(MAX_SKIPPED_LOGGED) {
        tracing::warn!(server_id = %server.id, tool = ?tool, reason = ?why, "an MCP tool is left out of the catalog");
    }
    if skipped.len() > MAX_SKIPPED_LOGGED {
        tracing::warn!(server_id = %server.id, left_out = skipped.len(), "more MCP tools are left out of the catalog than are logged");
    }
    Listed {
        tools: Arc::new(catalog),
        at,
    }
}
