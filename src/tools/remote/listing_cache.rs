//! The last `GET /api/tools` answer, whole, kept for as long as what it lists
//! is unchanged: the listing is then written from one shared buffer instead of
//! being joined again from every tool's JSON (BENCHMARKS.md, issue 20,
//! thirteenth pass).
//!
//! The key is the listing's content itself: the roles' names in order, each
//! with its registrations in order, compared by identity. A registration is
//! immutable and every register or replace makes a new one, so an equal key
//! lists equal JSON. The cache holds the registrations it names, so none of
//! them can be freed and its address reused by another while the key stands.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{RemoteTool, Role};

/// What one listing names, in order.
pub type Listed = [(Role, Vec<Arc<RemoteTool>>)];

/// The last whole listing and what it lists.
#[derive(Default)]
pub struct ListingCache {
    last: Mutex<Option<Cached>>,
}

struct Cached {
    key: ListingKey,
    body: Bytes,
}

/// What a listing lists, taken before its roles are consumed by writing it:
/// each role's name and its registrations, held.
pub struct ListingKey(Vec<(String, Vec<Arc<RemoteTool>>)>);

impl ListingKey {
    pub fn of(roles: &Listed) -> Self {
        Self(
            roles
                .iter()
                .map(|(role, tools)| (role.name.clone(), tools.clone()))
                .collect(),
        )
    }

    fn lists(&self, roles: &Listed) -> bool {
        self.0.len() == roles.len()
            && self
                .0
                .iter()
                .zip(roles)
                .all(|((name, tools), (role, listed))| {
                    *name == role.name
                        && tools.len() == listed.len()
                        && tools.iter().zip(listed).all(|(a, b)| Arc::ptr_eq(a, b))
                })
    }
}

impl ListingCache {
    /// Largest listing kept whole; a larger one is streamed each time, so
    /// that many roles' large schemas are never held in memory at once.
    pub const MAX_BYTES: usize = 8 * 1024 * 1024;

    fn last(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        // Poisoning cannot leave a half-written entry: it is replaced whole.
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The kept body, if it lists exactly `roles`.
    pub fn get(&self, roles: &Listed) -> Option<Bytes> {
        self.last()
            .as_ref()
            .filter(|cached| cached.key.lists(roles))
            .map(|cached| cached.body.clone())
    }

    /// Keeps `body` as the listing `key` names (when it is small enough).
    pub fn put(&self, key: ListingKey, body: Bytes) {
        if body.len() <= Self::MAX_BYTES {
            *self.last() = Some(Cached { key, body });
        }
    }
}

impl std::fmt::Debug for ListingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.last().as_ref().map_or(0, |cached| cached.body.len());
        f.debug_struct("ListingCache")
            .field("bytes", &bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::remote::{NewRemoteTool, RegistrationInput};

    fn tool(name: &str) -> Arc<RemoteTool> {
        let new = NewRemoteTool::validate(RegistrationInput {
            name: name.to_owned(),
            callback_url: "http://127.0.0.1:9333/cb".to_owned(),
            ..Default::default()
        })
        .unwrap();
        Arc::new(RemoteTool::new(&new, "Lanlan"))
    }

    fn role(name: &str) -> Role {
        Role {
            character_id: format!("char_{name}"),
            name: name.to_owned(),
        }
    }

    #[test]
    fn a_kept_listing_is_answered_only_for_the_same_roles_and_registrations() {
        let cache = ListingCache::default();
        let (a, b) = (tool("a"), tool("b"));
        let listed = vec![(role("Lanlan"), vec![a.clone(), b.clone()])];
        assert_eq!(cache.get(&listed), None);
        cache.put(ListingKey::of(&listed), Bytes::from_static(b"listing"));
        assert_eq!(cache.get(&listed).as_deref(), Some(&b"listing"[..]));

        // A replaced registration is a new one, even under the same name.
        let replaced = vec![(role("Lanlan"), vec![a.clone(), tool("b")])];
        assert_eq!(cache.get(&replaced), None);
        // Another order, one fewer, a renamed role, another role: all misses.
        assert_eq!(
            cache.get(&[(role("Lanlan"), vec![b.clone(), a.clone()])]),
            None
        );
        assert_eq!(cache.get(&[(role("Lanlan"), vec![a.clone()])]), None);
        assert_eq!(
            cache.get(&[(role("Mika"), vec![a.clone(), b.clone()])]),
            None
        );
        let two_roles = vec![
            (role("Lanlan"), vec![a.clone(), b.clone()]),
            (role("Mika"), vec![]),
        ];
        assert_eq!(cache.get(&two_roles), None);
        assert_eq!(cache.get(&[]), None);

        // The next listing replaces the kept one.
        cache.put(ListingKey::of(&two_roles), Bytes::from_static(b"two"));
        assert_eq!(cache.get(&listed), None);
        assert_eq!(cache.get(&two_roles).as_deref(), Some(&b"two"[..]));
    }

    #[test]
    fn a_listing_over_the_bound_is_not_kept() {
        let cache = ListingCache::default();
        let listed = vec![(role("Lanlan"), vec![tool("a")])];
        cache.put(
            ListingKey::of(&listed),
            Bytes::from(vec![b' '; ListingCache::MAX_BYTES + 1]),
        );
        assert_eq!(cache.get(&listed), None);
        cache.put(
            ListingKey::of(&listed),
            Bytes::from(vec![b' '; ListingCache::MAX_BYTES]),
        );
        assert!(cache.get(&listed).is_some());
    }
}
