//! Several toolgate instances on one PostgreSQL database. Each instance has a
//! row in `toolgate_instances` it keeps alive with a heartbeat, and tells the
//! others what it changed over `LISTEN/NOTIFY`, so that their caches and live
//! model sessions follow within a second. On SQLite there is one instance:
//! announcements go nowhere and nothing listens.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::Store;
use super::backend::{Pool, sql};
use super::instance_file::InstanceFile;
use super::peers::{GREETED_TOPIC, GREETING_TOPIC, Peers};
use crate::error::Result;
use crate::failure_log::FailureLog;
use crate::ids::now_ms;

/// The notification channel every instance listens on.
pub(super) const CHANNEL: &str = "toolgate_changes";
/// The topic of a batch of session events another instance relayed; its
/// data is `{"id": <its id in relayed_session_events>, "sessions": [<the
/// chat sessions it concerns>] or null}`. These announcements go to
/// [`Store::relayed_session_events`], not to the cluster's events.
pub(super) const SESSION_EVENTS_TOPIC: &str = "session_events";
/// How often an instance renews its heartbeat and looks for dead ones.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// An instance whose heartbeat is older than this is dead: the rows it left
/// `opened` become `uncertain`.
pub const STALE_AFTER_MS: i64 = 10_000;
/// PostgreSQL refuses payloads of 8,000 bytes or more.
const MAX_PAYLOAD: usize = 7_900;
/// The topic of the event an instance sends itself when it finds it was
/// taken for dead (never announced to others).
pub const TAKEN_FOR_DEAD: &str = "taken_for_dead";
/// Events kept for a slow subscriber before it starts missing them.
const EVENT_BUFFER: usize = 1024;
/// Announcements of relayed session events waiting to be read before new ones
/// are dropped. They have a queue of their own: a generation's batches
/// arrive far more often than any other change, and in the shared queue they
/// would make a slow subscriber miss catalog changes.
const RELAYED_BUFFER: usize = 4096;

/// A change another instance announced (or `resync`: notifications may have
/// been missed, so everything cached must be read again).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterEvent {
    pub topic: String,
    /// What changed; `null` when the announcement was too large to carry it
    /// (the receiver then treats the whole topic as changed).
    pub data: Value,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    from: String,
    topic: String,
    data: Value,
}

/// This instance's part in the cluster.
#[derive(Debug)]
pub(super) struct Cluster {
    pub(super) instance_id: String,
    /// The data directory, held while this process runs.
    directory: InstanceFile,
    events: broadcast::Sender<ClusterEvent>,
    /// Announcements of other instances' relayed session events (their
    /// data), for the one task that delivers them.
    relayed: mpsc::Sender<Value>,
    relayed_receiver: std::sync::Mutex<Option<mpsc::Receiver<Value>>>,
    /// Announcements dropped because that task fell behind, not yet logged.
    relayed_dropped: std::sync::atomic::AtomicU64,
    /// What this instance knows of the others.
    pub(super) peers: Peers,
    stop: CancellationToken,
}

impl Cluster {
    /// A new instance on `data_dir`; refuses when another process runs on it.
    pub(super) fn new(data_dir: &Path) -> anyhow::Result<Self> {
        let instance_id = crate::ids::new_id("inst");
        let directory = InstanceFile::claim(data_dir, &instance_id)?;
        let (relayed, relayed_receiver) = mpsc::channel(RELAYED_BUFFER);
        Ok(Self {
            instance_id,
            directory,
            events: broadcast::channel(EVENT_BUFFER).0,
            relayed,
            relayed_receiver: std::sync::Mutex::new(Some(relayed_receiver)),
            relayed_dropped: std::sync::atomic::AtomicU64::new(0),
            peers: Peers::default(),
            stop: CancellationToken::new(),
        })
    }

    pub(super) fn stop(&self) {
        self.stop.cancel();
        self.directory.release();
    }
}

impl Store {
    /// What this database's instances call themselves to their own MCP
    /// endpoint ([`SecretsKey::deployment_mark`](crate::secrets::SecretsKey::deployment_mark)).
    pub fn deployment_mark(&self) -> &str {
        self.secrets.deployment_mark()
    }

    /// This process's instance id: the owner of the journal rows it opens
    /// and of the jobs it claims.
    pub fn instance_id(&self) -> &str {
        &self.cluster.instance_id
    }

    /// The instance that ran on this data directory before this one (dead:
    /// its lock was free).
    pub fn previous_instance(&self) -> Option<&str> {
        self.cluster.directory.previous.as_deref()
    }

    /// Changes other instances announced, as they arrive.
    pub fn cluster_events(&self) -> broadcast::Receiver<ClusterEvent> {
        self.cluster.events.subscribe()
    }

    /// Other instances' announcements of relayed session events (the data of
    /// each: `{"id", "sessions"}`), as they arrive; taken once.
    pub fn relayed_session_events(&self) -> Option<mpsc::Receiver<Value>> {
        self.cluster.relayed_receiver.lock().ok()?.take()
    }

    /// How many announcements of relayed session events were dropped since
    /// the last call (their reader fell behind).
    pub fn relayed_announcements_dropped(&self) -> u64 {
        self.cluster
            .relayed_dropped
            .swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the other instances on the database that `topic` changed.
    /// Failing to tell them is logged, not an error of the write that changed
    /// it: the write stands, and their caches catch up at their next resync.
    pub async fn announce(&self, topic: &str, data: Value) {
        let Pool::Postgres(_) = &self.pool else {
            return;
        };
        let mut envelope = Envelope {
            from: self.cluster.instance_id.clone(),
            topic: topic.to_owned(),
            data,
        };
        let mut payload = serde_json::to_string(&envelope).unwrap_or_default();
        if payload.len() > MAX_PAYLOAD {
            envelope.data = Value::Null;
            payload = serde_json::to_string(&envelope).unwrap_or_default();
        }
        let sent = async {
            let mut conn = self.conn().await?;
            sql!(conn, c => query("SELECT pg_notify(?, ?)")
                .bind(CHANNEL)
                .bind(&payload)
                .execute(c)
                .await
                .map(|_| ()))
        };
        if let Err(err) = sent.await {
            tracing::warn!(error = %err, topic, "could not tell the other instances about a change");
        }
    }

    /// Records this instance as alive (at start-up, on either backend).
    pub(super) async fn register_instance(&self) -> Result<()> {
        let now = now_ms();
        let host = hostname();
        sql!(self.conn().await?, c => query(
            "INSERT INTO toolgate_instances (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        )
        .bind(&self.cluster.instance_id)
        .bind(&host)
        .bind(i64::from(std::process::id()))
        .bind(now)
        .bind(now)
        .execute(c)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// Renews this instance's heartbeat (re-registering it if another
    /// instance took it for dead and removed it).
    async fn beat(&self) -> Result<()> {
        let renewed = sql!(self.conn().await?, c => query(
            "UPDATE toolgate_instances SET heartbeat_at = ? WHERE id = ?",
        )
        .bind(now_ms())
        .bind(&self.cluster.instance_id)
        .execute(c)
        .await?
        .rows_affected());
        if renewed == 0 {
            tracing::warn!(instance = %self.cluster.instance_id, "this instance was taken for dead; registering again");
            self.register_instance().await?;
            // What it held was taken over meanwhile (its open journal rows,
            // its generations and their sessions' claims): its own followers
            // stop what it was still doing with them.
            let _ = self.cluster.events.send(ClusterEvent {
                topic: TAKEN_FOR_DEAD.into(),
                data: Value::Null,
            });
        }
        Ok(())
    }

    /// Removes this instance's row at a clean stop.
    pub(super) async fn deregister_instance(&self) {
        let removed = async {
            sql!(self.conn().await?, c => query("DELETE FROM toolgate_instances WHERE id = ?")
                .bind(&self.cluster.instance_id)
                .execute(c)
                .await
                .map(|_| ()))
        };
        if let Err(err) = removed.await {
            tracing::warn!(error = %err, "could not remove this instance's row");
        }
    }

    /// Starts the heartbeat, the sweep of dead instances and the listener
    /// (PostgreSQL only); they stop at [`Store::close`].
    pub(super) fn start_cluster(&self) {
        let Pool::Postgres(pool) = &self.pool else {
            return;
        };
        tokio::spawn(heartbeat(self.clone()));
        tokio::spawn(listen(self.clone(), pool.clone()));
    }

    /// Forgets the account's cached definitions, here and on the other
    /// instances.
    pub(super) async fn definitions_changed(&self, account_id: &str) {
        self.definition_cache.invalidate(account_id);
        self.announce("definitions", Value::String(account_id.to_owned()))
            .await;
    }

    /// Forgets the cached characters, here and on the other instances.
    pub(super) async fn characters_changed(&self) {
        self.character_cache.invalidate_all();
        self.announce("characters", Value::Null).await;
    }

    /// Applies a change another instance announced to this one's caches.
    fn apply_cluster_event(&self, event: &ClusterEvent) {
        match (event.topic.as_str(), event.data.as_str()) {
            ("definitions", Some(account_id)) => self.definition_cache.invalidate(account_id),
            ("definitions", None) => self.definition_cache.invalidate_all(),
            ("sessions", _) => self.session_cache.invalidate_all(),
            ("characters", _) => self.character_cache.invalidate_all(),
            ("accounts", _) => self.api_keys.clear(),
            ("resync", _) => self.forget_cached(),
            _ => {}
        }
    }

    /// Drops every cached row: what was cached may have changed unseen.
    fn forget_cached(&self) {
        self.definition_cache.invalidate_all();
        self.session_cache.invalidate_all();
        self.character_cache.invalidate_all();
        self.api_keys.clear();
    }
}

async fn heartbeat(store: Store) {
    let stop = store.cluster.stop.clone();
    let mut beat_failures = FailureLog::new("renewing this instance's heartbeat");
    let mut sweep_failures = FailureLog::new("sweeping dead instances");
    let mut forget_failures = FailureLog::new("deleting old relayed session events");
    let mut look_failures = FailureLog::new("looking for the other instances");
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
        if let Err(err) = store.beat().await {
            beat_failures.failed(&err);
            continue;
        }
        beat_failures.succeeded();
        match store.look_for_other_instances().await {
            Ok(()) => look_failures.succeeded(),
            Err(err) => look_failures.failed(&err),
        }
        match store.recover_dead_instances().await {
            Ok(recovered) => {
                sweep_failures.succeeded();
                if recovered > 0 {
                    tracing::warn!(
                        recovered,
                        "tool executions left open by a dead instance are now uncertain"
                    );
                }
            }
            Err(err) => sweep_failures.failed(&err),
        }
        match store.forget_old_relayed_events().await {
            Ok(()) => forget_failures.succeeded(),
            Err(err) => forget_failures.failed(&err),
        }
    }
}

async fn listen(store: Store, pool: sqlx::PgPool) {
    let mut listen_failures = FailureLog::new("listening for other instances' changes");
    while let Some(listener) = connect_listener(&store, &pool, &mut listen_failures).await {
        if receive_until_lost(&store, listener, &mut listen_failures)
            .await
            .is_break()
        {
            return;
        }
        // What was announced while the connection was down is lost: caches
        // are dropped now, and read again once a new connection listens.
        tracing::warn!(
            "the connection listening for other instances' changes was lost; every cached row is dropped and read again"
        );
        send_resync(&store);
    }
}

/// A connection listening on [`CHANNEL`], retried until one is made; `None`
/// once the instance stops. Each new one is followed by a resync: what was
/// announced before it listened was missed (while this instance started, or
/// while an earlier connection was down).
async fn connect_listener(
    store: &Store,
    pool: &sqlx::PgPool,
    failures: &mut FailureLog,
) -> Option<sqlx::postgres::PgListener> {
    let stop = &store.cluster.stop;
    loop {
        let connected = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return None,
            outcome = connected => outcome,
        };
        match outcome {
            Ok(listener) => {
                failures.succeeded();
                store.cluster.peers.listening();
                send_resync(store);
                return Some(listener);
            }
            Err(err) => {
                failures.failed(&err);
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(HEARTBEAT) => {}
                }
            }
        }
    }
}

/// Passes on other instances' announcements until the connection is lost
/// (`Continue`) or the instance stops (`Break`).
async fn receive_until_lost(
    store: &Store,
    mut listener: sqlx::postgres::PgListener,
    failures: &mut FailureLog,
) -> std::ops::ControlFlow<()> {
    let stop = &store.cluster.stop;
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return std::ops::ControlFlow::Break(()),
            received = listener.try_recv() => received,
        };
        let notification = match received {
            Ok(Some(notification)) => notification,
            // sqlx would reconnect on the next receive, but silently: the
            // caller reconnects instead, so the resync follows the new
            // connection rather than preceding it.
            Ok(None) => return std::ops::ControlFlow::Continue(()),
            Err(err) => {
                failures.failed(&err);
                return std::ops::ControlFlow::Continue(());
            }
        };
        failures.succeeded();
        let envelope = match serde_json::from_str::<Envelope>(notification.payload()) {
            Ok(envelope) if envelope.from == store.cluster.instance_id => continue,
            Ok(envelope) => envelope,
            Err(err) => {
                tracing::warn!(error = %err, "ignoring an unreadable change notification");
                continue;
            }
        };
        // Whatever another instance says, it is alive.
        store.cluster.peers.seen();
        let event = match envelope {
            envelope if envelope.topic == GREETING_TOPIC => {
                store.answer_greeting(envelope.from);
                continue;
            }
            envelope if envelope.topic == GREETED_TOPIC => {
                if envelope.data.as_str() == Some(store.cluster.instance_id.as_str()) {
                    store.cluster.peers.answered_by(envelope.from);
                }
                continue;
            }
            envelope if envelope.topic == SESSION_EVENTS_TOPIC => {
                if store.cluster.relayed.try_send(envelope.data).is_err() {
                    store
                        .cluster
                        .relayed_dropped
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                continue;
            }
            envelope => ClusterEvent {
                topic: envelope.topic,
                data: envelope.data,
            },
        };
        store.apply_cluster_event(&event);
        // Nobody subscribed is fine: the caches were the point.
        let _ = store.cluster.events.send(event);
    }
}

/// Drops every cached row and tells the subscribers to read again.
fn send_resync(store: &Store) {
    let resync = ClusterEvent {
        topic: "resync".into(),
        data: Value::Null,
    };
    store.apply_cluster_event(&resync);
    let _ = store.cluster.events.send(resync);
}

/// This machine's name, for operators reading `toolgate_instances`.
fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The SQL condition that `column` names a dead instance, or none: the
/// previous one on this data directory, or one (not this) without a heartbeat
/// since [`STALE_AFTER_MS`]. The placeholders `[previous, this, stale_before]`
/// bind [`Store::previous_instance`], this instance's id and the oldest live
/// heartbeat time. One rule for every kind of row a dead instance leaves.
pub(super) fn of_a_dead_instance(column: &str, [previous, this, stale_before]: [u8; 3]) -> String {
    format!(
        "({column} IS NULL OR {column} = ?{previous} OR ({column} <> ?{this} AND {column} NOT IN \
         (SELECT id FROM toolgate_instances WHERE heartbeat_at >= ?{stale_before})))"
    )
}

/// The SQL condition that `column` names a live instance: one with a
/// heartbeat since [`STALE_AFTER_MS`] that is not the previous one on this
/// data directory. The placeholders `[previous, stale_before]` bind as in
/// [`of_a_dead_instance`]; written positively so that a NULL never turns it.
pub(super) fn of_a_live_instance(column: &str, [previous, stale_before]: [u8; 2]) -> String {
    format!(
        "({column} IN (SELECT id FROM toolgate_instances WHERE heartbeat_at >= ?{stale_before}) \
         AND (?{previous} IS NULL OR {column} <> ?{previous}))"
    )
}

impl Store {
    /// Marks `uncertain` the rows left `opened` by instances that are dead
    /// (the previous one on this data directory, and those with no heartbeat
    /// for [`STALE_AFTER_MS`]) and forgets those instances. The rows of live
    /// instances, this one's included, are left to them. One write
    /// transaction, so two instances sweeping at once mark each row once.
    pub(super) async fn recover_dead_instances(&self) -> Result<u64> {
        let now = now_ms();
        let stale_before = now - STALE_AFTER_MS;
        let mut tx = self.begin_write().await?;
        let sweep = format!(
            "UPDATE tool_execution_record SET revision = revision + 1, status = 'uncertain', commit_outcome = 'uncertain', \
             lifecycle_state = 'finished', finished_at = ?1, \
             duration_ms = CASE WHEN ?1 > started_at THEN ?1 - started_at ELSE 0 END, \
             error_message = COALESCE(error_message, 'the instance running this call stopped; its outcome is unknown'), \
             execution_reason_code = COALESCE(execution_reason_code, \
               CASE WHEN instance_id = ?5 THEN ?2 ELSE ?6 END) \
             WHERE lifecycle_state = 'opened' AND status <> 'queued' AND runtime_job_id IS NULL \
               AND {}",
            of_a_dead_instance("instance_id", [5, 3, 4])
        );
        // Built from a fixed column name and placeholder numbers only.
        let changed = sql!(tx, c => query(sqlx::AssertSqlSafe(sweep))
        .bind(now)
        .bind(crate::reason::ReasonCode::InterruptedByRestart.as_str())
        .bind(&self.cluster.instance_id)
        .bind(stale_before)
        .bind(self.previous_instance())
        .bind(crate::reason::ReasonCode::InstanceLost.as_str())
        .execute(&mut *c)
        .await?
        .rows_affected());
        // A dead instance's claims are taken over by the next floor anyway;
        // removed here so that no row outlives what it claimed.
        let claims = format!(
            "DELETE FROM generation_claims WHERE {}",
            of_a_dead_instance("instance_id", [1, 2, 3])
        );
        // Built from a fixed column name and placeholder numbers only.
        sql!(tx, c => query(sqlx::AssertSqlSafe(claims))
            .bind(self.previous_instance())
            .bind(&self.cluster.instance_id)
            .bind(stale_before)
            .execute(c)
            .await
            .map(|_| ()))?;
        sql!(tx, c => query(
            "DELETE FROM toolgate_instances WHERE (heartbeat_at < ? OR id = ?) AND id <> ?",
        )
            .bind(stale_before)
            .bind(self.previous_instance())
            .bind(&self.cluster.instance_id)
            .execute(c)
            .await
            .map(|_| ()))?;
        tx.commit().await?;
        Ok(changed)
    }
}

impl Store {
    /// At start-up, the rows a stopped process left `opened` become
    /// `uncertain`. On SQLite there is one instance, so every such row is a
    /// previous process's; on PostgreSQL only dead instances' rows are (a live
    /// instance is still running its own).
    pub async fn recover_interrupted_at_start(&self) -> Result<u64> {
        match self.backend() {
            super::backend::Backend::Sqlite => {
                // Every other instance row is a stopped process's.
                sql!(self.conn().await?, c => query("DELETE FROM toolgate_instances WHERE id <> ?")
                    .bind(&self.cluster.instance_id)
                    .execute(c)
                    .await
                    .map(|_| ()))?;
                self.recover_interrupted_executions().await
            }
            super::backend::Backend::Postgres => self.recover_dead_instances().await,
        }
    }

    /// Whether other instances may share the database, so that start-up must
    /// not take every running job for lost.
    pub fn shared_database(&self) -> bool {
        self.backend() == super::backend::Backend::Postgres
    }
}
