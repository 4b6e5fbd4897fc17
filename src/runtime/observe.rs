//! What operators read off the runtime: the values `/metrics` shows at scrape
//! time, and readiness.

use std::time::Duration;

use super::ToolRuntime;
use crate::error::Result;
use crate::metrics::ScrapeSnapshot;

/// How long readiness waits for the database.
const READY_DB_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the server is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    Database,
    JobWorkers,
}

impl ToolRuntime {
    /// The scrape-time values.
    pub async fn scrape_snapshot(&self) -> Result<ScrapeSnapshot> {
        let mut remote_tools_by_role = Vec::new();
        for character in self.store.all_characters().await?.iter() {
            let count = self.remote.list(&character.id).len() as u64;
            if count > 0 {
                remote_tools_by_role.push((character.name.clone(), count));
            }
        }
        let (jobs_by_state, oldest) = self.store.job_queue_stats().await?;
        let (db_connections, db_idle_connections) = self.store.pool_stats();
        Ok(ScrapeSnapshot {
            remote_tools_by_role,
            live_model_sessions: self.model_sessions.live_count() as u64,
            jobs_by_state,
            oldest_claimable_job_seconds: oldest.map_or(0.0, |ms| ms.max(0) as f64 / 1000.0),
            mcp_servers_by_state: self.mcp.state_counts(),
            db_connections,
            db_idle_connections,
        })
    }

    /// Ready when the database answers and, if this instance runs jobs, the
    /// job worker runs.
    pub async fn readiness(&self) -> std::result::Result<(), NotReady> {
        if !self.store.answers_within(READY_DB_TIMEOUT).await {
            return Err(NotReady::Database);
        }
        if self.settings.job_workers > 0 && !self.jobs.worker_alive() {
            return Err(NotReady::JobWorkers);
        }
        Ok(())
    }
}
