//! Validated domain values. Nothing here knows about HTTP.

pub mod definition;
pub mod names;
pub mod paging;

pub use names::CharacterName;
pub use paging::{Page, PageRequest, SortOrder};
pub mod tool;
