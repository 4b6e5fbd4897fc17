//! toolgate: a tool runtime for AI character and role-play chat servers.
//!
//! The crate is layered: `domain` and `store` know nothing of HTTP; `api` maps
//! HTTP onto them; `app` wires a running server together.

pub mod api;
pub mod app;
pub mod body_deadline;
pub mod bootstrap;
pub mod call;
pub mod catalog;
pub mod config;
pub mod console;
pub mod domain;
pub mod error;
pub mod failure_log;
pub mod fast_map;
pub mod ids;
pub mod journal;
pub mod listener;
pub mod llm;
pub mod logging;
pub mod mcp_server;
pub mod metrics;
pub mod model_sessions;
pub mod operator;
pub mod permissions;
pub mod poll_again;
pub mod reason;
pub mod runtime;
pub mod schema;
pub mod secrets;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod tools;
