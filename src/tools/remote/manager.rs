//! The session-manager operations behind `/api/tools`: mutate the registries of
//! the target characters, then synchronise their live model sessions, all under
//! the model-session mutation lock. Also the remote half of the call path, where
//! the plugin eviction rule lives.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::{FailureEffect, NewRemoteTool, Registered, RemoteTool};
use crate::dispatch::{ToolCall, ToolOutcome};
use crate::error::{Error, Result};
use crate::model_sessions::{CatalogChange, MutationGuard};
use crate::runtime::ToolRuntime;

/// Which characters a Runtime Tools request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Every character that exists when the operation runs.
    AllRoles,
    /// The one character of this name; unknown names are `NotFound`.
    Role(&'a str),
}

impl<'a> Target<'a> {
    /// The contract's `role` field: null or "" targets every current role.
    pub fn from_role(role: Option<&'a str>) -> Self {
        match role {
            None | Some("") => Target::AllRoles,
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
    async fn record(
        &mut self,
        runtime: &ToolRuntime,
        guard: &MutationGuard<'_>,
        role: &Role,
        change: CatalogChange,
    ) {
        match runtime.model_sessions.sync(guard, runtime, &change).await {
            Ok(()) => self.affected_roles.push(role.name.clone()),
            Err(error) => self.failed_roles.push(FailedRole {
                role: role.name.clone(),
                error,
            }),
        }
    }
}

impl ToolRuntime {
    /// The roles `target` names, as the store has them now. Private: a list read
    /// outside the mutation lock must not feed garbage collection.
    async fn remote_roles(&self, target: Target<'_>) -> Result<Vec<Role>> {
        let to_role = |c: crate::store::Character| Role {
            character_id: c.id,
            name: c.name,
        };
        match target {
            Target::AllRoles => Ok(self
                .store
                .all_characters()
                .await?
                .into_iter()
                .map(to_role)
                .collect()),
            Target::Role(name) => match self.store.character_any_account(name).await? {
                Some(character) => Ok(vec![to_role(character)]),
                None => Err(Error::NotFound(format!(
                    "role {name:?} not found: no character has that name"
                ))),
            },
        }
    }

    /// Each role with its registrations, for listing.
    pub async fn list_remote(
        &self,
        target: Target<'_>,
    ) -> Result<Vec<(Role, Vec<Arc<RemoteTool>>)>> {
        let roles = self.remote_roles(target).await?;
        Ok(roles
            .into_iter()
            .map(|role| {
                let tools = self.remote.list(&role.character_id);
                (role, tools)
            })
            .collect())
    }

    /// Resolves a mutation's roles while it holds the lock and, when it targets
    /// every role, drops the registries of deleted characters in the same step.
    async fn mutation_roles(
        &self,
        guard: &MutationGuard<'_>,
        target: Target<'_>,
    ) -> Result<Vec<Role>> {
        let roles = self.remote_roles(target).await?;
        if target == Target::AllRoles {
            // Why this cannot drop a live character's registration: every
            // registry insert (`register_remote`) happens under this lock,
            // after its own role was read from the store under this lock. So
            // any registration already in a registry read its character before
            // this list was read, and a committed character stays visible to
            // later reads; one missing here was deleted since, and ids are never
            // reused. A character created after this read has no registration
            // yet: its registration waits for this lock. A list read outside
            // the lock could miss a character whose registration then lands
            // before the collection, which would erase it.
            let existing: HashSet<String> =
                roles.iter().map(|role| role.character_id.clone()).collect();
            let dropped = self.remote.retain_characters(guard, &existing);
            if dropped > 0 {
                tracing::debug!(dropped, "dropped the tool registries of deleted characters");
            }
        }
        Ok(roles)
    }

    /// Registers (or replaces) `tool` in every target role's registry.
    pub async fn register_remote(
        &self,
        target: Target<'_>,
        tool: NewRemoteTool,
    ) -> Result<MutationReport> {
        let guard = self.model_sessions.mutation_lock().await;
        let roles = self.mutation_roles(&guard, target).await?;
        // A fresh registration means the plugin is back: its failure streak starts over.
        self.remote
            .failures()
            .reset(tool.callback_url.origin(), &tool.source);
        let mut report = MutationReport::default();
        for role in &roles {
            let outcome = self
                .remote
                .register(&role.character_id, RemoteTool::new(&tool, &role.name));
            let mut change = CatalogChange {
                character_id: role.character_id.clone(),
                ..Default::default()
            };
            match outcome {
                Registered::Added => change.added.push(tool.name.clone()),
                Registered::Replaced => change.updated.push(tool.name.clone()),
            }
            report.record(self, &guard, role, change).await;
        }
        tracing::info!(
            tool = %tool.name,
            source = %tool.source,
            callback = %tool.callback_url,
            affected = ?report.affected_roles,
            failed = report.failed_roles.len(),
            "remote tool registered"
        );
        Ok(report)
    }

    /// Removes `name` from every target role; true when any registry held it.
    pub async fn unregister_remote(
        &self,
        target: Target<'_>,
        name: &str,
    ) -> Result<(bool, MutationReport)> {
        let guard = self.model_sessions.mutation_lock().await;
        let roles = self.mutation_roles(&guard, target).await?;
        let mut report = MutationReport::default();
        let mut removed = false;
        for role in &roles {
            if !self.remote.unregister(&role.character_id, name) {
                continue;
            }
            removed = true;
            let change = CatalogChange {
                character_id: role.character_id.clone(),
                removed: vec![name.to_owned()],
                ..Default::default()
            };
            report.record(self, &guard, role, change).await;
        }
        tracing::info!(tool = %name, removed, affected = ?report.affected_roles, "remote tool unregistered");
        Ok((removed, report))
    }

    /// Removes every tool of `source` from the target roles; returns how many.
    pub async fn clear_remote(
        &self,
        target: Target<'_>,
        source: &str,
    ) -> Result<(usize, MutationReport)> {
        let guard = self.model_sessions.mutation_lock().await;
        let roles = self.mutation_roles(&guard, target).await?;
        let mut report = MutationReport::default();
        let mut removed = 0;
        for role in &roles {
            let names = self.remote.clear_source(&role.character_id, source);
            if names.is_empty() {
                continue;
            }
            removed += names.len();
            let change = CatalogChange {
                character_id: role.character_id.clone(),
                removed: names,
                ..Default::default()
            };
            report.record(self, &guard, role, change).await;
        }
        tracing::info!(%source, removed, affected = ?report.affected_roles, "remote tools cleared");
        Ok((removed, report))
    }

    /// Runs a remote tool's callback and applies the plugin eviction rule.
    pub async fn call_remote(
        &self,
        tool: &Arc<RemoteTool>,
        call: &ToolCall,
        args: &Value,
    ) -> ToolOutcome {
        let exchange = self.remote.client().call(tool, call, args).await;
        if !tool.is_plugin() {
            return exchange.outcome;
        }
        let origin = tool.callback_url.origin();
        match exchange.effect {
            FailureEffect::Count => {
                if self.remote.failures().record_failure(origin, &tool.source) {
                    let evicted = self.evict_origin(origin, &tool.source).await;
                    if let ToolOutcome::Error(message) = exchange.outcome {
                        return ToolOutcome::Error(format!(
                            "{message}; after {} consecutive connection failures the {} tool(s) of {} at {origin} were unregistered",
                            super::EVICTION_THRESHOLD,
                            evicted,
                            tool.source
                        ));
                    }
                }
            }
            FailureEffect::Reset => self.remote.failures().reset(origin, &tool.source),
            FailureEffect::Neutral => {}
        }
        exchange.outcome
    }

    /// Evicts `source`'s tools at `origin` from every registry and synchronises
    /// the affected model sessions; returns how many registrations were removed.
    async fn evict_origin(&self, origin: &str, source: &str) -> usize {
        let guard = self.model_sessions.mutation_lock().await;
        let evicted = self.remote.evict_origin(origin, source);
        let mut count = 0;
        for (character_id, names) in evicted {
            count += names.len();
            tracing::warn!(%origin, %source, %character_id, tools = ?names, "evicted plugin tools after repeated connection failures");
            let change = CatalogChange {
                character_id,
                removed: names,
                ..Default::default()
            };
            if let Err(error) = self.model_sessions.sync(&guard, self, &change).await {
                tracing::warn!(%error, "a model session refused the catalog after eviction");
            }
        }
        count
    }
}
