//! What a client does with generated pages: regenerate a floor (a new run and
//! page, through the replay guard), select a page (its run committed, the
//! others discarded), cancel a run between steps.

use super::ToolRuntime;
use super::runs::Generated;
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
        let floor = self.store.floor_without_pages(account_id, floor_id).await?;
        let (Some(llm), Some(claim)) =
            (self.llm.clone(), self.claim_turn(&floor.session_id).await?)
        else {
            return Err(Error::refused(
                ErrorCode::ModelNotConfigured,
                "no model endpoint is configured; set TOOLGATE_LLM_BASE_URL and TOOLGATE_LLM_MODEL",
            ));
        };
        let run = self
            .open_run_for(account_id, &floor.id, confirmed, Generated::Yes)
            .await?;
        self.begin(claim, llm, account_id, run.clone(), &floor.content);
        Ok(run)
    }

    /// Chooses the page as its floor's reply: an open run is committed, a
    /// committed one's page becomes active again, and the floor's other open
    /// runs are discarded, all in one transaction (`Store::select_run`).
    pub async fn select_page(&self, account_id: &str, page_id: &str) -> Result<Run> {
        let run = self.store.run_of_page(account_id, page_id).await?;
        self.ensure_idle(&run.session_id).await?;
        let selected = self.store.select_run(account_id, &run.id).await?;
        // Jobs the commit staged became claimable in its transaction.
        self.jobs.queued(selected.jobs_queued);
        tracing::info!(page_id, run_id = %selected.run.id, discarded = ?selected.discarded, "page selected");
        Ok(selected.run)
    }

    /// Stops the run's generation: the model request in flight, or the next
    /// step (calls already started finish and are journalled); `false` when
    /// it is not generating. A run another live instance generates is
    /// recorded as asked and that instance told.
    pub async fn cancel_generation(&self, account_id: &str, run_id: &str) -> Result<bool> {
        let run = self.store.run(account_id, run_id).await?;
        if self.cancel_here(&run.id) {
            return Ok(true);
        }
        if !self.store.request_remote_cancel(account_id, run_id).await? {
            return Ok(false);
        }
        super::cluster::announce_run_cancel(self, run_id).await;
        tracing::info!(
            run_id,
            "run cancellation passed to the instance generating it"
        );
        Ok(true)
    }

    /// Deletes the account's session and stops its generation, on whichever
    /// instance drives it: nothing goes on generating for a session that is
    /// gone (its model requests, tool calls and events).
    pub async fn delete_session(
        &self,
        account_id: &str,
        session_id: &str,
    ) -> Result<crate::store::Session> {
        // Read first: the run goes with the session.
        let running = self.store.running_run_of_session(session_id).await?;
        let session = self.store.delete_session(account_id, session_id).await?;
        self.model_sessions
            .close_chat_session(&session.character_id, &session.id);
        super::cluster::announce_session_deleted(self, &session.character_id, &session.id).await;
        let here = self
            .turns
            .lock()
            .expect("turns lock")
            .get(&session.id)
            .map(|active| active.cancel.clone());
        match (here, running) {
            (Some(cancel), _) => cancel.cancel(),
            (None, Some(run_id)) => super::cluster::announce_run_cancel(self, &run_id).await,
            (None, None) => {}
        }
        Ok(session)
    }

    /// Stops this instance's generation of `run_id` (asked here or by another
    /// instance); false when this instance does not generate it.
    pub(super) fn cancel_here(&self, run_id: &str) -> bool {
        let turns = self.turns.lock().expect("turns lock");
        let Some(active) = turns
            .values()
            .find(|active| active.run_id.as_deref() == Some(run_id))
        else {
            return false;
        };
        active.cancel.cancel();
        tracing::info!(run_id, "run cancellation requested");
        true
    }

    /// The runs this instance is generating.
    pub(super) fn runs_generating_here(&self) -> Vec<String> {
        let turns = self.turns.lock().expect("turns lock");
        turns
            .values()
            .filter_map(|active| active.run_id.clone())
            .collect()
    }
}
