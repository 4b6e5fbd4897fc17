//! The run lifecycle: open (with the replay guard), commit, discard.

use super::ToolRuntime;
use crate::error::{Error, Result};
use crate::store::Run;

/// Whether the generation loop drives a run from its opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Generated {
    Yes,
    No,
}

impl ToolRuntime {
    /// Opens a run on the floor unless earlier attempts hold executions that are
    /// not replay-safe and that `confirmed` does not cover.
    pub async fn open_run(
        &self,
        account_id: &str,
        floor_id: &str,
        confirmed: Vec<String>,
    ) -> Result<Run> {
        self.open_run_for(account_id, floor_id, confirmed, Generated::No)
            .await
    }

    /// As [`Self::open_run`]; a run the loop generates is opened `running`
    /// and this instance's, so that no client closes it before the loop ends.
    pub(super) async fn open_run_for(
        &self,
        account_id: &str,
        floor_id: &str,
        confirmed: Vec<String>,
        generated: Generated,
    ) -> Result<Run> {
        if confirmed.len() > 1000 {
            return Err(Error::validation(
                "confirmed_execution_ids may list at most 1000 ids",
            ));
        }
        let floor = self.store.floor_ref(account_id, floor_id).await?;
        let blocking = self
            .store
            .blocking_executions(account_id, &floor.id)
            .await?;
        let unconfirmed: Vec<_> = blocking
            .into_iter()
            .filter(|execution| !confirmed.contains(&execution.id))
            .collect();
        if !unconfirmed.is_empty() {
            tracing::info!(
                floor_id,
                count = unconfirmed.len(),
                "run refused: replay confirmation required"
            );
            return Err(Error::ReplayConfirmationRequired {
                count: unconfirmed.len(),
                blocking_executions: serde_json::to_value(&unconfirmed)
                    .map_err(|err| Error::Internal(err.into()))?,
            });
        }
        let run = self
            .store
            .open_run(account_id, &floor, &confirmed, generated == Generated::Yes)
            .await?;
        tracing::info!(run_id = %run.id, floor_id, "run opened");
        Ok(run)
    }

    /// Commits the run: page active, executions committed, effects applied.
    pub async fn commit_run(
        &self,
        account_id: &str,
        run_id: &str,
        content: Option<&str>,
    ) -> Result<Run> {
        let run = self.store.commit_run(account_id, run_id, content).await?;
        Ok(self.committed(run))
    }

    /// [`Self::commit_run`] for a run just read from the account's runs
    /// (the turn's commit of its finished generation), without reading it again.
    pub(super) async fn commit_read_run(&self, run: &Run) -> Result<Run> {
        let run = self.store.commit_read_run(run).await?;
        Ok(self.committed(run))
    }

    /// What follows every commit, whichever way the run was found.
    fn committed(&self, committed: crate::store::Committed) -> Run {
        // Jobs staged by the run became claimable in the commit's transaction.
        self.jobs.queued(committed.jobs_queued);
        tracing::info!(run_id = %committed.run.id, jobs_queued = committed.jobs_queued, "run committed");
        committed.run
    }

    /// Discards the run: executions discarded, effects dropped.
    pub async fn discard_run(&self, account_id: &str, run_id: &str) -> Result<Run> {
        let run = self.store.discard_run(account_id, run_id).await?;
        tracing::info!(run_id, "run discarded");
        Ok(run)
    }
}
