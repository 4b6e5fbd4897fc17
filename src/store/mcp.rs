//! MCP server configurations, scoped to an account, and the last tool list of
//! each server. The secret map (stdio `env` / http `headers`) is sealed with
//! the store's secrets key, bound to the server id, before it is written; the
//! rest of the configuration is stored as JSON in clear. A sealed map the key
//! cannot open (the key changed) never fails a read: the server comes back
//! with the map empty and `secrets_error` set, and its ciphertext stays as it
//! is until new secrets are written, so restoring the key restores them.

use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
use crate::domain::mcp::{McpServer, McpServerConfig};
use crate::domain::{Page, PageRequest};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::{new_id, now_ms};

/// Filters of `GET /mcp/servers`; `None` matches everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct McpServerFilter {
    pub enabled: Option<bool>,
}

/// The tool list a server last answered, as the MCP runtime stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpSnapshot {
    pub server_id: String,
    pub tools: serde_json::Value,
    pub snapshot_at: i64,
}

const COLUMNS: &str = "id, account_id, name, enabled, config_json, secrets, created_at, updated_at";

/// What `secrets_error` says when the key cannot open a server's secrets.
const UNREADABLE: &str = "the stored secrets (stdio.env / http.headers) of this server cannot be decrypted with the current secrets key (TOOLGATE_SECRETS_KEY or <data-dir>/secrets-key changed); restore that key, or send the env / headers again";

fn corrupt(column: &str, err: impl std::fmt::Display) -> Error {
    Error::Internal(anyhow::anyhow!(
        "stored MCP server has an unreadable {column}: {err}"
    ))
}

fn conflict(name: &str) -> Error {
    Error::refused(
        ErrorCode::McpServerConflict,
        format!("this account already has an MCP server named {name:?}"),
    )
}

fn not_found(id: &str) -> Error {
    Error::not_found(format!("MCP server {id:?}"))
}

/// A stored row as read, with its sealed secrets kept apart.
struct StoredServer {
    server: McpServer,
    sealed: Option<Vec<u8>>,
}

/// Most MCP servers one account holds: each enabled one is a connection (a
/// child process for stdio) this server keeps open and refreshes.
pub const MAX_MCP_SERVERS_PER_ACCOUNT: i64 = 64;

impl Store {
    fn server_from_row(&self, row: &impl Record) -> Result<StoredServer> {
        let id: String = row.get("id");
        let raw: String = row.get("config_json");
        let mut config: McpServerConfig =
            serde_json::from_str(&raw).map_err(|err| corrupt("config_json", err))?;
        // The columns are what uniqueness and filters use: they win.
        config.name = row.get("name");
        config.enabled = row.get::<i64>("enabled") != 0;
        let sealed: Option<Vec<u8>> = row.get("secrets");
        let mut secrets_error = None;
        if let Some(sealed) = &sealed {
            match self.secrets.open(&id, sealed) {
                Ok(plain) => {
                    *config.secrets_mut() =
                        serde_json::from_slice(&plain).map_err(|err| corrupt("secrets", err))?;
                }
                Err(_) => secrets_error = Some(UNREADABLE.to_owned()),
            }
        }
        Ok(StoredServer {
            server: McpServer {
                id,
                account_id: row.get("account_id"),
                config,
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
                secrets_error,
            },
            sealed,
        })
    }

    fn servers_from_rows(&self, rows: &[impl Record]) -> Result<Vec<McpServer>> {
        rows.iter()
            .map(|row| self.server_from_row(row).map(|read| read.server))
            .collect()
    }

    /// The sealed form of `config`'s secret map for server `id`; None when empty.
    fn seal_secrets(&self, id: &str, config: &McpServerConfig) -> Result<Option<Vec<u8>>> {
        let secrets = config.secrets();
        if secrets.is_empty() {
            return Ok(None);
        }
        let plain = serde_json::to_vec(secrets).map_err(|err| Error::Internal(err.into()))?;
        Ok(Some(self.secrets.seal(id, &plain)?))
    }

    /// Stores a new server for `account_id`, giving it an id and timestamps.
    /// A name the account already uses is refused (`mcp_server_conflict`), and
    /// one past [`MAX_MCP_SERVERS_PER_ACCOUNT`] (`limit_exceeded`).
    pub async fn create_mcp_server(
        &self,
        account_id: &str,
        config: &McpServerConfig,
    ) -> Result<McpServer> {
        let now = now_ms();
        let server = McpServer {
            id: new_id("mcp"),
            account_id: account_id.to_owned(),
            config: config.clone(),
            created_at: now,
            updated_at: now,
            secrets_error: None,
        };
        let sealed = self.seal_secrets(&server.id, config)?;
        let public = serde_json::to_string(&config.without_secrets())
            .map_err(|err| Error::Internal(err.into()))?;
        // Counted and inserted by one statement under the write lock: two
        // creates at the cap cannot both pass it.
        let mut tx = self.begin_write().await?;
        let result = sql!(tx, c => query(AssertSqlSafe(format!(
            "INSERT INTO mcp_servers ({COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM mcp_servers WHERE account_id = ?) < ?"
        )))
        .bind(&server.id)
        .bind(account_id)
        .bind(&config.name)
        .bind(config.enabled as i64)
        .bind(public)
        .bind(sealed)
        .bind(now)
        .bind(now)
        .bind(account_id)
        .bind(MAX_MCP_SERVERS_PER_ACCOUNT)
        .execute(c)
        .await
        .map(|done| done.rows_affected()));
        let result = match result {
            Ok(inserted) => tx.commit().await.map(|()| inserted),
            Err(err) => Err(err),
        };
        match result {
            Ok(0) => Err(Error::refused(
                crate::error::ErrorCode::LimitExceeded,
                format!(
                    "the account holds {MAX_MCP_SERVERS_PER_ACCOUNT} MCP servers, the most it may (MAX_MCP_SERVERS_PER_ACCOUNT); delete some first"
                ),
            )),
            Ok(_) => Ok(server),
            Err(err) if super::is_unique_violation(&err) => Err(conflict(&config.name)),
            Err(err) => Err(err.into()),
        }
    }

    /// The account's server with that id; another account's is "not found".
    pub async fn mcp_server(&self, account_id: &str, id: &str) -> Result<McpServer> {
        let sql = format!("SELECT {COLUMNS} FROM mcp_servers WHERE id = ? AND account_id = ?");
        match sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(|row| self.server_from_row(row)))
        {
            Some(read) => Ok(read?.server),
            None => Err(not_found(id)),
        }
    }

    /// One page of the account's servers matching `filter`, sorted by
    /// `page.sort_by` (`created_at` or `name`; ties by id).
    pub async fn list_mcp_servers(
        &self,
        account_id: &str,
        filter: McpServerFilter,
        page: PageRequest,
    ) -> Result<Page<McpServer>> {
        let where_clause = match filter.enabled {
            Some(_) => "account_id = ? AND enabled = ?",
            None => "account_id = ?",
        };
        let count_sql = format!("SELECT COUNT(*) AS total FROM mcp_servers WHERE {where_clause}");
        let total = sql!(self.conn().await?, c => {
            let mut count = query(AssertSqlSafe(count_sql)).bind(account_id);
            if let Some(enabled) = filter.enabled {
                count = count.bind(enabled as i64);
            }
            count.fetch_one(c).await?.get::<i64>("total")
        });
        // Both come from closed lists (PageRequest and SortOrder), never from input.
        let sort = match page.sort_by {
            "name" => "name",
            _ => "created_at",
        };
        let order = page.sort_order.sql();
        let sql = format!(
            "SELECT {COLUMNS} FROM mcp_servers WHERE {where_clause} \
             ORDER BY {sort} {order}, id {order} LIMIT ? OFFSET ?"
        );
        let servers = sql!(self.conn().await?, c => {
            let mut select = query(AssertSqlSafe(sql)).bind(account_id);
            if let Some(enabled) = filter.enabled {
                select = select.bind(enabled as i64);
            }
            let rows = select
                .bind(page.limit)
                .bind(page.offset)
                .fetch_all(c)
                .await?;
            self.servers_from_rows(&rows)?
        });
        Ok(Page::new(servers, total, page))
    }

    /// Every enabled server of every account, oldest first: what start-up connects.
    pub async fn enabled_mcp_servers(&self) -> Result<Vec<McpServer>> {
        let sql =
            format!("SELECT {COLUMNS} FROM mcp_servers WHERE enabled = 1 ORDER BY created_at, id");
        sql!(self.conn().await?, c => self.servers_from_rows(
            &query(AssertSqlSafe(sql)).fetch_all(c).await?,
        ))
    }

    /// Replaces the account's server `id` with what `change` computes from the
    /// stored one, bumping `updated_at`, and returns what was stored. The
    /// transaction takes the write lock before reading (`begin_write`) and
    /// `change` cannot await, so a PATCH and a toggle racing each other merge
    /// into one another's result instead of losing a change. `change` does the
    /// merging and every check; its error writes nothing.
    ///
    /// Secrets: when `change` leaves `secrets_error` set (it wrote no new
    /// env / headers over unreadable ones), the stored ciphertext is kept as
    /// it is; otherwise the map `change` returned is sealed anew.
    pub async fn update_mcp_server(
        &self,
        account_id: &str,
        id: &str,
        change: impl FnOnce(&McpServer) -> Result<McpServer>,
    ) -> Result<McpServer> {
        let mut tx = self.begin_write().await?;
        let sql = format!("SELECT {COLUMNS} FROM mcp_servers WHERE id = ? AND account_id = ?");
        let existing = match sql!(tx, c => query(AssertSqlSafe(sql))
            .bind(id)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(|row| self.server_from_row(row)))
        {
            Some(read) => read?,
            None => return Err(not_found(id)),
        };
        let mut server = change(&existing.server)?;
        // `change` decides the configuration only.
        server.id = existing.server.id.clone();
        server.account_id = existing.server.account_id.clone();
        server.created_at = existing.server.created_at;
        server.updated_at = now_ms().max(existing.server.updated_at);
        let sealed = match &server.secrets_error {
            Some(_) => existing.sealed,
            None => self.seal_secrets(&server.id, &server.config)?,
        };
        if server.secrets_error.is_some() {
            // What is shown stays what was read: nothing, since it is unreadable.
            server.config.secrets_mut().clear();
        }
        let public = serde_json::to_string(&server.config.without_secrets())
            .map_err(|err| Error::Internal(err.into()))?;
        let result = sql!(tx, c => query(
            "UPDATE mcp_servers SET name = ?, enabled = ?, config_json = ?, secrets = ?, \
             updated_at = ? WHERE id = ? AND account_id = ?",
        )
        .bind(&server.config.name)
        .bind(server.config.enabled as i64)
        .bind(public)
        .bind(sealed)
        .bind(server.updated_at)
        .bind(&server.id)
        .bind(&server.account_id)
        .execute(c)
        .await
        .map(|_| ()));
        match result {
            Ok(_) => {}
            // Dropping `tx` rolls back.
            Err(err) if super::is_unique_violation(&err) => {
                return Err(conflict(&server.config.name));
            }
            Err(err) => return Err(err.into()),
        }
        tx.commit().await?;
        Ok(server)
    }

    /// Deletes the account's server with that id, and its snapshot with it.
    pub async fn delete_mcp_server(&self, account_id: &str, id: &str) -> Result<()> {
        let deleted = sql!(self.conn().await?, c => query(
            "DELETE FROM mcp_servers WHERE id = ? AND account_id = ?",
        )
        .bind(id)
        .bind(account_id)
        .execute(c)
        .await?
        .rows_affected());
        if deleted == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// Stores `tools` as the last tool list of `server_id`, replacing the one
    /// before. A server deleted meanwhile keeps no snapshot (nothing is written).
    pub async fn save_mcp_snapshot(
        &self,
        server_id: &str,
        tools: &serde_json::Value,
        snapshot_at: i64,
    ) -> Result<()> {
        sql!(self.conn().await?, c => query(
            "INSERT INTO mcp_tool_snapshots (server_id, tools_json, snapshot_at) \
             SELECT id, ?, ? FROM mcp_servers WHERE id = ? \
             ON CONFLICT (server_id) DO UPDATE SET tools_json = excluded.tools_json, \
             snapshot_at = excluded.snapshot_at",
        )
        .bind(tools.to_string())
        .bind(snapshot_at)
        .bind(server_id)
        .execute(c)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// Every stored snapshot (read at start-up, so a server that does not
    /// answer still offers its last tools).
    pub async fn mcp_snapshots(&self) -> Result<Vec<McpSnapshot>> {
        sql!(self.conn().await?, c => query(
            "SELECT server_id, tools_json, snapshot_at FROM mcp_tool_snapshots ORDER BY server_id",
        )
        .fetch_all(c)
        .await?
        .iter()
        .map(snapshot_from_row)
        .collect::<Result<Vec<_>>>())
    }
}

fn snapshot_from_row(row: &impl Record) -> Result<McpSnapshot> {
    let raw: String = row.get("tools_json");
    Ok(McpSnapshot {
        server_id: row.get("server_id"),
        tools: serde_json::from_str(&raw).map_err(|err| corrupt("tools_json", err))?,
        snapshot_at: row.get("snapshot_at"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::mcp_input::McpServerBody;
    use crate::secrets::SecretsKey;

    async fn store_with(dir: &std::path::Path, key: &SecretsKey) -> Store {
        let store = Store::open_with_secrets(None, dir, key.clone())
            .await
            .unwrap();
        for account in ["acct_a", "acct_b"] {
            sql!(store.conn().await.unwrap(), c => query(
                "INSERT INTO accounts (id, name, api_key_hash, created_at) VALUES (?, ?, ?, 0) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(account)
            .bind(account)
            .bind(format!("hash_{account}"))
            .execute(c)
            .await
            .map(|_| ())
            .unwrap());
        }
        store
    }

    fn config(body: serde_json::Value) -> McpServerConfig {
        serde_json::from_value::<McpServerBody>(body)
            .unwrap()
            .create()
            .unwrap()
    }

    fn with_env(name: &str) -> McpServerConfig {
        config(serde_json::json!({"name": name, "transport": "stdio",
            "stdio": {"command": "x", "env": {"TOKEN": "secret-value"}}}))
    }

    #[tokio::test]
    async fn concurrent_updates_of_different_fields_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let (key, _) = SecretsKey::generate().unwrap();
        let store = store_with(dir.path(), &key).await;
        let created = store
            .create_mcp_server("acct_a", &with_env("s"))
            .await
            .unwrap();
        let updates = (0..16u64).map(|i| {
            let store = store.clone();
            let id = created.id.clone();
            tokio::spawn(async move {
                store
                    .update_mcp_server("acct_a", &id, |existing| {
                        let mut server = existing.clone();
                        let overrides = &mut server.config.tool_overrides;
                        overrides.insert(format!("t{i}"), Default::default());
                        Ok(server)
                    })
                    .await
            })
        });
        for update in futures::future::join_all(updates).await {
            update.unwrap().unwrap();
        }
        let read = store.mcp_server("acct_a", &created.id).await.unwrap();
        assert_eq!(read.config.tool_overrides.len(), 16, "an update was lost");
        assert_eq!(read.secrets()["TOKEN"], "secret-value");
    }

    #[tokio::test]
    async fn unreadable_secrets_keep_their_ciphertext_until_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (old_key, _) = SecretsKey::generate().unwrap();
        let (new_key, _) = SecretsKey::generate().unwrap();
        let store = store_with(dir.path(), &old_key).await;
        let created = store
            .create_mcp_server("acct_a", &with_env("s"))
            .await
            .unwrap();
        store.close().await;

        let store = store_with(dir.path(), &new_key).await;
        let read = store.mcp_server("acct_a", &created.id).await.unwrap();
        assert!(read.secrets_error.is_some());
        assert!(read.secrets().is_empty());
        assert_eq!(store.enabled_mcp_servers().await.unwrap().len(), 1);
        let renamed = store
            .update_mcp_server("acct_a", &created.id, |existing| {
                let mut server = existing.clone();
                server.config.name = "renamed".into();
                Ok(server)
            })
            .await
            .unwrap();
        assert!(renamed.secrets_error.is_some());
        store.close().await;

        let store = store_with(dir.path(), &old_key).await;
        let read = store.mcp_server("acct_a", &created.id).await.unwrap();
        assert_eq!(read.secrets_error, None);
        assert_eq!(read.config.name, "renamed");
        assert_eq!(read.secrets()["TOKEN"], "secret-value");
    }

    #[tokio::test]
    async fn snapshots_replace_each_other_and_go_with_their_server() {
        let dir = tempfile::tempdir().unwrap();
        let (key, _) = SecretsKey::generate().unwrap();
        let store = store_with(dir.path(), &key).await;
        let a = store
            .create_mcp_server("acct_a", &with_env("a"))
            .await
            .unwrap();
        let b = store
            .create_mcp_server("acct_b", &with_env("a"))
            .await
            .unwrap();
        let tools = serde_json::json!([{"name": "read"}]);
        store.save_mcp_snapshot(&a.id, &tools, 1).await.unwrap();
        store
            .save_mcp_snapshot(&a.id, &serde_json::json!([]), 2)
            .await
            .unwrap();
        store.save_mcp_snapshot(&b.id, &tools, 3).await.unwrap();
        store
            .save_mcp_snapshot("mcp_gone", &tools, 4)
            .await
            .unwrap();
        let snapshots = store.mcp_snapshots().await.unwrap();
        let mut expected = vec![
            McpSnapshot {
                server_id: a.id.clone(),
                tools: serde_json::json!([]),
                snapshot_at: 2,
            },
            McpSnapshot {
                server_id: b.id.clone(),
                tools: tools.clone(),
                snapshot_at: 3,
            },
        ];
        expected.sort_by(|x, y| x.server_id.cmp(&y.server_id));
        assert_eq!(snapshots, expected);
        assert_eq!(
            store
                .delete_mcp_server("acct_b", &a.id)
                .await
                .unwrap_err()
                .code(),
            ErrorCode::NotFound
        );
        store.delete_mcp_server("acct_a", &a.id).await.unwrap();
        let left = store.mcp_snapshots().await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].server_id, b.id);
        let enabled = store.enabled_mcp_servers().await.unwrap();
        assert_eq!(enabled.iter().map(|s| &s.id).collect::<Vec<_>>(), [&b.id]);
    }
}
