//! Journal rows already written as JSON, kept by id beside the revision they
//! were written at, so that a page read again reuses them.
//!
//! Writing a row's JSON from its 28 columns is more than half of what a
//! journal page costs the server (BENCHMARKS.md, issue 20, fortieth look),
//! and most rows a page shows no longer change. Every statement that changes
//! a journal row also bumps its `revision` (migration 0028; the rule is
//! checked over the sources by `tests/architecture.rs`), so a kept text is
//! used only while the row's revision is the one it was written at: a row
//! changed since, by this instance or another sharing the database, is
//! written again from its columns.

use std::sync::Arc;

use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Bytes of row text kept at most (the texts and their ids).
pub(crate) const KEPT_BYTES: u64 = 32 * 1024 * 1024;
/// A row whose text is longer is not kept: a few rows with large arguments
/// would push out thousands of ordinary ones, and writing a large row's JSON
/// costs little beside copying it.
pub(crate) const MAX_KEPT_ROW_BYTES: usize = 16 * 1024;
/// About how long a row's text is, for the cache's first sizing.
const TYPICAL_ROW_BYTES: u64 = 1024;

/// A row's JSON text and the revision of the row it was written from.
#[derive(Clone)]
struct Kept {
    revision: i64,
    json: Arc<str>,
}

/// Weighs a kept row by the bytes it holds.
#[derive(Clone)]
struct ByBytes;

impl Weighter<Box<str>, Kept> for ByBytes {
    fn weight(&self, id: &Box<str>, kept: &Kept) -> u64 {
        (id.len() + kept.json.len()) as u64
    }
}

/// The journal rows written as JSON lately, bounded by [`KEPT_BYTES`];
/// shared by every reading thread.
pub(crate) struct RenderedRows {
    rows: Cache<Box<str>, Kept, ByBytes>,
}

impl RenderedRows {
    /// An empty set holding up to `capacity_bytes` of row text.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            rows: Cache::with_weighter(
                (capacity_bytes / TYPICAL_ROW_BYTES).max(1) as usize,
                capacity_bytes,
                ByBytes,
            ),
        }
    }

    /// The text of row `id` written at `revision`, if it is kept.
    pub fn get(&self, id: &str, revision: i64) -> Option<Arc<str>> {
        self.rows
            .get(id)
            .filter(|kept| kept.revision == revision)
            .map(|kept| kept.json)
    }

    /// Keeps the text of row `id` as written at `revision` (in place of any
    /// earlier revision's), unless it is longer than [`MAX_KEPT_ROW_BYTES`].
    pub fn keep(&self, id: &str, revision: i64, json: &Arc<str>) {
        if json.len() > MAX_KEPT_ROW_BYTES {
            return;
        }
        self.rows.insert(
            id.into(),
            Kept {
                revision,
                json: json.clone(),
            },
        );
    }

    /// Bytes of row text kept now.
    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.rows.weight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Arc<str> {
        Arc::from("x".repeat(len))
    }

    #[test]
    fn a_row_is_found_only_at_the_revision_it_was_written_at() {
        let rows = RenderedRows::new(KEPT_BYTES);
        let first = text(10);
        rows.keep("exec_a", 0, &first);
        assert_eq!(rows.get("exec_a", 0).as_deref(), Some(&*first));
        assert!(rows.get("exec_a", 1).is_none(), "a later revision was kept");
        assert!(rows.get("exec_b", 0).is_none(), "another row was kept");
        let second = text(20);
        rows.keep("exec_a", 1, &second);
        assert_eq!(rows.get("exec_a", 1).as_deref(), Some(&*second));
        assert!(rows.get("exec_a", 0).is_none(), "the old revision stayed");
    }

    #[test]
    fn a_long_row_is_not_kept() {
        let rows = RenderedRows::new(KEPT_BYTES);
        rows.keep("exec_long", 0, &text(MAX_KEPT_ROW_BYTES + 1));
        assert!(rows.get("exec_long", 0).is_none());
        rows.keep("exec_fits", 0, &text(MAX_KEPT_ROW_BYTES));
        assert!(rows.get("exec_fits", 0).is_some());
    }

    #[test]
    fn the_kept_bytes_stay_within_the_bound() {
        let capacity = 64 * 1024;
        let rows = RenderedRows::new(capacity);
        for n in 0..1_000 {
            rows.keep(&format!("exec_{n}"), 0, &text(1_000));
            assert!(rows.bytes() <= capacity, "{} bytes kept", rows.bytes());
        }
        assert!(rows.bytes() > capacity / 2, "the cache kept too little");
    }
}
