//! Folding the journal's log ([`super::journal_log`]) into the indexed table
//! on the journal thread's connection, and the statements that connection
//! runs.
//!
//! A fold applies records in the order they were appended, in one
//! transaction that also records how far the log is folded, so a crash leaves
//! every record either in the table and counted or neither. A record whose
//! statement fails (which a plain insert or an outcome cannot, short of a
//! damaged database) is logged and skipped: SQLite rolls back only that
//! statement, and its neighbours, already acknowledged, still land.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rusqlite::types::{ToSqlOutput, Value as SqlValue};
use rusqlite::{CachedStatement, Connection, ToSql, TransactionBehavior};

use super::journal_transaction::JournalTransaction;

use super::journal::{FINISH_SQL, FINISHED_INSERT, PLAIN_INSERT, Param, finished_row, row_at};
use super::journal_log::{self, HEADER_BYTES, JournalLog, LoggedKind, LoggedWrite, Pending};
use crate::error::{Error, Result};

const POSITION_SQL: &str =
    "UPDATE journal_log_position SET generation = ?1, folded_to = ?2 WHERE id = 1";

/// Applies `pending`'s records and records the log folded up to its end, in
/// one transaction; on an error nothing of it is in the table.
pub(super) fn fold(connection: &mut Connection, pending: &Pending) -> Result<()> {
    let (records, len) = journal_log::records(&pending.bytes);
    if len != pending.bytes.len() || records.len() != pending.count {
        // The bytes were framed in memory by this process: this is a bug,
        // and dropping them silently would lose acknowledged calls.
        return Err(Error::Internal(anyhow::anyhow!(
            "the journal log's pending records do not read back ({} of {} bytes, {} of {} records)",
            len,
            pending.bytes.len(),
            records.len(),
            pending.count
        )));
    }
    let tx = JournalTransaction::begin(connection).map_err(database_error)?;
    apply_all(&tx, records);
    set_position(&tx, pending.generation, pending.end)?;
    tx.commit().map_err(database_error)
}

/// At start-up: folds the records a previous run left in the log at
/// `log_base` (the database's generation past its offset, then the next
/// generation's file, which a run starts before the database names it) and
/// starts a generation after both.
pub(super) fn recover(connection: &mut Connection, log_base: &Path) -> anyhow::Result<JournalLog> {
    use anyhow::Context;
    let (generation, folded_to): (i64, i64) = connection
        .query_row(
            "SELECT generation, folded_to FROM journal_log_position WHERE id = 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .context("reading how far the journal log is folded")?;
    let (current, next) = unfolded_files(log_base, generation, u64::try_from(folded_to)?)?;
    let (mut records, current_len) = journal_log::records(&current);
    let (next_records, next_len) = journal_log::records(&next);
    records.extend(next_records);
    let count = records.len();
    let torn =
        journal_log::torn_len(&current[current_len..]) + journal_log::torn_len(&next[next_len..]);
    let fresh = generation + 2;
    let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    apply_all(&tx, records);
    set_position(&tx, fresh, HEADER_BYTES)?;
    tx.commit().context("folding the journal log")?;
    if count > 0 || torn > 0 {
        tracing::info!(
            records = count,
            torn_bytes = torn,
            "folded the journal log's records left by the last run"
        );
    }
    for old in [generation, generation + 1] {
        remove_if_there(&journal_log::path_of(log_base, old));
    }
    JournalLog::create(log_base, fresh).with_context(|| {
        format!(
            "starting the journal log {}",
            journal_log::path_of(log_base, fresh).display()
        )
    })
}

/// The unfolded bytes of the database's generation (past `folded_to`) and of
/// the next generation's file.
fn unfolded_files(
    log_base: &Path,
    generation: i64,
    folded_to: u64,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    use anyhow::Context;
    let reading = |generation, from| {
        journal_log::unfolded(log_base, generation, from).with_context(|| {
            format!(
                "reading the journal log {}",
                journal_log::path_of(log_base, generation).display()
            )
        })
    };
    Ok((
        reading(generation, folded_to)?,
        reading(generation + 1, HEADER_BYTES)?,
    ))
}

/// What a journal log holds beyond the table: the rows appended `opened`
/// (and not queued) and the rows whose outcome was appended, by id.
#[derive(Debug, Default)]
pub(super) struct LoggedCalls {
    pub opened: HashSet<String>,
    pub finished: HashSet<String>,
}

/// Reads the unfolded records of the database file `database`'s journal log,
/// changing nothing (`toolgate doctor` on a stopped server's files).
pub(super) fn logged_calls(
    database: &Path,
    generation: i64,
    folded_to: u64,
) -> anyhow::Result<LoggedCalls> {
    let base = journal_log::path_beside(database);
    let (current, next) = unfolded_files(&base, generation, folded_to)?;
    let mut calls = LoggedCalls::default();
    for bytes in [&current, &next] {
        for record in journal_log::records(bytes).0 {
            let Some(id) = execution_id(&record) else {
                continue;
            };
            let param = |index: usize| match record.params.get(index) {
                Some(Param::Text(Some(text))) => Some(text.as_ref()),
                _ => None,
            };
            match record.kind {
                LoggedKind::Insert
                    if param(row_at::LIFECYCLE) == Some("opened")
                        && param(row_at::STATUS) != Some("queued") =>
                {
                    calls.opened.insert(id.to_owned());
                }
                LoggedKind::Insert => {}
                LoggedKind::Finish => {
                    calls.finished.insert(id.to_owned());
                }
            }
        }
    }
    Ok(calls)
}

/// Deletes a log file whose records the database has; one left behind is
/// only disk space (start-up never reads an older generation's file).
pub(super) fn remove_if_there(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => {
            tracing::warn!(error = %err, path = %path.display(), "removing a folded journal log failed")
        }
    }
}

fn set_position(connection: &Connection, generation: i64, end: u64) -> Result<()> {
    let end = i64::try_from(end).map_err(|err| Error::Internal(err.into()))?;
    let mut statement = prepared(connection, POSITION_SQL)?;
    execute(
        &mut statement,
        &[Param::Int(Some(generation)), Param::Int(Some(end))],
    )
    .map(drop)
}

fn apply_all(connection: &Connection, records: Vec<LoggedWrite<'_>>) {
    for (sql, record) in statements(records) {
        let applied = prepared(connection, sql)
            .and_then(|mut statement| execute(&mut statement, &record.params));
        if let Err(err) = applied {
            tracing::error!(
                error = %err,
                kind = ?record.kind,
                execution_id = ?execution_id(&record),
                "a journal log record could not be folded into the table; skipped"
            );
        }
    }
}

/// The statements that apply `records`, in order. A row opened and finished
/// within the same records is written once, already finished: an insert
/// and an update of the same row would run the B-tree code of the table and
/// its indexes twice.
fn statements(records: Vec<LoggedWrite<'_>>) -> Vec<(&'static str, LoggedWrite<'_>)> {
    let mut out: Vec<(&'static str, LoggedWrite<'_>)> = Vec::with_capacity(records.len());
    let mut opened: HashMap<String, usize> = HashMap::new();
    for record in records {
        if record.kind == LoggedKind::Insert {
            if let Some(id) = execution_id(&record) {
                opened.insert(id.to_owned(), out.len());
            }
            out.push((PLAIN_INSERT.as_str(), record));
            continue;
        }
        let Some(&at) = execution_id(&record).and_then(|id| opened.get(id)) else {
            out.push((FINISH_SQL, record));
            continue;
        };
        let row = std::mem::take(&mut out[at].1.params);
        match finished_row(row, record.params) {
            Some(params) => {
                out[at] = (
                    FINISHED_INSERT.as_str(),
                    LoggedWrite {
                        kind: LoggedKind::Insert,
                        params,
                    },
                )
            }
            None => {
                // Not of the statements' shapes: cannot come from this
                // process's own appends.
                tracing::error!(
                    at,
                    "a journal log record has the wrong number of parameters; its row is skipped"
                );
            }
        }
    }
    out
}

/// The row a record is about: an insert's first parameter, an outcome's last.
fn execution_id<'a>(record: &'a LoggedWrite<'_>) -> Option<&'a str> {
    let param = match record.kind {
        LoggedKind::Insert => record.params.first(),
        LoggedKind::Finish => record.params.last(),
    };
    match param {
        Some(Param::Text(Some(text))) => Some(text),
        _ => None,
    }
}

/// The connection's cached statement for `sql`.
pub(super) fn prepared<'c>(connection: &'c Connection, sql: &str) -> Result<CachedStatement<'c>> {
    connection.prepare_cached(sql).map_err(database_error)
}

/// Binds the parameters the statement numbers (`?N` up to its highest): the
/// verdict uses only some of a row's.
pub(super) fn bind(statement: &mut CachedStatement<'_>, params: &[Param<'_>]) -> Result<()> {
    for index in 1..=statement.parameter_count() {
        let param = params.get(index - 1).ok_or_else(|| {
            Error::Internal(anyhow::anyhow!(
                "journal statement parameter ?{index} has no value"
            ))
        })?;
        statement
            .raw_bind_parameter(index, param)
            .map_err(database_error)?;
    }
    Ok(())
}

/// Runs a statement with `params`; the rows it changed.
pub(super) fn execute(statement: &mut CachedStatement<'_>, params: &[Param<'_>]) -> Result<usize> {
    bind(statement, params)?;
    statement.raw_execute().map_err(database_error)
}

impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Param::Text(Some(text)) => ToSqlOutput::from(text.as_ref()),
            Param::Int(Some(value)) => ToSqlOutput::from(*value),
            Param::Text(None) | Param::Int(None) => ToSqlOutput::Owned(SqlValue::Null),
        })
    }
}

/// A journal statement's error.
pub(super) fn database_error(err: rusqlite::Error) -> Error {
    Error::Internal(anyhow::Error::new(err).context("journal write"))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::journal::{CommitOutcome, ExecutionStatus, LifecycleState};
    use crate::store::journal::{
        Admission, ExecutionFinish, NewExecution, finish_params, row_params,
    };

    /// A database file in a new directory, migrated as the server migrates
    /// it (`schema::migrate`).
    pub(in crate::store) fn migrated_database() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let location = crate::store::schema::Location::DataDir(dir.path().to_owned());
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let pool = crate::store::schema::connect(&location, true)
                    .await
                    .unwrap();
                crate::store::schema::migrate(&pool).await.unwrap();
                pool.close().await;
            });
        let file = dir.path().join("toolgate.db");
        assert!(file.is_file(), "{} was not created", file.display());
        (dir, file)
    }

    /// A connection to a migrated database (the directory lives as long as
    /// the first value).
    fn migrated() -> (tempfile::TempDir, Connection) {
        let (dir, file) = migrated_database();
        (dir, Connection::open(file).unwrap())
    }

    pub(in crate::store) fn row(id: &str) -> NewExecution {
        NewExecution {
            id: id.into(),
            account_id: "acct".into(),
            session_id: "sess".into(),
            run_id: None,
            floor_id: Some("floor".into()),
            page_id: None,
            call_id: format!("call_{id}"),
            caller_slot: "assistant".into(),
            provider_id: "builtin".into(),
            provider_type: "builtin".into(),
            tool_name: "roll_dice".into(),
            args: serde_json::json!({"sides": 6}),
            args_canonical: "{\"sides\":6}".into(),
            status: ExecutionStatus::Running,
            lifecycle_state: LifecycleState::Opened,
            commit_outcome: CommitOutcome::Pending,
            side_effect_level: "none".into(),
            replay_safety: "safe".into(),
            delivery_mode: "sync".into(),
            attempt_no: 1,
            runtime_job_id: None,
            replay_parent_execution_id: None,
            result: None,
            error_message: None,
            reason_code: None,
            started_at: 1_000,
            step_key: None,
            provider_started: true,
            admission: Admission::default(),
        }
    }

    fn finish(outcome: Option<CommitOutcome>) -> ExecutionFinish {
        ExecutionFinish {
            status: ExecutionStatus::Success,
            provider_started: true,
            result: serde_json::json!({"rolls": [4]}),
            error_message: Some("note".into()),
            reason_code: None,
            commit_outcome: outcome,
        }
    }

    /// Appends `writes` to a fresh log and takes them, as the thread does.
    fn pending(dir: &Path, generation: i64, writes: &[(LoggedKind, Vec<Param<'_>>)]) -> Pending {
        let mut log = JournalLog::create(&dir.join("log"), generation).unwrap();
        for (kind, params) in writes {
            log.append(*kind, params).unwrap();
        }
        log.take()
    }

    /// Every column of every row but `revision`, in id order: the revision
    /// counts a row's changes in the table, and a row folded already finished
    /// was never in the table opened, so it has no change to count.
    fn table(connection: &Connection) -> Vec<Vec<String>> {
        let mut statement = connection
            .prepare("SELECT * FROM tool_execution_record ORDER BY id")
            .unwrap();
        let columns: Vec<usize> = (0..statement.column_count())
            .filter(|&i| statement.column_name(i).unwrap() != "revision")
            .collect();
        assert!(
            columns.len() > 20,
            "the journal table's columns: {columns:?}"
        );
        statement
            .query_map([], |row| {
                columns
                    .iter()
                    .map(|&i| Ok(format!("{:?}", row.get_ref(i)?)))
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_row_opened_and_finished_in_one_fold_is_the_row_an_insert_and_an_update_leave() {
        let dir = tempfile::tempdir().unwrap();
        for outcome in [None, Some(CommitOutcome::Committed)] {
            let (opened, done) = (row("exec_a"), finish(outcome));
            let insert = row_params(&opened, 1_500, "inst").to_vec();
            let outcome_params = finish_params("exec_a", &done, 1_742).to_vec();
            // One statement at a time, as before the log.
            let (_expected_dir, expected) = migrated();
            execute(
                &mut prepared(&expected, PLAIN_INSERT.as_str()).unwrap(),
                &insert,
            )
            .unwrap();
            execute(
                &mut prepared(&expected, FINISH_SQL).unwrap(),
                &outcome_params,
            )
            .unwrap();
            // Both records in one fold.
            let (_folded_dir, mut folded) = migrated();
            let writes = [
                (LoggedKind::Insert, insert.clone()),
                (LoggedKind::Finish, outcome_params.clone()),
            ];
            fold(&mut folded, &pending(dir.path(), 1, &writes)).unwrap();
            assert_eq!(table(&folded), table(&expected), "outcome {outcome:?}");
            let duration: i64 = folded
                .query_row("SELECT duration_ms FROM tool_execution_record", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(duration, 742);
        }
    }

    #[test]
    fn an_outcome_never_changes_a_row_already_decided() {
        let dir = tempfile::tempdir().unwrap();
        let (_db, mut connection) = migrated();
        let opened = row("exec_d");
        let insert = [(
            LoggedKind::Insert,
            row_params(&opened, 1_200, "inst").to_vec(),
        )];
        fold(&mut connection, &pending(dir.path(), 2, &insert)).unwrap();
        // Another instance took this one for dead and swept its rows.
        connection
            .execute(
                "UPDATE tool_execution_record SET revision = revision + 1, status = 'uncertain', lifecycle_state = 'finished', \
                 execution_reason_code = 'interrupted_by_restart' WHERE id = 'exec_d'",
                [],
            )
            .unwrap();
        let done = finish(None);
        let late = [(
            LoggedKind::Finish,
            finish_params("exec_d", &done, 1_300).to_vec(),
        )];
        fold(&mut connection, &pending(dir.path(), 2, &late)).unwrap();
        let (status, reason): (String, String) = connection
            .query_row(
                "SELECT status, execution_reason_code FROM tool_execution_record WHERE id = 'exec_d'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("uncertain", "interrupted_by_restart")
        );
    }

    #[test]
    fn an_outcome_folded_after_its_row_updates_it_and_the_position_follows() {
        let dir = tempfile::tempdir().unwrap();
        let (_db, mut connection) = migrated();
        let opened = row("exec_b");
        let first = pending(
            dir.path(),
            4,
            &[(
                LoggedKind::Insert,
                row_params(&opened, 1_200, "inst").to_vec(),
            )],
        );
        fold(&mut connection, &first).unwrap();
        let done = finish(None);
        let second = pending(
            dir.path(),
            4,
            &[(
                LoggedKind::Finish,
                finish_params("exec_b", &done, 1_300).to_vec(),
            )],
        );
        fold(&mut connection, &second).unwrap();
        let (state, duration): (String, i64) = connection
            .query_row(
                "SELECT lifecycle_state, duration_ms FROM tool_execution_record WHERE id = 'exec_b'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((state.as_str(), duration), ("finished", 300));
        let position: (i64, i64) = connection
            .query_row(
                "SELECT generation, folded_to FROM journal_log_position",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(position, (4, second.end as i64));
    }

    #[test]
    fn start_up_folds_only_what_the_table_lacks_and_starts_a_new_generation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.calls-log");
        let (_db, mut connection) = migrated();
        // The first run: generation 2 after its own start-up.
        let mut log = recover(&mut connection, &path).unwrap();
        assert_eq!(log.generation(), 2);
        let (a, b) = (row("exec_c"), row("exec_d"));
        log.append(LoggedKind::Insert, &row_params(&a, 2_000, "inst"))
            .unwrap();
        // Folded while the first run went on...
        fold(&mut connection, &log.take()).unwrap();
        // ... then one more record before a crash.
        log.append(LoggedKind::Insert, &row_params(&b, 2_100, "inst"))
            .unwrap();
        drop(log);
        let log = recover(&mut connection, &path).unwrap();
        assert_eq!(log.generation(), 4);
        assert!(
            !journal_log::path_of(&path, 2).exists(),
            "the folded file is removed"
        );
        let ids: Vec<String> = table(&connection)
            .into_iter()
            .map(|r| r[0].clone())
            .collect();
        assert_eq!(ids.len(), 2, "each record folded exactly once: {ids:?}");
        // Nothing is folded twice by a later start-up.
        drop(log);
        recover(&mut connection, &path).unwrap();
        assert_eq!(table(&connection).len(), 2);
    }

    #[test]
    fn start_up_reads_the_next_generation_a_run_started_before_the_database_named_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.calls-log");
        let (_db, mut connection) = migrated();
        let mut log = recover(&mut connection, &path).unwrap();
        let (a, b) = (row("exec_e"), row("exec_f"));
        log.append(LoggedKind::Insert, &row_params(&a, 3_000, "inst"))
            .unwrap();
        fold(&mut connection, &log.take()).unwrap();
        // A long log goes on in a new file; the crash comes before a fold
        // names it in the database.
        log.restart().unwrap();
        log.append(LoggedKind::Insert, &row_params(&b, 3_100, "inst"))
            .unwrap();
        let done = finish(None);
        log.append(LoggedKind::Finish, &finish_params("exec_e", &done, 3_200))
            .unwrap();
        drop(log);
        recover(&mut connection, &path).unwrap();
        let rows = table(&connection);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let finished: i64 = connection
            .query_row(
                "SELECT COUNT(*) FROM tool_execution_record WHERE lifecycle_state = 'finished'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(finished, 1);
    }
}
