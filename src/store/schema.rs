//! The database's schema version against the migrations built into this
//! binary, and what `toolgate doctor` reads without changing anything.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use super::backend::{Backend, Pool, sql};

/// The SQLite migrations this binary applies, embedded at compile time.
static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");
/// The PostgreSQL migrations: the same schema in PostgreSQL's types.
static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// The migrations this binary knows for `backend`.
pub fn migrator(backend: Backend) -> &'static Migrator {
    match backend {
        Backend::Sqlite => &SQLITE_MIGRATOR,
        Backend::Postgres => &POSTGRES_MIGRATOR,
    }
}

/// Connections one instance keeps to PostgreSQL: several instances share the
/// server's `max_connections` (100 by default).
const POSTGRES_MAX_CONNECTIONS: u32 = 16;

/// Where the database is, as the settings name it.
#[derive(Debug, Clone)]
pub enum Location {
    /// `<data dir>/toolgate.db`, the embedded default.
    DataDir(PathBuf),
    /// A `sqlite:` URL from `TOOLGATE_DATABASE_URL`.
    Url(String),
    /// A `postgres://` (or `postgresql://`) URL from `TOOLGATE_DATABASE_URL`.
    Postgres(String),
}

impl Location {
    /// The location `database_url` (or, without one, `data_dir`) names.
    pub fn of(database_url: Option<&str>, data_dir: &Path) -> anyhow::Result<Self> {
        match database_url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                PgConnectOptions::from_str(url).context(
                    "invalid PostgreSQL URL in TOOLGATE_DATABASE_URL (postgres://user@host:port/database)",
                )?;
                Ok(Location::Postgres(url.to_owned()))
            }
            Some(url) if url.starts_with("sqlite:") => Ok(Location::Url(url.to_owned())),
            Some(_) => anyhow::bail!("TOOLGATE_DATABASE_URL must be a sqlite: or postgres:// URL"),
            None => Ok(Location::DataDir(data_dir.to_owned())),
        }
    }

    /// Which backend the location is on.
    pub fn backend(&self) -> Backend {
        match self {
            Location::Postgres(_) => Backend::Postgres,
            _ => Backend::Sqlite,
        }
    }

    /// How the location reads in a report and in logs: a URL's password is
    /// never shown.
    pub fn describe(&self) -> String {
        match self {
            Location::DataDir(dir) => dir.join("toolgate.db").display().to_string(),
            Location::Url(url) => url.clone(),
            Location::Postgres(url) => match url::Url::parse(url) {
                Ok(parsed) => without_passwords(parsed).to_string(),
                Err(_) => "postgres://(unparseable URL)".to_owned(),
            },
        }
    }

    fn sqlite_options(&self) -> anyhow::Result<SqliteConnectOptions> {
        Ok(match self {
            Location::DataDir(dir) => SqliteConnectOptions::new().filename(dir.join("toolgate.db")),
            Location::Url(url) => SqliteConnectOptions::from_str(url)
                .with_context(|| format!("invalid database URL {url:?}"))?,
            Location::Postgres(_) => anyhow::bail!("not a SQLite location"),
        })
    }
}

/// The settings of every SQLite connection of the store: the pool's, and the
/// journal and checkpoint threads' own (WAL is a property of the file, set when
/// the pool opens it).
pub(super) const CONNECTION_PRAGMAS: &[(&str, &str)] = &[
    // NORMAL in WAL mode is durable against process crashes; only an OS crash
    // can lose the last transactions.
    ("synchronous", "NORMAL"),
    ("foreign_keys", "ON"),
    // Checkpoints run on a thread of their own, not inside whichever write
    // passes the threshold (store/checkpointer.rs).
    ("wal_autocheckpoint", "0"),
    // When the log starts over after a burst grew it, its file is cut back to
    // this size instead of keeping the burst's size on disk.
    ("journal_size_limit", "16777216"),
];

/// The page size of a database the store creates (an existing database keeps
/// its own: SQLite fixes it when the first table is written). Every commit
/// writes each page it changed whole into the write-ahead log, checksummed and
/// copied, and a journal row's insert changes the table's page and one page
/// per index: at 4 KiB that was a tenth of a builtin call's instructions.
/// 2 KiB pages cut a builtin call's instructions by 12 % and leave the
/// journal's pages over 1,000,000 rows as they were (BENCHMARKS.md, issue 20);
/// 1 KiB pages gained nothing more.
pub(super) const SQLITE_PAGE_SIZE: u32 = 2048;

/// How long a SQLite statement waits for the write lock another connection
/// holds before failing.
pub(super) const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens a pool on `location`; `create` makes the database (and the data
/// directory) when missing, else a missing database is an error.
pub async fn connect(location: &Location, create: bool) -> anyhow::Result<Pool> {
    connect_as(location, create, "toolgate").await
}

/// Like [`connect`]; on PostgreSQL every connection names itself `name`
/// (`application_name`, unless the URL sets one), so an operator reading
/// `pg_stat_activity` sees which instance holds which connection.
pub async fn connect_as(location: &Location, create: bool, name: &str) -> anyhow::Result<Pool> {
    if let Location::Postgres(url) = location {
        return connect_postgres(location, url, create, name).await;
    }
    if let (Location::DataDir(dir), true) = (location, create) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
    }
    let options = CONNECTION_PRAGMAS.iter().fold(
        location
            .sqlite_options()?
            .create_if_missing(create)
            .page_size(SQLITE_PAGE_SIZE)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(SQLITE_BUSY_TIMEOUT),
        |options, (name, value)| options.pragma(*name, *value),
    );
    SqlitePoolOptions::new()
        .max_connections(8)
        // The default pings every connection it hands out: one more round trip
        // to the connection's worker thread per statement, for a local file
        // that cannot drop the connection (BENCHMARKS.md).
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .map(Pool::Sqlite)
        .with_context(|| format!("opening the database {}", location.describe()))
}

async fn connect_postgres(
    location: &Location,
    url: &str,
    create: bool,
    name: &str,
) -> anyhow::Result<Pool> {
    let described = location.describe();
    if create
        && !sqlx::Postgres::database_exists(url)
            .await
            .with_context(|| format!("reaching the database server of {described}"))?
    {
        match sqlx::Postgres::create_database(url).await {
            Ok(()) => tracing::info!(database = %described, "created the PostgreSQL database"),
            // Another instance starting at the same moment created it first
            // (PostgreSQL then fails the second CREATE DATABASE).
            Err(_) if sqlx::Postgres::database_exists(url).await.unwrap_or(false) => {}
            Err(err) => {
                return Err(
                    anyhow::Error::new(err).context(format!("creating the database {described}"))
                );
            }
        }
    }
    let mut options = PgConnectOptions::from_str(url).context("invalid PostgreSQL URL")?;
    if options.get_application_name().is_none() {
        options = options.application_name(name);
    }
    PgPoolOptions::new()
        .max_connections(POSTGRES_MAX_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map(Pool::Postgres)
        .with_context(|| format!("opening the database {described}"))
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
    /// Versions applied from a text other than this binary's (the stored
    /// checksum differs): `serve` and `migrate` refuse such a database.
    pub modified: Vec<i64>,
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
        if !self.modified.is_empty() {
            return Some(format!(
                "migration(s) {:?} were applied from a text other than this binary's (their checksums differ); run the toolgate that migrated the database, or restore a backup",
                self.modified
            ));
        }
        None
    }
}

/// Reads which migrations the database has, changing nothing.
pub async fn schema_status(pool: &Pool) -> anyhow::Result<SchemaStatus> {
    let mut conn = pool.acquire().await?;
    let applied: Vec<(i64, bool, Vec<u8>)> = sql!(conn, c => {
        let table: bool = query_scalar(if POSTGRES {
            "SELECT to_regclass('_sqlx_migrations') IS NOT NULL"
        } else {
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')"
        })
        .fetch_one(&mut *c)
        .await?;
        if table {
            query_as("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&mut *c)
                .await?
        } else {
            Vec::new()
        }
    });
    drop(conn);
    let migrations = migrator(pool.backend());
    let known: Vec<i64> = migrations
        .iter()
        .map(|migration| migration.version)
        .collect();
    let has = |version: i64| applied.iter().any(|(v, _, _)| *v == version);
    let modified = applied
        .iter()
        .filter(|(version, _, checksum)| {
            migrations
                .iter()
                .find(|m| m.version == *version)
                .is_some_and(|m| m.checksum.as_ref() != checksum.as_slice())
        })
        .map(|(v, _, _)| *v)
        .collect();
    Ok(SchemaStatus {
        applied_version: applied.iter().map(|(v, _, _)| *v).max().unwrap_or(0),
        binary_version: known.iter().copied().max().unwrap_or(0),
        pending: known.iter().copied().filter(|v| !has(*v)).collect(),
        unknown: applied
            .iter()
            .map(|(v, _, _)| *v)
            .filter(|v| !known.contains(v))
            .collect(),
        failed: applied
            .iter()
            .filter(|(_, ok, _)| !ok)
            .map(|(v, _, _)| *v)
            .collect(),
        modified,
    })
}

/// Brings the schema up to date, refusing a database this binary must not
/// use. Returns the versions it applied.
pub async fn migrate(pool: &Pool) -> anyhow::Result<Vec<i64>> {
    let before = schema_status(pool).await?;
    if let Some(refusal) = before.refusal() {
        anyhow::bail!(refusal);
    }
    // sqlx's PostgreSQL migrator takes an advisory lock of its own, so
    // instances starting together apply each migration once.
    match pool {
        Pool::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await,
        Pool::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await,
    }
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
    /// The secrets key check and a sample of sealed secrets (None before the
    /// check's migration): judged against a key by the doctor, never shown.
    #[serde(skip)]
    pub stored_key_check: Option<super::StoredKeyCheck>,
}

/// The migration that adds `secrets_key_check` (its description, as sqlx
/// takes it from the file name, is the same for both backends).
const KEY_CHECK_MIGRATION: &str = "secrets key check";

/// Whether `schema` has the key check's table.
fn has_key_check(backend: Backend, schema: &SchemaStatus) -> bool {
    migrator(backend)
        .iter()
        .find(|m| m.description == KEY_CHECK_MIGRATION)
        .is_some_and(|m| m.version <= schema.applied_version)
}

/// Reads a checkup of `pool`, changing nothing.
pub async fn checkup(location: &Location, pool: &Pool) -> anyhow::Result<Checkup> {
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    sql!(conn, c => query("SELECT 1").execute(c).await.map(|_| ()))?;
    let round_trip_ms = started.elapsed().as_secs_f64() * 1000.0;
    drop(conn);
    let schema = schema_status(pool).await?;
    let mut checkup = Checkup {
        backend: pool.backend().as_str(),
        database: location.describe(),
        round_trip_ms,
        jobs: Vec::new(),
        oldest_queued_age_s: None,
        interrupted_calls: 0,
        stored_key_check: None,
        schema,
    };
    if checkup.schema.applied_version == 0 || checkup.schema.refusal().is_some() {
        return Ok(checkup);
    }
    let mut conn = pool.acquire().await?;
    let (jobs, oldest) = super::jobs::queue_stats(&mut conn).await?;
    checkup.jobs = jobs.into_iter().map(|(s, n)| (s, n as i64)).collect();
    checkup.oldest_queued_age_s = oldest.map(|ms| ms as f64 / 1000.0);
    let opened: Vec<String> = sql!(conn, c => query_scalar(
        "SELECT id FROM tool_execution_record WHERE lifecycle_state = 'opened' AND status <> 'queued'",
    )
    .fetch_all(c)
    .await?);
    if has_key_check(pool.backend(), &checkup.schema) {
        checkup.stored_key_check = Some(super::StoredKeyCheck::read(&mut conn, None).await?);
    }
    let logged = logged_calls(pool, &mut conn).await?;
    checkup.interrupted_calls = opened
        .iter()
        .chain(&logged.opened)
        .filter(|id| !logged.finished.contains(*id))
        .count() as i64;
    Ok(checkup)
}

/// The calls in a SQLite file's journal log that its table does not show
/// yet (a server that crashed leaves them for its next start-up to fold).
async fn logged_calls(
    pool: &Pool,
    conn: &mut super::backend::Conn,
) -> anyhow::Result<super::journal_fold::LoggedCalls> {
    let Some(file) = super::journal_writer::sqlite_file(pool) else {
        return Ok(Default::default());
    };
    // Absent before migration 20: no log then.
    let has_log: bool = sql!(*conn, c => query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'journal_log_position')",
    )
    .fetch_one(c)
    .await?);
    if !has_log {
        return Ok(Default::default());
    }
    let position: Option<(i64, i64)> = sql!(*conn, c => query_as(
        "SELECT generation, folded_to FROM journal_log_position WHERE id = 1",
    )
    .fetch_optional(c)
    .await?);
    match position {
        Some((generation, folded_to)) => {
            super::journal_fold::logged_calls(&file, generation, u64::try_from(folded_to)?)
        }
        None => Ok(Default::default()),
    }
}

/// The URL with every password masked: the one before `@` and any query
/// parameter whose name holds "password" (`?password=`, `sslpassword=`).
fn without_passwords(mut url: url::Url) -> url::Url {
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(key, value)| {
            let secret = key.to_ascii_lowercase().contains("password");
            let value = if secret {
                "***".into()
            } else {
                value.into_owned()
            };
            (key.into_owned(), value)
        })
        .collect();
    if !pairs.is_empty() {
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_described_postgres_url_shows_no_password() {
        let location = Location::Postgres(
            "postgres://app:s3cret@db:5432/toolgate?sslmode=require&password=q1&sslpassword=q2"
                .into(),
        );
        let described = location.describe();
        assert!(
            !["s3cret", "q1", "q2"]
                .iter()
                .any(|secret| described.contains(secret)),
            "{described}"
        );
        assert!(described.contains("sslmode=require"), "{described}");
    }

    #[tokio::test]
    async fn a_new_database_has_the_store_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let location = Location::DataDir(dir.path().join("data"));
        let pool = connect(&location, true).await.unwrap();
        migrate(&pool).await.unwrap();
        let mut conn = pool.acquire().await.unwrap();
        let page_size: i64 =
            sql!(conn, c => query_scalar("PRAGMA page_size").fetch_one(c).await).unwrap();
        assert_eq!(page_size, i64::from(SQLITE_PAGE_SIZE));
        drop(conn);
        pool.close().await;
    }
}
