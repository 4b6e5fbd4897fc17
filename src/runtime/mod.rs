//! The tool runtime service: everything a tool call needs, shared by the HTTP
//! handlers, the job workers and (later) the generation loop. The dispatcher
//! (`dispatch`) owns what is common to every provider; the providers are
//! registered in `ToolRuntime::new`, one line each.

pub mod approvals;
pub mod cluster;
mod conversation;
mod detach;
mod dispatch;
mod dry_run;
mod event_relay;
mod generation;
mod gone_sessions;
mod history;
pub mod jobs;
mod journal_rows;
mod observe;
mod runs;
mod slot_prompts;
mod slots;
mod turns;

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::task::TaskTracker;

use crate::catalog::{
    Catalog, CatalogChange, CatalogEvents, CatalogMutation, ToolProvider, mutate_with,
};
use crate::config::Settings;
use crate::domain::tool::Slot;
use crate::error::Result;
use crate::model_sessions::{ModelSessionHub, Offer, OfferKey, OfferedCatalogs};
use crate::permissions::ToolPermissions;
use crate::store::{Session, Store};
use crate::tools::builtin::BuiltinProvider;
use crate::tools::definitions::DefinitionProvider;
use crate::tools::mcp::{McpHub, McpListener, McpProvider};
use crate::tools::remote::{RemoteProvider, RemoteRegistry};
use crate::tools::script::{ScriptLimits, ScriptRunner};

pub use detach::FinishOnDrop;
pub use dry_run::{DRY_RUN_MAX_CALLS, DryRun, DryRunCall, DryRunVerdict};
pub use generation::{Turn, TurnClaim};
pub use gone_sessions::run_gone_session_sweeper;
pub use jobs::JobSignal;
pub use observe::NotReady;

/// Shared tool-runtime state; cheap to clone: one reference count, however
/// many parts it has. Every request's handler state holds one, and a clone
/// that bumped each part's own count cost a call two dozen atomic updates on
/// counters every core shares (BENCHMARKS.md, issue 20).
#[derive(Clone)]
pub struct ToolRuntime(Arc<RuntimeParts>);

impl std::ops::Deref for ToolRuntime {
    type Target = RuntimeParts;

    fn deref(&self) -> &RuntimeParts {
        &self.0
    }
}

/// What a [`ToolRuntime`] shares.
pub struct RuntimeParts {
    pub store: Store,
    pub settings: Arc<Settings>,
    /// Runtime registrations of `/api/tools` (also one of the providers).
    pub remote: Arc<RemoteRegistry>,
    /// MCP servers and their connections (also one of the providers).
    pub mcp: Arc<McpHub>,
    /// Every provider, in catalog order.
    providers: Arc<[Arc<dyn ToolProvider>]>,
    /// Live model sessions; catalog mutations synchronise them.
    pub model_sessions: Arc<ModelSessionHub>,
    /// A chat session's events on their way to the other instances' streams.
    relay: event_relay::EventRelay,
    /// Wakes the job workers when a job becomes claimable.
    pub jobs: Arc<JobSignal>,
    /// Calls and changes whose caller went away before they finished: they
    /// run to their end in a task of their own, and shutdown waits for them.
    started_work: TaskTracker,
    /// The model endpoint of the generation loop; None when not configured.
    pub llm: Option<crate::llm::LlmClient>,
    /// Each session's generation in progress in this process (a finished one
    /// waiting for the next floor is in the store).
    turns: generation::ActiveTurns,
    /// Cancelled at shutdown: running generations stop between steps.
    stopping: tokio_util::sync::CancellationToken,
    /// Slots of argument validations on the blocking pool (see
    /// `ToolRuntime::checked_arguments`).
    validations: Arc<tokio::sync::Semaphore>,
}

impl ToolRuntime {
    /// A runtime with empty registries and no live model sessions.
    pub fn new(store: Store, settings: Arc<Settings>) -> anyhow::Result<Self> {
        use anyhow::Context;
        let remote =
            Arc::new(RemoteRegistry::new(&settings).context("building the callback client")?);
        let scripts =
            ScriptRunner::with_default_concurrency(ScriptLimits::from_settings(&settings));
        let mcp = Arc::new(McpHub::new(
            store.clone(),
            settings.max_tool_schema_bytes,
            settings.callback_response_limit_bytes,
            settings.mcp_private_urls_for_all_accounts,
        ));
        let providers: Vec<Arc<dyn ToolProvider>> = vec![
            Arc::new(BuiltinProvider::new(store.clone())),
            Arc::new(RemoteProvider::new(remote.clone())),
            Arc::new(DefinitionProvider::new(
                store.clone(),
                scripts,
                settings.enable_unsafe_script_handler,
            )),
            Arc::new(McpProvider::new(mcp.clone())),
        ];
        // A malformed endpoint stops the start instead of silently turning
        // generation off.
        let llm = match crate::llm::LlmConfig::try_from_settings(&settings)
            .context("the model endpoint (--llm-base-url)")?
        {
            Some(config) => {
                Some(crate::llm::LlmClient::new(config).context("building the model client")?)
            }
            None => None,
        };
        Ok(Self(Arc::new(RuntimeParts {
            llm,
            turns: Default::default(),
            stopping: Default::default(),
            remote,
            mcp,
            providers: providers.into(),
            model_sessions: Arc::new(ModelSessionHub::default()),
            relay: event_relay::EventRelay::new(store.shared_database()),
            jobs: Arc::new(JobSignal::default()),
            started_work: TaskTracker::new(),
            validations: Arc::new(tokio::sync::Semaphore::new(
                dispatch::MAX_VALIDATIONS_RUNNING,
            )),
            store,
            settings,
        })))
    }

    /// The full catalog of `session` right now, before permissions.
    pub async fn catalog(&self, session: &Session) -> Result<Catalog> {
        Catalog::build(session, &self.providers).await
    }

    /// What the session's model is offered for `slot` (every slot's session-wide
    /// rules when `None`): the catalog with the session's permissions applied.
    /// The runtime catalog endpoint and live model sessions both use this, and a
    /// call is allowed by the same rules, so a model is never offered a tool that
    /// every call to it would refuse.
    pub async fn offered_catalog(&self, session: &Session, slot: Option<Slot>) -> Result<Catalog> {
        Ok(self.offer_of(session).await?.catalog(slot))
    }

    /// What `session` offers its model before a slot is chosen: every
    /// provider's entries and the session's permissions.
    async fn offer_of(&self, session: &Session) -> Result<Offer> {
        Ok(Offer {
            permissions: ToolPermissions::from_metadata(&session.metadata)?,
            entries: Catalog::entries_of(session, &self.providers).await?,
            session_id: session.id.clone(),
        })
    }

    /// The provider whose job snapshots carry `kind`.
    fn provider(&self, kind: &str) -> Option<&Arc<dyn ToolProvider>> {
        self.providers
            .iter()
            .find(|provider| provider.kind() == kind)
    }

    /// Stops taking new calls' tasks and waits for the started calls and
    /// changes (at shutdown, after the listener has stopped).
    pub async fn finish_started_calls(&self) {
        self.stopping.cancel();
        self.started_work.close();
        if !self.started_work.is_empty() {
            tracing::info!(
                unfinished = self.started_work.len(),
                "waiting for started tool calls and changes to finish"
            );
        }
        self.started_work.wait().await;
    }

    /// `work` in a task of its own that shutdown waits for, awaited here:
    /// for callers whose own task shutdown neither drops nor awaits.
    pub async fn run_to_the_end<F>(&self, work: F) -> Result<F::Output, tokio::task::JoinError>
    where
        F: Future<Output: Send + 'static> + Send + 'static,
    {
        self.started_work.spawn(work).await
    }

    /// `work`, run where it is awaited; dropped unfinished (its client hung
    /// up), it runs to its end in a task that shutdown waits for. `what`
    /// names it in the log line of that hand-off.
    pub fn finish_on_drop<F>(&self, what: &'static str, work: F) -> FinishOnDrop<F>
    where
        F: Future<Output: Send> + Send + 'static,
    {
        FinishOnDrop::new(work, what, self.started_work.clone())
    }

    /// Runs a stored write that changes catalogs (a definition, a session's
    /// permissions) under the catalog mutation lock, then offers the new
    /// catalogs to the live model sessions `change` names, before answering. A
    /// model session that refuses the new catalog keeps its old one and is
    /// logged: the write itself stands.
    pub async fn write_catalog<T: Send>(
        &self,
        write: BoxFuture<'_, Result<T>>,
        change: impl FnOnce(&T) -> CatalogChange + Send,
    ) -> Result<T> {
        let ((written, changes), results) = mutate_with(self, async move {
            let outcome = write.await;
            let changes: Vec<CatalogChange> = outcome.as_ref().map(change).into_iter().collect();
            ((outcome, changes.clone()), changes)
        })
        .await;
        for error in results.into_iter().filter_map(std::result::Result::err) {
            tracing::warn!(%error, "a live model session refused the changed catalog");
        }
        for change in &changes {
            cluster::announce_catalog_change(self, change).await;
        }
        written
    }

    /// Offers each change to the live model sessions it concerns; one result per
    /// change.
    async fn sync_changes(
        &self,
        guard: &crate::model_sessions::MutationGuard<'_>,
        changes: &[CatalogChange],
    ) -> Vec<std::result::Result<(), String>> {
        self.model_sessions.sync_all(guard, self, changes).await
    }
}

impl CatalogEvents for ToolRuntime {
    fn mutate<'a>(
        &'a self,
        mutation: CatalogMutation<'a>,
    ) -> BoxFuture<'a, Vec<std::result::Result<(), String>>> {
        Box::pin(async move {
            let guard = self.model_sessions.mutation_lock().await;
            let changes = mutation.await;
            self.sync_changes(&guard, &changes).await
        })
    }
}

impl McpListener for ToolRuntime {
    fn catalog_events(&self) -> &dyn CatalogEvents {
        self
    }

    fn publish(&self, account_id: &str, name: &'static str, data: serde_json::Value) {
        let event = crate::model_sessions::ModelSessionEvent::new(name, &data);
        self.model_sessions.publish_to_account(account_id, event);
    }
}

impl ToolRuntime {
    /// Attaches the stored MCP servers; each connects in the background.
    pub async fn start_mcp(&self) -> Result<()> {
        let admin = self.store.admin_account().await?.map(|account| account.id);
        let may_start = |server: &crate::domain::mcp::McpServer| {
            self.may_attach_stored(admin.as_deref(), server)
        };
        self.mcp
            .start(Arc::new(self.clone()), admin.clone(), may_start)
            .await
    }

    /// Attaches every enabled stored server again (a server unchanged since it
    /// was attached is left as it is) and detaches every attached one that is
    /// no longer stored, enabled and allowed: after announcements of other
    /// instances may have been missed.
    pub async fn reattach_mcp_servers(&self) -> Result<()> {
        let admin = self.store.admin_account().await?.map(|account| account.id);
        let mut kept = std::collections::HashSet::new();
        for server in self.store.enabled_mcp_servers().await? {
            if self.may_attach_stored(admin.as_deref(), &server) {
                kept.insert(server.id.clone());
                self.mcp.upsert(server).await;
            }
        }
        for attached in self.mcp.attached() {
            if kept.contains(&attached.id) {
                continue;
            }
            // Read again: one created here since the list above was read is
            // attached and stored, and stays.
            match self
                .store
                .mcp_server(&attached.account_id, &attached.id)
                .await
            {
                Ok(stored)
                    if stored.config.enabled
                        && !self.may_attach_stored(admin.as_deref(), &stored) =>
                {
                    self.mcp.remove(&stored.account_id, &stored.id).await;
                }
                Ok(stored) => self.mcp.upsert(stored).await,
                Err(crate::error::Error::NotFound(_)) => {
                    self.mcp.remove(&attached.account_id, &attached.id).await;
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Whether a stored server may be attached now. One stored before stdio
    /// servers or private URLs were the admin's alone, or while every account
    /// was allowed them, is not attached until that is allowed again.
    fn may_attach_stored(
        &self,
        admin: Option<&str>,
        server: &crate::domain::mcp::McpServer,
    ) -> bool {
        let is_admin = admin == Some(server.account_id.as_str());
        self.may_run_mcp_command(&server.config, is_admin)
            && self.may_reach_mcp_url(&server.config, is_admin)
    }

    /// Whether an account may have `config` run: a stdio server's command runs
    /// as the server's own user, which could read every account's data, so
    /// only the admin's may, unless `--mcp-stdio-for-all-accounts`.
    pub fn may_run_mcp_command(
        &self,
        config: &crate::domain::mcp::McpServerConfig,
        is_admin: bool,
    ) -> bool {
        !config.transport.is_stdio() || is_admin || self.settings.mcp_stdio_for_all_accounts
    }

    /// Whether an account may have an HTTP server at `config`'s URL: on
    /// loopback or a private network toolgate itself (trusting loopback peers
    /// on `/api/tools`) and the machine's other services answer, so only the
    /// admin's may, unless `--mcp-private-urls-for-all-accounts`. A host name
    /// is held to the same rule when it is resolved at connect time.
    pub fn may_reach_mcp_url(
        &self,
        config: &crate::domain::mcp::McpServerConfig,
        is_admin: bool,
    ) -> bool {
        let crate::domain::mcp::McpTransport::Http(http) = &config.transport else {
            return true;
        };
        let reach = crate::domain::mcp_rules::Reach::of_owner(
            is_admin,
            self.settings.mcp_private_urls_for_all_accounts,
        );
        // A URL that does not parse is refused by validation, not here.
        url::Url::parse(&http.url).map_or(true, |url| reach.allows_url(&url))
    }
}

impl OfferedCatalogs for ToolRuntime {
    fn current<'a>(
        &'a self,
        sessions: &'a [&'a Session],
    ) -> BoxFuture<'a, Result<Vec<Option<Arc<Session>>>>> {
        Box::pin(async move {
            let wanted: Vec<(&str, &str)> = sessions
                .iter()
                .map(|session| (session.account_id.as_str(), session.id.as_str()))
                .collect();
            self.store.shared_sessions(&wanted).await
        })
    }

    fn offer<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Offer>> {
        Box::pin(self.offer_of(session))
    }

    fn offer_key(&self, session: &Session) -> Result<Option<OfferKey>> {
        let mut entries = Vec::with_capacity(32);
        for provider in self.providers.iter() {
            if !provider.entry_keys(session, &mut entries) {
                return Ok(None);
            }
        }
        Ok(Some(OfferKey {
            entries,
            permissions: ToolPermissions::from_metadata(&session.metadata)?,
        }))
    }
}
