//! Console sign-ins: an opaque random cookie value mapped, in memory, to the
//! account whose key signed in. Only the value's hash is kept, so the map
//! never holds a usable cookie. A restart signs everyone out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::store::Account;

/// How long a sign-in lasts (the cookie's Max-Age).
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Most sign-ins held at once; past it the one closest to expiry goes.
pub const MAX_SESSIONS: usize = 10_000;

/// A valid sign-in: its key (the cookie's hash, which CSRF tokens bind to)
/// and its account.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    pub key: String,
    pub account: Account,
    /// When the sign-in expires.
    pub expires_at: Instant,
    /// Cancelled when it is signed out or pushed out: what it keeps open
    /// (an event stream) ends with it.
    pub ended: CancellationToken,
}

impl ConsoleSession {
    /// Resolves once the sign-in is over: signed out, pushed out or expired.
    pub async fn over(self) {
        tokio::select! {
            _ = self.ended.cancelled() => {}
            _ = tokio::time::sleep_until(self.expires_at.into()) => {}
        }
    }
}

#[derive(Debug)]
struct Entry {
    account: Account,
    expires_at: Instant,
    ended: CancellationToken,
}

/// Every live console sign-in of this process.
#[derive(Debug, Default)]
pub struct ConsoleSessions {
    entries: Mutex<HashMap<String, Entry>>,
}

/// The map key of a cookie value.
fn key_of(cookie: &str) -> String {
    hex::encode(Sha256::digest(cookie.as_bytes()))
}

impl ConsoleSessions {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Signs `account` in; the returned value goes into the cookie.
    pub fn create(&self, account: Account) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let cookie = hex::encode(bytes);
        let now = Instant::now();
        let mut entries = self.entries();
        entries.retain(|_, entry| entry.expires_at > now);
        if entries.len() >= MAX_SESSIONS
            && let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, entry)| entry.expires_at)
                .map(|(key, _)| key.clone())
            && let Some(pushed_out) = entries.remove(&oldest)
        {
            pushed_out.ended.cancel();
        }
        entries.insert(
            key_of(&cookie),
            Entry {
                account,
                expires_at: now + SESSION_TTL,
                ended: CancellationToken::new(),
            },
        );
        cookie
    }

    /// The sign-in a cookie value names, unless it is unknown or expired.
    pub fn get(&self, cookie: &str) -> Option<ConsoleSession> {
        let key = key_of(cookie);
        let mut entries = self.entries();
        let entry = entries.get(&key)?;
        if entry.expires_at <= Instant::now() {
            entries.remove(&key);
            return None;
        }
        Some(ConsoleSession {
            account: entry.account.clone(),
            expires_at: entry.expires_at,
            ended: entry.ended.clone(),
            key,
        })
    }

    /// Signs the session out; what it keeps open ends.
    pub fn end(&self, key: &str) {
        if let Some(entry) = self.entries().remove(key) {
            entry.ended.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account {
            id: "acct_1".into(),
            name: "a".into(),
            is_admin: false,
            created_at: 0,
        }
    }

    #[test]
    fn a_cookie_finds_its_account_until_signed_out() {
        let sessions = ConsoleSessions::default();
        let cookie = sessions.create(account());
        let found = sessions.get(&cookie).expect("signed in");
        assert_eq!(found.account.id, "acct_1");
        assert_ne!(found.key, cookie, "the map holds a hash, not the cookie");
        assert!(sessions.get("not-a-cookie").is_none());
        assert!(!found.ended.is_cancelled());
        sessions.end(&found.key);
        assert!(sessions.get(&cookie).is_none());
        assert!(found.ended.is_cancelled(), "what it held open ends");
    }
}
