//! The database's schema version against the migrations built into this
//! binary, and what `toolgate doctor` reads without changing anything.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::SqlitePool;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// The migrations this binary applies, embedded at compile time.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Where the database is, as the settings name it.
#[derive(Debug, Clone)]
pub enum Location {
    /// `<data dir>/toolgate.db`, the embedded default.
    DataDir(PathBuf),
    /// A `sqlite:` URL from `TOOLGATE_DATABASE_URL`.
    Url(String),
}

impl Location {
    /// The location `database_url` (or, without one, `data_dir`) names.
    pub fn of(database_url: Option<&str>, data_dir: &Path) -> anyhow::Result<Self> {
        match database_url {
            Some(url) if url.starts_with("postgres") => anyhow::bail!(
                "PostgreSQL storage is not available in this build yet; unset TOOLGATE_DATABASE_URL to use the embedded SQLite database"
            ),
            Some(url) => Ok(Location::Url(url.to_owned())),
            None => Ok(Location::DataDir(data_dir.to_owned())),
        }
    }

    /// How the location reads in a report (a URL's password is never shown:
    /// SQLite URLs carry none).
    pub fn describe(&self) -> String {
        match self {
            Location::DataDir(dir) => dir.join("toolgate.db").display().to_string(),
            Location::Url(url) => url.clone(),
        }
    }

    fn options(&self) -> anyhow::Result<SqliteConnectOptions> {
        Ok(match self {
            Location::DataDir(dir) => SqliteConnectOptions::new().filename(dir.join("toolgate.db")),
            Location::Url(url) => SqliteConnectOptions::from_str(url)
                .with_context(|| format!("invalid database URL {url:?}"))?,
        })
    }
}

/// Opens a pool on `location`; `create` makes the database (and the data
/// directory) when missing, else a missing database is an error.
pub async fn connect(location: &Location, create: bool) -> anyhow::Result<SqlitePool> {
    if let (Location::DataDir(dir), true) = (location, create) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
    }
    let options = location
        .options()?
        .create_if_missing(create)
        .journal_mode(SqliteJournalMode::Wal)
        // NORMAL in WAL mode is durable against process crashes; only an OS crash
        // can lose the last transactions.
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(8)
        // The default pings every connection it hands out: one more round trip
        // to the connection's worker thread per statement, for a local file
        // that cannot drop the connection (BENCHMARKS.md).
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .with_context(|| format!("opening the database {}", location.describe()))
}

/// The database's migrations against this binary's.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaStatus {
    /// Highest version applied to the database (0: none).
    pub applied_version: i64,
    /// Highest version this binary knows.
    pub binary_version: i64,
    /// Versions this binary has and the database has not: applied at start-up.
    pub pending: Vec<i64>,
    /// Versions the database has and this binary does not: a newer toolgate
    /// migrated it, and this one must not run on it.
    pub unknown: Vec<i64>,
    /// A migration that began and did not finish.
    pub failed: Vec<i64>,
}

impl SchemaStatus {
    /// Why this binary must not use the database, if it must not.
    pub fn refusal(&self) -> Option<String> {
        if !self.unknown.is_empty() {
            return Some(format!(
                "the database's schema is newer than this toolgate: it has migration(s) {:?} this binary does not know (it knows up to version {}); run the toolgate that migrated it, or restore a backup taken before",
                self.unknown, self.binary_version
            ));
        }
        if !self.failed.is_empty() {
            return Some(format!(
                "migration(s) {:?} began and did not finish; restore a backup taken before them",
                self.failed
            ));
        }
        None
    }
}

/// Reads which migrations the database has, changing nothing.
pub async fn schema_status(pool: &SqlitePool) -> anyhow::Result<SchemaStatus> {
    let table: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(pool)
    .await?;
    let applied: Vec<(i64, bool)> = match table {
        Some(_) => {
            sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
                .fetch_all(pool)
                .await?
        }
        None => Vec::new(),
    };
    let known: Vec<i64> = MIGRATOR.iter().map(|migration| migration.version).collect();
    let has = |version: i64| applied.iter().any(|(v, _)| *v == version);
    Ok(SchemaStatus {
        applied_version: applied.iter().map(|(v, _)| *v).max().unwrap_or(0),
        binary_version: known.iter().copied().max().unwrap_or(0),
        pending: known.iter().copied().filter(|v| !has(*v)).collect(),
        unknown: applied
            .iter()
            .map(|(v, _)| *v)
            .filter(|v| !known.contains(v))
            .collect(),
        failed: applied
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(v, _)| *v)
            .collect(),
    })
}

/// Brings the schema up to date, refusing a database this binary must not
/// use. Returns the versions it applied.
pub async fn migrate(pool: &SqlitePool) -> anyhow::Result<Vec<i64>> {
    let before = schema_status(pool).await?;
    if let Some(refusal) = before.refusal() {
        anyhow::bail!(refusal);
    }
    MIGRATOR
        .run(pool)
        .await
        .context("applying database migrations")?;
    Ok(before.pending)
}

/// What `toolgate doctor` reports of a database.
#[derive(Debug, Clone, Serialize)]
pub struct Checkup {
    pub backend: &'static str,
    pub database: String,
    /// One `SELECT 1`, in milliseconds.
    pub round_trip_ms: f64,
    pub schema: SchemaStatus,
    /// Runtime jobs by state (empty before the schema exists).
    pub jobs: Vec<(String, i64)>,
    /// How long the oldest claimable job has waited, in seconds.
    pub oldest_queued_age_s: Option<f64>,
    /// Journal rows left `opened` by a process that stopped mid-call: the next
    /// start-up marks them `uncertain`.
    pub interrupted_calls: i64,
}

/// Reads a checkup of `pool`, changing nothing.
pub async fn checkup(location: &Location, pool: &SqlitePool) -> anyhow::Result<Checkup> {
    let started = Instant::now();
    sqlx::query("SELECT 1").execute(pool).await?;
    let round_trip_ms = started.elapsed().as_secs_f64() * 1000.0;
    let schema = schema_status(pool).await?;
    let mut checkup = Checkup {
        backend: "sqlite",
        database: location.describe(),
        round_trip_ms,
        jobs: Vec::new(),
        oldest_queued_age_s: None,
        interrupted_calls: 0,
        schema,
    };
    if checkup.schema.applied_version == 0 || checkup.schema.refusal().is_some() {
        return Ok(checkup);
    }
    let (jobs, oldest) = super::jobs::queue_stats(&mut *pool.acquire().await?).await?;
    checkup.jobs = jobs.into_iter().map(|(s, n)| (s, n as i64)).collect();
    checkup.oldest_queued_age_s = oldest.map(|ms| ms as f64 / 1000.0);
    checkup.interrupted_calls = sqlx::query_scalar(
        "SELECT COUNT(*) FROM tool_execution_record WHERE lifecycle_state = 'opened' AND status <> 'queued'",
    )
    .fetch_one(pool)
    .await?;
    Ok(checkup)
}
