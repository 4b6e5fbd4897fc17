//! Which secrets key the database's secrets are sealed with: a known value
//! sealed by the first start that found none, opened by every start after it.
//!
//! Without it, an instance started without the shared `TOOLGATE_SECRETS_KEY`
//! (or whose data directory's key file was lost or replaced) starts with a key
//! of its own: it cannot open the others' secrets, and the ones it seals the
//! others cannot open. The check refuses such a start instead.

use anyhow::Context;

use super::Store;
use super::backend::{AsHandle, sql};
use crate::ids::now_ms;
use crate::secrets::SecretsKey;

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

/// What the database holds to judge a key by: its check, and a sample of its
/// sealed secrets (which tell a damaged check, or a database from before the
/// check, from another key's).
#[derive(Clone)]
pub struct StoredKeyCheck {
    check: Option<Vec<u8>>,
    sampled: Vec<(String, Vec<u8>)>,
}

/// What a start with a given key does about the database's key check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyVerdict {
    /// The key opens the stored check.
    Opens,
    /// Nothing is sealed yet: the start writes the check with its key.
    WritesCheck,
    /// The stored check does not open but the key opens a stored secret: the
    /// check was damaged and the start writes it again.
    RewritesDamagedCheck,
    /// Another key sealed what the database holds: the start is refused.
    Mismatch,
}

impl KeyVerdict {
    /// Whether a start with the key goes on.
    pub fn accepted(self) -> bool {
        self != Self::Mismatch
    }
}

impl StoredKeyCheck {
    /// Reads the check and the sample on `conn` (in the caller's transaction
    /// when it is one). The sample is read even beside a check (a check that
    /// does not open is told from a damaged one by the secrets), unless
    /// `key`, when given, opens the check: then nothing else is needed.
    pub(crate) async fn read(
        conn: &mut impl AsHandle,
        key: Option<&SecretsKey>,
    ) -> anyhow::Result<Self> {
        let check = sql!(*conn, c => query_scalar::<Vec<u8>>(
            "SELECT sealed FROM secrets_key_check WHERE id = 1",
        )
        .fetch_optional(c)
        .await)
        .context("reading the secrets key check")?;
        if let (Some(sealed), Some(key)) = (&check, key)
            && opens(key, sealed)
        {
            return Ok(Self {
                check,
                sampled: Vec::new(),
            });
        }
        let sampled = sql!(*conn, c => query_as::<(String, Vec<u8>)>(
            "SELECT id, secrets FROM mcp_servers WHERE secrets IS NOT NULL ORDER BY id LIMIT ?",
        )
        .bind(SAMPLED_SERVERS)
        .fetch_all(c)
        .await)
        .context("reading stored MCP secrets")?;
        Ok(Self { check, sampled })
    }

    /// Whether the database holds a check at all.
    pub fn present(&self) -> bool {
        self.check.is_some()
    }

    /// What a start with `key` does.
    pub fn verdict(&self, key: &SecretsKey) -> KeyVerdict {
        if self
            .check
            .as_deref()
            .is_some_and(|sealed| opens(key, sealed))
        {
            return KeyVerdict::Opens;
        }
        let opens_a_secret = self
            .sampled
            .iter()
            .any(|(id, sealed)| key.open(id, sealed).is_ok());
        if opens_a_secret {
            return if self.present() {
                KeyVerdict::RewritesDamagedCheck
            } else {
                KeyVerdict::WritesCheck
            };
        }
        // Without a secret to judge by, a check that does not open is
        // another key's, whatever could have damaged it.
        if self.binds_a_key() {
            KeyVerdict::Mismatch
        } else {
            KeyVerdict::WritesCheck
        }
    }

    /// Whether the database holds a check or sealed secrets: a key of its
    /// own, which a start without the database's key would generate, is refused.
    pub fn binds_a_key(&self) -> bool {
        self.present() || !self.sampled.is_empty()
    }
}

impl std::fmt::Debug for StoredKeyCheck {
    // Sealed values stay out of reports and logs, though they are no secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredKeyCheck")
            .field("present", &self.present())
            .field("sampled_secrets", &self.sampled.len())
            .finish()
    }
}

fn opens(key: &SecretsKey, sealed: &[u8]) -> bool {
    key.open(OWNER, sealed)
        .is_ok_and(|plain| plain == PLAINTEXT)
}

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
        let stored = StoredKeyCheck::read(&mut tx, Some(&self.secrets)).await?;
        match stored.verdict(&self.secrets) {
            KeyVerdict::Opens => return Ok(()),
            KeyVerdict::Mismatch => return Err(SecretsKeyMismatch.into()),
            KeyVerdict::RewritesDamagedCheck => tracing::warn!(
                "the database's secrets key check did not open although this key opens stored secrets; it was damaged and is written again"
            ),
            KeyVerdict::WritesCheck => {}
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
            super::peers::LIVE_OTHER_INSTANCES_SQL
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretsKey {
        SecretsKey::generate().unwrap().0
    }

    fn stored(check: Option<&SecretsKey>, secrets: &[(&str, &SecretsKey)]) -> StoredKeyCheck {
        StoredKeyCheck {
            check: check.map(|key| key.seal(OWNER, PLAINTEXT).unwrap()),
            sampled: secrets
                .iter()
                .map(|(id, key)| ((*id).to_owned(), key.seal(id, b"{}").unwrap()))
                .collect(),
        }
    }

    #[test]
    fn a_key_is_judged_by_the_check_else_by_the_stored_secrets() {
        let (ours, theirs) = (key(), key());
        let verdict = |stored: StoredKeyCheck| stored.verdict(&ours);
        assert_eq!(verdict(stored(Some(&ours), &[])), KeyVerdict::Opens);
        assert_eq!(verdict(stored(None, &[])), KeyVerdict::WritesCheck);
        assert_eq!(
            verdict(stored(None, &[("a", &theirs), ("b", &ours)])),
            KeyVerdict::WritesCheck
        );
        assert_eq!(
            verdict(stored(None, &[("a", &theirs)])),
            KeyVerdict::Mismatch
        );
        assert_eq!(verdict(stored(Some(&theirs), &[])), KeyVerdict::Mismatch);
        assert_eq!(
            verdict(stored(Some(&theirs), &[("a", &theirs)])),
            KeyVerdict::Mismatch
        );
        // A check no key opens beside a secret this key opens was damaged.
        let mut damaged = stored(Some(&ours), &[("a", &ours)]);
        damaged.check = Some(b"not sealed".to_vec());
        assert_eq!(verdict(damaged), KeyVerdict::RewritesDamagedCheck);
        assert!(!stored(None, &[]).binds_a_key());
        assert!(stored(Some(&theirs), &[]).binds_a_key());
        let debug = format!("{:?}", stored(Some(&ours), &[("a", &ours)]));
        assert_eq!(
            debug,
            "StoredKeyCheck { present: true, sampled_secrets: 1 }"
        );
    }
}
