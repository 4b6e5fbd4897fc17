//! The session-manager operations behind `/api/tools`: mutate the registries of
//! the target characters, then synchronise their live model sessions, all under
//! the model-session mutation lock. Also the remote half of the call path, where
//! the plugin eviction rule lives.

use std::sync::Arc;

use serde_json::Value;

use super::{FailureEffect, NewRemoteTool, Registered, RemoteTool};
use crate::dispatch::{ToolCall, ToolOutcome};
use crate::model_sessions::{CatalogChange, MutationGuard};
use crate::runtime::ToolRuntime;

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
    /// Registers (or replaces) `tool` in every target role's registry.
    pub async fn register_remote(&self, roles: &[Role], tool: NewRemoteTool) -> MutationReport {
        let guard = self.model_sessions.mutation_lock().await;
        // A fresh registration means the plugin is back: its failure streak starts over.
        self.remote
            .failures()
            .reset(tool.callback_url.origin(), &tool.source);
        let mut report = MutationReport::default();
        for role in roles {
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
        report
    }

    /// Removes `name` from every target role; true when any registry held it.
    pub async fn unregister_remote(&self, roles: &[Role], name: &str) -> (bool, MutationReport) {
        let guard = self.model_sessions.mutation_lock().await;
        let mut report = MutationReport::default();
        let mut removed = false;
        for role in roles {
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
        (removed, report)
    }

    /// Removes every tool of `source` from the target roles; returns how many.
    pub async fn clear_remote(&self, roles: &[Role], source: &str) -> (usize, MutationReport) {
        let guard = self.model_sessions.mutation_lock().await;
        let mut report = MutationReport::default();
        let mut removed = 0;
        for role in roles {
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
        (removed, report)
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
