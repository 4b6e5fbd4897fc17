//! The plugin eviction rule's counters: consecutive connection-level failures per
//! callback origin and source tag.

use std::collections::HashMap;
use std::sync::Mutex;

/// Consecutive connection-level failures after which a plugin origin is evicted.
pub const EVICTION_THRESHOLD: u32 = 3;

/// Failure streaks keyed by (origin, source).
#[derive(Debug, Default)]
pub struct FailureCounter {
    streaks: Mutex<HashMap<(String, String), u32>>,
}

impl FailureCounter {
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
