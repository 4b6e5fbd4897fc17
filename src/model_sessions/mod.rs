//! Model sessions: live consumers of a session's tool catalog (an event-stream
//! subscriber today, a running generation later), grouped by character.
//!
//! "Synchronised to active model sessions" means: when a catalog mutation returns,
//! every live model session of each affected character has checked the new catalog
//! against its model provider's limits, taken it (or refused it, keeping its
//! previous one), and has a `catalog_changed` event queued in its stream.
//!
//! Every registry mutation and every sync runs under one mutation lock, so the
//! catalogs sessions take can never arrive out of order, and a session that opens
//! concurrently with a mutation sees either the state before it (and then gets the
//! event) or after it.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use futures::future::BoxFuture;

use crate::catalog::{Availability, Catalog, CatalogChange, CatalogScope};
use crate::domain::tool::{Slot, ToolSpec};
use crate::error::{Error, Result};
use crate::fast_map::FastMap;
use crate::store::Session;

mod verdicts;

use verdicts::Verdicts;
pub use verdicts::{Offer, OfferKey};

/// Events a model session's stream may hold before the session counts as stuck.
const EVENT_BUFFER: usize = 1024;
/// Places of that queue a `token` event may not take: a client reading slower
/// than the model streams loses tokens (`run_finished` repeats the whole
/// text), never the events that say what happened.
const KEPT_FOR_OTHER_EVENTS: usize = 64;
/// Bytes of event bodies a stream may hold unread before it counts as stuck
/// (a token is skipped instead): counting events alone let one unread stream
/// hold 1,024 deferred results of a megabyte each (probe I: 1.26 GB). An
/// empty queue always takes one event, however large.
const MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
/// The kind of the generation loop's text deltas, the one kind a stream that
/// has fallen behind may go without.
pub const TOKEN_EVENT: &str = "token";
/// Every kind of event the runtime publishes to a chat session's streams
/// (not `ready`, `catalog_changed` or an observer's `journal`, which each
/// instance makes itself): the kinds another instance may relay here.
pub const SESSION_EVENT_KINDS: &[&str] = &[
    TOKEN_EVENT,
    "run_started",
    "run_finished",
    "run_failed",
    "reply_rejected",
    "slot_finished",
    "slot_failed",
    "memories_buffered",
    "tool_call_started",
    "tool_call_finished",
    "approval_requested",
    "tool_result",
];

/// The kind named `name` among [`SESSION_EVENT_KINDS`].
pub fn session_event_kind(name: &str) -> Option<&'static str> {
    SESSION_EVENT_KINDS
        .iter()
        .copied()
        .find(|kind| *kind == name)
}

/// One event for a model session's subscriber.
#[derive(Debug, Clone)]
pub struct ModelSessionEvent {
    /// `ready` when the stream opens, `catalog_changed` on every catalog change.
    pub kind: &'static str,
    pub data: EventData,
}

impl ModelSessionEvent {
    /// An event whose body is `data` serialized.
    pub fn new(kind: &'static str, data: &impl serde::Serialize) -> Self {
        Self {
            kind,
            data: EventData::serialized(data),
        }
    }

    /// Whether a stream that has fallen behind may go without this event: a
    /// `token`'s text arrives again, whole, in the run's `run_finished`.
    fn may_be_skipped(&self) -> bool {
        self.kind == TOKEN_EVENT
    }
}

/// An event's JSON body, serialized once: an event published to many streams
/// is cloned for each, and each stream writes the text as it is.
#[derive(Debug, Clone)]
pub struct EventData(Arc<str>);

impl EventData {
    /// The body of anything serializable (a value that cannot be serialized,
    /// which no event type of ours is, becomes `null`).
    fn serialized(value: &impl serde::Serialize) -> Self {
        Self(
            serde_json::to_string(value)
                .unwrap_or_else(|_| "null".to_owned())
                .into(),
        )
    }

    /// A body that is JSON text already (another instance's event, read
    /// back as it was serialized there).
    pub fn from_json_text(text: &str) -> Self {
        Self(text.into())
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The body parsed again, for a reader that looks inside it.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

/// The model provider a session talks to, and so the limits its catalog must meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelProvider {
    /// Any OpenAI-compatible chat-completions endpoint.
    OpenAiCompatible,
}

/// The bytes `^[a-zA-Z0-9_-]{1,64}$` allows, as a table: the check runs for
/// every tool of every live model session on each catalog change.
const OPENAI_NAME_BYTES: [bool; 256] = {
    let mut allowed = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        allowed[byte] = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        byte += 1;
    }
    allowed
};

/// `^[a-zA-Z0-9_-]{1,64}$`.
fn openai_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|byte| OPENAI_NAME_BYTES[usize::from(byte)])
}

/// A name's first eight bytes as a number, zero-padded: numbers compare as
/// the names' starts do, so sorting by it first leaves only names that share
/// eight bytes to compare as strings.
fn name_prefix(name: &str) -> u64 {
    let mut start = [0u8; 8];
    let length = name.len().min(8);
    start[..length].copy_from_slice(&name.as_bytes()[..length]);
    u64::from_be_bytes(start)
}

impl ModelProvider {
    /// OpenAI's chat-completions API refuses more tools than this.
    pub const OPENAI_MAX_TOOLS: usize = 128;

    pub fn as_str(self) -> &'static str {
        match self {
            ModelProvider::OpenAiCompatible => "openai_compatible",
        }
    }

    /// Checks the tools a model request would carry against the provider's limits.
    pub fn check_tools(self, names: &[&str]) -> std::result::Result<(), String> {
        self.check_names(names.iter().copied())
    }

    fn check_names<'a>(
        self,
        names: impl ExactSizeIterator<Item = &'a str>,
    ) -> std::result::Result<(), String> {
        match self {
            ModelProvider::OpenAiCompatible => {
                let count = names.len();
                if let Some(bad) = names.into_iter().find(|name| !openai_tool_name(name)) {
                    return Err(format!(
                        "tool name {bad:?} is not accepted by the OpenAI-compatible provider (names must match ^[a-zA-Z0-9_-]{{1,64}}$)"
                    ));
                }
                if count > Self::OPENAI_MAX_TOOLS {
                    return Err(format!(
                        "the catalog has {count} tools; the OpenAI-compatible provider accepts at most {}",
                        Self::OPENAI_MAX_TOOLS
                    ));
                }
                Ok(())
            }
        }
    }

    /// The tools the model would be offered, by name: available entries only,
    /// because unavailable and conflicting tools are never sent to the model.
    /// The specs are the catalog's own (shared), not copies of their names:
    /// this runs for every live model session on each catalog change.
    fn offered_tools(catalog: &Catalog) -> AcceptedTools {
        let mut keyed: Vec<(u64, Arc<ToolSpec>)> = catalog
            .entries
            .iter()
            .filter(|entry| entry.availability == Availability::Available)
            .map(|entry| (name_prefix(&entry.spec.name), entry.spec.clone()))
            .collect();
        keyed.sort_unstable_by(|(a_start, a), (b_start, b)| {
            a_start.cmp(b_start).then_with(|| a.name.cmp(&b.name))
        });
        keyed.into_iter().map(|(_, tool)| tool).collect()
    }

    /// The tools to take from `catalog`, or why this provider cannot take it.
    fn accept(self, catalog: &Catalog) -> std::result::Result<AcceptedTools, String> {
        let tools = Self::offered_tools(catalog);
        self.check_names(tools.iter().map(|tool| tool.name.as_str()))
            .map(|()| tools)
    }
}

/// The tools a model session took, ordered by name. Shared: one decision
/// of a mutation is taken by every session offered the same catalog, and a
/// copy per session cost each one an allocation and an atomic increment per
/// tool (BENCHMARKS.md, issue 20, fifteenth pass).
type AcceptedTools = Arc<[Arc<ToolSpec>]>;

/// Reads what a live model session is offered: the session's catalog
/// entries and permissions as they are now (the runtime implements it); the
/// model session's slot then decides what of it the model may call.
pub trait OfferedCatalogs: Send + Sync {
    /// `sessions` as they are now, read together: one per session, `None`
    /// for one that is gone. A model session holds its session as it was
    /// when it opened; its permissions may have changed since.
    fn current<'a>(
        &'a self,
        sessions: &'a [&'a Session],
    ) -> BoxFuture<'a, Result<Vec<Option<Arc<Session>>>>>;

    /// What `session`, as it is now, offers its model.
    fn offer<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Offer>>;

    /// What decides the verdict of `session`, as it is now, when every
    /// provider can give its entries' keys without building them; `None`
    /// otherwise (the default).
    fn offer_key(&self, _session: &Session) -> Result<Option<OfferKey>> {
        Ok(None)
    }
}

/// One live model session.
#[derive(Debug)]
struct ModelSession {
    id: String,
    session: Session,
    /// The slot whose permissions decide what this model session is offered.
    slot: Slot,
    provider: ModelProvider,
    events: mpsc::Sender<ModelSessionEvent>,
    /// The tools of the catalog this session took last; what its next model
    /// request uses.
    accepted: Mutex<AcceptedTools>,
    /// A watcher (the web console's live journal), not a model: it takes no
    /// catalog, so syncs pass it by, and only it receives journal events.
    observer: bool,
    /// What names this session in its `catalog_changed` bodies, serialized
    /// once (see [`ChangedBodies`]).
    names_json: SessionNames,
    /// Bytes of the bodies queued and not yet read (see [`MAX_QUEUED_BYTES`]);
    /// the subscription takes off what it reads.
    queued_bytes: Arc<AtomicUsize>,
}

/// A sync's `catalog_changed` events, each with the queue place taken for it,
/// in the order they were decided; dropping them queues them. A sync whose
/// request is dropped midway (its client hung up) still queues every event
/// it decided, as it did when each was queued at once.
#[derive(Default)]
struct HeldEvents(Vec<(mpsc::OwnedPermit<ModelSessionEvent>, ModelSessionEvent)>);

impl Drop for HeldEvents {
    fn drop(&mut self) {
        for (place, event) in self.0.drain(..) {
            place.send(event);
        }
    }
}

/// Why an event could not be queued.
enum Delivery {
    Queued,
    /// A token left out for a stream that has fallen behind.
    Skipped,
    Gone,
    Stuck,
}

impl<T> From<mpsc::error::TrySendError<T>> for Delivery {
    fn from(refused: mpsc::error::TrySendError<T>) -> Self {
        match refused {
            mpsc::error::TrySendError::Closed(_) => Delivery::Gone,
            mpsc::error::TrySendError::Full(_) => Delivery::Stuck,
        }
    }
}

/// What one sync carries from change to change.
struct Syncing {
    reached: Reached,
    bodies: ChangedBodies,
    verdicts: Verdicts,
    held: HeldEvents,
}

impl ModelSession {
    fn new(
        id: String,
        session: Session,
        slot: Slot,
        provider: ModelProvider,
        events: mpsc::Sender<ModelSessionEvent>,
        accepted: AcceptedTools,
        observer: bool,
    ) -> Self {
        let names_json = SessionNames {
            model_session_id: raw_json(&id),
            session_id: raw_json(&session.id),
            role: raw_json(&session.character),
        };
        Self {
            id,
            session,
            slot,
            provider,
            events,
            accepted: Mutex::new(accepted),
            observer,
            names_json,
            queued_bytes: Arc::default(),
        }
    }

    fn deliver(&self, event: ModelSessionEvent) -> Delivery {
        if event.may_be_skipped() && self.events.capacity() <= KEPT_FOR_OTHER_EVENTS {
            return Delivery::Skipped;
        }
        let bytes = event.data.as_str().len();
        if let Some(refused) = self.take_bytes(&event) {
            return refused;
        }
        match self.events.try_send(event) {
            Ok(()) => Delivery::Queued,
            Err(refused) => {
                self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                refused.into()
            }
        }
    }

    /// Counts `event`'s body among the queued bytes, unless that would pass
    /// [`MAX_QUEUED_BYTES`]: then what the stream gets instead (a token is
    /// skipped, any other event finds the stream stuck).
    fn take_bytes(&self, event: &ModelSessionEvent) -> Option<Delivery> {
        let bytes = event.data.as_str().len();
        let before = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before == 0 || before + bytes <= MAX_QUEUED_BYTES {
            return None;
        }
        self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        Some(if event.may_be_skipped() {
            Delivery::Skipped
        } else {
            Delivery::Stuck
        })
    }

    /// Takes `event`'s place in the queue now, and adds the event to `held`
    /// to be queued when the sync ends: what [`Self::deliver`] would answer,
    /// without waking the stream yet.
    fn deliver_later(&self, event: ModelSessionEvent, held: &mut HeldEvents) -> Delivery {
        let bytes = event.data.as_str().len();
        if let Some(refused) = self.take_bytes(&event) {
            return refused;
        }
        match self.events.clone().try_reserve_owned() {
            Ok(place) => {
                held.0.push((place, event));
                Delivery::Queued
            }
            Err(refused) => {
                self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                refused.into()
            }
        }
    }

    fn accepted(&self) -> MutexGuard<'_, AcceptedTools> {
        self.accepted.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `catalog_changed` bodies of one catalog mutation's syncs. What model
/// sessions share is serialized once, not once per session: a change's names
/// (a registration into every role is one change per role, all naming the
/// same tool) and the accepted tool list (the same for every session offered
/// the same catalog). What names the session is serialized once per model
/// session, when it opens (`names_json`). A registration into every role
/// reaches every live model session of the server.
#[derive(Default)]
struct ChangedBodies {
    added: Fragment<String>,
    updated: Fragment<String>,
    removed: Fragment<String>,
    tools: Fragment<Arc<ToolSpec>>,
}

/// An item of a list of names.
trait Named: Clone {
    fn name(&self) -> &str;
}

impl Named for String {
    fn name(&self) -> &str {
        self
    }
}

impl Named for Arc<ToolSpec> {
    fn name(&self) -> &str {
        &self.name
    }
}

/// A list of names and its JSON, kept while the next list names the same.
struct Fragment<T>(Option<(Vec<T>, Box<RawValue>)>);

impl<T> Default for Fragment<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T: Named> Fragment<T> {
    fn json(&mut self, items: &[T]) -> &RawValue {
        let same = |kept: &[T]| {
            kept.len() == items.len() && kept.iter().zip(items).all(|(a, b)| a.name() == b.name())
        };
        if self.0.as_ref().is_some_and(|(kept, _)| !same(kept)) {
            self.0 = None;
        }
        let (_, json) = self.0.get_or_insert_with(|| {
            let names: Vec<&str> = items.iter().map(Named::name).collect();
            (items.to_vec(), raw_json(&names))
        });
        json
    }
}

/// A model session's ids and role as JSON strings.
#[derive(Debug)]
struct SessionNames {
    model_session_id: Box<RawValue>,
    session_id: Box<RawValue>,
    role: Box<RawValue>,
}

/// The body a console watcher gets: only what changed.
#[derive(serde::Serialize)]
struct WatcherBody<'a> {
    added: &'a RawValue,
    updated: &'a RawValue,
    removed: &'a RawValue,
}

fn raw_json(value: &impl serde::Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(value)
        .unwrap_or_else(|_| RawValue::from_string("null".to_owned()).expect("null is JSON"))
}

impl ChangedBodies {
    /// A `catalog_changed` body: every part is already JSON (the session's
    /// names since it opened, the change's lists and the tool list shared by
    /// the sessions it reaches), so the body is those parts joined after
    /// their keys, in a string of the exact length. Written through serde
    /// instead, the same body cost 8 % more of a registration into 100 live
    /// sessions (BENCHMARKS.md, issue 20); the unit test below checks every
    /// field.
    fn body(
        &mut self,
        change: &CatalogChange,
        model_session: &ModelSession,
        error: Option<&str>,
        tools: &[Arc<ToolSpec>],
    ) -> EventData {
        let names = &model_session.names_json;
        let accepted = if error.is_none() { "true" } else { "false" };
        // Most bodies carry no error: its JSON is then the literal.
        let error = error.map(|error| raw_json(&error));
        let fields: [(&str, &str); 9] = [
            ("{\"model_session_id\":", names.model_session_id.get()),
            (",\"session_id\":", names.session_id.get()),
            (",\"role\":", names.role.get()),
            (",\"added\":", self.added.json(&change.added).get()),
            (",\"updated\":", self.updated.json(&change.updated).get()),
            (",\"removed\":", self.removed.json(&change.removed).get()),
            (",\"accepted\":", accepted),
            (
                ",\"error\":",
                error.as_deref().map_or("null", RawValue::get),
            ),
            (",\"tools\":", self.tools.json(tools).get()),
        ];
        let length = fields
            .iter()
            .map(|(key, value)| key.len() + value.len())
            .sum::<usize>()
            + 1;
        let mut text = String::with_capacity(length);
        for (key, value) in fields {
            text.push_str(key);
            text.push_str(value);
        }
        text.push('}');
        EventData(text.into())
    }

    fn watcher_body(&mut self, change: &CatalogChange) -> EventData {
        EventData::serialized(&WatcherBody {
            added: self.added.json(&change.added),
            updated: self.updated.json(&change.updated),
            removed: self.removed.json(&change.removed),
        })
    }
}

/// Why a session has no verdict.
fn unassembled(err: Error) -> String {
    format!("the catalog could not be assembled: {err}")
}

/// The error of a session that is gone.
fn gone(session: &Session) -> Error {
    Error::not_found(format!("session {:?}", session.id))
}

/// The live model sessions each change of one mutation reaches, found once
/// before any is offered its catalog, with their sessions as they are now,
/// read together: a registration into every role is one change per role,
/// and one read per session was a round trip each on a shared database.
/// Sessions join only under the mutation lock, so none joins while a sync
/// runs; one that closes meanwhile is found gone when its event is queued.
struct Reached {
    /// Each change's model sessions, the changes one after the other.
    live: Vec<Arc<ModelSession>>,
    current: Vec<std::result::Result<Arc<Session>, String>>,
    /// Where each change's model sessions end in `live`.
    ends: Vec<usize>,
    /// Model sessions this sync closed (their streams were not being read):
    /// a later change of the same mutation passes them by.
    closed: Vec<Arc<ModelSession>>,
}

impl Reached {
    /// Finds the live model sessions of each of `changes` and reads their
    /// sessions.
    async fn find(
        hub: &ModelSessionHub,
        catalogs: &dyn OfferedCatalogs,
        changes: &[CatalogChange],
    ) -> Self {
        let mut live = Vec::new();
        let mut ends = Vec::with_capacity(changes.len());
        for change in changes {
            hub.concerned_into(&change.scope, false, &mut live);
            ends.push(live.len());
        }
        let current = current_of(catalogs, &live).await;
        Self {
            live,
            current,
            ends,
            closed: Vec::new(),
        }
    }

    /// The positions in `live` of the model sessions of change `index`.
    fn of_change(&self, index: usize) -> std::ops::Range<usize> {
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        start..self.ends[index]
    }

    fn was_closed(&self, model_session: &Arc<ModelSession>) -> bool {
        self.closed
            .iter()
            .any(|closed| Arc::ptr_eq(closed, model_session))
    }
}

/// The sessions of `live` as they are now, in one read.
async fn current_of(
    catalogs: &dyn OfferedCatalogs,
    live: &[Arc<ModelSession>],
) -> Vec<std::result::Result<Arc<Session>, String>> {
    if live.is_empty() {
        return Vec::new();
    }
    let sessions: Vec<&Session> = live.iter().map(|live| &live.session).collect();
    match catalogs.current(&sessions).await {
        Ok(found) => found
            .into_iter()
            .zip(&sessions)
            .map(|(current, session)| current.ok_or_else(|| unassembled(gone(session))))
            .collect(),
        Err(err) => {
            let reason = unassembled(err);
            sessions.iter().map(|_| Err(reason.clone())).collect()
        }
    }
}

/// What a session, as it is now, takes of its catalog for `slot` through
/// `provider`. The verdict of an equal combination decided earlier in the
/// mutation is found by the entries' keys, before any entry is built: the
/// sessions of a mutation are mostly offered the same tools, and building
/// every session's entries was a third of a registration's fan-out
/// (BENCHMARKS.md, issue 20, eighteenth pass).
async fn verdict_of(
    catalogs: &dyn OfferedCatalogs,
    session: &Session,
    slot: Slot,
    provider: ModelProvider,
    verdicts: &mut Verdicts,
) -> verdicts::Verdict {
    match catalogs.offer_key(session) {
        Ok(Some(key)) => {
            if let Some(verdict) = verdicts.known(&key, slot, provider) {
                return verdict;
            }
        }
        Ok(None) => {}
        Err(err) => return Err(unassembled(err)),
    }
    match catalogs.offer(session).await {
        Ok(offer) => verdicts.verdict(offer, slot, provider),
        Err(err) => Err(unassembled(err)),
    }
}

/// Whether `session` is one of those an account's or a session's change
/// concerns (a character's are found by their key).
fn scope_holds(scope: &CatalogScope, session: &Session) -> bool {
    match scope {
        CatalogScope::Character(id) => session.character_id == *id,
        CatalogScope::Account(id) => session.account_id == *id,
        CatalogScope::Session(id) => session.id == *id,
    }
}

/// Proof that the caller holds the mutation lock.
pub struct MutationGuard<'a>(#[allow(dead_code)] tokio::sync::MutexGuard<'a, ()>);

/// The live model sessions and whether shutdown has begun, under one lock: a
/// session joins only while that lock shows the hub open, and `close_all`
/// closes it and ends every stream under the same lock, so no stream can join
/// after `close_all` ended the others.
#[derive(Debug, Default)]
struct Live {
    closed: bool,
    by_character: FastMap<String, Vec<Arc<ModelSession>>>,
    /// How many of the live ones are observers: every call publishes its
    /// journal row to the session's observers, and without any there is no
    /// live session to scan.
    observers: usize,
    /// How many live streams (model sessions and observers) each account
    /// holds.
    by_account: FastMap<String, usize>,
}

/// Every live model session of the server, by character id.
#[derive(Debug, Default)]
pub struct ModelSessionHub {
    live: Mutex<Live>,
    mutation: tokio::sync::Mutex<()>,
    /// Cancelled by `close_all`: streams the hub does not hold itself (the
    /// MCP endpoint's) end with it.
    closing: tokio_util::sync::CancellationToken,
}

fn too_many_streams(limit: usize) -> Error {
    Error::refused(
        crate::error::ErrorCode::LimitExceeded,
        format!(
            "this account already holds {limit} live event streams (max_event_streams_per_account); close one first"
        ),
    )
}

fn shutting_down() -> Error {
    Error::refused(
        crate::error::ErrorCode::ShuttingDown,
        "the server is shutting down",
    )
}

impl ModelSessionHub {
    fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many model sessions are live now.
    pub fn live_count(&self) -> usize {
        // Console observers watch; they are not model sessions.
        self.live()
            .by_character
            .values()
            .flatten()
            .filter(|model_session| !model_session.observer)
            .count()
    }

    /// Whether any stream (a model session's or a watcher's) of one of the
    /// chat sessions is open here.
    pub fn streams_any_of(&self, session_ids: &[&str]) -> bool {
        self.live()
            .by_character
            .values()
            .flatten()
            .any(|model_session| session_ids.contains(&model_session.session.id.as_str()))
    }

    /// Serialises catalog mutations and syncs.
    pub async fn mutation_lock(&self) -> MutationGuard<'_> {
        MutationGuard(self.mutation.lock().await)
    }

    /// Opens a model session for `session`; it lives until the subscription drops
    /// or `close_all` ends it. The first event is `ready`, carrying the catalog
    /// the session took. Once shutdown has begun it is refused (`shutting_down`),
    /// and so is one past `per_account` live model sessions of the session's
    /// account (`limit_exceeded`; None: no limit).
    pub async fn open(
        self: &Arc<Self>,
        catalogs: &dyn OfferedCatalogs,
        session: Session,
        slot: Slot,
        provider: ModelProvider,
        per_account: Option<usize>,
    ) -> Result<Subscription> {
        let _guard = self.mutation_lock().await;
        // Spares building a catalog for nothing; the check that counts is the
        // one taken together with joining, below.
        if self.live().closed {
            return Err(shutting_down());
        }
        let current = catalogs
            .current(&[&session])
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| gone(&session))?;
        let catalog = catalogs.offer(&current).await?.catalog(Some(slot));
        let (accepted, error) = match provider.accept(&catalog) {
            Ok(names) => (names, None),
            Err(reason) => (AcceptedTools::default(), Some(reason)),
        };
        let names: Vec<&str> = accepted.iter().map(|tool| tool.name.as_str()).collect();
        let (sender, receiver) = mpsc::channel(EVENT_BUFFER);
        let model_session = Arc::new(ModelSession::new(
            crate::ids::new_id("msess"),
            session,
            slot,
            provider,
            sender,
            accepted.clone(),
            false,
        ));
        let ready = ModelSessionEvent::new(
            "ready",
            &json!({
                "model_session_id": model_session.id,
                "session_id": model_session.session.id,
                "role": model_session.session.character,
                "slot": slot,
                "provider": provider.as_str(),
                "accepted": error.is_none(),
                "error": error,
                "tools": names,
            }),
        );
        // The channel is empty, so this cannot fail.
        let _ = model_session.deliver(ready);
        // `close_all` may have run while the catalog was built.
        let subscription = self.join(model_session, receiver, per_account)?;
        tracing::info!(model_session = %subscription.id, character_id = %subscription.character_id, "model session opened");
        Ok(subscription)
    }

    /// Adds a model session (or observer) to the live ones unless shutdown
    /// has begun, under the lock `close_all` takes; the account's count is
    /// checked and taken under the same lock, so parallel opens cannot pass
    /// `per_account` together.
    fn join(
        self: &Arc<Self>,
        model_session: Arc<ModelSession>,
        events: mpsc::Receiver<ModelSessionEvent>,
        per_account: Option<usize>,
    ) -> Result<Subscription> {
        let character_id = model_session.session.character_id.clone();
        let id = model_session.id.clone();
        let queued_bytes = model_session.queued_bytes.clone();
        let mut live = self.live();
        if live.closed {
            return Err(shutting_down());
        }
        // A console observer holds a connection as a model session does, so
        // both count toward the account's streams.
        let account = &model_session.session.account_id;
        let held = live.by_account.get(account).copied().unwrap_or(0);
        if let Some(limit) = per_account.filter(|&limit| held >= limit) {
            return Err(too_many_streams(limit));
        }
        *live.by_account.entry(account.clone()).or_default() += 1;
        live.observers += usize::from(model_session.observer);
        live.by_character
            .entry(character_id.clone())
            .or_default()
            .push(model_session);
        Ok(Subscription {
            hub: self.clone(),
            character_id,
            id,
            events,
            queued_bytes,
        })
    }

    /// Opens a watcher of `session`'s events: it receives what is published to
    /// the session (results, run events) and to observers (journal rows), never
    /// a catalog, so it cannot refuse one. Refused once shutdown has begun,
    /// and past `per_account` live streams of the session's account.
    pub fn observe(
        self: &Arc<Self>,
        session: Session,
        per_account: Option<usize>,
    ) -> Result<Subscription> {
        let (sender, receiver) = mpsc::channel(EVENT_BUFFER);
        let observer = Arc::new(ModelSession::new(
            crate::ids::new_id("watch"),
            session,
            Slot::Narrator,
            ModelProvider::OpenAiCompatible,
            sender,
            AcceptedTools::default(),
            true,
        ));
        self.join(observer, receiver, per_account)
    }

    /// The live model sessions a change concerns (`observers`: the console's
    /// watchers of those sessions instead; they take no catalog).
    fn concerned(&self, scope: &CatalogScope, observers: bool) -> Vec<Arc<ModelSession>> {
        let mut concerned = Vec::new();
        self.concerned_into(scope, observers, &mut concerned);
        concerned
    }

    /// [`Self::concerned`], added to `found`.
    fn concerned_into(
        &self,
        scope: &CatalogScope,
        observers: bool,
        found: &mut Vec<Arc<ModelSession>>,
    ) {
        let live = self.live();
        let live = &live.by_character;
        let wanted = |model_session: &&Arc<ModelSession>| model_session.observer == observers;
        match scope {
            CatalogScope::Character(id) => {
                found.extend(live.get(id).into_iter().flatten().filter(wanted).cloned());
            }
            CatalogScope::Account(_) | CatalogScope::Session(_) => found.extend(
                live.values()
                    .flatten()
                    .filter(wanted)
                    .filter(|model_session| scope_holds(scope, &model_session.session))
                    .cloned(),
            ),
        }
    }

    /// Tells the console's watchers of the sessions a change concerns that
    /// their catalog changed (they assemble it themselves, when they show it).
    fn notify_observers(
        &self,
        change: &CatalogChange,
        bodies: &mut ChangedBodies,
        held: &mut HeldEvents,
    ) {
        if !self.any_observers() {
            return;
        }
        let observers = self.concerned(&change.scope, true);
        if observers.is_empty() {
            return;
        }
        let event = ModelSessionEvent {
            kind: "catalog_changed",
            data: bodies.watcher_body(change),
        };
        for observer in observers {
            // A watcher that is gone or not reading misses a refresh; its
            // page still shows the catalog on reload.
            let _ = observer.deliver_later(event.clone(), held);
        }
    }

    /// Offers each of one mutation's changes, in order, to the live model
    /// sessions it concerns; one result per change.
    ///
    /// Each session's place in its queue is taken as its verdict is made, so
    /// the results are what queueing at once would give; the events, the
    /// console watchers' included, are queued together at the end. Queueing
    /// one wakes its stream, and 100 streams writing while the sync still
    /// decides took the machine's other core from it and from the client
    /// waiting for the answer (BENCHMARKS.md, issue 20, twenty-third pass).
    pub async fn sync_all(
        &self,
        guard: &MutationGuard<'_>,
        catalogs: &dyn OfferedCatalogs,
        changes: &[CatalogChange],
    ) -> Vec<std::result::Result<(), String>> {
        let mut syncing = Syncing {
            reached: Reached::find(self, catalogs, changes).await,
            bodies: ChangedBodies::default(),
            verdicts: Verdicts::default(),
            held: HeldEvents::default(),
        };
        let mut results = Vec::with_capacity(changes.len());
        for (index, change) in changes.iter().enumerate() {
            results.push(
                self.sync_one(guard, catalogs, (index, change), &mut syncing)
                    .await,
            );
        }
        // Queues the held events, in order.
        drop(syncing);
        results
    }

    /// Offers the new catalog to each live model session the change concerns.
    /// Err names every session that refused it, and why.
    async fn sync_one(
        &self,
        _guard: &MutationGuard<'_>,
        catalogs: &dyn OfferedCatalogs,
        (index, change): (usize, &CatalogChange),
        syncing: &mut Syncing,
    ) -> std::result::Result<(), String> {
        let Syncing {
            reached,
            bodies,
            verdicts,
            held,
        } = syncing;
        self.notify_observers(change, bodies, held);
        let mut refusals = Vec::new();
        for at in reached.of_change(index) {
            let model_session = &reached.live[at];
            if reached.was_closed(model_session) {
                continue;
            }
            let verdict = match &reached.current[at] {
                Ok(session) => {
                    let (slot, provider) = (model_session.slot, model_session.provider);
                    verdict_of(catalogs, session, slot, provider, verdicts).await
                }
                Err(reason) => Err(reason.clone()),
            };
            let mut accepted = model_session.accepted();
            let error = match verdict {
                Ok(names) => {
                    *accepted = names;
                    None
                }
                Err(reason) => Some(reason),
            };
            let event = ModelSessionEvent {
                kind: "catalog_changed",
                data: bodies.body(change, model_session, error.as_deref(), &accepted),
            };
            drop(accepted);
            match model_session.deliver_later(event, held) {
                Delivery::Queued | Delivery::Skipped => {}
                Delivery::Gone => {
                    self.close(model_session);
                    continue;
                }
                Delivery::Stuck => {
                    // A subscriber that stopped reading cannot be synchronised;
                    // closing it makes the client reconnect and start fresh.
                    self.close(model_session);
                    refusals.push(format!(
                        "model session {} was closed: its event stream is not being read",
                        model_session.id
                    ));
                    let closed = model_session.clone();
                    reached.closed.push(closed);
                    continue;
                }
            }
            if let Some(reason) = error {
                tracing::warn!(model_session = %model_session.id, reason = ?reason, "model session refused the new catalog");
                refusals.push(format!(
                    "model session {} of session {} refused the catalog: {reason}",
                    model_session.id, model_session.session.id
                ));
            }
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals.join("; "))
        }
    }

    /// Queues an event for every live model session of one chat session (e.g. a
    /// deferred tool result). Returns how many sessions took it.
    pub fn publish_to_session(&self, session_id: &str, event: ModelSessionEvent) -> usize {
        self.publish_where(|session, _| session.id == session_id, event)
    }

    /// Queues an event for the observers of one chat session only (a journal
    /// row was written); model sessions never see it. Every call publishes
    /// here and watchers are rare: without one, the event is not even made,
    /// and no live session is scanned.
    pub fn publish_to_observers(
        &self,
        session_id: &str,
        event: impl FnOnce() -> ModelSessionEvent,
    ) -> usize {
        if !self.any_observers() {
            return 0;
        }
        self.publish_where(
            |session, observer| observer && session.id == session_id,
            event(),
        )
    }

    /// Queues an event for every live model session of an account (an MCP
    /// server's connection changed). Returns how many sessions took it.
    pub fn publish_to_account(&self, account_id: &str, event: ModelSessionEvent) -> usize {
        self.publish_where(|session, _| session.account_id == account_id, event)
    }

    fn publish_where(
        &self,
        concerned: impl Fn(&Session, bool) -> bool,
        event: ModelSessionEvent,
    ) -> usize {
        let targets: Vec<Arc<ModelSession>> = self
            .live()
            .by_character
            .values()
            .flatten()
            .filter(|model_session| concerned(&model_session.session, model_session.observer))
            .cloned()
            .collect();
        let mut taken = 0;
        for model_session in &targets {
            match model_session.deliver(event.clone()) {
                Delivery::Queued => taken += 1,
                Delivery::Skipped => {}
                Delivery::Gone => self.close(model_session),
                Delivery::Stuck => {
                    // Even the places tokens may not take are full: going
                    // on would leave a stream that silently misses what
                    // follows, a run's end among it; closed, its client
                    // reconnects and reads afresh.
                    tracing::warn!(
                        model_session = %model_session.id,
                        session_id = ?model_session.session.id,
                        event = event.kind,
                        "an event stream is not being read and was closed"
                    );
                    self.close(model_session);
                }
            }
        }
        taken
    }

    /// Ends the event streams of a deleted chat session: nothing more reaches
    /// them, and they free their places under the per-account cap.
    pub fn close_chat_session(&self, character_id: &str, session_id: &str) {
        let ids: Vec<String> = self
            .live()
            .by_character
            .get(character_id)
            .map(|sessions| {
                sessions
                    .iter()
                    .filter(|live| live.session.id == session_id)
                    .map(|live| live.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        for id in &ids {
            self.remove(character_id, id);
        }
        if !ids.is_empty() {
            tracing::info!(
                session_id,
                streams = ids.len(),
                "event streams of a deleted session closed"
            );
        }
    }

    /// The chat sessions that have live streams here (model sessions and
    /// observers), each once, as (character id, session id).
    pub fn chat_sessions(&self) -> Vec<(String, String)> {
        let live = self.live();
        let mut sessions: Vec<(String, String)> = live
            .by_character
            .iter()
            .flat_map(|(character_id, streams)| {
                streams
                    .iter()
                    .map(move |stream| (character_id.clone(), stream.session.id.clone()))
            })
            .collect();
        drop(live);
        sessions.sort_unstable();
        sessions.dedup();
        sessions
    }

    /// Takes `model_session` out of the live ones: its stream ends once its
    /// queued events are read.
    fn close(&self, model_session: &ModelSession) {
        self.remove(&model_session.session.character_id, &model_session.id);
    }

    fn remove(&self, character_id: &str, id: &str) {
        let mut live = self.live();
        let Live {
            by_character,
            observers,
            by_account,
            ..
        } = &mut *live;
        if let Some(sessions) = by_character.get_mut(character_id) {
            sessions.retain(|session| {
                let removed = session.id == id;
                if removed {
                    *observers -= usize::from(session.observer);
                    let account = &session.session.account_id;
                    if let Some(held) = by_account.get_mut(account) {
                        *held -= 1;
                        if *held == 0 {
                            by_account.remove(account);
                        }
                    }
                }
                !removed
            });
            if sessions.is_empty() {
                by_character.remove(character_id);
            }
        }
    }

    /// Whether any observer (a console watcher) is live.
    fn any_observers(&self) -> bool {
        self.live().observers > 0
    }

    /// Ends every stream (at shutdown) so that open connections can close, and
    /// refuses every later `open`. It takes the lock `open` joins under rather
    /// than the mutation lock, so shutdown never queues behind a catalog sync.
    pub fn close_all(&self) {
        let mut live = self.live();
        live.closed = true;
        live.by_character.clear();
        live.observers = 0;
        self.closing.cancel();
    }

    /// Cancelled when `close_all` runs (at shutdown).
    pub fn closing(&self) -> tokio_util::sync::CancellationToken {
        self.closing.clone()
    }
}

/// A live model session's event stream; dropping it ends the model session.
pub struct Subscription {
    hub: Arc<ModelSessionHub>,
    character_id: String,
    id: String,
    events: mpsc::Receiver<ModelSessionEvent>,
    /// The model session's count of queued bytes, which reading lowers.
    queued_bytes: Arc<AtomicUsize>,
}

impl Subscription {
    pub fn model_session_id(&self) -> &str {
        &self.id
    }
}

impl futures::Stream for Subscription {
    type Item = ModelSessionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.events.poll_recv(cx);
        if let Poll::Ready(Some(event)) = &polled {
            self.queued_bytes
                .fetch_sub(event.data.as_str().len(), Ordering::AcqRel);
        }
        polled
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.remove(&self.character_id, &self.id);
        tracing::info!(model_session = %self.id, "model session closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_limits() {
        let provider = ModelProvider::OpenAiCompatible;
        assert!(provider.check_tools(&["get_weather", "a-b", "X9"]).is_ok());
        let err = provider.check_tools(&["get.weather"]).unwrap_err();
        assert!(err.contains("get.weather"), "{err}");
        assert!(provider.check_tools(&["天气"]).is_err());
        assert!(provider.check_tools(&[&"a".repeat(65)]).is_err());
        let many: Vec<String> = (0..129).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(provider.check_tools(&refs[..128]).is_ok());
        assert!(provider.check_tools(&refs).unwrap_err().contains("128"));
    }

    fn session() -> Session {
        Session {
            id: "sess_test".into(),
            account_id: "acct_test".into(),
            character_id: "char_test".into(),
            character: "Lanlan".into(),
            title: String::new(),
            metadata: json!({}),
            created_at: 0,
            updated_at: 0,
        }
    }

    fn model_session(id: &str) -> ModelSession {
        ModelSession::new(
            id.into(),
            session(),
            Slot::Narrator,
            ModelProvider::OpenAiCompatible,
            mpsc::channel(1).0,
            AcceptedTools::default(),
            false,
        )
    }

    fn spec(name: &str) -> Arc<ToolSpec> {
        entry(name).spec
    }

    fn entry(name: &str) -> crate::catalog::CatalogEntry {
        use crate::domain::tool::{SideEffectLevel, ToolMetadata};
        let metadata = ToolMetadata::declared(SideEffectLevel::None, Vec::new(), None);
        crate::catalog::testing::entry(name, "remote:test", metadata)
    }

    #[test]
    fn accepted_tools_are_ordered_by_name() {
        // Names sharing their first eight bytes, a name that is another's
        // start, and bytes past ASCII: the order must be the names' own.
        let names = [
            "bench_reg_10",
            "get_time",
            "bench_reg_2",
            "bench_re",
            "a",
            "bench_reg_1",
            "zz",
            "bench_r",
            "Z_upper",
        ];
        let entries = names.iter().map(|name| entry(name)).collect();
        let catalog = Catalog::assemble("sess_test", entries);
        let accepted = ModelProvider::OpenAiCompatible.accept(&catalog).unwrap();
        let accepted: Vec<&str> = accepted.iter().map(|tool| tool.name.as_str()).collect();
        let mut expected = names.to_vec();
        expected.sort_unstable();
        assert_eq!(accepted, expected);
        let mut beyond_ascii = ["ab\u{e9}", "ab", "ab\u{1}", "abcdefgh\u{e9}", "abcdefgh"];
        let prefixes = beyond_ascii.map(name_prefix);
        beyond_ascii.sort_unstable();
        let mut by_prefix = prefixes.to_vec();
        by_prefix.sort_unstable();
        assert_eq!(beyond_ascii.map(name_prefix).to_vec(), by_prefix);
    }

    #[test]
    fn changed_bodies_share_only_what_is_equal() {
        let change = CatalogChange {
            scope: CatalogScope::Character("char_test".into()),
            added: vec!["new \"one\"".into()],
            updated: Vec::new(),
            removed: vec!["old".into()],
        };
        let mut bodies = ChangedBodies::default();
        let names = |list: &[&str]| list.iter().map(|n| spec(n)).collect::<Vec<_>>();
        let expected = |id: &str, error: Value, tools: &[&str]| {
            json!({
                "model_session_id": id,
                "session_id": "sess_test",
                "role": "Lanlan",
                "added": ["new \"one\""],
                "updated": [],
                "removed": ["old"],
                "accepted": error.is_null(),
                "error": error,
                "tools": tools,
            })
        };
        // The accepted list changes and comes back: a shared list must never
        // stand in another session's body.
        let cases: [(&str, Option<&str>, &[&str]); 4] = [
            ("msess_1", None, &["a", "b"]),
            ("msess_2", None, &["a", "b"]),
            ("msess_3", Some("too \"many\""), &["a"]),
            ("msess_4", None, &["a", "b"]),
        ];
        for (id, error, tools) in cases {
            let body = bodies.body(&change, &model_session(id), error, &names(tools));
            assert_eq!(body.to_value(), expected(id, json!(error), tools), "{id}");
        }
    }

    /// Catalogs for a hub test: always empty.
    struct EmptyCatalogs;

    impl OfferedCatalogs for EmptyCatalogs {
        fn current<'a>(
            &'a self,
            sessions: &'a [&'a Session],
        ) -> BoxFuture<'a, Result<Vec<Option<Arc<Session>>>>> {
            let found = sessions
                .iter()
                .map(|session| Some(Arc::new((*session).clone())))
                .collect();
            Box::pin(std::future::ready(Ok(found)))
        }

        fn offer<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Offer>> {
            Box::pin(std::future::ready(Ok(Offer {
                session_id: session.id.clone(),
                entries: Vec::new(),
                permissions: Default::default(),
            })))
        }
    }

    /// Opens a narrator's model session of `session()` on empty catalogs.
    async fn open(hub: &Arc<ModelSessionHub>) -> Result<Subscription> {
        hub.open(
            &EmptyCatalogs,
            session(),
            Slot::Narrator,
            ModelProvider::OpenAiCompatible,
            None,
        )
        .await
    }

    #[tokio::test]
    async fn observers_are_counted_as_they_come_and_go() {
        let hub = Arc::new(ModelSessionHub::default());
        let model = open(&hub).await.unwrap();
        assert!(!hub.any_observers(), "a model session is not an observer");
        let unmade = || -> ModelSessionEvent { panic!("an event made for no observer") };
        assert_eq!(hub.publish_to_observers("sess_test", unmade), 0);
        let first = hub.observe(session(), None).unwrap();
        let second = hub.observe(session(), None).unwrap();
        assert!(hub.any_observers());
        let journal = || ModelSessionEvent::new("journal", &json!({}));
        assert_eq!(hub.publish_to_observers("sess_test", journal), 2);
        assert_eq!(hub.publish_to_observers("sess_other", journal), 0);
        drop(first);
        assert!(hub.any_observers(), "one observer is still live");
        drop(model);
        drop(second);
        assert!(!hub.any_observers());
        let third = hub.observe(session(), None).unwrap();
        hub.close_all();
        assert!(!hub.any_observers());
        drop(third);
        assert!(!hub.any_observers());
    }

    #[tokio::test]
    async fn a_stream_that_is_not_read_is_reported_and_closed() {
        let hub = Arc::new(ModelSessionHub::default());
        let _unread = open(&hub).await.unwrap();
        let mut change = CatalogChange::new(CatalogScope::Character("char_test".into()));
        change.added.push("weather".into());
        // `ready` and then one event per mutation fill the buffer; none is read.
        for _ in 1..EVENT_BUFFER {
            let guard = hub.mutation_lock().await;
            let results = hub
                .sync_all(&guard, &EmptyCatalogs, std::slice::from_ref(&change))
                .await;
            assert_eq!(results, [Ok(())]);
        }
        // The last mutation reaches the session twice (its character's change
        // and its account's): the first closes it, the second passes it by.
        let account_change = CatalogChange::new(CatalogScope::Account(session().account_id));
        let guard = hub.mutation_lock().await;
        let results = hub
            .sync_all(&guard, &EmptyCatalogs, &[change, account_change])
            .await;
        let refusal = results[0].as_ref().expect_err("the stream is full");
        assert!(refusal.contains("is not being read"), "{refusal}");
        assert_eq!(results[1], Ok(()), "a closed session is not offered again");
        assert!(
            hub.live().by_character.is_empty(),
            "the stuck session was closed"
        );
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_skips_tokens_and_is_closed_when_other_events_find_it_full()
    {
        let hub = Arc::new(ModelSessionHub::default());
        let mut unread = open(&hub).await.unwrap();
        let session_id = session().id;
        let token = || ModelSessionEvent::new(TOKEN_EVENT, &serde_json::json!({"text": "x"}));
        let tool_call = || ModelSessionEvent::new("tool_call_started", &serde_json::json!({}));
        // `ready` took one place; tokens take the others but the last 64.
        let tokens = EVENT_BUFFER - 1 - KEPT_FOR_OTHER_EVENTS;
        for _ in 0..tokens {
            assert_eq!(hub.publish_to_session(&session_id, token()), 1);
        }
        assert_eq!(hub.publish_to_session(&session_id, token()), 0, "skipped");
        for _ in 0..KEPT_FOR_OTHER_EVENTS {
            assert_eq!(hub.publish_to_session(&session_id, tool_call()), 1);
        }
        assert_eq!(hub.publish_to_session(&session_id, token()), 0, "skipped");
        assert!(
            !hub.live().by_character.is_empty(),
            "a skipped token closes nothing"
        );
        assert_eq!(hub.publish_to_session(&session_id, tool_call()), 0);
        assert!(
            hub.live().by_character.is_empty(),
            "the stuck stream was left open, missing events"
        );
        // What was queued is still read, then the stream ends.
        let mut read = 0;
        while unread.events.recv().await.is_some() {
            read += 1;
        }
        assert_eq!(read, EVENT_BUFFER);
    }

    #[tokio::test]
    async fn a_stream_holds_at_most_its_byte_budget_unread_and_reading_frees_it() {
        use futures::StreamExt;
        let hub = Arc::new(ModelSessionHub::default());
        let mut stream = open(&hub).await.unwrap();
        let session_id = session().id;
        let result = || {
            ModelSessionEvent::new(
                "tool_result",
                &serde_json::json!({"output": "x".repeat(1 << 20)}),
            )
        };
        let size = result().data.as_str().len();
        let fitting = MAX_QUEUED_BYTES / size;
        assert!(
            fitting < EVENT_BUFFER / 4,
            "bytes, not places, are the bound here"
        );
        stream.next().await.expect("ready");
        for _ in 0..fitting {
            assert_eq!(hub.publish_to_session(&session_id, result()), 1);
        }
        // A token past the budget (the room left is less than a result) is
        // skipped and closes nothing.
        let text = "x".repeat(size);
        let token = ModelSessionEvent::new(TOKEN_EVENT, &serde_json::json!({"text": text}));
        assert_eq!(hub.publish_to_session(&session_id, token), 0);
        // Reading frees what was read.
        for _ in 0..4 {
            stream.next().await.expect("a queued result");
        }
        for _ in 0..4 {
            assert_eq!(hub.publish_to_session(&session_id, result()), 1);
        }
        // One more result finds the stream stuck: it is closed, as a full
        // queue's is, and what it holds is still read.
        assert_eq!(hub.publish_to_session(&session_id, result()), 0);
        assert!(
            hub.live().by_character.is_empty(),
            "the stuck stream was closed"
        );
        let mut read = 0;
        while stream.next().await.is_some() {
            read += 1;
        }
        assert_eq!(read, fitting);
    }

    /// Empty catalogs whose second offer waits until `second` is notified.
    #[derive(Default)]
    struct GatedCatalogs {
        offers: std::sync::atomic::AtomicUsize,
        second: tokio::sync::Notify,
    }

    impl OfferedCatalogs for GatedCatalogs {
        fn current<'a>(
            &'a self,
            sessions: &'a [&'a Session],
        ) -> BoxFuture<'a, Result<Vec<Option<Arc<Session>>>>> {
            EmptyCatalogs.current(sessions)
        }

        fn offer<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Offer>> {
            let made = self
                .offers
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if made == 1 {
                    self.second.notified().await;
                }
                EmptyCatalogs.offer(session).await
            })
        }
    }

    /// The kinds of the events queued on `stream` so far, `ready` left out.
    fn queued_kinds(stream: &mut Subscription) -> Vec<&'static str> {
        use futures::{FutureExt, StreamExt};
        std::iter::from_fn(|| stream.next().now_or_never().flatten())
            .map(|event| event.kind)
            .filter(|kind| *kind != "ready")
            .collect()
    }

    /// Two model sessions of `session()` and a console watcher of it, a
    /// change of its character, and catalogs whose second offer waits.
    struct GatedSync {
        hub: Arc<ModelSessionHub>,
        streams: [Subscription; 2],
        watcher: Subscription,
        change: CatalogChange,
        catalogs: GatedCatalogs,
    }

    impl GatedSync {
        async fn new() -> Self {
            let hub = Arc::new(ModelSessionHub::default());
            let streams = [open(&hub).await.unwrap(), open(&hub).await.unwrap()];
            let watcher = hub.observe(session(), None).unwrap();
            Self {
                hub,
                streams,
                watcher,
                change: CatalogChange::new(CatalogScope::Character("char_test".into())),
                catalogs: GatedCatalogs::default(),
            }
        }
    }

    #[tokio::test]
    async fn a_sync_queues_its_events_once_every_verdict_is_made() {
        use futures::FutureExt;
        let GatedSync {
            hub,
            mut streams,
            mut watcher,
            change,
            catalogs,
        } = GatedSync::new().await;
        let guard = hub.mutation_lock().await;
        let mut sync =
            std::pin::pin!(hub.sync_all(&guard, &catalogs, std::slice::from_ref(&change)));
        assert!(
            sync.as_mut().now_or_never().is_none(),
            "the second offer waits"
        );
        for stream in streams.iter_mut().chain([&mut watcher]) {
            assert_eq!(
                queued_kinds(stream),
                Vec::<&str>::new(),
                "queued before the last verdict"
            );
        }
        catalogs.second.notify_one();
        assert_eq!(sync.await, [Ok(())]);
        for stream in streams.iter_mut().chain([&mut watcher]) {
            assert_eq!(queued_kinds(stream), ["catalog_changed"]);
        }
    }

    #[tokio::test]
    async fn a_sync_cut_short_still_queues_the_events_it_decided() {
        use futures::FutureExt;
        let GatedSync {
            hub,
            mut streams,
            watcher: _,
            change,
            catalogs,
        } = GatedSync::new().await;
        let guard = hub.mutation_lock().await;
        // Polled once and dropped at the second offer, as a request whose
        // client hung up is.
        let sync = hub.sync_all(&guard, &catalogs, std::slice::from_ref(&change));
        assert!(sync.now_or_never().is_none(), "the second offer waits");
        let queued: Vec<Vec<&str>> = streams.iter_mut().map(queued_kinds).collect();
        assert!(
            queued.contains(&vec!["catalog_changed"]) && queued.contains(&vec![]),
            "the first verdict's event is queued, the second's never made: {queued:?}"
        );
    }

    #[tokio::test]
    async fn open_after_close_all_is_refused() {
        let hub = Arc::new(ModelSessionHub::default());
        hub.close_all();
        let refused = open(&hub).await;
        match refused {
            Err(err) => assert_eq!(err.code(), crate::error::ErrorCode::ShuttingDown),
            Ok(_) => panic!("a model session opened after close_all"),
        }
        assert!(hub.live().by_character.is_empty());
    }

    /// Empty catalogs that count their reads of current sessions and treat
    /// `sess_gone` as deleted.
    #[derive(Default)]
    struct CountingCatalogs {
        reads: Mutex<Vec<usize>>,
    }

    impl OfferedCatalogs for CountingCatalogs {
        fn current<'a>(
            &'a self,
            sessions: &'a [&'a Session],
        ) -> BoxFuture<'a, Result<Vec<Option<Arc<Session>>>>> {
            self.reads.lock().unwrap().push(sessions.len());
            let found = sessions
                .iter()
                .map(|session| (session.id != "sess_gone").then(|| Arc::new((*session).clone())))
                .collect();
            Box::pin(std::future::ready(Ok(found)))
        }

        fn offer<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Offer>> {
            EmptyCatalogs.offer(session)
        }
    }

    /// A session `id` of its own character `char_{id}`.
    fn session_of(id: &str) -> Session {
        Session {
            id: id.into(),
            character_id: format!("char_{id}"),
            ..session()
        }
    }

    #[tokio::test]
    async fn a_mutation_reads_the_sessions_of_all_its_changes_at_once() {
        let hub = Arc::new(ModelSessionHub::default());
        let catalogs = CountingCatalogs::default();
        let mut streams = Vec::new();
        for id in ["sess_a", "sess_b", "sess_a"] {
            let opened = hub.open(
                &catalogs,
                session_of(id),
                Slot::Narrator,
                ModelProvider::OpenAiCompatible,
                None,
            );
            streams.push(opened.await.unwrap());
        }
        // Two sessions of one character; `sess_gone` opened while it existed
        // (on catalogs that still had it) and was deleted since.
        streams.push(open(&hub).await.unwrap());
        let gone = Session {
            id: "sess_gone".into(),
            ..session()
        };
        let opened = hub.open(
            &EmptyCatalogs,
            gone,
            Slot::Narrator,
            ModelProvider::OpenAiCompatible,
            None,
        );
        streams.push(opened.await.unwrap());
        catalogs.reads.lock().unwrap().clear();

        let changes: Vec<CatalogChange> = ["char_sess_a", "char_sess_b", "char_test"]
            .into_iter()
            .map(|id| CatalogChange::new(CatalogScope::Character(id.into())))
            .collect();
        let guard = hub.mutation_lock().await;
        let results = hub.sync_all(&guard, &catalogs, &changes).await;
        assert_eq!(
            *catalogs.reads.lock().unwrap(),
            [5],
            "one read for the five model sessions of all three changes"
        );
        assert_eq!(results[..2], [Ok(()), Ok(())]);
        let refusal = results[2].as_ref().expect_err("a deleted session refuses");
        assert!(refusal.contains("could not be assembled"), "{refusal}");
        assert!(refusal.contains("sess_gone"), "{refusal}");
    }
}
