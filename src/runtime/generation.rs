//! The generation loop's lifecycle: a session's right to generate (one turn
//! at a time, taken in the same step as the check), starting a run, ending it
//! (its page filled and marked finished, or discarded), and committing the
//! finished page when the session's next floor arrives — durable, so a
//! restart loses neither.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use crate::error::{Error, ErrorCode, Result};
use crate::llm::LlmClient;
use crate::model_sessions::ModelSessionEvent;
use crate::store::{Floor, FloorRef, GenerationState, Run, Store};

/// A run the loop is driving, as the floor route started it.
#[derive(Debug, Clone)]
pub struct Turn {
    pub account_id: String,
    pub session_id: String,
    pub run: Run,
    pub content: String,
    /// Cancelled by `POST /runs/{id}/cancel`: the loop stops before its next step.
    pub cancel: CancellationToken,
}

/// A session's generation in progress in this process.
#[derive(Debug, Clone)]
pub(super) struct ActiveTurn {
    claim_id: String,
    /// None until the claimed turn has opened its run.
    pub run_id: Option<String>,
    pub cancel: CancellationToken,
}

/// Every session's generation in progress, by session id.
pub(super) type ActiveTurns = Arc<Mutex<HashMap<String, ActiveTurn>>>;

/// A session's right to generate, taken in one step with the check that no
/// other generation runs there, in this process and in the database (so on
/// every instance sharing it); dropping it frees the session.
pub struct TurnClaim {
    turns: ActiveTurns,
    store: Store,
    session_id: String,
    claim_id: String,
    cancel: CancellationToken,
    /// Whether the database row still has to be removed.
    held_in_store: bool,
}

impl TurnClaim {
    fn attach(&self, run_id: &str) {
        let mut turns = self.turns.lock().expect("turns lock");
        if let Some(active) = turns.get_mut(&self.session_id)
            && active.claim_id == self.claim_id
        {
            active.run_id = Some(run_id.to_owned());
        }
    }

    /// Frees the session on every instance before returning, so that a floor
    /// posted on the event that follows is accepted anywhere.
    pub(super) async fn release(mut self) {
        if let Err(error) = self
            .store
            .release_generation_claim(&self.session_id, &self.claim_id)
            .await
        {
            // Left in place, the row is this instance's: its next claim of
            // the session, or any instance once this one is dead, takes it over.
            tracing::warn!(session_id = ?self.session_id, %error, "could not release a generation claim");
        }
        self.held_in_store = false;
    }
}

impl Drop for TurnClaim {
    fn drop(&mut self) {
        let mut turns = self.turns.lock().expect("turns lock");
        if turns
            .get(&self.session_id)
            .is_some_and(|active| active.claim_id == self.claim_id)
        {
            turns.remove(&self.session_id);
        }
        drop(turns);
        if self.held_in_store
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let (store, session_id, claim_id) = (
                self.store.clone(),
                std::mem::take(&mut self.session_id),
                std::mem::take(&mut self.claim_id),
            );
            handle.spawn(async move {
                if let Err(error) = store.release_generation_claim(&session_id, &claim_id).await {
                    tracing::warn!(%session_id, %error, "could not release a generation claim");
                }
            });
        }
    }
}

/// How a turn ended.
pub(super) enum Ending {
    Answered(String),
    Failed(String, Option<u16>),
}

impl ToolRuntime {
    /// Takes the session's right to generate; refused while a generation runs
    /// here or on another instance. None when no model is configured
    /// (nothing will generate).
    pub async fn claim_turn(&self, session_id: &str) -> Result<Option<TurnClaim>> {
        if self.llm.is_none() {
            return Ok(None);
        }
        let mut claim = {
            let mut turns = self.turns.lock().expect("turns lock");
            if let Some(active) = turns.get(session_id) {
                return Err(still_generating(active.run_id.as_deref()));
            }
            let claim = TurnClaim {
                turns: self.turns.clone(),
                store: self.store.clone(),
                session_id: session_id.to_owned(),
                claim_id: crate::ids::new_id("claim"),
                cancel: CancellationToken::new(),
                held_in_store: false,
            };
            let active = ActiveTurn {
                claim_id: claim.claim_id.clone(),
                run_id: None,
                cancel: claim.cancel.clone(),
            };
            turns.insert(session_id.to_owned(), active);
            claim
        };
        // Dropped on refusal or error: the in-process claim goes with it.
        let (taken, discarded) = self
            .store
            .claim_generation(session_id, &claim.claim_id)
            .await?;
        if !taken {
            let running = self.store.running_run_of_session(session_id).await?;
            return Err(still_generating(running.as_deref()));
        }
        claim.held_in_store = true;
        for run_id in &discarded {
            tracing::warn!(%run_id, "a generation a dead instance left running was discarded as its session was claimed");
            // An instance only paused, not dead, hears it on resuming.
            super::cluster::announce_run_cancel(self, run_id).await;
        }
        Ok(Some(claim))
    }

    /// Commits the session's finished generations (each floor's newest: its
    /// page becomes the floor's reply, the floor's other open runs are
    /// discarded) before a new floor is appended. Read from the store, so it
    /// holds across a restart.
    pub async fn commit_finished_turn(&self, account_id: &str, session_id: &str) -> Result<()> {
        for run in self
            .store
            .finished_runs_to_commit(account_id, session_id)
            .await?
        {
            let committed = match self.commit_read_run(&run).await {
                Ok(committed) => committed,
                // Committed or discarded by a client in the meantime.
                Err(Error::Refused {
                    code: ErrorCode::RunNotOpen,
                    ..
                }) => continue,
                Err(error) => return Err(error),
            };
            self.discard_other_runs(account_id, &committed).await?;
        }
        Ok(())
    }

    /// Discards the open runs of `chosen`'s floor other than `chosen`. A run
    /// still marked generating is left: the session's claim is held, so its
    /// instance is dead, and the sweep of dead instances discards it.
    pub(super) async fn discard_other_runs(&self, account_id: &str, chosen: &Run) -> Result<()> {
        for other in self
            .store
            .open_runs_of_floor(account_id, &chosen.floor_id)
            .await?
        {
            if other.id == chosen.id {
                continue;
            }
            match self.discard_run(account_id, &other.id).await {
                Ok(_) => {}
                Err(Error::Refused {
                    code: ErrorCode::GenerationInProgress | ErrorCode::RunNotOpen,
                    ..
                }) => {
                    tracing::info!(run_id = %other.id, "left a run another request or instance closes")
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Refuses while the session is generating, here or on another instance.
    pub(super) async fn ensure_idle(&self, session_id: &str) -> Result<()> {
        if let Some(active) = self.turns.lock().expect("turns lock").get(session_id) {
            return Err(still_generating(active.run_id.as_deref()));
        }
        if self.store.generating_elsewhere(session_id).await? {
            let running = self.store.running_run_of_session(session_id).await?;
            return Err(still_generating(running.as_deref()));
        }
        Ok(())
    }

    /// Starts a generation for a floor the caller just appended; None when
    /// no model is configured (the floor is stored all the same). The floor
    /// is new, its id not yet answered to anyone: no call is journalled on
    /// it to confirm, and it is its own reference (two reads fewer before
    /// every turn's first model request than a run opened on a floor by id).
    pub async fn start_turn(
        &self,
        claim: Option<TurnClaim>,
        account_id: &str,
        floor: &Floor,
    ) -> Result<Option<Run>> {
        let (Some(llm), Some(claim)) = (self.llm.clone(), claim) else {
            return Ok(None);
        };
        let floor_ref = FloorRef {
            id: floor.id.clone(),
            session_id: floor.session_id.clone(),
            active_page_id: None,
        };
        let run = self
            .store
            .open_run(account_id, &floor_ref, &[], true)
            .await?;
        tracing::info!(run_id = %run.id, floor_id = %floor.id, "run opened");
        self.begin(claim, llm, account_id, run.clone(), &floor.content);
        Ok(Some(run))
    }

    /// Runs the generation of an opened run (for the user's `content`) in a
    /// task of its own (tracked: shutdown waits for it, and stops it between
    /// steps).
    pub(super) fn begin(
        &self,
        claim: TurnClaim,
        llm: LlmClient,
        account_id: &str,
        run: Run,
        content: &str,
    ) {
        claim.attach(&run.id);
        let turn = Turn {
            account_id: account_id.to_owned(),
            session_id: run.session_id.clone(),
            run,
            content: content.to_owned(),
            cancel: claim.cancel.clone(),
        };
        let runtime = self.clone();
        self.started_work
            .spawn(async move { runtime.run_turn(&llm, turn, claim).await });
    }

    async fn run_turn(&self, llm: &LlmClient, turn: Turn, claim: TurnClaim) {
        let run = &turn.run;
        self.emit(
            &turn,
            "run_started",
            json!({"floor_id": run.floor_id, "page_id": run.page_id}),
        );
        tracing::info!(run_id = %run.id, session_id = ?turn.session_id, "generation started");
        let ending = match self.generate(llm, &turn).await {
            Ok(ending) => ending,
            Err(error) => Ending::Failed(error.to_string(), None),
        };
        // An answer that could not be stored fails the run like any other
        // failure: left generating, no client could ever close the run.
        let ending = match ending {
            Ending::Answered(text) => match self.finish_answered(run, &text).await {
                Ok(()) => Ending::Answered(text),
                Err(error) => {
                    Ending::Failed(format!("the answer could not be stored: {error}"), None)
                }
            },
            failed => failed,
        };
        match ending {
            Ending::Answered(text) => {
                tracing::info!(run_id = %run.id, "generation finished");
                // Freed before the event: a floor posted on run_finished is accepted.
                claim.release().await;
                self.emit(
                    &turn,
                    "run_finished",
                    json!({"content": text, "page_id": run.page_id}),
                );
            }
            Ending::Failed(message, status) => {
                tracing::warn!(run_id = %run.id, status, error = ?message, "generation failed");
                match self.finish_failed(&turn.account_id, run).await {
                    Ok(()) => {}
                    // Its session was deleted while it generated: nothing is left to discard.
                    Err(Error::NotFound(_)) => {
                        tracing::debug!(run_id = %run.id, "the failed run's session is gone")
                    }
                    // Discarded already, by an instance that took this one for dead.
                    Err(Error::Refused {
                        code: ErrorCode::RunNotOpen,
                        ..
                    }) => tracing::debug!(run_id = %run.id, "the failed run was discarded already"),
                    Err(error) => {
                        tracing::warn!(run_id = %run.id, %error, "could not discard the failed run")
                    }
                }
                claim.release().await;
                self.emit(
                    &turn,
                    "run_failed",
                    json!({"error": {"message": message, "status": status}}),
                );
            }
        }
    }

    async fn finish_answered(&self, run: &Run, text: &str) -> Result<()> {
        self.store.set_page_content(&run.page_id, text).await?;
        if self
            .store
            .end_run_generation(&run.id, GenerationState::Finished)
            .await?
        {
            return Ok(());
        }
        // Taken for dead while it generated: another instance discarded the
        // run (and its page) and may be generating in the session now.
        Err(Error::refused(
            ErrorCode::RunNotOpen,
            format!("run {} was discarded by another instance", run.id),
        ))
    }

    async fn finish_failed(&self, account_id: &str, run: &Run) -> Result<()> {
        self.store
            .end_run_generation(&run.id, GenerationState::Failed)
            .await?;
        self.discard_run(account_id, &run.id).await.map(drop)
    }

    /// At start-up and every few seconds on a shared database: runs that a
    /// stopped process or a dead instance was generating have no one to
    /// finish them; they are discarded (their calls stay journalled).
    pub async fn discard_interrupted_generations(&self) -> Result<usize> {
        let discarded = self.store.discard_interrupted_generations().await?;
        for run_id in &discarded {
            tracing::warn!(run_id = %run_id, "a generation interrupted by the previous stop was discarded");
            // An instance only paused, not dead, hears it on resuming.
            super::cluster::announce_run_cancel(self, run_id).await;
        }
        Ok(discarded.len())
    }

    pub(super) fn emit(&self, turn: &Turn, kind: &'static str, mut data: Value) {
        if let Some(fields) = data.as_object_mut() {
            fields.insert("run_id".into(), json!(turn.run.id));
        }
        let event = ModelSessionEvent::new(kind, &data);
        self.publish_to_session(&turn.session_id, event);
    }
}

pub(super) fn still_generating(run_id: Option<&str>) -> Error {
    let run = run_id.map_or_else(|| "a run".to_owned(), |id| format!("run {id}"));
    Error::refused(
        ErrorCode::GenerationInProgress,
        format!("{run} is still generating; wait for run_finished or cancel it"),
    )
}
