//! Tool providers: one module per kind of provider.

pub mod builtin;
pub mod definitions;
pub mod mcp;
pub mod remote;
pub mod script;
