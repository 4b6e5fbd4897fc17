//! Identifiers and clocks shared by every module.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Monotonic within a process: ids made in the same millisecond still sort in
/// the order they were made, so "sort by time, then id" is insertion order.
static GENERATOR: Mutex<ulid::Generator> = Mutex::new(ulid::Generator::new());

/// A new prefixed, sortable, unique identifier such as `sess_01J...`.
pub fn new_id(prefix: &str) -> String {
    let monotonic = GENERATOR
        .lock()
        .ok()
        .and_then(|mut generator| generator.generate().ok());
    // The generator only fails when the random part overflows within one
    // millisecond; a fresh random id is still unique then.
    let ulid = match monotonic {
        Some(ulid) => ulid,
        None => ulid::Ulid::new(),
    };
    format!("{prefix}_{}", ulid.to_string().to_lowercase())
}

/// Milliseconds since the Unix epoch: the unit of every timestamp in the API.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_sort_in_creation_order() {
        let ids: Vec<String> = (0..1000).map(|_| super::new_id("x")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }
}
