//! The per-run overlay of sandbox effects: variable and resource writes made
//! inside an open run are appended here instead of touching session state, read
//! back merged over the session's state (read-your-writes), applied in order at
//! the run's commit and dropped at its discard.
//!
//! Writes are checked exactly like direct writes (names, sizes, per-session
//! counts taken over the state *as the run sees it*), so applying an accepted
//! overlay at commit never fails on a limit.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{AsHandle, Record, sql};
use super::resources::{
    MAX_RESOURCE_NAME_CHARS, MAX_RESOURCES_PER_SESSION, checked_resource, decode_resource,
    too_many_resources,
};
use super::state_names::check_state_name;
use super::variables::{
    MAX_VARIABLE_NAME_CHARS, MAX_VARIABLES_PER_SESSION, checked_variable, decode_variable,
    too_many_variables,
};
use crate::error::{Error, Result};
use crate::ids::now_ms;
use crate::store::{Resource, ResourceContent, ResourceSummary};

/// Most buffered writes one run may hold: as many as the highest
/// `max_calls_per_turn`, so a legitimate run never reaches it.
pub const MAX_EFFECTS_PER_RUN: i64 = 1000;

/// The names a session's other open runs have set (`?1` the run writing, or
/// none; `?2` the session; `?3` the kind). Every open run may commit, so a
/// per-session count counts them too, or runs spread over floors would each
/// fill the session to its limit. A name one of them deletes still counts: the
/// bound errs on the safe side.
pub(super) const STAGED_BY_OTHER_OPEN_RUNS: &str = "SELECT e.name FROM run_effects e \
     JOIN floor_runs r ON r.id = e.run_id \
     WHERE e.session_id = ?2 AND e.kind = ?3 AND e.op = 'set' AND e.run_id <> ?1 AND r.state = 'open'";

/// The open run a buffered write belongs to.
#[derive(Debug, Clone, Copy)]
pub struct RunScope<'a> {
    pub session_id: &'a str,
    pub run_id: &'a str,
}

/// What session state an effect touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Variable,
    Resource,
}

impl Kind {
    /// The kind as `run_effects.kind` stores it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Variable => "variable",
            Kind::Resource => "resource",
        }
    }

    /// The session-state table the effect lands in (a fixed name, never input).
    fn table(self) -> &'static str {
        match self {
            Kind::Variable => "session_variables",
            Kind::Resource => "session_resources",
        }
    }

    fn limit(self) -> i64 {
        match self {
            Kind::Variable => MAX_VARIABLES_PER_SESSION,
            Kind::Resource => MAX_RESOURCES_PER_SESSION,
        }
    }
}

/// One buffered write as read back for a merge.
struct Effect {
    name: String,
    /// `None` for a delete.
    set: Option<SetPayload>,
    created_at: i64,
}

struct SetPayload {
    /// Left empty when only sizes were read (listings).
    payload: String,
    content_kind: Option<String>,
    bytes: i64,
}

fn effect_from_row(row: &impl Record, with_payload: bool) -> Effect {
    let op: String = row.get("op");
    let set = (op == "set").then(|| SetPayload {
        payload: if with_payload {
            row.get::<Option<String>>("payload").unwrap_or_default()
        } else {
            String::new()
        },
        content_kind: row.get("content_kind"),
        bytes: row.get("bytes"),
    });
    Effect {
        name: row.get("name"),
        set,
        created_at: row.get("created_at"),
    }
}

/// A resource summary after `effect` on top of `before` (same name).
fn fold_summary(before: Option<ResourceSummary>, effect: &Effect) -> Option<ResourceSummary> {
    let set = effect.set.as_ref()?;
    Some(ResourceSummary {
        name: effect.name.clone(),
        kind: set.content_kind.clone().unwrap_or_else(|| "text".into()),
        bytes: set.bytes,
        // Replacing keeps the creation time, as an upsert at commit does.
        created_at: before.map_or(effect.created_at, |b| b.created_at),
        updated_at: effect.created_at,
    })
}

/// A resource summary after all of `effects` (same name, oldest first). Not a
/// `try_fold`: a delete (`None`) does not end the fold, a later set revives it.
fn fold_summaries(
    mut current: Option<ResourceSummary>,
    effects: &[Effect],
) -> Option<ResourceSummary> {
    for effect in effects {
        current = fold_summary(current, effect);
    }
    current
}

impl Store {
    /// The variable as the run sees it: its own latest write, else the session's.
    pub async fn run_variable(&self, scope: RunScope<'_>, name: &str) -> Result<Option<Value>> {
        check_state_name("variable", name, MAX_VARIABLE_NAME_CHARS)?;
        let latest = self
            .effects_of(scope.run_id, Kind::Variable, Some(name), true)
            .await?
            .pop();
        match latest {
            Some(Effect { set: None, .. }) => Ok(None),
            Some(Effect { set: Some(set), .. }) => decode_variable(name, &set.payload).map(Some),
            None => self.variable(scope.session_id, name).await,
        }
    }

    /// Buffers a variable write in the run.
    pub async fn run_set_variable(
        &self,
        scope: RunScope<'_>,
        name: &str,
        value: &Value,
    ) -> Result<()> {
        let serialized = checked_variable(name, value)?;
        self.buffer_set(scope, Kind::Variable, name, &serialized, None)
            .await
    }

    /// Every resource as the run sees it, by name.
    pub async fn run_list_resources(&self, scope: RunScope<'_>) -> Result<Vec<ResourceSummary>> {
        let mut merged: BTreeMap<String, ResourceSummary> = self
            .list_resources(scope.session_id)
            .await?
            .into_iter()
            .map(|summary| (summary.name.clone(), summary))
            .collect();
        for effect in self
            .effects_of(scope.run_id, Kind::Resource, None, false)
            .await?
        {
            let before = merged.remove(&effect.name);
            if let Some(after) = fold_summary(before, &effect) {
                merged.insert(effect.name.clone(), after);
            }
        }
        // BTreeMap order is byte order, the same as SQLite's BINARY `ORDER BY name`.
        Ok(merged.into_values().collect())
    }

    /// One resource as the run sees it.
    pub async fn run_resource(&self, scope: RunScope<'_>, name: &str) -> Result<Option<Resource>> {
        check_state_name("resource", name, MAX_RESOURCE_NAME_CHARS)?;
        let effects = self
            .effects_of(scope.run_id, Kind::Resource, Some(name), true)
            .await?;
        let base = self.resource(scope.session_id, name).await?;
        let Some(last) = effects.last() else {
            return Ok(base);
        };
        let Some(set) = &last.set else {
            return Ok(None);
        };
        let summary = fold_summaries(base.map(|r| r.summary), &effects);
        let kind = set.content_kind.as_deref().unwrap_or("text");
        let content = decode_resource(name, kind, &set.payload)?;
        Ok(summary.map(|summary| Resource { summary, content }))
    }

    /// Buffers a resource write in the run; answers whether it creates the
    /// resource as the run sees it.
    pub async fn run_write_resource(
        &self,
        scope: RunScope<'_>,
        name: &str,
        content: &ResourceContent,
    ) -> Result<bool> {
        let stored = checked_resource(name, content)?;
        // Informational only, as for direct writes.
        let existed = self.run_resource_exists(scope, name).await?;
        self.buffer_set(scope, Kind::Resource, name, &stored, Some(content.kind()))
            .await?;
        Ok(!existed)
    }

    /// Buffers a resource delete in the run; answers whether the resource
    /// existed as the run sees it (nothing is buffered when it did not).
    pub async fn run_delete_resource(&self, scope: RunScope<'_>, name: &str) -> Result<bool> {
        check_state_name("resource", name, MAX_RESOURCE_NAME_CHARS)?;
        if !self.run_resource_exists(scope, name).await? {
            return Ok(false);
        }
        // In a write transaction: on PostgreSQL only its lock makes the checks
        // and the insert one step against every other writer (see `buffer_set`).
        let mut tx = self.begin_write().await?;
        let written = sql!(tx, c => query(
            "INSERT INTO run_effects (run_id, seq, session_id, kind, name, op, payload, content_kind, created_at) \
             SELECT ?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_effects WHERE run_id = ?1), ?2, 'resource', ?3, 'delete', NULL, NULL, ?4 \
             WHERE EXISTS (SELECT 1 FROM floor_runs WHERE id = ?1 AND session_id = ?2 AND state = 'open') \
               AND (SELECT COUNT(*) FROM run_effects WHERE run_id = ?1) < ?5",
        )
        .bind(scope.run_id)
        .bind(scope.session_id)
        .bind(name)
        .bind(now_ms())
        .bind(MAX_EFFECTS_PER_RUN)
        .execute(c)
        .await?
        .rows_affected());
        if written == 0 {
            drop(tx);
            return Err(self.refusal(scope, Kind::Resource).await);
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn run_resource_exists(&self, scope: RunScope<'_>, name: &str) -> Result<bool> {
        let latest = self
            .effects_of(scope.run_id, Kind::Resource, Some(name), false)
            .await?
            .pop();
        Ok(match latest {
            Some(effect) => effect.set.is_some(),
            None => self.resource(scope.session_id, name).await?.is_some(),
        })
    }

    /// The run's writes of `kind` (of one name, or all), oldest first.
    async fn effects_of(
        &self,
        run_id: &str,
        kind: Kind,
        name: Option<&str>,
        with_payload: bool,
    ) -> Result<Vec<Effect>> {
        let payload = if with_payload {
            "payload"
        } else {
            "CAST(NULL AS TEXT)"
        };
        Ok(sql!(self.conn().await?, c => {
            // The payload's size in bytes (UTF-8), as resource sizes are counted.
            let bytes = if POSTGRES {
                "CAST(octet_length(payload) AS BIGINT)"
            } else {
                "length(CAST(payload AS BLOB))"
            };
            let sql = format!(
                "SELECT name, op, {payload} AS payload, content_kind, created_at, \
                 COALESCE({bytes}, 0) AS bytes \
                 FROM run_effects WHERE run_id = ?1 AND kind = ?2 AND (?3 IS NULL OR name = ?3) ORDER BY seq"
            );
            query(AssertSqlSafe(sql))
                .bind(run_id)
                .bind(kind.as_str())
                .bind(name)
                .fetch_all(c)
                .await?
                .iter()
                .map(|row| effect_from_row(row, with_payload))
                .collect()
        }))
    }

    /// Appends a `set` to the run's overlay. One statement checks that the run is
    /// still open, the run's own cap, and the per-session count over the state as
    /// the run sees it (the session's names, minus those the run deleted, plus
    /// those it set, plus those the session's other open runs set: they may all
    /// commit), so concurrent calls cannot race past a limit and a write
    /// racing the commit is either applied by it or refused. The statement runs
    /// in a write transaction: SQLite would serialise it with the commit anyway,
    /// PostgreSQL only under the write lock (else it reads the run as open
    /// while the commit is applying and deleting the run's effects).
    async fn buffer_set(
        &self,
        scope: RunScope<'_>,
        kind: Kind,
        name: &str,
        payload: &str,
        content_kind: Option<&str>,
    ) -> Result<()> {
        let table = kind.table();
        let sql = format!(
            "WITH latest AS ( \
                 SELECT e.name, e.op FROM run_effects e \
                 WHERE e.run_id = ?1 AND e.kind = ?3 AND e.seq = \
                     (SELECT MAX(x.seq) FROM run_effects x WHERE x.run_id = ?1 AND x.kind = ?3 AND x.name = e.name) \
             ), effective AS ( \
                 SELECT name FROM {table} WHERE session_id = ?2 \
                     AND name NOT IN (SELECT name FROM latest WHERE op = 'delete') \
                 UNION SELECT name FROM latest WHERE op = 'set' \
                 UNION {STAGED_BY_OTHER_OPEN_RUNS} \
             ) \
             INSERT INTO run_effects (run_id, seq, session_id, kind, name, op, payload, content_kind, created_at) \
             SELECT ?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_effects WHERE run_id = ?1), ?2, ?3, ?4, 'set', ?5, ?6, ?7 \
             WHERE EXISTS (SELECT 1 FROM floor_runs WHERE id = ?1 AND session_id = ?2 AND state = 'open') \
               AND (SELECT COUNT(*) FROM run_effects WHERE run_id = ?1) < ?8 \
               AND ((SELECT COUNT(*) FROM effective) < ?9 OR ?4 IN (SELECT name FROM effective))"
        );
        let mut tx = self.begin_write().await?;
        let written = sql!(tx, c => query(AssertSqlSafe(sql))
            .bind(scope.run_id)
            .bind(scope.session_id)
            .bind(kind.as_str())
            .bind(name)
            .bind(payload)
            .bind(content_kind)
            .bind(now_ms())
            .bind(MAX_EFFECTS_PER_RUN)
            .bind(kind.limit())
            .execute(c)
            .await?
            .rows_affected());
        if written == 0 {
            drop(tx);
            return Err(self.refusal(scope, kind).await);
        }
        tx.commit().await?;
        Ok(())
    }

    /// Why a buffered write was not written (checked after the fact; the write
    /// itself was atomic).
    async fn refusal(&self, scope: RunScope<'_>, kind: Kind) -> Error {
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(err) => return err.into(),
        };
        let state: std::result::Result<Option<String>, _> = sql!(conn, c => query_scalar::<String>(
            "SELECT state FROM floor_runs WHERE id = ? AND session_id = ?",
        )
        .bind(scope.run_id)
        .bind(scope.session_id)
        .fetch_optional(c)
        .await);
        match state {
            Err(err) => return err.into(),
            Ok(None) => return Error::not_found(format!("run {:?}", scope.run_id)),
            Ok(Some(state)) if state != "open" => {
                return Error::refused(
                    crate::error::ErrorCode::RunNotOpen,
                    format!(
                        "run {} is already {state}; its writes can no longer change",
                        scope.run_id
                    ),
                );
            }
            Ok(Some(_)) => {}
        }
        let buffered: std::result::Result<i64, _> = sql!(conn, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM run_effects WHERE run_id = ?",
        )
        .bind(scope.run_id)
        .fetch_one(c)
        .await);
        match buffered {
            Err(err) => err.into(),
            Ok(count) if count >= MAX_EFFECTS_PER_RUN => Error::validation(format!(
                "this run already made the maximum of {MAX_EFFECTS_PER_RUN} state changes"
            )),
            Ok(_) => match kind {
                Kind::Variable => too_many_variables(),
                Kind::Resource => too_many_resources(),
            },
        }
    }
}

/// One buffered write as the commit applies it.
struct Buffered {
    session_id: String,
    kind: String,
    name: String,
    op: String,
    payload: Option<String>,
    content_kind: Option<String>,
    at: i64,
}

fn buffered_from_row(row: &impl Record) -> Buffered {
    Buffered {
        session_id: row.get("session_id"),
        kind: row.get("kind"),
        name: row.get("name"),
        op: row.get("op"),
        payload: row.get("payload"),
        content_kind: row.get("content_kind"),
        at: row.get("created_at"),
    }
}

/// At commit, inside its transaction: applies the run's buffered writes to the
/// session's state in the order they were made, then forgets them. Answers how
/// many were applied. No limit is checked here: each write was checked when it
/// was buffered.
pub(super) async fn apply_state_effects(tx: &mut impl AsHandle, run_id: &str) -> Result<u64> {
    // Taken and forgotten in one statement (a run that buffered nothing, the
    // common case, costs one round trip, not two). RETURNING keeps no order.
    let mut effects = sql!(*tx, c => query(
        "DELETE FROM run_effects WHERE run_id = ? \
         RETURNING seq, session_id, kind, name, op, payload, content_kind, created_at",
    )
    .bind(run_id)
    .fetch_all(c)
    .await?
    .iter()
    .map(|row| (row.get::<i64>("seq"), buffered_from_row(row)))
    .collect::<Vec<_>>());
    effects.sort_unstable_by_key(|(seq, _)| *seq);
    for (_, effect) in &effects {
        apply_state_effect(tx, run_id, effect).await?;
    }
    Ok(effects.len() as u64)
}

/// Applies one buffered write to the session's state.
async fn apply_state_effect(tx: &mut impl AsHandle, run_id: &str, effect: &Buffered) -> Result<()> {
    let Buffered {
        session_id,
        name,
        at,
        ..
    } = effect;
    match (effect.kind.as_str(), effect.op.as_str(), &effect.payload) {
        ("variable", "set", Some(value)) => {
            sql!(*tx, c => query(
                "INSERT INTO session_variables (session_id, name, value_json, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?) \
                 ON CONFLICT (session_id, name) DO UPDATE SET value_json = excluded.value_json, \
                    updated_at = excluded.updated_at",
            )
            .bind(session_id)
            .bind(name)
            .bind(value)
            .bind(*at)
            .bind(*at)
            .execute(c)
            .await
            .map(|_| ())?);
        }
        ("resource", "set", Some(content)) => {
            sql!(*tx, c => query(
                "INSERT INTO session_resources (session_id, name, kind, content, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (session_id, name) DO UPDATE SET kind = excluded.kind, \
                    content = excluded.content, updated_at = excluded.updated_at",
            )
            .bind(session_id)
            .bind(name)
            .bind(effect.content_kind.as_deref().unwrap_or("text"))
            .bind(content)
            .bind(*at)
            .bind(*at)
            .execute(c)
            .await
            .map(|_| ())?);
        }
        (kind @ ("variable" | "resource"), "delete", _) => {
            let table = if kind == "variable" {
                Kind::Variable.table()
            } else {
                Kind::Resource.table()
            };
            let sql = format!("DELETE FROM {table} WHERE session_id = ? AND name = ?");
            sql!(*tx, c => query(AssertSqlSafe(sql))
                .bind(session_id)
                .bind(name)
                .execute(c)
                .await
                .map(|_| ())?);
        }
        (kind, op, _) => {
            // The table's CHECK constraints make this unreachable; refusing
            // the commit is better than applying half an overlay.
            return Err(Error::Internal(anyhow::anyhow!(
                "run {run_id} holds a malformed buffered effect ({kind} {op} {name:?})"
            )));
        }
    }
    Ok(())
}

/// At discard (and after applying): forgets the run's buffered writes. Answers
/// how many there were.
pub(super) async fn drop_state_effects(tx: &mut impl AsHandle, run_id: &str) -> Result<u64> {
    Ok(
        sql!(*tx, c => query("DELETE FROM run_effects WHERE run_id = ?")
        .bind(run_id)
        .execute(c)
        .await?
        .rows_affected()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, bytes: i64, at: i64) -> Effect {
        Effect {
            name: name.into(),
            set: Some(SetPayload {
                payload: String::new(),
                content_kind: Some("json".into()),
                bytes,
            }),
            created_at: at,
        }
    }

    fn delete(name: &str, at: i64) -> Effect {
        Effect {
            name: name.into(),
            set: None,
            created_at: at,
        }
    }

    fn base(at: i64) -> ResourceSummary {
        ResourceSummary {
            name: "r".into(),
            kind: "text".into(),
            bytes: 1,
            created_at: at,
            updated_at: at,
        }
    }

    /// Folding must agree with what the commit's upserts and deletes produce.
    #[test]
    fn folding_matches_applying_in_order() {
        let replaced = fold_summary(Some(base(1)), &set("r", 5, 10)).unwrap();
        assert_eq!((replaced.created_at, replaced.updated_at), (1, 10));
        assert_eq!((replaced.kind.as_str(), replaced.bytes), ("json", 5));

        let created = fold_summary(None, &set("r", 2, 10)).unwrap();
        assert_eq!((created.created_at, created.updated_at), (10, 10));

        let ops = [delete("r", 10), set("r", 3, 20), set("r", 4, 30)];
        let recreated = fold_summaries(Some(base(1)), &ops).unwrap();
        assert_eq!((recreated.created_at, recreated.updated_at), (20, 30));
        assert!(fold_summary(Some(base(1)), &delete("r", 10)).is_none());
    }
}
