//! The session-manager operations behind `/api/tools`: resolve the target
//! characters, mutate their registries and synchronise their live model
//! sessions, all as one catalog mutation (under its lock).

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{NewRemoteTool, Registered, RemoteRegistry, RemoteTool};
use crate::catalog::{CatalogChange, CatalogEvents, CatalogScope, mutate_with};
use crate::error::{Error, Result};
use crate::fast_map::FastSet;
use crate::store::{CharacterRole, Store};

/// Which characters a Runtime Tools request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Every character that exists when the operation runs.
    AllRoles,
    /// The one character of this name; unknown names are `NotFound`.
    Role(&'a str),
}

impl<'a> Target<'a> {
    /// The contract's `role` field: null targets every current role; any
    /// other value, "" included, names one (404 when no character has it),
    /// so that a blank role never reaches every character by mistake.
    pub fn from_role(role: Option<&'a str>) -> Self {
        match role {
            None => Target::AllRoles,
            Some(name) => Target::Role(name),
        }
    }
}

/// A character addressed as a role: its id keys the registry, its name is shown.
#[derive(Debug, Clone)]
pub struct Role {
    pub character_id: String,
    pub name: String,
}

/// A role whose live model sessions did not take the change.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct FailedRole {
    pub role: String,
    pub error: String,
}

/// Which roles took a mutation and which failed to synchronise.
#[derive(Debug, Clone, Default)]
pub struct MutationReport {
    /// Roles whose registry changed and whose live model sessions all took it.
    pub affected_roles: Vec<String>,
    /// Roles whose registry changed but where a live model session refused it.
    pub failed_roles: Vec<FailedRole>,
}

impl MutationReport {
    /// Pairs each changed role with its sync result.
    fn from_results(roles: Vec<String>, results: Vec<Result<(), String>>) -> Self {
        let mut report = Self::default();
        for (role, result) in roles.into_iter().zip(results) {
            match result {
                Ok(()) => report.affected_roles.push(role),
                Err(error) => report.failed_roles.push(FailedRole { role, error }),
            }
        }
        report
    }

    /// The mutation's roles by name, at debug. The info line counts them: a
    /// mutation of every role names them all, and formatting a hundred names
    /// on each register was 5 % of its work, on the answer's path.
    fn log_roles(&self) {
        tracing::debug!(
            affected = ?self.affected_roles,
            failed = ?self.failed_roles,
            "the roles of the mutation"
        );
    }
}

/// One role's (still empty) change, and the role's name for the report.
fn change_for(role: &Role) -> (String, CatalogChange) {
    (
        role.name.clone(),
        CatalogChange::new(CatalogScope::Character(role.character_id.clone())),
    )
}

/// The roles `target` names, as the store has them now.
///
/// Boxed: the store's read is almost 3 KB of future, and inline it made the
/// register, unregister, clear and list handlers' futures that large, which
/// axum's route layers box and copy whole on every request (BENCHMARKS.md,
/// issue 20, fifteenth pass).
fn resolve_roles<'a>(store: &'a Store, target: Target<'a>) -> BoxFuture<'a, Result<Vec<Role>>> {
    Box::pin(async move {
        let to_role = |c: &CharacterRole| Role {
            character_id: c.id.clone(),
            name: c.name.clone(),
        };
        match target {
            Target::AllRoles => Ok(store.all_characters().await?.iter().map(to_role).collect()),
            Target::Role(name) => match store.character_any_account(name).await? {
                Some(character) => Ok(vec![to_role(&character)]),
                None => Err(Error::NotFound(format!(
                    "role {name:?} not found: no character has that name"
                ))),
            },
        }
    })
}

/// Resolves a mutation's roles inside the catalog mutation and, when it targets
/// every role, drops the registries of deleted characters in the same step.
async fn mutation_roles(
    registry: &RemoteRegistry,
    store: &Store,
    target: Target<'_>,
) -> Result<Vec<Role>> {
    let roles = resolve_roles(store, target).await?;
    if target == Target::AllRoles {
        // Why this cannot drop a live character's registration: every registry
        // insert happens inside a catalog mutation (one at a time, under its
        // lock), after its own role was read from the store inside it. So any
        // registration already in a registry read its character before this list
        // was read, and a committed character stays visible to later reads; one
        // missing here was deleted since, and ids are never reused. A character
        // created after this read has no registration yet: its registration
        // waits for this mutation. A list read outside the lock could miss a
        // character whose registration then lands before the collection.
        let existing: FastSet<&str> = roles
            .iter()
            .map(|role| role.character_id.as_str())
            .collect();
        let dropped = registry.retain_characters(&existing);
        if dropped > 0 {
            tracing::debug!(dropped, "dropped the tool registries of deleted characters");
        }
    }
    Ok(roles)
}

/// Runs a registry mutation on the roles `target` names, inside one catalog
/// mutation, and reports which roles took it and how many registrations it
/// removed.
async fn mutate(
    registry: &RemoteRegistry,
    events: &dyn CatalogEvents,
    store: &Store,
    target: Target<'_>,
    mutation: impl FnOnce(&[Role]) -> Result<Vec<(String, CatalogChange)>> + Send,
) -> Result<(MutationReport, usize)> {
    let (outcome, results) = mutate_with(events, async move {
        let changed = match mutation_roles(registry, store, target).await {
            Ok(roles) => mutation(&roles),
            Err(err) => Err(err),
        };
        match changed {
            Ok(changed) => {
                let removed = changed.iter().map(|(_, c)| c.removed.len()).sum::<usize>();
                let (roles, changes): (Vec<_>, Vec<_>) = changed.into_iter().unzip();
                (Ok((roles, removed)), changes)
            }
            Err(err) => (Err(err), Vec::new()),
        }
    })
    .await;
    let (roles, removed) = outcome?;
    Ok((MutationReport::from_results(roles, results), removed))
}

impl RemoteRegistry {
    /// Each role `target` names with its registrations, for listing.
    pub async fn list_roles(
        &self,
        store: &Store,
        target: Target<'_>,
    ) -> Result<Vec<(Role, Vec<Arc<RemoteTool>>)>> {
        let roles = resolve_roles(store, target).await?;
        Ok(roles
            .into_iter()
            .map(|role| {
                let tools = self.list(&role.character_id);
                (role, tools)
            })
            .collect())
    }
}

impl RemoteRegistry {
    /// Registers (or replaces) `tool` in every target role's registry, or
    /// refuses it when it would pass a limit (checked with the inserts, under
    /// the registry lock, inside the catalog mutation).
    pub async fn register_into(
        &self,
        events: &dyn CatalogEvents,
        store: &Store,
        target: Target<'_>,
        tool: NewRemoteTool,
    ) -> Result<MutationReport> {
        let registered = mutate(self, events, store, target, |roles| {
            let registered = self.register(roles, &tool)?;
            // A fresh registration means the plugin is back: its failure streak
            // starts over.
            self.failures()
                .reset(tool.callback_url.origin(), &tool.source);
            Ok(roles
                .iter()
                .zip(registered)
                .map(|(role, registered)| {
                    let (name, mut change) = change_for(role);
                    match registered {
                        Registered::Added => change.added.push(tool.name.clone()),
                        Registered::Replaced => change.updated.push(tool.name.clone()),
                    }
                    (name, change)
                })
                .collect())
        })
        .await;
        let report = match registered {
            Ok((report, _)) => report,
            Err(err) => {
                if err.code() == crate::error::ErrorCode::LimitExceeded {
                    tracing::warn!(
                        tool = ?tool.name,
                        source = ?tool.source,
                        reason = %err,
                        "remote tool registration refused: a runtime tool limit is reached"
                    );
                }
                return Err(err);
            }
        };
        tracing::info!(
            tool = ?tool.name,
            source = ?tool.source,
            // The origin only: a plugin's path may hold its secret token.
            callback_origin = %tool.callback_url.origin(),
            affected = report.affected_roles.len(),
            failed = report.failed_roles.len(),
            "remote tool registered"
        );
        report.log_roles();
        Ok(report)
    }

    /// Removes `name` from every target role; true when any registry held it.
    pub async fn unregister_from(
        &self,
        events: &dyn CatalogEvents,
        store: &Store,
        target: Target<'_>,
        name: &str,
    ) -> Result<(bool, MutationReport)> {
        let (report, removed) = mutate(self, events, store, target, |roles| {
            Ok(roles
                .iter()
                .filter(|role| self.unregister(&role.character_id, name))
                .map(|role| {
                    let (role, mut change) = change_for(role);
                    change.removed.push(name.to_owned());
                    (role, change)
                })
                .collect())
        })
        .await?;
        let removed = removed > 0;
        tracing::info!(
            tool = ?name,
            removed,
            affected = report.affected_roles.len(),
            "remote tool unregistered"
        );
        report.log_roles();
        Ok((removed, report))
    }

    /// Removes every tool of `source` from the target roles; returns how many.
    pub async fn clear_from(
        &self,
        events: &dyn CatalogEvents,
        store: &Store,
        target: Target<'_>,
        source: &str,
    ) -> Result<(usize, MutationReport)> {
        let (report, removed) = mutate(self, events, store, target, |roles| {
            Ok(roles
                .iter()
                .filter_map(|role| {
                    let names = self.clear_source(&role.character_id, source);
                    (!names.is_empty()).then(|| {
                        let (role, mut change) = change_for(role);
                        change.removed = names;
                        (role, change)
                    })
                })
                .collect())
        })
        .await?;
        tracing::info!(
            source = ?source,
            removed,
            affected = report.affected_roles.len(),
            "remote tools cleared"
        );
        report.log_roles();
        Ok((removed, report))
    }
}
