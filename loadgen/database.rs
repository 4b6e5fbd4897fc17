//! The bench's PostgreSQL database (`--postgres`): a fresh one per run,
//! dropped at the end, and the journal seeding that writes to either backend.

use anyhow::Context;
use sqlx::Connection;
use sqlx::migrate::MigrateDatabase;

use super::SeedRow;

/// A database made for this run on the given PostgreSQL server.
pub(crate) struct BenchDatabase {
    pub(crate) url: String,
}

impl BenchDatabase {
    /// A fresh, uniquely named database (toolgate creates it at start).
    pub(crate) async fn create(server: &str) -> anyhow::Result<Self> {
        let server = server.trim_end_matches('/');
        let url = format!(
            "{server}/toolgate_bench_{}_{}",
            std::process::id(),
            toolgate::ids::now_ms()
        );
        sqlx::PgConnection::connect(&format!("{server}/postgres"))
            .await
            .with_context(|| format!("the PostgreSQL server {server} does not answer"))?
            .close()
            .await?;
        Ok(Self { url })
    }

    /// Drops the database, ending its connections.
    pub(crate) async fn drop_it(self) -> anyhow::Result<()> {
        sqlx::Postgres::force_drop_database(&self.url).await?;
        Ok(())
    }
}

/// The seeding connection, on either backend.
pub(crate) enum SeedConn {
    /// The connection and the database file it writes.
    Sqlite(sqlx::SqliteConnection, std::path::PathBuf),
    Postgres(sqlx::PgConnection),
}

/// The multi-row insert of a batch, for a query builder of either backend.
macro_rules! seed_insert {
    ($query:ident, $account_id:expr, $batch:expr) => {{
        let account_id: &str = $account_id;
        let batch: &[SeedRow] = $batch;
        $query.push_values(batch, |mut values, row| {
            let args = format!(r#"{{"count":2,"sides":{}}}"#, row.sides);
            let queued = row.status == "queued";
            let failed = !matches!(row.status, "success" | "queued");
            values
                .push_bind(row.id.clone())
                .push_bind(account_id.to_owned())
                .push_bind(row.session_id.clone())
                .push_bind(row.run_id.clone())
                .push_bind(row.floor_id.clone())
                .push_bind(row.page_id.clone())
                .push_bind(format!("call_{}", &row.id[6..]))
                .push_bind(row.caller_slot)
                .push_bind(row.provider_id)
                .push_bind(row.provider_type)
                .push_bind(row.tool_name)
                .push_bind(args.clone())
                .push_bind(args)
                .push_bind((!failed && !queued).then_some(r#"{"rolls":[3,17],"total":20}"#))
                .push_bind(row.status)
                .push_bind(if queued { "opened" } else { "finished" })
                .push_bind(row.commit_outcome)
                .push_bind(if row.tool_name == "send_mail" {
                    "irreversible"
                } else {
                    "none"
                })
                .push_bind(if row.tool_name == "send_mail" {
                    "never_auto_replay"
                } else {
                    "safe"
                })
                .push_bind(failed.then_some("the tool failed"))
                .push_bind(if queued { 0 } else { row.duration })
                .push_bind(row.started_at)
                .push_bind((!queued).then_some(row.started_at + row.duration))
                .push_bind(if queued { "async_job" } else { "inline" })
                .push_bind(1i64)
                .push_bind(None::<String>)
                .push_bind(None::<String>)
                .push_bind(row.started_at);
        });
    }};
}

impl SeedConn {
    /// Runs one statement (BEGIN, COMMIT).
    pub(crate) async fn execute(&mut self, statement: &'static str) -> anyhow::Result<()> {
        match self {
            SeedConn::Sqlite(conn, _) => sqlx::query(statement).execute(conn).await.map(drop)?,
            SeedConn::Postgres(conn) => sqlx::query(statement).execute(conn).await.map(drop)?,
        }
        Ok(())
    }

    /// Inserts a batch of journal rows of the admin account.
    pub(crate) async fn insert_batch(
        &mut self,
        account_id: &str,
        batch: &[SeedRow],
    ) -> anyhow::Result<()> {
        const INSERT: &str = "INSERT INTO tool_execution_record (id, account_id, session_id, run_id, floor_id, page_id, call_id, \
         caller_slot, provider_id, provider_type, tool_name, args_json, args_canonical, result_json, status, \
         lifecycle_state, commit_outcome, side_effect_level, replay_safety, error_message, duration_ms, \
         started_at, finished_at, delivery_mode, attempt_no, runtime_job_id, replay_parent_execution_id, created_at) ";
        match self {
            SeedConn::Sqlite(conn, _) => {
                let mut query = sqlx::QueryBuilder::<sqlx::Sqlite>::new(INSERT);
                seed_insert!(query, account_id, batch);
                query.build().execute(conn).await?;
            }
            SeedConn::Postgres(conn) => {
                let mut query = sqlx::QueryBuilder::<sqlx::Postgres>::new(INSERT);
                seed_insert!(query, account_id, batch);
                query.build().execute(conn).await?;
            }
        }
        Ok(())
    }

    /// Checkpoints SQLite's log into the database file and writes that file
    /// to disk (PostgreSQL: refreshes the planner's statistics, as its
    /// autovacuum would soon, and checkpoints), then closes.
    ///
    /// The seed is written without syncs, so without the final flush the
    /// kernel writes its gigabyte back a few seconds later, while the journal
    /// queries are measured: that writeback (iowait, steal, kernel time on the
    /// bench's 2 cores) was the queries' 10-30 ms tail, seen with a
    /// `/proc/vmstat` sampler beside per-request times (BENCHMARKS.md).
    pub(crate) async fn finish(self) -> anyhow::Result<()> {
        match self {
            SeedConn::Sqlite(mut conn, path) => {
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
                // The log was mostly checkpointed (unsynced) by SQLite's own
                // auto-checkpoints already, so the checkpoint above may have
                // nothing to sync: the file is flushed here instead.
                tokio::task::spawn_blocking(move || std::fs::File::open(&path)?.sync_all())
                    .await?
                    .context("flushing the seeded database to disk")?;
            }
            SeedConn::Postgres(mut conn) => {
                sqlx::query("ANALYZE tool_execution_record")
                    .execute(&mut conn)
                    .await?;
                // Needs a superuser or pg_checkpoint; without it the tail of
                // the server's own checkpoint may show in the figures.
                if let Err(err) = sqlx::query("CHECKPOINT").execute(&mut conn).await {
                    super::progress(&format!(
                        "warning: CHECKPOINT after seeding failed ({err}); the seed's writeback may overlap the queries"
                    ));
                }
                conn.close().await?;
            }
        }
        Ok(())
    }
}
