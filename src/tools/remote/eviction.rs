//! The plugin eviction rule's counters: consecutive connection-level failures per
//! callback origin and source tag.

use std::collections::HashMap;
use std::sync::Mutex;

/// Consecutive connection-level failures after which a plugin origin is evicted.
pub const EVICTION_THRESHOLD: u32 = 3;

/// Most (origin, source) pairs remembered as unreachable; past it an outage
/// is simply not logged (its calls still fail and are counted in metrics).
const MAX_UNREACHABLE: usize = 10_000;

/// Failure streaks keyed by (origin, source), and which of them are in an
/// outage (for one log line when it begins and one when it ends, for every
/// source, not only plugins).
#[derive(Debug, Default)]
pub struct FailureCounter {
    streaks: Mutex<HashMap<(String, String), u32>>,
    unreachable: Mutex<std::collections::HashSet<(String, String)>>,
}

impl FailureCounter {
    /// A connection to `origin` for `source` failed: true when that begins
    /// an outage.
    pub fn note_unreachable(&self, origin: &str, source: &str) -> bool {
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        unreachable.len() < MAX_UNREACHABLE
            && unreachable.insert((origin.to_owned(), source.to_owned()))
    }

    /// `origin` answered for `source`: true when that ends an outage.
    pub fn note_answered(&self, origin: &str, source: &str) -> bool {
        let mut unreachable = self.unreachable.lock().unwrap_or_else(|p| p.into_inner());
        !unreachable.is_empty() && unreachable.remove(&(origin.to_owned(), source.to_owned()))
    }

    /// Counts one connection-level failure. Returns true exactly once per streak,
    /// when it reaches the threshold; the streak starts over after that.
    pub fn record_failure(&self, origin: &str, source: &str) -> bool {
        let mut streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
        let key = (origin.to_owned(), source.to_owned());
        let count = streaks.entry(key.clone()).or_insert(0);
        *count += 1;
        if *count >= EVICTION_THRESHOLD {
            streaks.remove(&key);
            true
        } else {
            false
        }
    }

    /// Any HTTP answer, read timeout or fresh registration ends a streak.
    pub fn reset(&self, origin: &str, source: &str) {
        let mut streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
        streaks.remove(&(origin.to_owned(), source.to_owned()));
    }

    /// The current streak (for logs and tests).
    pub fn streak(&self, origin: &str, source: &str) -> u32 {
        let streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
        streaks
            .get(&(origin.to_owned(), source.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_begins_and_ends_once() {
        let counter = FailureCounter::default();
        assert!(counter.note_unreachable("http://127.0.0.1:9", "external"));
        assert!(!counter.note_unreachable("http://127.0.0.1:9", "external"));
        assert!(counter.note_unreachable("http://127.0.0.1:9", "plugin:p"));
        assert!(counter.note_answered("http://127.0.0.1:9", "external"));
        assert!(!counter.note_answered("http://127.0.0.1:9", "external"));
        assert!(counter.note_unreachable("http://127.0.0.1:9", "external"));
    }

    #[test]
    fn third_consecutive_failure_trips_once() {
        let counter = FailureCounter::default();
        assert!(!counter.record_failure("o", "plugin:a"));
        assert!(!counter.record_failure("o", "plugin:a"));
        assert!(!counter.record_failure("o2", "plugin:a"));
        assert!(!counter.record_failure("o", "plugin:b"));
        assert!(counter.record_failure("o", "plugin:a"));
        assert_eq!(counter.streak("o", "plugin:a"), 0);
    }

    #[test]
    fn reset_ends_the_streak() {
        let counter = FailureCounter::default();
        counter.record_failure("o", "plugin:a");
        counter.record_failure("o", "plugin:a");
        counter.reset("o", "plugin:a");
        assert!(!counter.record_failure("o", "plugin:a"));
        assert!(!counter.record_failure("o", "plugin:a"));
        assert!(counter.record_failure("o", "plugin:a"));
    }
}
