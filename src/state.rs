//! The services one running server shares between its requests and workers.

use std::sync::Arc;

use crate::runtime::ToolRuntime;

/// Everything a request handler may reach; cheap to clone. The runtime holds
/// the store and the settings, so they are reached through it.
#[derive(Clone)]
pub struct AppState {
    pub runtime: ToolRuntime,
    /// Identifies this start of the server: new at every start, the same for
    /// every answer of one process. Runtime tool registrations do not survive a
    /// restart, so a plugin that sees it change knows to register again without
    /// diffing listings (`/healthz` and every `/api/tools` answer carry it).
    pub boot_id: Arc<str>,
}

impl AppState {
    /// The state of a server starting now, with a fresh boot id.
    pub fn new(runtime: ToolRuntime) -> Self {
        Self {
            runtime,
            boot_id: crate::ids::new_id("boot").into(),
        }
    }
}
