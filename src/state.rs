//! The services one running server shares between its requests and workers.

use crate::runtime::ToolRuntime;

/// Everything a request handler may reach; cheap to clone. The runtime holds
/// the store and the settings, so they are reached through it.
#[derive(Clone)]
pub struct AppState {
    pub runtime: ToolRuntime,
}
