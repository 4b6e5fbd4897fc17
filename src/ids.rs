//! Identifiers and clocks shared by every module.

use std::time::{SystemTime, UNIX_EPOCH};

/// A new prefixed, sortable, unique identifier such as `sess_01J...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// Milliseconds since the Unix epoch: the unit of every timestamp in the API.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
