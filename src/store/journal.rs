//! Storage of the execution journal.

use std::borrow::Cow;

use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{AsHandle, Record, sql, storable_text};
use super::journal_queue::JournalWrite;
use super::journal_reader::{ReadParam, ReaderRow};
use super::page_bytes::take_within;
use super::rendered_rows::RenderedRows;
use crate::domain::Page;
use crate::error::Result;
use crate::ids::now_ms;
use crate::journal::query::{CallRecordQuery, ExecutionQuery, TOTAL_EXACT_UP_TO};
use crate::journal::{
    CallRecord, CommitOutcome, ExecutionJson, ExecutionRecord, ExecutionRecordRef, ExecutionStatus,
    LegacyStatus, LifecycleState, StoredJson, stored_json_ref,
};
use crate::reason::ReasonCode;

/// A journal row as it is first written, before (or instead of) running the tool.
#[derive(Debug, Clone)]
pub struct NewExecution {
    pub id: String,
    pub account_id: String,
    pub session_id: String,
    pub run_id: Option<String>,
    pub floor_id: Option<String>,
    pub page_id: Option<String>,
    pub call_id: String,
    pub caller_slot: String,
    pub provider_id: String,
    pub provider_type: String,
    pub tool_name: String,
    pub args: serde_json::Value,
    pub args_canonical: String,
    pub status: ExecutionStatus,
    pub lifecycle_state: LifecycleState,
    pub commit_outcome: CommitOutcome,
    pub side_effect_level: String,
    pub replay_safety: String,
    pub delivery_mode: String,
    pub attempt_no: i64,
    pub runtime_job_id: Option<String>,
    pub replay_parent_execution_id: Option<String>,
    /// Set when the row is written already finished (refusals).
    pub result: Option<serde_json::Value>,
    pub error_message: Option<String>,
    /// Why the call did not succeed, for rows written already finished.
    pub reason_code: Option<ReasonCode>,
    pub started_at: i64,
    /// The run step this call belongs to (max_steps_per_generation).
    pub step_key: Option<String>,
    /// Whether the row is written to run its provider (see `Admission`).
    pub provider_started: bool,
    /// The limits a row that starts its provider must fit in.
    pub admission: Admission,
}

/// The limits checked in the same statement that writes a call's row, so that
/// parallel calls cannot both take the last step or the last call of a budget.
/// Only rows whose provider started count against them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Admission {
    /// `max_steps_per_generation`: a row opening a new step of its run needs
    /// fewer than this many steps used.
    pub step_limit: Option<u32>,
    /// `max_calls_per_turn`: calls of the row's run (or of its floor outside
    /// runs) must be fewer than this.
    pub call_limit: Option<u32>,
}

/// Whether a call's row was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    Yes,
    /// The row's run was committed or discarded first.
    RunNotOpen,
    /// The row would open a step past `max_steps_per_generation`.
    StepLimit,
    /// The row would exceed `max_calls_per_turn`.
    CallLimit,
    /// Another run on the row's floor made the same call (tool and
    /// arguments) after the replay guard looked: the guard must decide again
    /// against that execution before the row may be written.
    ReplayChanged,
    /// A finish found its row decided already: another instance took this
    /// one for dead while the call ran and marked the row `uncertain`. The
    /// journal keeps that outcome, and the caller is told it.
    AlreadyDecided,
}

/// The end of an execution.
#[derive(Debug, Clone)]
pub struct ExecutionFinish {
    pub status: ExecutionStatus,
    /// False when the provider turned out never to have received the call.
    pub provider_started: bool,
    pub result: serde_json::Value,
    pub error_message: Option<String>,
    /// Why the call did not succeed; None on success.
    pub reason_code: Option<ReasonCode>,
    pub commit_outcome: Option<CommitOutcome>,
}

const COLUMNS: &str = "id, session_id, run_id, floor_id, page_id, call_id, caller_slot, provider_id, \
    provider_type, tool_name, args_json, result_json, status, lifecycle_state, commit_outcome, \
    side_effect_level, replay_safety, error_message, duration_ms, started_at, finished_at, \
    delivery_mode, attempt_no, runtime_job_id, replay_parent_execution_id, provider_started, \
    execution_reason_code, created_at";

fn record_from_row(row: &impl Record) -> ExecutionRecord {
    record_ref_from_row(row).to_record()
}

/// A journal row borrowed from its result row: a page answered as JSON is
/// written from it without an owned copy of each string, and records are
/// copied from it. States no server writes read as the least certain ones.
fn record_ref_from_row(row: &impl Record) -> ExecutionRecordRef<'_> {
    let delivery_mode = row.text("delivery_mode");
    ExecutionRecordRef {
        id: row.text("id"),
        session_id: row.text("session_id"),
        run_id: row.text_opt("run_id"),
        floor_id: row.text_opt("floor_id"),
        page_id: row.text_opt("page_id"),
        call_id: row.text("call_id"),
        caller_slot: row.text("caller_slot"),
        provider_id: row.text("provider_id"),
        provider_type: row.text("provider_type"),
        tool_name: row.text("tool_name"),
        args: stored_json_ref(row.text_opt("args_json")),
        result: stored_json_ref(row.text_opt("result_json")),
        status: ExecutionStatus::parse("status", row.text("status"))
            .unwrap_or(ExecutionStatus::Uncertain),
        lifecycle_state: LifecycleState::parse("lifecycle_state", row.text("lifecycle_state"))
            .unwrap_or(LifecycleState::Finished),
        commit_outcome: CommitOutcome::parse("commit_outcome", row.text("commit_outcome"))
            .unwrap_or(CommitOutcome::Uncertain),
        side_effect_level: row.text("side_effect_level"),
        replay_safety: row.text("replay_safety"),
        error_message: row.text_opt("error_message"),
        execution_reason_code: row
            .text_opt("execution_reason_code")
            .and_then(ReasonCode::parse),
        duration_ms: row.get("duration_ms"),
        started_at: row.get("started_at"),
        finished_at: row.get("finished_at"),
        result_visibility: ExecutionRecordRef::result_visibility_of(delivery_mode),
        delivery_mode,
        attempt_no: row.get("attempt_no"),
        runtime_job_id: row.text_opt("runtime_job_id"),
        replay_parent_execution_id: row.text_opt("replay_parent_execution_id"),
        provider_started: row.get::<i64>("provider_started") != 0,
        created_at: row.get("created_at"),
    }
}

/// SQL for the legacy status of a row: `ExecutionStatus::legacy` written as a
/// CASE so that the projection can filter on it.
fn legacy_status_sql() -> String {
    let arms: String = ExecutionStatus::ALL
        .iter()
        .map(|status| {
            format!(
                "WHEN '{}' THEN '{}' ",
                status.as_str(),
                status.legacy().as_str()
            )
        })
        .collect();
    format!("CASE status {arms}END")
}

impl Store {
    /// Writes a journal row (group-committed with concurrent journal writes) if
    /// its run is still open and it fits its admission limits. Rows for refused
    /// calls are written already finished.
    pub async fn insert_execution(&self, row: &NewExecution) -> Result<Admitted> {
        self.journal_writer
            .write(JournalWrite::Insert {
                row: Box::new(row.clone()),
                instance_id: self.instance_id().to_owned(),
            })
            .await
    }

    /// Finishes an opened row with its outcome (group-committed).
    pub async fn finish_execution(&self, id: &str, finish: &ExecutionFinish) -> Result<Admitted> {
        self.journal_writer
            .write(JournalWrite::Finish {
                id: id.to_owned(),
                finish: finish.clone(),
                at: now_ms(),
            })
            .await
    }

    /// At start-up: rows a crash left running cannot be known; they become
    /// `uncertain` and finished. Jobs' rows are left to `expire_lost_jobs`,
    /// which hands a replay-safe job over again instead.
    pub async fn recover_interrupted_executions(&self) -> Result<u64> {
        self.settle_journal().await?;
        let now = now_ms();
        let changed = sql!(self.conn().await?, c => query(
            "UPDATE tool_execution_record SET revision = revision + 1, status = 'uncertain', commit_outcome = 'uncertain', \
             lifecycle_state = 'finished', finished_at = ?1, \
             duration_ms = CASE WHEN ?1 > started_at THEN ?1 - started_at ELSE 0 END, \
             error_message = COALESCE(error_message, 'the server stopped while this call was running; its outcome is unknown'), \
             execution_reason_code = COALESCE(execution_reason_code, ?2) \
             WHERE lifecycle_state = 'opened' AND status <> 'queued' AND runtime_job_id IS NULL",
        )
        .bind(now)
        .bind(ReasonCode::InterruptedByRestart.as_str())
        .execute(c)
        .await?
        .rows_affected());
        Ok(changed)
    }

    /// One journal row of the account.
    pub async fn execution(&self, account_id: &str, id: &str) -> Result<Option<ExecutionRecord>> {
        self.settle_journal().await?;
        let sql =
            format!("SELECT {COLUMNS} FROM tool_execution_record WHERE id = ? AND account_id = ?");
        Ok(sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(record_from_row)))
    }

    /// The arguments of the account's journal rows `ids` (at most a few
    /// dozen), by id: what a turn needs of the calls whose deferred results
    /// it delivers, without their results (a row may hold megabytes).
    pub async fn execution_arguments(
        &self,
        account_id: &str,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, StoredJson>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        self.settle_journal().await?;
        let places = vec!["?"; ids.len()].join(", ");
        // Built from placeholders only.
        let sql = format!(
            "SELECT id, args_json FROM tool_execution_record WHERE account_id = ? AND id IN ({places})"
        );
        Ok(sql!(self.conn().await?, c => {
            let mut rows = query(AssertSqlSafe(sql)).bind(account_id);
            for id in ids {
                rows = rows.bind(id);
            }
            rows.fetch_all(c)
                .await?
                .iter()
                .map(|row| (row.get("id"), StoredJson::from_text(row.get("args_json"))))
                .collect()
        }))
    }

    /// The ids of the account's run's journal rows, oldest first, at most
    /// `limit` of them (a run holds at most `max_calls_per_turn` started
    /// calls, but its refused ones are not counted against it). Ids only: a
    /// row may hold megabytes of arguments, and a caller going through a
    /// thousand of them reads each with [`Store::execution`] in turn.
    pub async fn run_execution_ids(
        &self,
        account_id: &str,
        run_id: &str,
        limit: i64,
    ) -> Result<Vec<String>> {
        self.settle_journal().await?;
        Ok(sql!(self.conn().await?, c => query_scalar::<String>(
            "SELECT id FROM tool_execution_record WHERE run_id = ? AND account_id = ? \
             ORDER BY created_at, id LIMIT ?",
        )
        .bind(run_id)
        .bind(account_id)
        .bind(limit)
        .fetch_all(c)
        .await?))
    }

    /// A page of the journal matching `query`, as records (the console
    /// builds its pages from them).
    pub async fn query_executions(
        &self,
        account_id: &str,
        query: ExecutionQuery,
    ) -> Result<Page<ExecutionRecord>> {
        self.query_executions_as(account_id, query).await
    }

    /// A page of the journal matching `query`, each row in the form `T`:
    /// records, or rows already written as JSON (the API's
    /// `GET /tool-executions`).
    pub(crate) async fn query_executions_as<T: PageRow>(
        &self,
        account_id: &str,
        query: ExecutionQuery,
    ) -> Result<Page<T>> {
        self.settle_journal().await?;
        let (where_sql, binds) = filter_conditions(account_id, &query);
        let page = &query.page;
        let (keyset_sql, keyset_binds) = keyset_condition(&query);
        let sql = page_statement(&where_sql, &keyset_sql, page);
        // The total counts the filter's rows; the page reads past the cursor.
        let mut page_binds = binds.clone();
        for bind in keyset_binds {
            page_binds.push(match bind {
                KeysetValue::Sort(value) => ReadParam::Int(value),
                KeysetValue::Id(id) => ReadParam::Text(id.to_owned()),
            });
        }
        // One row past the page says whether another follows, whatever `total`.
        page_binds.extend([ReadParam::Int(page.limit + 1), ReadParam::Int(page.offset)]);
        let ((total, total_is_estimate), PageRows { mut items, cut }) = self
            .rows_and_total::<T>(sql, page_binds, &where_sql, &binds, &query)
            .await?;
        // A page cut at its byte bound has at least the row that did not fit
        // after it.
        let more = cut || items.len() as i64 > page.limit;
        items.truncate(page.limit as usize);
        let next_cursor = items
            .last()
            .filter(|_| more)
            .map(|last| next_cursor(last.cursor_key(page.sort_by), page));
        let mut result = Page::new(items, total, query.page);
        result.total_is_estimate = Some(total_is_estimate);
        result.more = Some(more);
        result.next_cursor = next_cursor;
        Ok(result)
    }

    /// A page's rows (`sql` with `page_binds`) and its bounded total (the
    /// rows `where_sql` with `binds` matches).
    async fn rows_and_total<T: PageRow>(
        &self,
        sql: String,
        page_binds: Vec<ReadParam>,
        where_sql: &str,
        binds: &[ReadParam],
        query: &ExecutionQuery,
    ) -> Result<((i64, bool), PageRows<T>)> {
        let page = &query.page;
        // A page that ends at or past the bound tells the bounded total
        // itself, unless it is past the last row: no count walks the same
        // index beside it (BENCHMARKS.md, issue 20). Only offset pages get
        // there: a cursor comes without an offset, so its page ends at
        // `limit`, far below the bound (it never reads the rows before its
        // cursor, so it could not tell).
        if page_end(page) >= TOTAL_EXACT_UP_TO {
            debug_assert!(query.cursor.is_none(), "a cursor page has no offset");
            let rows = self
                .read_page_rows::<T>(sql, page_binds, page.sort_by)
                .await?;
            // A page cut short by its bytes ended before its rows did, so
            // they do not tell the total.
            let told = (!rows.cut)
                .then(|| total_from_page(rows.items.len() as i64, page))
                .flatten();
            let total = match told {
                Some(total) => total,
                None => self.bounded_total(where_sql, binds, query).await?,
            };
            return Ok((total, rows));
        }
        // The count and the page read on two connections at once: on a large
        // session the count of up to TOTAL_EXACT_UP_TO rows costs about as
        // much as the page.
        tokio::try_join!(
            self.bounded_total(where_sql, binds, query),
            self.read_page_rows::<T>(sql, page_binds, page.sort_by)
        )
    }

    /// The journal rows `sql` selects, up to `page_bytes::MAX_PAGE_BYTES`: on
    /// an SQLite file through the journal reader (each row built on its
    /// thread), else through the pool, a row at a time.
    async fn read_page_rows<T: PageRow>(
        &self,
        sql: String,
        binds: Vec<ReadParam>,
        sort_by: &'static str,
    ) -> Result<PageRows<T>> {
        if let Some(reader) = &self.journal_reader {
            let rendered = reader.rendered_rows();
            let (items, cut) = reader
                .rows_within(
                    sql,
                    binds,
                    move |row| T::from_reader(row, sort_by, &rendered),
                    T::size_bytes,
                )
                .await?;
            return Ok(PageRows { items, cut });
        }
        let (items, cut) = sql!(self.conn().await?, c => {
            let mut rows = query(AssertSqlSafe(sql));
            for bind in &binds {
                rows = match bind {
                    ReadParam::Text(text) => rows.bind(text),
                    ReadParam::Int(n) => rows.bind(*n),
                };
            }
            take_within(rows.fetch(c), |row| {
                let row = T::from_record(record_from_row(&row), sort_by);
                let bytes = row.size_bytes();
                (row, bytes)
            })
            .await?
        });
        Ok(PageRows { items, cut })
    }

    /// Matching rows, counted exactly up to [`TOTAL_EXACT_UP_TO`] or the
    /// page's end (whichever is further); beyond, a lower bound, flagged.
    async fn bounded_total(
        &self,
        where_sql: &str,
        binds: &[ReadParam],
        query: &ExecutionQuery,
    ) -> Result<(i64, bool)> {
        let bound = TOTAL_EXACT_UP_TO.max(page_end(&query.page));
        let sql = format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM tool_execution_record WHERE {where_sql} LIMIT ?) AS matching"
        );
        let mut binds = binds.to_vec();
        binds.push(ReadParam::Int(bound.saturating_add(1)));
        let counted = match &self.journal_reader {
            Some(reader) => reader
                .rows(sql, binds, |row| row.first::<i64>().unwrap_or(0))
                .await?
                .first()
                .copied()
                .unwrap_or(0),
            None => sql!(self.conn().await?, c => {
                let mut total = query_scalar::<i64>(AssertSqlSafe(sql));
                for bind in &binds {
                    total = match bind {
                        ReadParam::Text(text) => total.bind(text),
                        ReadParam::Int(n) => total.bind(*n),
                    };
                }
                total.fetch_one(c).await?
            }),
        };
        Ok((counted, counted > bound))
    }

    /// The legacy call-record projection of `GET /tools/call-records`.
    pub async fn query_call_records(
        &self,
        account_id: &str,
        query: CallRecordQuery,
    ) -> Result<Page<CallRecord>> {
        self.settle_journal().await?;
        let CallRecordSql {
            base,
            outer_sql,
            binds,
            outer_binds,
        } = call_record_sql(account_id, &query);
        let total_sql = format!("SELECT COUNT(*) FROM ({base}) AS records {outer_sql}");
        let total = sql!(self.conn().await?, c => {
            let mut total = query_scalar::<i64>(AssertSqlSafe(total_sql));
            for bind in binds.iter().chain(&outer_binds) {
                total = total.bind(bind);
            }
            total.fetch_one(c).await?
        });
        let page = &query.page;
        let order = page.sort_order.sql();
        // page_id is NULL for calls outside pages: first, as SQLite sorts NULL
        // ascending (PostgreSQL would put them last).
        let sort = |of: &str| {
            if page.sort_by == "seq" {
                format!("{of}page_id ASC NULLS FIRST, {of}seq {order}")
            } else {
                format!("{of}created_at {order}, {of}id {order}")
            }
        };
        // The page is chosen on the numbered rows' narrow columns; only its
        // rows are joined to their arguments and results (numbered with
        // them, every row of the account's matching pages carried its
        // arguments through the window: +273 MB for one floor, probe I).
        let sql = format!(
            "SELECT r.id, r.page_id, r.caller_slot, r.created_at, r.legacy_status, r.seq, \
             t.tool_name, t.args_json, t.result_json, t.duration_ms \
             FROM (SELECT * FROM ({base}) AS records {outer_sql} ORDER BY {} LIMIT ? OFFSET ?) AS r \
             JOIN tool_execution_record t ON t.id = r.id ORDER BY {}",
            sort(""),
            sort("r.")
        );
        // A page bounded as the journal's own; `has_more` follows from the
        // exact total.
        let (items, _) = sql!(self.conn().await?, c => {
            let mut rows = query(AssertSqlSafe(sql));
            for bind in binds.iter().chain(&outer_binds) {
                rows = rows.bind(bind);
            }
            take_within(rows.bind(page.limit).bind(page.offset).fetch(c), |row| {
                let record = call_record_from_row(&row);
                let bytes = record.args.as_str().len() + record.result.as_str().len() + 256;
                (record, bytes)
            })
            .await?
        });
        Ok(Page::new(items, total, query.page))
    }
}

fn call_record_from_row(row: &impl Record) -> CallRecord {
    CallRecord {
        id: row.get("id"),
        page_id: row.get("page_id"),
        seq: row.get("seq"),
        caller_slot: row.get("caller_slot"),
        tool_name: row.get("tool_name"),
        args: StoredJson::from_text(row.get("args_json")),
        result: StoredJson::from_text(row.get("result_json")),
        status: LegacyStatus::parse("status", &row.get::<String>("legacy_status"))
            .unwrap_or(LegacyStatus::Error),
        duration_ms: row.get("duration_ms"),
        created_at: row.get("created_at"),
    }
}

/// The condition a journal query's rows meet (the account's rows and the
/// query's filters), with the values it binds, in order.
fn filter_conditions(account_id: &str, query: &ExecutionQuery) -> (String, Vec<ReadParam>) {
    let mut conditions = vec!["account_id = ?".to_owned()];
    let mut binds = vec![ReadParam::Text(account_id.to_owned())];
    let mut filter = |column: &str, value: Option<String>| {
        if let Some(value) = value {
            conditions.push(format!("{column} = ?"));
            binds.push(ReadParam::Text(value));
        }
    };
    filter("session_id", query.session_id.clone());
    filter("floor_id", query.floor_id.clone());
    filter("run_id", query.run_id.clone());
    filter(
        "caller_slot",
        query.caller_slot.map(|s| s.as_str().to_owned()),
    );
    filter("tool_name", query.tool_name.clone());
    filter("status", query.status.map(|s| s.as_str().to_owned()));
    filter(
        "lifecycle_state",
        query.lifecycle_state.map(|s| s.as_str().to_owned()),
    );
    filter(
        "commit_outcome",
        query.commit_outcome.map(|s| s.as_str().to_owned()),
    );
    filter("provider_type", query.provider_type.clone());
    (conditions.join(" AND "), binds)
}

/// The statement of a journal page: the rows `where_sql` and the cursor's
/// `keyset_sql` select, in the page's order, one past its limit (binds: the
/// condition's, the cursor's, then limit and offset).
fn page_statement(where_sql: &str, keyset_sql: &str, page: &crate::domain::PageRequest) -> String {
    // Column names below come from closed lists, never from input.
    let order = page.sort_order.sql();
    let nulls = nulls_like_sqlite(page.sort_by, page.sort_order);
    format!(
        "SELECT {COLUMNS}, revision FROM tool_execution_record WHERE {where_sql}{keyset_sql} \
         ORDER BY {} {order}{nulls}, id {order} LIMIT ? OFFSET ?",
        page.sort_by
    )
}

/// The NULLS clause that makes a nullable sort column order as SQLite orders
/// it on both backends (NULL first ascending, last descending; PostgreSQL's
/// default is the reverse). Empty for columns that are never NULL, so their
/// ORDER BY still matches their indexes on PostgreSQL.
fn nulls_like_sqlite(column: &str, order: crate::domain::SortOrder) -> &'static str {
    match (column, order) {
        ("finished_at", crate::domain::SortOrder::Asc) => " NULLS FIRST",
        ("finished_at", crate::domain::SortOrder::Desc) => " NULLS LAST",
        _ => "",
    }
}

/// The SQL of the call-record projection: the numbered rows of the account's
/// journal (`base`) and the filters applied after numbering (`outer_sql`).
struct CallRecordSql {
    base: String,
    outer_sql: String,
    binds: Vec<String>,
    outer_binds: Vec<String>,
}

fn call_record_sql(account_id: &str, query: &CallRecordQuery) -> CallRecordSql {
    let mut conditions = vec!["account_id = ?".to_owned()];
    let mut binds = vec![account_id.to_owned()];
    if let Some(page_id) = &query.page_id {
        conditions.push("page_id = ?".into());
        binds.push(page_id.clone());
    }
    if let Some(floor_id) = &query.floor_id {
        conditions.push("floor_id = ?".into());
        binds.push(floor_id.clone());
    }
    let mut outer = Vec::new();
    let mut outer_binds = Vec::new();
    if let Some(slot) = query.caller_slot {
        outer.push("caller_slot = ?");
        outer_binds.push(slot.as_str().to_owned());
    }
    if let Some(status) = query.status {
        outer.push("legacy_status = ?");
        outer_binds.push(status.as_str().to_owned());
    }
    let outer_sql = if outer.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", outer.join(" AND "))
    };
    // seq numbers the calls of each page in the order they were made, before
    // any filter, so a record keeps its seq whatever the query.
    let base = format!(
        "SELECT id, page_id, caller_slot, created_at, \
         {} AS legacy_status, \
         ROW_NUMBER() OVER (PARTITION BY page_id ORDER BY created_at, id) - 1 AS seq \
         FROM tool_execution_record WHERE {}",
        legacy_status_sql(),
        conditions.join(" AND ")
    );
    CallRecordSql {
        base,
        outer_sql,
        binds,
        outer_binds,
    }
}

/// The conditions a row must meet to be written; `?4` is its run, `?5` its
/// floor, `?28` its step, `?29` whether it starts its provider, `?30` the step
/// limit and `?31` the call limit (`?32` is the row's reason code). They are evaluated by the statement that
/// writes the row, under the database's write lock.
const ADMISSION_RUN_OPEN: &str =
    "(?4 IS NULL OR EXISTS (SELECT 1 FROM floor_runs WHERE id = ?4 AND state = 'open'))";
const ADMISSION_STEP: &str = "(?29 = 0 OR ?28 IS NULL OR ?30 IS NULL \
    OR EXISTS (SELECT 1 FROM tool_execution_record WHERE run_id = ?4 AND provider_started = 1 AND step_key = ?28) \
    OR (SELECT COUNT(DISTINCT step_key) FROM tool_execution_record \
        WHERE run_id = ?4 AND provider_started = 1 AND step_key IS NOT NULL) < ?30)";
/// The replay guard's answer still holds: the newest started execution of
/// the same tool with the same arguments (`?11`, `?13`) on the floor by
/// another run is the one the guard decided against (`?26`, none if it found
/// none). Without it, two runs making the same irreversible call at once both
/// pass the guard and both run (issue 20, probe J).
const ADMISSION_REPLAY: &str = "(?29 = 0 OR ?4 IS NULL OR ?5 IS NULL \
    OR COALESCE((SELECT id FROM tool_execution_record \
        WHERE floor_id = ?5 AND run_id IS NOT NULL AND run_id <> ?4 AND tool_name = ?11 \
        AND args_canonical = ?13 AND provider_started = 1 \
        ORDER BY created_at DESC, id DESC LIMIT 1), '') = COALESCE(?26, ''))";
const ADMISSION_CALLS: &str = "(?29 = 0 OR ?31 IS NULL \
    OR (CASE WHEN ?4 IS NOT NULL \
        THEN (SELECT COUNT(*) FROM tool_execution_record WHERE run_id = ?4 AND provider_started = 1) \
        ELSE (SELECT COUNT(*) FROM tool_execution_record WHERE floor_id = ?5 AND run_id IS NULL AND provider_started = 1) \
        END) < ?31)";

const INSERT_COLUMNS: &str = "INSERT INTO tool_execution_record (id, account_id, session_id, run_id, \
    floor_id, page_id, call_id, caller_slot, provider_id, provider_type, tool_name, args_json, args_canonical, \
    result_json, status, lifecycle_state, commit_outcome, side_effect_level, replay_safety, error_message, \
    duration_ms, started_at, finished_at, delivery_mode, attempt_no, runtime_job_id, replay_parent_execution_id, \
    created_at, step_key, provider_started, execution_reason_code, instance_id)";
const INSERT_VALUES: &str = "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
    ?18, ?19, ?20, 0, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?32, ?33";

/// A row's insert under its admission conditions.
static GUARDED_INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{INSERT_COLUMNS} SELECT {INSERT_VALUES} \
         WHERE {ADMISSION_RUN_OPEN} AND {ADMISSION_REPLAY} AND {ADMISSION_STEP} AND {ADMISSION_CALLS}"
    )
});

/// A row's insert when nothing is to be checked (no run, no limits).
pub(super) static PLAIN_INSERT: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{INSERT_COLUMNS} VALUES ({INSERT_VALUES})"));

/// A row's insert with its outcome already applied, as [`FINISH_SQL`] would
/// have applied it to the stored row (its duration from its start to its
/// finish): the journal log's fold writes a call opened and finished within
/// one fold as this one statement.
pub(super) static FINISHED_INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let values = INSERT_VALUES.replacen(
        "?20, 0, ?21",
        "?20, CASE WHEN ?22 > ?21 THEN ?22 - ?21 ELSE 0 END, ?21",
        1,
    );
    format!("{INSERT_COLUMNS} VALUES ({values})")
});

/// Applies an outcome's parameters ([`finish_params`]) to a row's
/// ([`row_params`]) as [`FINISH_SQL`] applies them to the stored row; None
/// when either list is not of its statement's length.
pub(super) fn finished_row<'a>(
    mut row: Vec<Param<'a>>,
    finish: Vec<Param<'a>>,
) -> Option<Vec<Param<'a>>> {
    let [
        status,
        result,
        error,
        reason,
        finished_at,
        outcome,
        started,
        _id,
    ]: [Param<'a>; 8] = finish.try_into().ok()?;
    if row.len() != row_at::COUNT {
        return None;
    }
    row[row_at::STATUS] = status;
    row[row_at::RESULT] = result;
    row[row_at::ERROR] = error;
    row[row_at::REASON] = reason;
    row[row_at::LIFECYCLE] = text(LifecycleState::Finished.as_str());
    row[row_at::FINISHED_AT] = finished_at;
    if let Param::Text(Some(_)) = outcome {
        row[row_at::COMMIT_OUTCOME] = outcome;
    }
    row[row_at::PROVIDER_STARTED] = started;
    Some(row)
}

/// One parameter of the journal's write statements, typed so that either
/// driver (sqlx on both backends, rusqlite on the SQLite journal thread) binds
/// it with its SQL type, NULLs included.
#[derive(Debug, Clone)]
pub(super) enum Param<'a> {
    Text(Option<Cow<'a, str>>),
    Int(Option<i64>),
}

fn text(value: &str) -> Param<'_> {
    Param::Text(Some(Cow::Borrowed(value)))
}

fn text_opt(value: Option<&str>) -> Param<'_> {
    Param::Text(value.map(Cow::Borrowed))
}

/// Where [`row_params`] puts the values that an outcome replaces and that
/// the journal log's readers look at (`?N` is position N - 1).
pub(super) mod row_at {
    pub const RESULT: usize = 13;
    pub const STATUS: usize = 14;
    pub const LIFECYCLE: usize = 15;
    pub const COMMIT_OUTCOME: usize = 16;
    pub const ERROR: usize = 19;
    pub const FINISHED_AT: usize = 21;
    pub const PROVIDER_STARTED: usize = 28;
    pub const REASON: usize = 31;
    /// How many parameters a row has.
    pub const COUNT: usize = 33;
}

/// A row's values as `?1` … `?33` (the numbering of the statements above;
/// `?33` is the instance writing it).
pub(super) fn row_params<'a>(
    row: &'a NewExecution,
    now: i64,
    instance: &'a str,
) -> [Param<'a>; row_at::COUNT] {
    let finished = row.lifecycle_state == LifecycleState::Finished;
    [
        text(&row.id),
        text(&row.account_id),
        text(&row.session_id),
        text_opt(row.run_id.as_deref()),
        text_opt(row.floor_id.as_deref()),
        text_opt(row.page_id.as_deref()),
        text(&row.call_id),
        text(&row.caller_slot),
        text(&row.provider_id),
        text(&row.provider_type),
        text(&row.tool_name),
        Param::Text(Some(Cow::Owned(row.args.to_string()))),
        text(&row.args_canonical),
        Param::Text(row.result.as_ref().map(|r| Cow::Owned(r.to_string()))),
        text(row.status.as_str()),
        text(row.lifecycle_state.as_str()),
        text(row.commit_outcome.as_str()),
        text(&row.side_effect_level),
        text(&row.replay_safety),
        Param::Text(row.error_message.as_deref().map(storable_text)),
        Param::Int(Some(row.started_at)),
        Param::Int(finished.then_some(now)),
        text(&row.delivery_mode),
        Param::Int(Some(row.attempt_no)),
        text_opt(row.runtime_job_id.as_deref()),
        text_opt(row.replay_parent_execution_id.as_deref()),
        Param::Int(Some(now)),
        text_opt(row.step_key.as_deref()),
        Param::Int(Some(row.provider_started as i64)),
        Param::Int(row.admission.step_limit.map(i64::from)),
        Param::Int(row.admission.call_limit.map(i64::from)),
        text_opt(row.reason_code.map(ReasonCode::as_str)),
        text(instance),
    ]
}

/// Binds [`Param`]s in order, by reference, to a sqlx query of either backend.
macro_rules! bind_params {
    ($query:expr, $params:expr) => {{
        let mut query = $query;
        for param in $params.iter() {
            query = match param {
                Param::Text(value) => query.bind(value.as_deref()),
                Param::Int(value) => query.bind(*value),
            };
        }
        query
    }};
}

/// Which statement writes `row`: a row with no run and no limits has nothing
/// to check, and the plain insert spares the statement its conditions.
pub(super) fn insert_sql(row: &NewExecution) -> &'static str {
    if is_guarded(row) {
        &GUARDED_INSERT
    } else {
        &PLAIN_INSERT
    }
}

/// Whether a row is written only if its admission conditions hold (it is in
/// a run, or it starts its provider under a step or call limit).
pub(super) fn is_guarded(row: &NewExecution) -> bool {
    row.run_id.is_some()
        || (row.provider_started
            && (row.admission.step_limit.is_some() || row.admission.call_limit.is_some()))
}

/// Which admission condition refused a row: evaluated with the row's
/// parameters after its insert wrote nothing. Numbered parameters bind by
/// number, so the row's other values are ignored.
pub(super) static ADMISSION_VERDICT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {ADMISSION_RUN_OPEN} AS run_open, {ADMISSION_REPLAY} AS replay_ok, \
         {ADMISSION_STEP} AS step_ok, {ADMISSION_CALLS} AS calls_ok"
    )
});

/// What a refused row's verdict (run open, replay guard unchanged, step
/// within the limit) means.
pub(super) fn refusal(run_open: bool, replay_ok: bool, step_ok: bool) -> Admitted {
    if !run_open {
        Admitted::RunNotOpen
    } else if !replay_ok {
        Admitted::ReplayChanged
    } else if !step_ok {
        Admitted::StepLimit
    } else {
        Admitted::CallLimit
    }
}

/// Writes a call's row on any connection or transaction, if it is admitted.
pub(super) async fn insert_execution_with(
    conn: &mut impl AsHandle,
    row: &NewExecution,
    instance_id: &str,
) -> Result<Admitted> {
    let now = now_ms();
    let params = row_params(row, now, instance_id);
    let sql = insert_sql(row);
    let inserted = sql!(*conn, c => bind_params!(query(AssertSqlSafe(sql)), params)
        .execute(c)
        .await?
        .rows_affected());
    if inserted > 0 {
        return Ok(Admitted::Yes);
    }
    // Another connection may have changed the run in between (this is not
    // always inside a transaction), but a run never reopens, so "not open"
    // stays true; the counts only matter while it is open.
    let (run_open, replay_ok, step_ok) = sql!(*conn, c => {
        let verdict = bind_params!(query(AssertSqlSafe(ADMISSION_VERDICT.as_str())), params)
            .fetch_one(c)
            .await?;
        (
            verdict.get::<bool>("run_open"),
            verdict.get::<bool>("replay_ok"),
            verdict.get::<bool>("step_ok"),
        )
    });
    Ok(refusal(run_open, replay_ok, step_ok))
}

/// Finishes an opened row at `now` on any connection or transaction.
pub(super) async fn finish_execution_with(
    conn: &mut impl AsHandle,
    id: &str,
    finish: &ExecutionFinish,
    now: i64,
) -> Result<Admitted> {
    let params = finish_params(id, finish, now);
    let finished = sql!(*conn, c => bind_params!(query(FINISH_SQL), params)
        .execute(c)
        .await?
        .rows_affected());
    if finished == 0 {
        late_outcome_left_out(id, finish);
        return Ok(Admitted::AlreadyDecided);
    }
    Ok(Admitted::Yes)
}

/// Logs an outcome that arrived for a row already decided (see
/// [`FINISH_SQL`]): the journal keeps the one decided first, and the caller is
/// answered with that one ([`Admitted::AlreadyDecided`]), so this line is
/// the only record of what the provider answered.
pub(super) fn late_outcome_left_out(id: &str, finish: &ExecutionFinish) {
    tracing::warn!(
        execution_id = %id,
        status = finish.status.as_str(),
        "a call's outcome arrived after its row was decided (its instance was taken for dead); \
         the journal keeps the earlier outcome and the caller is answered with it"
    );
}

/// Finishes an opened row: `finish_params` binds it. A row no longer opened
/// is left as it is: another instance may have marked it `uncertain` while
/// this one was taken for dead (stopped, not killed), and a decided row
/// never changes its outcome again.
pub(super) const FINISH_SQL: &str = "UPDATE tool_execution_record SET revision = revision + 1, status = ?1, result_json = ?2, \
     error_message = ?3, execution_reason_code = ?4, lifecycle_state = 'finished', finished_at = ?5, \
     duration_ms = CASE WHEN ?5 > started_at THEN ?5 - started_at ELSE 0 END, \
     commit_outcome = COALESCE(?6, commit_outcome), provider_started = ?7 \
     WHERE id = ?8 AND lifecycle_state = 'opened'";

/// The parameters of [`FINISH_SQL`].
pub(super) fn finish_params<'a>(
    id: &'a str,
    finish: &'a ExecutionFinish,
    now: i64,
) -> [Param<'a>; 8] {
    [
        text(finish.status.as_str()),
        Param::Text(Some(Cow::Owned(finish.result.to_string()))),
        Param::Text(finish.error_message.as_deref().map(storable_text)),
        text_opt(finish.reason_code.map(ReasonCode::as_str)),
        Param::Int(Some(now)),
        text_opt(finish.commit_outcome.map(CommitOutcome::as_str)),
        Param::Int(Some(finish.provider_started as i64)),
        text(id),
    ]
}

/// The condition that starts a keyset page after the cursor's row, in the
/// query's order (SQLite sorts NULL first ascending, last descending: only
/// `finished_at` can be NULL, and the page's ORDER BY spells that order out
/// with [`nulls_like_sqlite`] so PostgreSQL sorts the same), and the values it
/// binds, in order.
fn keyset_condition(query: &ExecutionQuery) -> (String, Vec<KeysetValue<'_>>) {
    let Some(cursor) = &query.cursor else {
        return (String::new(), Vec::new());
    };
    let column = query.page.sort_by;
    let descending = query.page.sort_order == crate::domain::SortOrder::Desc;
    let (op, id) = if descending {
        ("<", "id < ?")
    } else {
        (">", "id > ?")
    };
    let condition = match (cursor.value, descending) {
        (Some(_), true) => {
            format!("({column} {op} ? OR ({column} = ? AND {id}) OR {column} IS NULL)")
        }
        (Some(_), false) => format!("({column} {op} ? OR ({column} = ? AND {id}))"),
        (None, true) => format!("({column} IS NULL AND {id})"),
        (None, false) => format!("({column} IS NOT NULL OR {id})"),
    };
    let mut values = Vec::with_capacity(3);
    if let Some(value) = cursor.value {
        values.extend([KeysetValue::Sort(value), KeysetValue::Sort(value)]);
    }
    values.push(KeysetValue::Id(&cursor.id));
    (format!(" AND {condition}"), values)
}

/// A value the keyset condition binds.
enum KeysetValue<'a> {
    Sort(i64),
    Id(&'a str),
}

// A cursor page (offset 0) always ends below the count's bound, so only
// offset pages take their total from their rows (`rows_and_total`).
const _: () = assert!(crate::domain::PageRequest::MAX_LIMIT < TOTAL_EXACT_UP_TO);

/// `offset + limit`: where an offset page ends (an offset can be any
/// non-negative number, so it saturates instead of overflowing).
fn page_end(page: &crate::domain::PageRequest) -> i64 {
    page.offset.saturating_add(page.limit)
}

/// What [`Store::bounded_total`] would count for an offset page whose end
/// (`offset + limit`) is at or past [`TOTAL_EXACT_UP_TO`], from the `read`
/// rows it got (up to `limit + 1`), when they tell: with a row past the page
/// the count would stop at its bound, `offset + limit + 1`, flagged; with
/// some rows but none past it the page holds the last row. None for a page
/// past the last row, which needs the count.
fn total_from_page(read: i64, page: &crate::domain::PageRequest) -> Option<(i64, bool)> {
    debug_assert!(page_end(page) >= TOTAL_EXACT_UP_TO);
    if read > page.limit {
        Some((page_end(page).saturating_add(1), true))
    } else if read > 0 || page.offset == 0 {
        Some((page.offset.saturating_add(read), false))
    } else {
        None
    }
}

/// The cursor of the page after the one whose last row has `key` (its value
/// of the page's sort column, its id).
fn next_cursor(key: (Option<i64>, &str), page: &crate::domain::PageRequest) -> String {
    let (value, id) = key;
    crate::journal::query::Cursor {
        value,
        id: id.to_owned(),
    }
    .encode(page)
}

/// The rows of a journal page as read, and whether the read stopped at
/// `page_bytes::MAX_PAGE_BYTES` with rows left (then `has_more` is true and the
/// `next_cursor` follows its last row).
struct PageRows<T> {
    items: Vec<T>,
    cut: bool,
}

/// A form the rows of a journal page are read in.
pub(crate) trait PageRow: Sized + Send + 'static {
    /// About how many bytes the row holds (what a page's bound counts).
    fn size_bytes(&self) -> usize;
    /// The row, built on the journal reader's thread from the statement
    /// (its columns and `revision`), or from `rendered` where it holds the
    /// row at that revision.
    fn from_reader(row: &ReaderRow<'_, '_>, sort_by: &str, rendered: &RenderedRows) -> Self;
    /// The row, built from a record read through the pool.
    fn from_record(record: ExecutionRecord, sort_by: &str) -> Self;
    /// The row's value of the page's sort column `sort_by`, and its id.
    fn cursor_key(&self, sort_by: &str) -> (Option<i64>, &str);
}

impl PageRow for ExecutionRecord {
    fn size_bytes(&self) -> usize {
        // The texts a caller can make large; the rest is a few hundred bytes.
        self.args.as_str().len()
            + self.result.as_str().len()
            + self.error_message.as_ref().map_or(0, String::len)
            + self.tool_name.len()
            + 512
    }

    fn from_reader(row: &ReaderRow<'_, '_>, _sort_by: &str, _rendered: &RenderedRows) -> Self {
        record_from_row(row)
    }

    fn from_record(record: ExecutionRecord, _sort_by: &str) -> Self {
        record
    }

    fn cursor_key(&self, sort_by: &str) -> (Option<i64>, &str) {
        (self.borrowed().sort_value(sort_by), &self.id)
    }
}

impl PageRow for ExecutionJson {
    fn size_bytes(&self) -> usize {
        self.as_str().len()
    }

    fn from_reader(row: &ReaderRow<'_, '_>, sort_by: &str, rendered: &RenderedRows) -> Self {
        let id = row.text("id");
        let revision: i64 = row.get("revision");
        if let Some(json) = rendered.get(id, revision) {
            let sort_value = row.get(crate::journal::sort_column(sort_by));
            return ExecutionJson::written(json, id.to_owned(), sort_value);
        }
        let written = ExecutionJson::new(&record_ref_from_row(row), sort_by);
        rendered.keep(id, revision, written.shared());
        written
    }

    fn from_record(record: ExecutionRecord, sort_by: &str) -> Self {
        ExecutionJson::new(&record.borrowed(), sort_by)
    }

    fn cursor_key(&self, _sort_by: &str) -> (Option<i64>, &str) {
        // Taken when the row was written, with the same page's sort.
        (self.sort_value(), self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rows as the journal reader reads them: one with every column set,
    /// one with every nullable column NULL, states no server writes and
    /// stored JSON that is not JSON.
    /// The two test rows, each read as a record and written as JSON through
    /// `rendered`, on `connection` (from [`test_rows`]).
    fn read_both_ways(
        connection: &rusqlite::Connection,
        rendered: &RenderedRows,
    ) -> Vec<(ExecutionRecord, ExecutionJson)> {
        read_sorted_by(connection, rendered, "finished_at")
    }

    /// [`read_both_ways`] for a page sorted by `sort_by`.
    fn read_sorted_by(
        connection: &rusqlite::Connection,
        rendered: &RenderedRows,
        sort_by: &str,
    ) -> Vec<(ExecutionRecord, ExecutionJson)> {
        super::super::journal_reader::query(
            connection,
            &format!("SELECT {COLUMNS}, revision FROM tool_execution_record ORDER BY id"),
            &[],
            |row| {
                (
                    record_from_row(row),
                    <ExecutionJson as PageRow>::from_reader(row, sort_by, rendered),
                )
            },
        )
        .expect("rows read")
    }

    /// A database holding two journal rows, one with every text that needs
    /// escaping and every optional column set, one with none.
    fn test_rows() -> rusqlite::Connection {
        let connection = rusqlite::Connection::open_in_memory().expect("in-memory database");
        connection
            .execute_batch(&format!(
                "CREATE TABLE tool_execution_record ({COLUMNS}, revision);
                 INSERT INTO tool_execution_record ({COLUMNS}, revision) VALUES
                 ('texec_1', 'sess_1', 'run_1', 'floor_1', 'page_1', 'call_1', 'narrator',
                  'plugin:x', 'http_callback', 'send\"mail\\\\', '{{\"to\": \"a\\u00e9\"}}',
                  '[1, {{\"ok\": true}}]', 'error', 'finished', 'committed', 'external',
                  'unsafe', 'line\none', 12, 1000, 1012, 'async_job', 2, 'job_1', 'texec_0', 1,
                  'mcp_remote_error', 999, 0),
                 ('texec_2', 'sess_1', NULL, NULL, NULL, 'call_2', 'verifier', 'builtin',
                  'builtin', 'roll_dice', 'not json', NULL, 'exploded', 'gone', 'maybe',
                  'none', 'safe', NULL, 0, 2000, NULL, 'inline', 1, NULL, NULL, 0, NULL, 2000, 0);"
            ))
            .expect("rows written");
        connection
    }

    /// A floor's page and a session's, in every sort and direction, from its
    /// start or after a cursor, is a search of one index in the page's order:
    /// never a sort of every row of the floor (which reads each row whole,
    /// large results included, to find its sort value).
    #[tokio::test]
    async fn a_floor_or_session_page_in_every_sort_searches_one_index_in_order() {
        use crate::domain::{PageRequest, SortOrder};
        use crate::journal::query::Cursor;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let super::super::backend::Pool::Sqlite(pool) = &store.pool else {
            panic!("Store::open(None, …) opens SQLite");
        };
        for (floor_id, session_id) in [(Some("floor_1"), None), (None, Some("sess_1"))] {
            for sort_by in ["created_at", "started_at", "finished_at"] {
                for sort_order in [SortOrder::Asc, SortOrder::Desc] {
                    for cursor in [None, Some(Some(5)), Some(None)] {
                        let query = ExecutionQuery {
                            session_id: session_id.map(str::to_owned),
                            floor_id: floor_id.map(str::to_owned),
                            run_id: None,
                            caller_slot: None,
                            tool_name: None,
                            status: None,
                            lifecycle_state: None,
                            commit_outcome: None,
                            provider_type: None,
                            page: PageRequest {
                                limit: 50,
                                offset: 0,
                                sort_by,
                                sort_order,
                            },
                            cursor: cursor.map(|value| Cursor {
                                value,
                                id: "texec_1".into(),
                            }),
                        };
                        let (where_sql, _) = filter_conditions("acct_1", &query);
                        let (keyset_sql, _) = keyset_condition(&query);
                        let sql = page_statement(&where_sql, &keyset_sql, &query.page);
                        let plan = explain(pool, &sql).await;
                        assert!(
                            plan.iter().any(|step| step.starts_with("SEARCH"))
                                && !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                            "{sql}\n{plan:?}"
                        );
                    }
                }
            }
        }
    }

    /// The steps of `sql`'s query plan (their `detail` column).
    async fn explain(pool: &sqlx::SqlitePool, sql: &str) -> Vec<String> {
        sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(pool)
            .await
            .expect("a plan")
            .iter()
            .map(|row| sqlx::Row::get::<String, _>(row, "detail"))
            .collect()
    }

    #[test]
    fn a_page_written_off_the_statement_is_the_records_json() {
        let rows = read_both_ways(&test_rows(), &RenderedRows::new(1 << 20));
        assert_eq!(rows.len(), 2);
        for (record, json) in &rows {
            assert_eq!(
                json.as_str(),
                serde_json::to_string(record).expect("a record serialises")
            );
            assert_eq!(
                json.cursor_key("finished_at"),
                record.cursor_key("finished_at")
            );
        }
        let first: serde_json::Value = serde_json::from_str(rows[0].1.as_str()).expect("JSON");
        assert_eq!(first["tool_name"], "send\"mail\\\\");
        assert_eq!(first["args"]["to"], "a\u{e9}");
        assert_eq!(first["result"][1]["ok"], true);
        assert_eq!(first["result_visibility"], "deferred_receipt");
        assert_eq!(first["execution_reason_code"], "mcp_remote_error");
        assert_eq!(first["provider_started"], true);
        let second: serde_json::Value = serde_json::from_str(rows[1].1.as_str()).expect("JSON");
        assert_eq!(second["args"], serde_json::Value::Null);
        assert_eq!(second["result"], serde_json::Value::Null);
        assert_eq!(second["status"], "uncertain");
        assert_eq!(second["finished_at"], serde_json::Value::Null);
        assert_eq!(second["run_id"], serde_json::Value::Null);
        assert_eq!(second["result_visibility"], "immediate");
        assert_eq!(rows[1].1.cursor_key("finished_at"), (None, "texec_2"));
    }

    /// A row read again at the same revision is the text written the first
    /// time; a row whose revision changed is written again from its columns.
    #[test]
    fn a_row_is_written_again_only_when_its_revision_changed() {
        let connection = test_rows();
        let rendered = RenderedRows::new(1 << 20);
        let first = read_both_ways(&connection, &rendered);
        // Kept rows take their cursor's sort value off the row, in every sort.
        for sort_by in ["finished_at", "created_at", "started_at"] {
            let again = read_sorted_by(&connection, &rendered, sort_by);
            for ((_, written), (record, reused)) in first.iter().zip(&again) {
                assert!(
                    std::sync::Arc::ptr_eq(written.shared(), reused.shared()),
                    "row {} was written again at the same revision",
                    record.id
                );
                assert_eq!(
                    reused.cursor_key(sort_by),
                    record.cursor_key(sort_by),
                    "{sort_by}"
                );
            }
        }
        connection
            .execute(
                "UPDATE tool_execution_record SET revision = revision + 1, status = 'success', \
                 finished_at = 2500 WHERE id = 'texec_2'",
                [],
            )
            .expect("row changed");
        let changed = read_both_ways(&connection, &rendered);
        assert!(std::sync::Arc::ptr_eq(
            first[0].1.shared(),
            changed[0].1.shared()
        ));
        let (record, json) = &changed[1];
        assert_eq!(record.status, ExecutionStatus::Success);
        assert_eq!(
            json.as_str(),
            serde_json::to_string(record).expect("a record serialises")
        );
        assert_eq!(json.cursor_key("finished_at"), (Some(2500), "texec_2"));
    }
}
