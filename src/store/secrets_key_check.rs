//! Which secrets key the database's secrets are sealed with: a known value
//! sealed by the first start that found none, opened by every start after it.
//!
//! Without it, an instance started without the shared `TOOLGATE_SECRETS_KEY`
//! (or whose data directory's key file was lost or replaced) starts with a key
//! of its own: it cannot open the others' secrets, and the ones it seals the
//! others cannot open. The check refuses such a start instead.

use anyhow::Context;

use super::Store;
use super::backend::sql;
use crate::ids::now_ms;

/// Whose sealed value the check is (sealing binds it, as a server's id does).
const OWNER: &str = "toolgate:secrets-key-check";
const PLAINTEXT: &[u8] = b"toolgate secrets key check 1";
/// How many stored servers' secrets a database from before the check is
/// judged by: one of them opening is enough.
const SAMPLED_SERVERS: i64 = 32;

/// The start's secrets key does not open what the database was sealed with.
#[derive(Debug, thiserror::Error)]
#[error(
    "this secrets key does not open the secrets stored in the database (another instance, or an \
     earlier start, sealed them with a different key): start with that key (TOOLGATE_SECRETS_KEY, \
     or the secrets-key file of the data directory it was generated into); if it is lost, stop \
     every instance and run `toolgate forget-secrets`, which drops the stored secrets so that a \
     new key can take over"
)]
pub struct SecretsKeyMismatch;

impl Store {
    /// Opens the database's key check with this store's key, writing it
    /// when there is none. A key that does not open it, or that opens none of
    /// the secrets a database from before the check holds, is
    /// [`SecretsKeyMismatch`]. A check that does not open while this key opens
    /// a stored secret was damaged: it is written again (logged).
    ///
    /// One write transaction: two instances starting at once on a new
    /// database write one check and the other is judged by it, and
    /// `forget-secrets` cannot drop the check between this read and this
    /// start's use of its key.
    pub async fn check_secrets_key(&self) -> anyhow::Result<()> {
        let mut tx = self.begin_write().await?;
        let stored = sql!(tx, c => query_scalar::<Vec<u8>>(
            "SELECT sealed FROM secrets_key_check WHERE id = 1",
        )
        .fetch_optional(c)
        .await)
        .context("reading the secrets key check")?;
        if stored
            .as_deref()
            .is_some_and(|sealed| self.opens_key_check(sealed))
        {
            return Ok(());
        }
        let sampled = sql!(tx, c => query_as::<(String, Vec<u8>)>(
            "SELECT id, secrets FROM mcp_servers WHERE secrets IS NOT NULL ORDER BY id LIMIT ?",
        )
        .bind(SAMPLED_SERVERS)
        .fetch_all(c)
        .await)
        .context("reading stored MCP secrets")?;
        let opens_a_secret = sampled
            .iter()
            .any(|(id, sealed)| self.secrets.open(id, sealed).is_ok());
        // Without a secret to judge by, a check that does not open is another
        // key's: refused, whatever could have damaged it.
        if !opens_a_secret && (stored.is_some() || !sampled.is_empty()) {
            return Err(SecretsKeyMismatch.into());
        }
        if stored.is_some() {
            tracing::warn!(
                "the database's secrets key check did not open although this key opens stored secrets; it was damaged and is written again"
            );
        }
        let sealed = self.secrets.seal(OWNER, PLAINTEXT)?;
        sql!(tx, c => query(
            "INSERT INTO secrets_key_check (id, sealed, created_at) VALUES (1, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET sealed = excluded.sealed, created_at = excluded.created_at",
        )
        .bind(sealed)
        .bind(now_ms())
        .execute(c)
        .await
        .map(drop))
        .context("writing the secrets key check")?;
        tx.commit().await?;
        Ok(())
    }

    fn opens_key_check(&self, sealed: &[u8]) -> bool {
        self.secrets
            .open(OWNER, sealed)
            .is_ok_and(|plain| plain == PLAINTEXT)
    }
}

/// An MCP server whose sealed secrets [`Store::forget_secrets`] dropped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ForgottenServer {
    pub id: String,
    pub account_id: String,
    pub name: String,
}

impl Store {
    /// Drops every stored secret and the key check, so that the next start's
    /// key takes over: the servers that had secrets keep their configuration
    /// without them and are disabled (an enabled one would connect without
    /// its credentials). Refused while another instance is alive on the
    /// database: it would go on sealing with the old key. One transaction.
    pub async fn forget_secrets(&self) -> anyhow::Result<Vec<ForgottenServer>> {
        let mut tx = self.begin_write().await?;
        let live = sql!(tx, c => query_scalar::<String>(
            "SELECT id FROM toolgate_instances WHERE id <> ?1 AND heartbeat_at >= ?2 \
             AND (?3 IS NULL OR id <> ?3) ORDER BY id",
        )
        .bind(self.instance_id())
        .bind(now_ms() - super::cluster::STALE_AFTER_MS)
        .bind(self.previous_instance())
        .fetch_all(c)
        .await)
        .context("reading the live instances")?;
        anyhow::ensure!(
            live.is_empty(),
            "{} other instance(s) are running on this database ({}); stop them first, or wait {} s after they stopped",
            live.len(),
            live.join(", "),
            super::cluster::STALE_AFTER_MS / 1000
        );
        let forgotten = sql!(tx, c => query_as::<(String, String, String)>(
            "SELECT id, account_id, name FROM mcp_servers WHERE secrets IS NOT NULL \
             ORDER BY account_id, name",
        )
        .fetch_all(c)
        .await)
        .context("reading the servers with secrets")?;
        sql!(tx, c => query(
            "UPDATE mcp_servers SET secrets = NULL, enabled = 0, updated_at = ? \
             WHERE secrets IS NOT NULL",
        )
        .bind(now_ms())
        .execute(c)
        .await
        .map(drop))
        .context("dropping the stored secrets")?;
        sql!(tx, c => query("DELETE FROM secrets_key_check").execute(c).await.map(drop))
            .context("dropping the secrets key check")?;
        tx.commit().await?;
        Ok(forgotten
            .into_iter()
            .map(|(id, account_id, name)| ForgottenServer {
                id,
                account_id,
                name,
            })
            .collect())
    }
}
