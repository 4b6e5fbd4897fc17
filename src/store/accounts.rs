//! Accounts (tenants) and their API keys, stored as SHA-256 hashes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Store;
use super::backend::{Record, sql};
use crate::error::{Error, Result};
use crate::fast_map::FastMap;
use crate::ids::{new_id, now_ms};
use rand::Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// A tenant. Its API key is never stored, only its hash.
#[derive(Debug, Clone, Serialize)]
pub struct Account {
    pub id: String,
    pub name: String,
    pub is_admin: bool,
    pub created_at: i64,
}

/// A freshly created account with the one copy of its API key.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub account: Account,
    pub api_key: String,
}

/// A fresh high-entropy API key.
pub fn generate_api_key() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    format!("tg_{}", hex::encode(bytes))
}

/// Keys are 256-bit random values, so a plain SHA-256 is enough: there is nothing
/// for a slow password hash to protect against brute force.
fn hash_key(api_key: &str) -> String {
    hex::encode(Sha256::digest(api_key.as_bytes()))
}

/// Recently authenticated accounts by key hash. Accounts are never deleted and
/// keys never change today; the TTL bounds how long a change made behind the
/// server's back (directly in the database) could go unnoticed.
#[derive(Debug, Default)]
pub(super) struct KeyCache {
    entries: Mutex<FastMap<String, (Account, Instant)>>,
}

impl KeyCache {
    const TTL: Duration = Duration::from_secs(30);
    const MAX_ENTRIES: usize = 10_000;

    fn lock(&self) -> std::sync::MutexGuard<'_, FastMap<String, (Account, Instant)>> {
        // Every update is a single insert or clear: a poisoned map is still whole.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, hash: &str) -> Option<Account> {
        let entries = self.lock();
        let (account, at) = entries.get(hash)?;
        (at.elapsed() < Self::TTL).then(|| account.clone())
    }

    /// Forgets every cached key (another instance changed accounts).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    fn insert(&self, hash: String, account: Account) {
        let mut entries = self.lock();
        if entries.len() >= Self::MAX_ENTRIES {
            entries.retain(|_, (_, at)| at.elapsed() < Self::TTL);
            if entries.len() >= Self::MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(hash, (account, Instant::now()));
    }
}

fn account_from_row(row: &impl Record) -> Account {
    Account {
        id: row.get("id"),
        name: row.get("name"),
        is_admin: row.get::<i64>("is_admin") != 0,
        created_at: row.get("created_at"),
    }
}

impl Store {
    /// Creates an account with the given key, or a generated one.
    pub async fn create_account(
        &self,
        name: &str,
        is_admin: bool,
        api_key: Option<String>,
    ) -> Result<NewAccount> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 128 {
            return Err(Error::validation("account name must be 1-128 characters"));
        }
        let api_key = api_key.unwrap_or_else(generate_api_key);
        let account = Account {
            id: new_id("acct"),
            name: name.to_owned(),
            is_admin,
            created_at: now_ms(),
        };
        let result = sql!(self.conn().await?, c => query(
            "INSERT INTO accounts (id, name, api_key_hash, is_admin, created_at) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&account.id)
        .bind(&account.name)
        .bind(hash_key(&api_key))
        .bind(is_admin as i64)
        .bind(account.created_at)
        .execute(c)
        .await
        .map(|_| ()));
        match result {
            Ok(_) => Ok(NewAccount { account, api_key }),
            Err(err) if super::is_unique_violation(&err) => Err(Error::Refused {
                code: crate::error::ErrorCode::AccountConflict,
                message: "an account with this API key already exists".into(),
            }),
            Err(err) => Err(err.into()),
        }
    }

    /// The account owning `api_key`, if any. Known keys are answered from memory
    /// for up to [`KeyCache::TTL`]; unknown keys always ask the database, so a new
    /// account's key works at once.
    pub async fn account_by_api_key(&self, api_key: &str) -> Result<Option<Account>> {
        let hash = hash_key(api_key);
        if let Some(account) = self.api_keys.get(&hash) {
            return Ok(Some(account));
        }
        let account = sql!(self.conn().await?, c => query(
            "SELECT id, name, is_admin, created_at FROM accounts WHERE api_key_hash = ?",
        )
        .bind(&hash)
        .fetch_optional(c)
        .await?
        .as_ref()
        .map(account_from_row));
        if let Some(account) = &account {
            self.api_keys.insert(hash, account.clone());
        }
        Ok(account)
    }

    pub async fn count_accounts(&self) -> Result<i64> {
        Ok(
            sql!(self.conn().await?, c => query_scalar("SELECT COUNT(*) FROM accounts")
            .fetch_one(c)
            .await?),
        )
    }

    /// The admin account created at first start.
    pub async fn admin_account(&self) -> Result<Option<Account>> {
        Ok(sql!(self.conn().await?, c => query(
            "SELECT id, name, is_admin, created_at FROM accounts WHERE is_admin = 1 ORDER BY created_at LIMIT 1",
        )
        .fetch_optional(c)
        .await?
        .as_ref()
        .map(account_from_row)))
    }
}
