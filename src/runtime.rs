//! The tool runtime service: everything a tool call needs, shared by the HTTP
//! handlers and (later) the generation loop and job workers.

use std::sync::Arc;

use crate::config::Settings;
use crate::jobs::JobSignal;
use crate::model_sessions::ModelSessionHub;
use crate::store::Store;
use crate::tools::remote::RemoteRegistry;

/// Shared tool-runtime state; cheap to clone.
#[derive(Clone)]
pub struct ToolRuntime {
    pub store: Store,
    pub settings: Arc<Settings>,
    pub remote: Arc<RemoteRegistry>,
    /// Live model sessions per character; catalog mutations synchronise them.
    pub model_sessions: Arc<ModelSessionHub>,
    /// Wakes the job workers when a job becomes claimable.
    pub jobs: Arc<JobSignal>,
    /// Runs script-handler tools in the sandbox.
    pub scripts: crate::tools::script::ScriptRunner,
}

impl ToolRuntime {
    /// A runtime with empty registries and no live model sessions.
    pub fn new(store: Store, settings: Arc<Settings>) -> anyhow::Result<Self> {
        use anyhow::Context;
        Ok(Self {
            remote: Arc::new(
                RemoteRegistry::new(&settings).context("building the callback client")?,
            ),
            model_sessions: Arc::new(ModelSessionHub::default()),
            jobs: Arc::new(JobSignal::default()),
            scripts: crate::tools::script::ScriptRunner::with_default_concurrency(
                settings.script_limits(),
            ),
            store,
            settings,
        })
    }
}
