//! What a client does with generated pages: regenerate a floor (a new run and
//! page, through the replay guard), select a page (its run committed, the
//! others discarded), cancel a run between steps.

use super::ToolRuntime;
use crate::error::{Error, ErrorCode, Result};
use crate::store::Run;

impl ToolRuntime {
    /// Starts a new run (a new page) on the floor with its user message; 409
    /// `tool_replay_confirmation_required` until `confirmed` covers the earlier
    /// attempts' executions that are not replay-safe.
    pub async fn regenerate(
        &self,
        account_id: &str,
        floor_id: &str,
        confirmed: Vec<String>,
    ) -> Result<Run> {
        let floor = self.store.floor(account_id, floor_id).await?;
        let (Some(llm), Some(claim)) = (self.llm.clone(), self.claim_turn(&floor.session_id)?)
        else {
            return Err(Error::refused(
                ErrorCode::ModelNotConfigured,
                "no model endpoint is configured; set TOOLGATE_LLM_BASE_URL and TOOLGATE_LLM_MODEL",
            ));
        };
        let run = self.open_run(account_id, &floor.id, confirmed).await?;
        self.begin(
            claim,
            llm,
            account_id,
            &floor.session_id,
            run.clone(),
            &floor.content,
        )
        .await?;
        Ok(run)
    }

    /// Chooses the page: its run is committed and the floor's other open runs
    /// are discarded.
    pub async fn select_page(&self, account_id: &str, page_id: &str) -> Result<Run> {
        let run = self.store.run_of_page(account_id, page_id).await?;
        self.ensure_idle(&run.session_id)?;
        let chosen = match run.state.as_str() {
            "open" => self.commit_run(account_id, &run.id, None).await?,
            "committed" => run,
            _ => {
                return Err(Error::refused(
                    ErrorCode::RunNotOpen,
                    format!(
                        "page {page_id} belongs to run {}, which was discarded",
                        run.id
                    ),
                ));
            }
        };
        self.discard_other_runs(account_id, &chosen).await?;
        tracing::info!(page_id, run_id = %chosen.id, "page selected");
        Ok(chosen)
    }

    /// Stops the run's generation: the model request in flight, or the next
    /// step (calls already started finish and are journalled); `false` when
    /// it is not generating.
    pub async fn cancel_generation(&self, account_id: &str, run_id: &str) -> Result<bool> {
        let Some(cancel) = self.generating(account_id, run_id).await? else {
            return Ok(false);
        };
        cancel.cancel();
        tracing::info!(run_id, "run cancellation requested");
        Ok(true)
    }

    /// Refuses (`generation_in_progress`) while the loop is still generating
    /// `run_id`: a client's commit or discard waits for `run_finished` (or a
    /// cancel), so that the loop never goes on calling tools in a run that is
    /// no longer open.
    pub async fn ensure_not_generating(&self, account_id: &str, run_id: &str) -> Result<()> {
        match self.generating(account_id, run_id).await? {
            Some(_) => Err(super::generation::still_generating(Some(run_id))),
            None => Ok(()),
        }
    }

    /// The cancel token of the turn generating the account's run `run_id`,
    /// if one is (404 for a run the account does not have).
    async fn generating(
        &self,
        account_id: &str,
        run_id: &str,
    ) -> Result<Option<tokio_util::sync::CancellationToken>> {
        let run = self.store.run(account_id, run_id).await?;
        let turns = self.turns.lock().expect("turns lock");
        Ok(turns
            .get(&run.session_id)
            .filter(|active| active.run_id.as_deref() == Some(run.id.as_str()))
            .map(|active| active.cancel.clone()))
    }
}
