//! Small read-through caches for rows read on every tool call (a session, an
//! account's enabled definitions), so that a call does not pay a database round
//! trip for data that changes rarely.
//!
//! Every write to the cached tables goes through `Store` and invalidates. A
//! generation counter keeps a read that raced a write from storing what it read
//! before the write. Instances sharing a PostgreSQL database invalidate each
//! other's caches through `store::cluster` (LISTEN/NOTIFY).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fast_map::FastMap;

/// Entries kept before the cache starts over (it only ever saves a query).
const MAX_ENTRIES: usize = 10_000;

/// A generation-guarded map from keys to cached values.
#[derive(Debug)]
pub struct GenerationCache<V> {
    generation: AtomicU64,
    entries: Mutex<FastMap<String, V>>,
}

impl<V> Default for GenerationCache<V> {
    fn default() -> Self {
        Self {
            generation: AtomicU64::new(0),
            entries: Mutex::new(FastMap::default()),
        }
    }
}

impl<V: Clone> GenerationCache<V> {
    pub fn get(&self, key: &str) -> Option<V> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// The generation to pass to `put` after reading the database.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Stores what was read, unless a write happened since `generation`.
    pub fn put(&self, key: &str, generation: u64, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key.to_owned(), value);
    }

    pub fn invalidate(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        self.generation.fetch_add(1, Ordering::SeqCst);
        entries.remove(key);
    }

    pub fn invalidate_all(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        self.generation.fetch_add(1, Ordering::SeqCst);
        entries.clear();
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
    }
}
