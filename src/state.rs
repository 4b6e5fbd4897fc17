//! The services one running server shares between its requests and workers.

use std::sync::Arc;

use crate::config::Settings;
use crate::runtime::ToolRuntime;
use crate::store::Store;

/// Everything a request handler may reach; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub settings: Arc<Settings>,
    pub runtime: ToolRuntime,
}
