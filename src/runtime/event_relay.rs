//! A chat session's events reach its event streams on every instance sharing
//! the database, not only on the instance that produced them: a client behind
//! a balancer may hold its stream on one instance while its floor generates,
//! or its approval is decided, on another.
//!
//! Publishing stays in process and immediate; beside it, the event is queued
//! for a relay task that stores what has queued as one batch (a row of
//! `relayed_session_events`, announced by id on the change channel) while the
//! previous batch is written, so a generation's tokens cost one statement per
//! batch, not one per token. The other instances read the batch by its id and
//! publish its events to their own streams of those sessions. Publishing
//! never waits for the database: when the queue is full the event is dropped
//! and the drop logged (a stream that misses events reads the journal and
//! `GET /sessions/{id}/tool-results`, as after a reconnect).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use crate::failure_log::FailureLog;
use crate::model_sessions::{EventData, ModelSessionEvent, session_event_kind};
use crate::store::Store;

/// Events waiting for the relay before new ones are dropped.
const QUEUE_EVENTS: usize = 4096;
/// A batch ends once it holds this many events...
const MAX_BATCH_EVENTS: usize = 256;
/// ...or once its bodies pass this many bytes (a larger event goes alone).
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// A batch whose sessions' ids take more JSON than this is announced without
/// naming them (every instance with a stream open reads it): the
/// announcement must stay under PostgreSQL's 8,000 bytes.
const MAX_ANNOUNCED_SESSIONS_BYTES: usize = 4096;

/// An event waiting to be relayed.
struct Outgoing {
    session_id: String,
    event: ModelSessionEvent,
}

/// One relayed event as stored in a batch.
#[derive(Serialize, Deserialize)]
struct Relayed {
    session_id: String,
    kind: String,
    data: Box<RawValue>,
}

/// This instance's queue of session events for the others; on an unshared
/// database (SQLite) there are no others and nothing is queued.
pub(crate) struct EventRelay {
    sender: Option<mpsc::Sender<Outgoing>>,
    /// Taken once by the relay task.
    receiver: Mutex<Option<mpsc::Receiver<Outgoing>>>,
    /// Events dropped because the queue was full, not yet logged.
    dropped: AtomicU64,
}

impl EventRelay {
    /// A relay that queues events when `shared` (other instances may hold
    /// streams of this database's sessions).
    pub(crate) fn new(shared: bool) -> Self {
        let (sender, receiver) = if shared {
            let (sender, receiver) = mpsc::channel(QUEUE_EVENTS);
            (Some(sender), Some(receiver))
        } else {
            (None, None)
        };
        Self {
            sender,
            receiver: Mutex::new(receiver),
            dropped: AtomicU64::new(0),
        }
    }

    fn offer(&self, session_id: &str, event: &ModelSessionEvent) {
        debug_assert!(
            session_event_kind(event.kind).is_some(),
            "{} is missing from SESSION_EVENT_KINDS: other instances would drop it",
            event.kind
        );
        let Some(sender) = &self.sender else {
            return;
        };
        let outgoing = Outgoing {
            session_id: session_id.to_owned(),
            event: event.clone(),
        };
        if sender.try_send(outgoing).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl ToolRuntime {
    /// Sends `event` to every live model session of the chat session, on this
    /// instance at once and on the others through the relay.
    pub(crate) fn publish_to_session(&self, session_id: &str, event: ModelSessionEvent) -> usize {
        self.relay.offer(session_id, &event);
        self.model_sessions.publish_to_session(session_id, event)
    }

    /// Starts the task that relays this instance's session events, when the
    /// database is shared; it stops once `stop` is cancelled and what was
    /// queued by then is written.
    pub fn start_event_relay(
        &self,
        stop: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let receiver = self.relay.receiver.lock().ok()?.take()?;
        Some(tokio::spawn(forward(self.clone(), receiver, stop)))
    }
}

/// Writes what has queued as one batch at a time until `stop`, then what is
/// left.
async fn forward(
    runtime: ToolRuntime,
    mut receiver: mpsc::Receiver<Outgoing>,
    stop: CancellationToken,
) {
    let mut failures = FailureLog::new("relaying session events to the other instances");
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            first = receiver.recv() => first,
        };
        let Some(first) = first else { return };
        let batch = next_batch(first, &mut receiver);
        write_batch(&runtime, &batch, &mut failures).await;
    }
    while let Ok(first) = receiver.try_recv() {
        let batch = next_batch(first, &mut receiver);
        write_batch(&runtime, &batch, &mut failures).await;
    }
}

/// `first` and what queued behind it, within the batch's bounds.
fn next_batch(first: Outgoing, receiver: &mut mpsc::Receiver<Outgoing>) -> Vec<Outgoing> {
    let mut bytes = first.event.data.as_str().len();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_EVENTS && bytes < MAX_BATCH_BYTES {
        let Ok(next) = receiver.try_recv() else { break };
        bytes += next.event.data.as_str().len();
        batch.push(next);
    }
    batch
}

async fn write_batch(runtime: &ToolRuntime, batch: &[Outgoing], failures: &mut FailureLog) {
    let dropped = runtime.relay.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "session events were not relayed to the other instances: the relay's queue was full"
        );
    }
    match relay(&runtime.store, batch).await {
        Ok(()) => failures.succeeded(),
        Err(err) => {
            tracing::warn!(
                lost = batch.len(),
                "session events could not be relayed to the other instances"
            );
            failures.failed(&err);
        }
    }
}

async fn relay(store: &Store, batch: &[Outgoing]) -> anyhow::Result<()> {
    let relayed = batch
        .iter()
        .map(|outgoing| {
            Ok(Relayed {
                session_id: outgoing.session_id.clone(),
                kind: outgoing.event.kind.to_owned(),
                data: RawValue::from_string(outgoing.event.data.as_str().to_owned())?,
            })
        })
        .collect::<serde_json::Result<Vec<_>>>()?;
    let mut sessions: Vec<&str> = batch.iter().map(|o| o.session_id.as_str()).collect();
    sessions.sort_unstable();
    sessions.dedup();
    let mut sessions = serde_json::to_string(&sessions)?;
    if sessions.len() > MAX_ANNOUNCED_SESSIONS_BYTES {
        sessions = "null".to_owned();
    }
    store
        .relay_session_events(&serde_json::to_string(&relayed)?, &sessions)
        .await?;
    Ok(())
}

/// Publishes to this instance's streams the batch another instance relayed
/// (`announced`: its id and the sessions it concerns); a batch of sessions
/// without a stream here is not read.
pub(super) async fn deliver(runtime: &ToolRuntime, announced: &serde_json::Value) {
    let Some(id) = announced["id"].as_i64() else {
        tracing::warn!("ignoring an unreadable relayed-events announcement");
        return;
    };
    if let Ok(sessions) = serde_json::from_value::<Vec<String>>(announced["sessions"].clone())
        && !runtime.model_sessions.streams_any_of(&sessions)
    {
        return;
    }
    let events = match runtime.store.relayed_session_events(id).await {
        Ok(Some(events)) => events,
        Ok(None) => {
            tracing::warn!(
                batch = id,
                "a relayed batch of session events was gone before it was read"
            );
            return;
        }
        Err(err) => {
            tracing::warn!(error = %err, batch = id, "could not read a relayed batch of session events");
            return;
        }
    };
    let relayed: Vec<Relayed> = match serde_json::from_str(&events) {
        Ok(relayed) => relayed,
        Err(err) => {
            tracing::warn!(error = %err, batch = id, "ignoring an unreadable relayed batch of session events");
            return;
        }
    };
    for event in relayed {
        let Some(kind) = session_event_kind(&event.kind) else {
            tracing::warn!(kind = ?event.kind, "ignoring a relayed session event of an unknown kind");
            continue;
        };
        let event_data = EventData::from_json_text(event.data.get());
        runtime.model_sessions.publish_to_session(
            &event.session_id,
            ModelSessionEvent {
                kind,
                data: event_data,
            },
        );
    }
}
