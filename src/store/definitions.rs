//! Custom tool definitions, scoped to an account.

use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
use super::page_bytes::{row_bytes, take_within};
use crate::domain::definition::{DefinitionSource, HandlerType, ScriptHandler, ToolDefinition};
use crate::domain::tool::{SideEffectLevel, Slot};
use crate::domain::{Page, PageRequest};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{new_id, now_ms};

/// Filters of `GET /tools/definitions`; `None` matches everything.
#[derive(Debug, Clone, Default)]
pub struct DefinitionFilter {
    pub source: Option<DefinitionSource>,
    pub source_id: Option<String>,
    pub enabled: Option<bool>,
}

const COLUMNS: &str = "id, account_id, name, description, parameters_json, side_effect_level, \
    allowed_slots_json, source, source_id, enabled, handler_type, handler_json, created_at, updated_at";

fn corrupt(column: &str, err: impl std::fmt::Display) -> Error {
    Error::Internal(anyhow::anyhow!(
        "stored tool definition has an unreadable {column}: {err}"
    ))
}

fn from_row(row: &impl Record) -> Result<ToolDefinition> {
    let text = |column: &'static str| -> String { row.get(column) };
    let json = |column: &'static str| -> Result<serde_json::Value> {
        serde_json::from_str(&text(column)).map_err(|err| corrupt(column, err))
    };
    let side_effect_level: SideEffectLevel =
        serde_json::from_value(serde_json::Value::String(text("side_effect_level")))
            .map_err(|err| corrupt("side_effect_level", err))?;
    let allowed_slots: Vec<Slot> = serde_json::from_value(json("allowed_slots_json")?)
        .map_err(|err| corrupt("allowed_slots_json", err))?;
    let source = DefinitionSource::parse(&text("source")).map_err(|err| corrupt("source", err))?;
    let handler_type: Option<String> = row.get("handler_type");
    let handler_type = match handler_type.as_deref() {
        None => None,
        Some("script") => Some(HandlerType::Script),
        Some(other) => return Err(corrupt("handler_type", other)),
    };
    let handler: Option<String> = row.get("handler_json");
    let handler = match handler {
        None => None,
        Some(raw) => Some(
            serde_json::from_str::<ScriptHandler>(&raw)
                .map_err(|err| corrupt("handler_json", err))?,
        ),
    };
    Ok(ToolDefinition {
        validator: Default::default(),
        id: row.get("id"),
        account_id: row.get("account_id"),
        name: row.get("name"),
        description: row.get("description"),
        parameters: std::sync::Arc::new(json("parameters_json")?),
        side_effect_level,
        allowed_slots,
        source,
        source_id: row.get("source_id"),
        enabled: row.get::<i64>("enabled") != 0,
        handler_type,
        handler,
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    })
}

fn conflict(definition: &ToolDefinition) -> Error {
    Error::Refused {
        code: crate::error::ErrorCode::ToolDefinitionConflict,
        message: format!(
            "this account already has a tool definition named {:?} with source {} and source_id {}",
            definition.name,
            definition.source.as_str(),
            match &definition.source_id {
                Some(id) => format!("{id:?}"),
                None => "null".to_owned(),
            }
        ),
    }
}

fn level_text(level: SideEffectLevel) -> String {
    match serde_json::to_value(level) {
        Ok(serde_json::Value::String(text)) => text,
        _ => "none".to_owned(),
    }
}

fn slots_json(slots: &[Slot]) -> String {
    serde_json::Value::Array(
        slots
            .iter()
            .map(|slot| serde_json::Value::String(slot.as_str().to_owned()))
            .collect(),
    )
    .to_string()
}

fn handler_json(definition: &ToolDefinition) -> Option<String> {
    definition
        .handler
        .as_ref()
        .map(|handler| serde_json::json!(handler).to_string())
}

/// Binds the values of the conditions `list_definitions` put in its WHERE clause,
/// in the same order, on either backend's query.
macro_rules! bind_filters {
    ($query:expr, $account_id:expr, $filter:expr) => {{
        let filter: &DefinitionFilter = $filter;
        let mut query = $query.bind($account_id.to_owned());
        if let Some(source) = filter.source {
            query = query.bind(source.as_str());
        }
        if let Some(source_id) = &filter.source_id {
            query = query.bind(source_id.clone());
        }
        if let Some(enabled) = filter.enabled {
            query = query.bind(enabled as i64);
        }
        query
    }};
}

/// Most tool definitions one account holds: every one is offered in its
/// characters' catalogs (each up to 64 KiB of schema, 16 KiB of description
/// and 64 KiB of script), and model providers take far fewer tools a request.
pub const MAX_DEFINITIONS_PER_ACCOUNT: i64 = 256;

impl Store {
    /// Stores a new definition for `account_id`, giving it an id and timestamps;
    /// refused past [`MAX_DEFINITIONS_PER_ACCOUNT`].
    pub async fn create_definition(
        &self,
        account_id: &str,
        mut definition: ToolDefinition,
    ) -> Result<ToolDefinition> {
        let now = now_ms();
        definition.id = new_id("tooldef");
        definition.account_id = account_id.to_owned();
        definition.created_at = now;
        definition.updated_at = now;
        // Counted and inserted in one write transaction: two creates at the
        // cap cannot both pass it.
        let mut tx = self.begin_write().await?;
        let held = sql!(tx, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM tool_definitions WHERE account_id = ?",
        )
        .bind(account_id)
        .fetch_one(c)
        .await?);
        if held >= MAX_DEFINITIONS_PER_ACCOUNT {
            return Err(Error::refused(
                ErrorCode::LimitExceeded,
                format!(
                    "the account holds {held} tool definitions, the most it may (MAX_DEFINITIONS_PER_ACCOUNT = {MAX_DEFINITIONS_PER_ACCOUNT}); delete some first"
                ),
            ));
        }
        let result = sql!(tx, c => query(AssertSqlSafe(format!(
            "INSERT INTO tool_definitions ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )))
        .bind(&definition.id)
        .bind(&definition.account_id)
        .bind(&definition.name)
        .bind(&definition.description)
        .bind(definition.parameters.to_string())
        .bind(level_text(definition.side_effect_level))
        .bind(slots_json(&definition.allowed_slots))
        .bind(definition.source.as_str())
        .bind(&definition.source_id)
        .bind(definition.enabled as i64)
        .bind(definition.handler_type.map(HandlerType::as_str))
        .bind(handler_json(&definition))
        .bind(definition.created_at)
        .bind(definition.updated_at)
        .execute(c)
        .await
        .map(|_| ()));
        let result = match result {
            Ok(()) => tx.commit().await,
            Err(err) => Err(err),
        };
        self.definitions_changed(account_id).await;
        match result {
            Ok(_) => Ok(definition),
            Err(err) if super::is_unique_violation(&err) => Err(conflict(&definition)),
            Err(err) => Err(err.into()),
        }
    }

    /// The account's definition with that id; another account's is "not found".
    pub async fn definition(&self, account_id: &str, id: &str) -> Result<ToolDefinition> {
        let sql = format!("SELECT {COLUMNS} FROM tool_definitions WHERE id = ? AND account_id = ?");
        sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        .unwrap_or_else(|| Err(Error::not_found(format!("tool definition {id:?}"))))
    }

    /// One page of the account's definitions matching `filter`.
    pub async fn list_definitions(
        &self,
        account_id: &str,
        filter: &DefinitionFilter,
        page: PageRequest,
    ) -> Result<Page<ToolDefinition>> {
        let mut conditions = vec!["account_id = ?"];
        if filter.source.is_some() {
            conditions.push("source = ?");
        }
        if filter.source_id.is_some() {
            conditions.push("source_id = ?");
        }
        if filter.enabled.is_some() {
            conditions.push("enabled = ?");
        }
        let where_clause = conditions.join(" AND ");
        let count_sql =
            format!("SELECT COUNT(*) AS total FROM tool_definitions WHERE {where_clause}");
        let total = sql!(self.conn().await?, c => {
            bind_filters!(query(AssertSqlSafe(count_sql)), account_id, filter)
                .fetch_one(c)
                .await?
                .get::<i64>("total")
        });
        // sort_by comes from a closed list validated by PageRequest, never from input.
        let order = page.sort_order.sql();
        // A definition's size is its texts' (a schema may be 256 KiB): the
        // page ends early past `MAX_PAGE_BYTES`, `has_more` true.
        let sql = format!(
            "SELECT {COLUMNS}, CAST(octet_length(description) + octet_length(parameters_json) \
             + COALESCE(octet_length(handler_json), 0) AS BIGINT) AS definition_bytes \
             FROM tool_definitions WHERE {where_clause} ORDER BY {} {order}, id {order} LIMIT ? OFFSET ?",
            page.sort_by
        );
        let (definitions, _) = sql!(self.conn().await?, c => {
            take_within(
                bind_filters!(query(AssertSqlSafe(sql)), account_id, filter)
                    .bind(page.limit)
                    .bind(page.offset)
                    .fetch(c),
                |row| (from_row(&row), row_bytes(&row, "definition_bytes")),
            )
            .await?
        });
        let definitions = definitions.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(Page::new(definitions, total, page))
    }

    /// The account's enabled definitions if they are cached, without reading
    /// the database: what a caller that cannot wait for a read may use.
    pub fn cached_enabled_definitions(
        &self,
        account_id: &str,
    ) -> Option<std::sync::Arc<Vec<ToolDefinition>>> {
        self.definition_cache.get(account_id)
    }

    /// Every enabled definition of the account, by name: what its sessions see.
    pub async fn enabled_definitions(
        &self,
        account_id: &str,
    ) -> Result<std::sync::Arc<Vec<ToolDefinition>>> {
        if let Some(cached) = self.cached_enabled_definitions(account_id) {
            return Ok(cached);
        }
        let generation = self.definition_cache.generation();
        let sql = format!(
            "SELECT {COLUMNS} FROM tool_definitions WHERE account_id = ? AND enabled = 1 ORDER BY name, id"
        );
        let definitions = sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(account_id)
            .fetch_all(c)
            .await?
            .iter()
            .map(from_row)
            .collect::<Result<Vec<_>>>())?;
        let definitions = std::sync::Arc::new(definitions);
        self.definition_cache
            .put(account_id, generation, definitions.clone());
        Ok(definitions)
    }

    /// Replaces the account's definition `id` with what `change` computes from the
    /// stored one, bumping `updated_at`, and returns the row as it found it
    /// and what was stored (the catalogs' change is judged on both). The
    /// transaction takes the write lock before reading (`begin_write`) and
    /// `change` cannot await, so two concurrent updates (a PATCH of one field and
    /// a toggle, say) cannot lose one another's change: the later one merges into
    /// what the earlier one wrote. `change` does the merging and every check; its
    /// error aborts the transaction with nothing written.
    pub async fn update_definition(
        &self,
        account_id: &str,
        id: &str,
        change: impl FnOnce(&ToolDefinition) -> Result<ToolDefinition>,
    ) -> Result<(ToolDefinition, ToolDefinition)> {
        let mut tx = self.begin_write().await?;
        let sql = format!("SELECT {COLUMNS} FROM tool_definitions WHERE id = ? AND account_id = ?");
        let existing = match sql!(tx, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        {
            Some(read) => read?,
            None => return Err(Error::not_found(format!("tool definition {id:?}"))),
        };
        let mut definition = change(&existing)?;
        // `change` decides the client-settable fields only.
        definition.id = existing.id.clone();
        definition.account_id = existing.account_id.clone();
        definition.created_at = existing.created_at;
        definition.updated_at = now_ms().max(existing.updated_at);
        // Holding the write lock since the read, the row is still there.
        let result = sql!(tx, c => query(
            "UPDATE tool_definitions SET name = ?, description = ?, parameters_json = ?, side_effect_level = ?, \
             allowed_slots_json = ?, source = ?, source_id = ?, enabled = ?, handler_type = ?, handler_json = ?, \
             updated_at = ? WHERE id = ? AND account_id = ?",
        )
        .bind(&definition.name)
        .bind(&definition.description)
        .bind(definition.parameters.to_string())
        .bind(level_text(definition.side_effect_level))
        .bind(slots_json(&definition.allowed_slots))
        .bind(definition.source.as_str())
        .bind(&definition.source_id)
        .bind(definition.enabled as i64)
        .bind(definition.handler_type.map(HandlerType::as_str))
        .bind(handler_json(&definition))
        .bind(definition.updated_at)
        .bind(&definition.id)
        .bind(&definition.account_id)
        .execute(c)
        .await
        .map(|_| ()));
        match result {
            Ok(_) => {}
            // Dropping `tx` rolls back; nothing changed, so the cache stays valid.
            Err(err) if super::is_unique_violation(&err) => return Err(conflict(&definition)),
            Err(err) => return Err(err.into()),
        }
        let committed = tx.commit().await;
        // After the commit (even a failed one, whose outcome is unknown): a reader
        // that read the old rows before this point is refused by the generation
        // guard, and one that reads after it sees the new rows.
        self.definitions_changed(account_id).await;
        committed?;
        Ok((existing, definition))
    }

    /// Deletes the account's definition with that id.
    pub async fn delete_definition(&self, account_id: &str, id: &str) -> Result<()> {
        let deleted = sql!(self.conn().await?, c => query(
            "DELETE FROM tool_definitions WHERE id = ? AND account_id = ?",
        )
        .bind(id)
        .bind(account_id)
        .execute(c)
        .await?
        .rows_affected());
        self.definitions_changed(account_id).await;
        if deleted == 0 {
            return Err(Error::not_found(format!("tool definition {id:?}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::definition::{self, DefinitionChanges};

    async fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        for account in ["acct_a", "acct_b"] {
            sql!(store.conn().await.unwrap(), c => query(
                "INSERT INTO accounts (id, name, api_key_hash, created_at) VALUES (?, ?, ?, 0)",
            )
            .bind(account)
            .bind(account)
            .bind(format!("hash_{account}"))
            .execute(c)
            .await
            .map(|_| ())
            .unwrap());
        }
        (store, dir)
    }

    fn def(name: &str, source_id: Option<&str>) -> ToolDefinition {
        definition::create(DefinitionChanges {
            name: Some(name.into()),
            source_id: Some(source_id.map(str::to_owned)),
            ..Default::default()
        })
        .unwrap()
    }

    #[tokio::test]
    async fn identity_counts_null_source_id_as_a_value() {
        let (store, _dir) = store().await;
        store
            .create_definition("acct_a", def("t", None))
            .await
            .unwrap();
        let err = store
            .create_definition("acct_a", def("t", None))
            .await
            .unwrap_err();
        assert_eq!(err.code().as_str(), "tool_definition_conflict");
        // The store itself keeps '' apart from NULL even though the API refuses ''.
        let mut empty = def("t", Some("x"));
        empty.source_id = Some(String::new());
        store
            .create_definition("acct_a", empty.clone())
            .await
            .unwrap();
        assert!(store.create_definition("acct_a", empty).await.is_err());
        store
            .create_definition("acct_a", def("t", Some("x")))
            .await
            .unwrap();
        store
            .create_definition("acct_b", def("t", None))
            .await
            .unwrap();
        let mut other_source = def("t", None);
        other_source.source = DefinitionSource::Preset;
        store
            .create_definition("acct_a", other_source)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn round_trips_every_field() {
        let (store, _dir) = store().await;
        let mut input = def("lookup", Some("char_1"));
        input.allowed_slots = vec![Slot::Narrator, Slot::Director];
        input.side_effect_level = SideEffectLevel::Sandbox;
        input.handler_type = Some(HandlerType::Script);
        input.handler = Some(ScriptHandler {
            script: Some("return 1;".into()),
        });
        input.enabled = false;
        let created = store.create_definition("acct_a", input).await.unwrap();
        let read = store.definition("acct_a", &created.id).await.unwrap();
        assert_eq!(read, created);
        assert_eq!(
            store
                .definition("acct_b", &created.id)
                .await
                .unwrap_err()
                .code(),
            crate::error::ErrorCode::NotFound
        );
        assert!(
            store
                .enabled_definitions("acct_a")
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_refused_update_writes_nothing_and_releases_the_lock() {
        let (store, _dir) = store().await;
        store
            .create_definition("acct_a", def("taken", None))
            .await
            .unwrap();
        let created = store
            .create_definition("acct_a", def("t", None))
            .await
            .unwrap();
        // Read into the cache, so that a missed invalidation would show.
        assert_eq!(store.enabled_definitions("acct_a").await.unwrap().len(), 2);
        let refused = store
            .update_definition("acct_a", &created.id, |_| Err(Error::validation("no")))
            .await
            .unwrap_err();
        assert_eq!(refused.code().as_str(), "validation_error");
        let conflict = store
            .update_definition("acct_a", &created.id, |existing| {
                Ok(ToolDefinition {
                    name: "taken".into(),
                    ..existing.clone()
                })
            })
            .await
            .unwrap_err();
        assert_eq!(conflict.code().as_str(), "tool_definition_conflict");
        assert_eq!(
            store
                .update_definition("acct_b", &created.id, |existing| Ok(existing.clone()))
                .await
                .unwrap_err()
                .code(),
            crate::error::ErrorCode::NotFound
        );
        assert_eq!(
            store.definition("acct_a", &created.id).await.unwrap(),
            created
        );
        // Rolled back rather than left holding the write lock: the next write goes through.
        let (before, disabled) = store
            .update_definition("acct_a", &created.id, |existing| {
                Ok(ToolDefinition {
                    enabled: false,
                    ..existing.clone()
                })
            })
            .await
            .unwrap();
        assert_eq!(before, created, "the row as the write found it");
        assert!(!disabled.enabled);
        assert_eq!(disabled.created_at, created.created_at);
        let enabled = store.enabled_definitions("acct_a").await.unwrap();
        assert_eq!(enabled.len(), 1);
        assert_eq!(enabled[0].name, "taken");
    }
}
