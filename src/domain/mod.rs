//! Validated domain values. Nothing here knows about HTTP.

pub mod callback_url;
pub mod definition;
pub mod mcp;
pub mod mcp_input;
pub mod mcp_rules;
pub mod model_overrides;
pub mod names;
pub mod paging;

pub use callback_url::CallbackUrl;
pub use names::CharacterName;
pub use paging::{Page, PageRequest, SortOrder};
pub mod tool;
