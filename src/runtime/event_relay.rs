//! A chat session's events reach its event streams on every instance sharing
//! the database, not only on the instance that produced them: a client behind
//! a balancer may hold its stream on one instance while its floor generates,
//! or its approval is decided, on another.
//!
//! Publishing stays in process and immediate; beside it, the event is queued
//! for a relay task that stores what has queued as one batch (a row of
//! `relayed_session_events`, announced by id on the change channel) while the
//! previous batch is written, so a generation's tokens cost one statement per
//! batch, not one per token. The other instances read the batches announced
//! for sessions they hold streams of (what queued, in one statement; the
//! announcements have a queue of their own, apart from the catalog changes
//! they would crowd out) and publish their events to those streams. Publishing
//! never waits for the database: when the queue is full the event is dropped
//! and the drop logged (a stream that misses events reads the journal and
//! `GET /sessions/{id}/tool-results`, as after a reconnect). An instance alone
//! on the database relays nothing (see `store::peers` for how it knows).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use crate::failure_log::FailureLog;
use crate::model_sessions::{EventData, ModelSessionEvent, session_event_kind};
use crate::store::Store;

/// Events waiting for the relay before new ones are dropped...
const QUEUE_EVENTS: usize = 4096;
/// ...and the bytes of their bodies (a deferred result may be megabytes):
/// the queue, the batch being written included, holds no more, except that
/// an empty queue always takes one event.
const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;
/// A batch ends once it holds this many events...
const MAX_BATCH_EVENTS: usize = 256;
/// ...or once its bodies pass this many bytes (a larger event goes alone).
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// How long a stop waits for the events still queued to be written (a
/// database that does not answer must not hold the stop).
const FINAL_WRITES_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
/// Most announced batches read in one statement.
const MAX_BATCHES_READ_AT_ONCE: usize = 64;
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
    /// Bytes of the bodies queued or being written.
    queued_bytes: AtomicUsize,
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
            queued_bytes: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Queues `event` for the other instances when there are any
    /// (`others_present`).
    fn offer(&self, session_id: &str, event: &ModelSessionEvent, others_present: bool) {
        debug_assert!(
            session_event_kind(event.kind).is_some(),
            "{} is missing from SESSION_EVENT_KINDS: other instances would drop it",
            event.kind
        );
        let Some(sender) = self.sender.as_ref().filter(|_| others_present) else {
            return;
        };
        let bytes = event.data.as_str().len();
        let before = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        let outgoing = Outgoing {
            session_id: session_id.to_owned(),
            event: event.clone(),
        };
        if (before > 0 && before + bytes > MAX_QUEUED_BYTES) || sender.try_send(outgoing).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The relay is done with `batch` (written or lost): its bytes leave the
    /// queue's count.
    fn done_with(&self, batch: &[Outgoing]) {
        let bytes = batch.iter().map(|o| o.event.data.as_str().len()).sum();
        self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl ToolRuntime {
    /// Sends `event` to every live model session of the chat session, on this
    /// instance at once and on the others through the relay.
    pub(crate) fn publish_to_session(&self, session_id: &str, event: ModelSessionEvent) -> usize {
        self.relay
            .offer(session_id, &event, self.store.other_instances_present());
        self.model_sessions.publish_to_session(session_id, event)
    }

    /// Starts the task that relays this instance's session events to the
    /// others and theirs to this instance's streams, when the database is
    /// shared; it stops once `stop` is cancelled and what this instance had
    /// queued by then is written.
    pub fn start_event_relay(
        &self,
        stop: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let outgoing = self.relay.receiver.lock().ok()?.take()?;
        let announcements = self.store.relayed_session_events()?;
        let (runtime, stop_receiving) = (self.clone(), stop.clone());
        Some(tokio::spawn(async move {
            tokio::join!(
                forward(runtime.clone(), outgoing, stop),
                receive(runtime, announcements, stop_receiving)
            );
        }))
    }
}

/// Writes what has queued as one batch at a time until `stop`, then what is
/// left within [`FINAL_WRITES_WITHIN`].
async fn forward(
    runtime: ToolRuntime,
    mut receiver: mpsc::Receiver<Outgoing>,
    stop: CancellationToken,
) {
    let mut failures = FailureLog::new("relaying session events to the other instances");
    while let Some(first) = next_or_stop(&mut receiver, &stop).await {
        relay_batch(&runtime, first, &mut receiver, &mut failures).await;
    }
    // After a stop (or with every sender gone), what is still queued.
    let last_writes = async {
        while let Ok(first) = receiver.try_recv() {
            relay_batch(&runtime, first, &mut receiver, &mut failures).await;
        }
    };
    if tokio::time::timeout(FINAL_WRITES_WITHIN, last_writes)
        .await
        .is_err()
    {
        tracing::warn!(
            "the stop did not wait for the last session events to be relayed: the database did not take them in time"
        );
    }
}

/// Writes `first` and what queued behind it as one batch, then frees its
/// place in the queue's byte count.
async fn relay_batch(
    runtime: &ToolRuntime,
    first: Outgoing,
    receiver: &mut mpsc::Receiver<Outgoing>,
    failures: &mut FailureLog,
) {
    let batch = next_batch(first, receiver);
    write_batch(runtime, &batch, failures).await;
    runtime.relay.done_with(&batch);
}

/// The next item queued, waiting for one; None once `stop` is cancelled or
/// every sender is gone.
async fn next_or_stop<T>(receiver: &mut mpsc::Receiver<T>, stop: &CancellationToken) -> Option<T> {
    tokio::select! {
        _ = stop.cancelled() => None,
        next = receiver.recv() => next,
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

/// Delivers the batches other instances relay (`announcements`: the data of
/// each announcement) to this instance's streams until `stop`; what has
/// queued is read in one statement.
async fn receive(
    runtime: ToolRuntime,
    mut announcements: mpsc::Receiver<serde_json::Value>,
    stop: CancellationToken,
) {
    let mut failures = FailureLog::new("reading the session events other instances relayed");
    while let Some(first) = next_or_stop(&mut announcements, &stop).await {
        let mut ids = Vec::new();
        want(&runtime, &first, &mut ids);
        while ids.len() < MAX_BATCHES_READ_AT_ONCE {
            let Ok(next) = announcements.try_recv() else {
                break;
            };
            want(&runtime, &next, &mut ids);
        }
        let dropped = runtime.store.relayed_announcements_dropped();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "batches of session events other instances relayed were missed: their reader fell behind"
            );
        }
        if ids.is_empty() {
            continue;
        }
        match runtime.store.relayed_batches(&ids).await {
            Ok(batches) => {
                failures.succeeded();
                if batches.len() < ids.len() {
                    tracing::warn!(
                        missing = ids.len() - batches.len(),
                        "relayed batches of session events were gone before they were read"
                    );
                }
                for (id, events) in batches {
                    publish_batch(&runtime, id, &events);
                }
            }
            Err(err) => failures.failed(&err),
        }
    }
}

/// Adds the announced batch's id to `ids` unless it names only sessions
/// without a stream here.
fn want(runtime: &ToolRuntime, announced: &serde_json::Value, ids: &mut Vec<i64>) {
    let Some(id) = announced["id"].as_i64() else {
        tracing::warn!("ignoring an unreadable relayed-events announcement");
        return;
    };
    // A batch that names its sessions is read only for a stream of one.
    if let Some(sessions) = announced["sessions"].as_array() {
        let sessions: Vec<&str> = sessions.iter().filter_map(|s| s.as_str()).collect();
        if !runtime.model_sessions.streams_any_of(&sessions) {
            return;
        }
    }
    ids.push(id);
}

/// Publishes one relayed batch's events to this instance's streams.
fn publish_batch(runtime: &ToolRuntime, id: i64, events: &str) {
    let relayed: Vec<Relayed> = match serde_json::from_str(events) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event_of(bytes: usize) -> ModelSessionEvent {
        ModelSessionEvent::new("tool_result", &"x".repeat(bytes))
    }

    /// Nothing reads the queue here (its database is down, say): it takes
    /// events up to its byte bound, then drops and counts them, and one
    /// written batch makes room again.
    #[test]
    fn the_queue_holds_at_most_its_bytes_and_counts_what_it_drops() {
        let relay = EventRelay::new(true);
        let mut receiver = relay.receiver.lock().unwrap().take().unwrap();
        let mib = 1024 * 1024;
        for _ in 0..100 {
            relay.offer("sess_1", &event_of(mib), true);
        }
        let queued = relay.queued_bytes.load(Ordering::Relaxed);
        assert!(queued <= MAX_QUEUED_BYTES, "{queued} bytes queued");
        let held = MAX_QUEUED_BYTES / (mib + 2);
        assert_eq!(relay.dropped.load(Ordering::Relaxed), 100 - held as u64);
        let first = receiver.try_recv().expect("the first event");
        let batch = next_batch(first, &mut receiver);
        relay.done_with(&batch);
        relay.offer("sess_1", &event_of(mib), true);
        assert_eq!(relay.dropped.load(Ordering::Relaxed), 100 - held as u64);
        // An empty queue takes an event however large.
        let rest = std::iter::from_fn(|| receiver.try_recv().ok()).collect::<Vec<_>>();
        relay.done_with(&rest);
        assert_eq!(relay.queued_bytes.load(Ordering::Relaxed), 0);
        relay.offer("sess_1", &event_of(MAX_QUEUED_BYTES + 1), true);
        assert!(receiver.try_recv().is_ok());
    }

    /// On an unshared database nothing is queued.
    #[test]
    fn an_unshared_database_queues_nothing() {
        let relay = EventRelay::new(false);
        relay.offer("sess_1", &event_of(10), true);
        assert!(relay.receiver.lock().unwrap().is_none());
        assert_eq!(relay.queued_bytes.load(Ordering::Relaxed), 0);
    }

    /// On a shared database with no other instance present nothing is
    /// queued either.
    #[test]
    fn an_instance_alone_queues_nothing() {
        let relay = EventRelay::new(true);
        let mut receiver = relay.receiver.lock().unwrap().take().unwrap();
        relay.offer("sess_1", &event_of(10), false);
        assert!(receiver.try_recv().is_err());
        assert_eq!(relay.queued_bytes.load(Ordering::Relaxed), 0);
        relay.offer("sess_1", &event_of(10), true);
        assert!(receiver.try_recv().is_ok());
    }
}
