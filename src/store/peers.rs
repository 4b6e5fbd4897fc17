//! Whether other instances share the database now, for work only they need:
//! an instance alone on PostgreSQL does not relay its sessions' events to
//! nobody (three to four statements a generated turn).
//!
//! Knowing is a time, not a flag: the last moment another instance was seen
//! alive (its heartbeat in `toolgate_instances`, or any announcement it
//! sent). Others count as present for [`STALE_AFTER_MS`] after it, the time
//! after which a silent instance is taken for dead anyway. A time only moves
//! forward, so a heartbeat's read that missed a new instance cannot undo the
//! greeting that announced it.
//!
//! A new instance greets the live ones before it serves, and waits for their
//! answers: each has counted it before answering, so no event published
//! after a stream could open on the new instance is kept from it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

use super::Store;
use super::backend::sql;
use super::cluster::STALE_AFTER_MS;
use crate::error::Result;
use crate::ids::now_ms;

/// The topic a starting instance announces itself with (no data).
pub(super) const GREETING_TOPIC: &str = "instance_started";
/// The topic of an answer to a greeting; its data is the greeted instance's id.
pub(super) const GREETED_TOPIC: &str = "instance_greeted";
/// How long a starting instance waits to listen and for the live instances'
/// answers: one that does not answer (hung, or its listener reconnecting)
/// counts this one at its next heartbeat, within seconds.
const GREETING_WITHIN: Duration = Duration::from_secs(3);

/// The other instances with a live heartbeat, by id: not `?1` (this one),
/// heartbeat at or after `?2`, not `?3` (the previous one on this data
/// directory, dead). One statement for every reader of the live instances.
pub(super) const LIVE_OTHER_INSTANCES_SQL: &str = "SELECT id FROM toolgate_instances WHERE id <> ?1 AND heartbeat_at >= ?2 \
     AND (?3 IS NULL OR id <> ?3) ORDER BY id";

/// What this instance knows of the others.
#[derive(Debug)]
pub(super) struct Peers {
    /// What `last_seen_ms` counts from: a monotonic clock, so that a jump
    /// of the wall clock neither forgets the others nor keeps them.
    since: Instant,
    /// When another instance was last seen alive, in ms after `since` plus
    /// one (0: never).
    last_seen_ms: AtomicI64,
    /// Whether this instance's listener listens (greetings' answers arrive
    /// through it).
    listening: watch::Sender<bool>,
    /// The instances that answered this one's greeting.
    answered: watch::Sender<HashSet<String>>,
}

impl Default for Peers {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            last_seen_ms: AtomicI64::new(0),
            listening: watch::Sender::new(false),
            answered: watch::Sender::new(HashSet::new()),
        }
    }
}

impl Peers {
    /// Now on this instance's monotonic clock, in ms (from 1).
    fn now(&self) -> i64 {
        i64::try_from(self.since.elapsed().as_millis()).unwrap_or(i64::MAX - 1) + 1
    }

    /// Another instance is alive now.
    pub(super) fn seen(&self) {
        self.last_seen_ms.fetch_max(self.now(), Ordering::Relaxed);
    }

    /// This instance's listener listens (again).
    pub(super) fn listening(&self) {
        self.listening.send_replace(true);
    }

    /// `instance` answered this one's greeting.
    pub(super) fn answered_by(&self, instance: String) {
        self.answered.send_modify(|answered| {
            answered.insert(instance);
        });
    }

    fn present(&self) -> bool {
        let last = self.last_seen_ms.load(Ordering::Relaxed);
        last > 0 && self.now() - last < STALE_AFTER_MS
    }
}

impl Store {
    /// Whether another instance shares the database (seen alive within
    /// [`STALE_AFTER_MS`]); never on SQLite.
    pub fn other_instances_present(&self) -> bool {
        self.cluster.peers.present()
    }

    /// The other instances with a live heartbeat (not the previous one on
    /// this data directory: it is dead).
    async fn live_other_instances(&self) -> Result<Vec<String>> {
        let live = sql!(self.conn().await?, c => query_scalar::<String>(LIVE_OTHER_INSTANCES_SQL)
        .bind(self.instance_id())
        .bind(now_ms() - STALE_AFTER_MS)
        .bind(self.previous_instance())
        .fetch_all(c)
        .await)?;
        Ok(live)
    }

    /// The heartbeat's look at the instances table: another live heartbeat
    /// counts as seeing that instance.
    pub(super) async fn look_for_other_instances(&self) -> Result<()> {
        if !self.live_other_instances().await?.is_empty() {
            self.cluster.peers.seen();
        }
        Ok(())
    }

    /// At start-up, after this instance's row is written: tells the live
    /// instances it is here and waits (within [`GREETING_WITHIN`]) until
    /// each has answered, that is, counted it. A failure is logged: the
    /// heartbeats find each other within seconds anyway.
    pub(super) async fn greet_other_instances(&self) {
        let peers = &self.cluster.peers;
        let listening = async { peers.listening.subscribe().wait_for(|l| *l).await.is_ok() };
        if !tokio::time::timeout(GREETING_WITHIN, listening)
            .await
            .unwrap_or(false)
        {
            tracing::warn!(
                "not listening for the other instances yet; they will count this one at their next heartbeat"
            );
            return;
        }
        let others = match self.live_other_instances().await {
            Ok(others) if others.is_empty() => return,
            Ok(others) => others,
            Err(err) => {
                tracing::warn!(error = %err, "could not read the other instances to greet them");
                return;
            }
        };
        peers.seen();
        self.announce(GREETING_TOPIC, Value::Null).await;
        let all_answered = async {
            let mut answered = peers.answered.subscribe();
            let _ = answered
                .wait_for(|answered| others.iter().all(|other| answered.contains(other)))
                .await;
        };
        if tokio::time::timeout(GREETING_WITHIN, all_answered)
            .await
            .is_err()
        {
            let answered = peers.answered.borrow().len();
            tracing::warn!(
                live = others.len(),
                answered,
                "not every live instance answered this one's greeting in time; the others count it at their next heartbeat"
            );
        } else {
            tracing::info!(
                others = others.len(),
                "greeted the other instances on the database"
            );
        }
    }

    /// Another instance greeted this one: it is counted, then told so.
    pub(super) fn answer_greeting(&self, from: String) {
        self.cluster.peers.seen();
        let store = self.clone();
        tokio::spawn(async move {
            store.announce(GREETED_TOPIC, Value::String(from)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Others count as present from the moment one is seen until
    /// [`STALE_AFTER_MS`] later, and never before any is seen.
    #[test]
    fn others_are_present_for_a_while_after_one_is_seen() {
        let peers = Peers::default();
        assert!(!peers.present(), "none seen yet");
        peers.seen();
        assert!(peers.present());
        let stale = Duration::from_millis(STALE_AFTER_MS as u64 + 1);
        let long_ago = Peers {
            since: Instant::now()
                .checked_sub(stale)
                .expect("a machine up for more than 10 s"),
            ..Peers::default()
        };
        long_ago.last_seen_ms.store(1, Ordering::Relaxed);
        assert!(
            !long_ago.present(),
            "seen more than {STALE_AFTER_MS} ms ago"
        );
        long_ago.seen();
        assert!(long_ago.present(), "seen again");
    }
}
