//! Persistent storage. Every SQL statement of the server lives under this module so
//! that a second backend (PostgreSQL) only has to reimplement what is here.

mod accounts;
mod activity;
mod approvals;
pub mod backend;
mod cache;
mod characters;
mod checkpointer;
mod cluster;
mod definitions;
mod floors;
mod fold_priority;
mod generation_claims;
mod instance_file;
mod jobs;
mod journal;
mod journal_fold;
mod journal_log;
mod journal_queue;
mod journal_reader;
mod journal_task;
mod journal_thread;
mod journal_transaction;
mod journal_writer;
mod mcp;
pub mod memory;
pub mod page_bytes;
mod peers;
mod relayed_events;
mod rendered_rows;
pub mod resources;
pub mod run_effects;
pub mod run_generation;
mod runs;
pub mod schema;
mod secrets_key_check;
mod session_metadata;
mod sessions;
mod state_names;
pub mod variables;
mod wal_vfs;

use std::path::Path;
use std::sync::Arc;

pub use accounts::{Account, NewAccount};
pub use approvals::{ApprovalDecision, Decided};
pub use backend::Backend;
pub use characters::{Character, CharacterPatch, CharacterRole};
pub use cluster::{ClusterEvent, STALE_AFTER_MS, TAKEN_FOR_DEAD};
pub use definitions::DefinitionFilter;
pub use floors::{Floor, FloorPage, FloorRef};
pub use jobs::{Delivery, LostJobs, MAX_JOB_ATTEMPTS, NewJob, RuntimeJob};
pub use journal::{Admission, Admitted, ExecutionFinish, NewExecution};
pub use mcp::{McpServerFilter, McpSnapshot};
pub use memory::{Memory, MemoryHit};
pub use resources::{Resource, ResourceContent, ResourceSummary};
pub use run_effects::RunScope;
pub use run_generation::GenerationState;
pub use runs::{BlockingExecution, Committed, ReplayParent, Run, Selected};
pub use secrets_key_check::{ForgottenServer, KeyVerdict, SecretsKeyMismatch, StoredKeyCheck};
pub use sessions::Session;

use crate::secrets::SecretsKey;

/// Handle to the database; cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: backend::Pool,
    /// Accounts by API-key hash, so that authenticating a request costs no query.
    api_keys: Arc<accounts::KeyCache>,
    /// Group-commits journal writes. SQLite admits one writer at a time, and a
    /// connection that finds the write lock taken sleeps in its busy handler;
    /// the hot-path writes (every call's rows, its budget and step checks
    /// included) go through this one task instead (BENCHMARKS.md).
    journal_writer: journal_writer::JournalWriter,
    /// The journal's page reads on an SQLite file (None: through the pool).
    journal_reader: Option<journal_reader::JournalReader>,
    /// Enabled definitions by account: read on every call's catalog.
    definition_cache:
        Arc<cache::GenerationCache<Arc<Vec<crate::domain::definition::ToolDefinition>>>>,
    /// Sessions by id: read on every call.
    session_cache: Arc<cache::GenerationCache<Arc<Session>>>,
    /// Every character (the roles of `/api/tools`): read by every registration
    /// inside the catalog mutation.
    character_cache: Arc<cache::GenerationCache<Arc<Vec<CharacterRole>>>>,
    /// Seals and opens stored secrets (MCP servers' env and headers).
    secrets: SecretsKey,
    /// This instance among the others on the database (PostgreSQL).
    cluster: Arc<cluster::Cluster>,
}

impl Store {
    /// Opens (creating if needed) the database and brings its schema up to
    /// date, with the data directory's own secrets key (generated there on
    /// first use; see [`SecretsKey::load`]).
    pub async fn open(database_url: Option<&str>, data_dir: &Path) -> anyhow::Result<Self> {
        let mut secrets = SecretsKey::load(None, data_dir)?;
        let store = Self::open_with_secrets(database_url, data_dir, secrets.key.clone()).await?;
        secrets.save()?;
        Ok(store)
    }

    /// Opens the database like [`open`](Self::open), sealing stored secrets
    /// with `secrets`.
    pub async fn open_with_secrets(
        database_url: Option<&str>,
        data_dir: &Path,
        secrets: SecretsKey,
    ) -> anyhow::Result<Self> {
        // Before the database: a second process on this directory stops here.
        let cluster = Arc::new(cluster::Cluster::new(data_dir)?);
        let location = schema::Location::of(database_url, data_dir)?;
        let pool = schema::connect_as(
            &location,
            true,
            &format!("toolgate {}", cluster.instance_id),
        )
        .await?;
        let applied = schema::migrate(&pool).await?;
        if !applied.is_empty() {
            tracing::info!(?applied, "database migrations applied");
        }
        let store = Self {
            journal_writer: journal_writer::JournalWriter::spawn(pool.clone())?,
            journal_reader: journal_writer::sqlite_file(&pool)
                .map(journal_reader::JournalReader::new),
            pool,
            api_keys: Arc::default(),
            definition_cache: Arc::default(),
            session_cache: Arc::default(),
            character_cache: Arc::default(),
            secrets,
            cluster,
        };
        store.register_instance().await?;
        store.start_cluster();
        store.greet_other_instances().await;
        Ok(store)
    }

    /// Closes every connection, checkpointing the write-ahead log.
    pub async fn close(&self) {
        self.cluster.stop();
        self.deregister_instance().await;
        // Readers and the journal writer hold connections of their own; the
        // last connection to close folds the write-ahead log back.
        if let Some(reader) = &self.journal_reader {
            reader.close();
        }
        self.journal_writer.close().await;
        self.pool.close().await;
    }

    /// Which backend the database is on.
    pub fn backend(&self) -> backend::Backend {
        self.pool.backend()
    }

    /// A connection for one statement or a few; dropping it gives it back.
    pub(crate) async fn conn(&self) -> Result<backend::Conn, sqlx::Error> {
        self.pool.acquire().await
    }

    /// A write transaction, serialised with every other (see [`backend`]).
    /// The journal's log is folded first: a transaction may read or change
    /// the rows of calls already answered.
    pub(crate) async fn begin_write(&self) -> crate::error::Result<backend::Tx> {
        self.settle_journal().await?;
        Ok(self.pool.begin_write().await?)
    }

    /// Returns once every journal write acknowledged so far is in the
    /// journal's table (see `journal_log`): every read of that table, and
    /// every change to it outside the journal writer, starts with this.
    pub(crate) async fn settle_journal(&self) -> crate::error::Result<()> {
        self.journal_writer.settle().await
    }
}

/// True when `err` is a UNIQUE constraint violation.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}
