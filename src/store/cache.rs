//! Small read-through caches for rows read on every tool call (a session, an
//! account's enabled definitions), so that a call does not pay a database round
//! trip for data that changes rarely.
//!
//! Every write to the cached tables goes through `Store` and invalidates. A
//! generation counter and per-key invalidation stamps keep a read that raced a
//! write of its key from storing what it read before the write. Instances sharing a PostgreSQL database invalidate each
//! other's caches through `store::cluster` (LISTEN/NOTIFY).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fast_map::FastMap;

/// Entries kept before the cache starts over (it only ever saves a query).
const MAX_ENTRIES: usize = 10_000;

/// A generation-guarded map from keys to cached values.
///
/// A read takes a ticket ([`generation`](Self::generation)) before it reads
/// the database, and its `put` is refused when its key (or every key) was
/// invalidated since. Invalidations are stamped per key: one account's writes
/// never keep another account's reads out of the cache.
#[derive(Debug)]
pub struct GenerationCache<V> {
    /// Counts invalidations; a ticket is its value when a read began.
    generation: AtomicU64,
    state: Mutex<State<V>>,
}

#[derive(Debug)]
struct State<V> {
    entries: FastMap<String, V>,
    /// The generation each key was last invalidated at.
    invalidated: FastMap<String, u64>,
    /// The generation of the last [`GenerationCache::invalidate_all`] (or of
    /// the last time `invalidated` was forgotten, which counts as one).
    all_invalidated: u64,
}

impl<V> Default for GenerationCache<V> {
    fn default() -> Self {
        Self {
            generation: AtomicU64::new(0),
            state: Mutex::new(State {
                entries: FastMap::default(),
                invalidated: FastMap::default(),
                all_invalidated: 0,
            }),
        }
    }
}

impl<V: Clone> GenerationCache<V> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<V>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<V> {
        self.state().entries.get(key).cloned()
    }

    /// The ticket to pass to `put` after reading the database.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Stores what was read, unless `key` was invalidated since `generation`.
    pub fn put(&self, key: &str, generation: u64, value: V) {
        let mut state = self.state();
        let invalidated = state.invalidated.get(key).copied().unwrap_or(0);
        if invalidated.max(state.all_invalidated) > generation {
            return;
        }
        if state.entries.len() >= MAX_ENTRIES {
            state.entries.clear();
        }
        state.entries.insert(key.to_owned(), value);
    }

    pub fn invalidate(&self, key: &str) {
        let mut state = self.state();
        let now = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        state.entries.remove(key);
        if state.invalidated.len() >= MAX_ENTRIES {
            // Forgetting the stamps is safe when it refuses every read
            // begun before now, as invalidating all does.
            state.invalidated.clear();
            state.all_invalidated = now;
        }
        state.invalidated.insert(key.to_owned(), now);
    }

    pub fn invalidate_all(&self) {
        let mut state = self.state();
        let now = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        state.entries.clear();
        state.invalidated.clear();
        state.all_invalidated = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_raced_a_write_is_not_cached() {
        let cache = GenerationCache::<u32>::default();
        let before = cache.generation();
        cache.invalidate("a");
        cache.put("a", before, 1);
        assert_eq!(cache.get("a"), None);
        cache.put("a", cache.generation(), 2);
        assert_eq!(cache.get("a"), Some(2));
        cache.invalidate_all();
        assert_eq!(cache.get("a"), None);
        let before = cache.generation();
        cache.invalidate_all();
        cache.put("a", before, 3);
        assert_eq!(
            cache.get("a"),
            None,
            "invalidating all refuses every earlier read"
        );
    }

    /// Found by a probe: one account editing its definitions every 20 ms kept
    /// every other account's definitions out of the cache (each call read
    /// them all from the database: 1 ms -> 66 ms p50).
    #[test]
    fn another_keys_invalidation_does_not_refuse_a_read() {
        let cache = GenerationCache::<u32>::default();
        let before = cache.generation();
        cache.invalidate("a");
        cache.put("b", before, 1);
        assert_eq!(cache.get("b"), Some(1));
        cache.put("a", before, 1);
        assert_eq!(cache.get("a"), None);
    }

    #[test]
    fn forgetting_the_stamps_refuses_the_reads_they_would_have() {
        let cache = GenerationCache::<u32>::default();
        let before = cache.generation();
        for n in 0..=MAX_ENTRIES {
            cache.invalidate(&format!("key {n}"));
        }
        cache.put("key 0", before, 1);
        assert_eq!(cache.get("key 0"), None);
        cache.put("key 0", cache.generation(), 2);
        assert_eq!(cache.get("key 0"), Some(2));
    }
}
