//! The session-manager operations behind `/api/tools`: mutate the registries of
//! the target characters and synchronise their live model sessions, as one
//! catalog mutation.

use super::{NewRemoteTool, Registered, RemoteRegistry, RemoteTool};
use crate::catalog::{CatalogChange, CatalogEvents, CatalogScope};

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
}

/// One role's change, and the role's name for the report.
fn change_for(role: &Role, change: CatalogChange) -> (String, CatalogChange) {
    (
        role.name.clone(),
        CatalogChange {
            scope: CatalogScope::Character(role.character_id.clone()),
            ..change
        },
    )
}

/// Applies a registry mutation that yields (role name, change) pairs as one
/// catalog mutation and reports which roles took it.
async fn mutate(
    events: &dyn CatalogEvents,
    mutation: impl FnOnce() -> Vec<(String, CatalogChange)> + Send,
) -> MutationReport {
    let mut names = Vec::new();
    let names_out = &mut names;
    let results = events
        .mutate(Box::pin(async move {
            let (roles, changes): (Vec<_>, Vec<_>) = mutation().into_iter().unzip();
            *names_out = roles;
            changes
        }))
        .await;
    MutationReport::from_results(names, results)
}

impl RemoteRegistry {
    /// Registers (or replaces) `tool` in every target role's registry.
    pub async fn register_into(
        &self,
        events: &dyn CatalogEvents,
        roles: &[Role],
        tool: NewRemoteTool,
    ) -> MutationReport {
        let report = mutate(events, || {
            // A fresh registration means the plugin is back: its failure streak
            // starts over.
            self.failures()
                .reset(tool.callback_url.origin(), &tool.source);
            roles
                .iter()
                .map(|role| {
                    let mut change = CatalogChange::default();
                    match self.register(&role.character_id, RemoteTool::new(&tool, &role.name)) {
                        Registered::Added => change.added.push(tool.name.clone()),
                        Registered::Replaced => change.updated.push(tool.name.clone()),
                    }
                    change_for(role, change)
                })
                .collect()
        })
        .await;
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
    pub async fn unregister_from(
        &self,
        events: &dyn CatalogEvents,
        roles: &[Role],
        name: &str,
    ) -> (bool, MutationReport) {
        let report = mutate(events, || {
            roles
                .iter()
                .filter(|role| self.unregister(&role.character_id, name))
                .map(|role| {
                    let removed = vec![name.to_owned()];
                    change_for(
                        role,
                        CatalogChange {
                            removed,
                            ..Default::default()
                        },
                    )
                })
                .collect()
        })
        .await;
        let removed = !(report.affected_roles.is_empty() && report.failed_roles.is_empty());
        tracing::info!(tool = %name, removed, affected = ?report.affected_roles, "remote tool unregistered");
        (removed, report)
    }

    /// Removes every tool of `source` from the target roles; returns how many.
    pub async fn clear_from(
        &self,
        events: &dyn CatalogEvents,
        roles: &[Role],
        source: &str,
    ) -> (usize, MutationReport) {
        let mut removed = 0;
        let counted = &mut removed;
        let report = mutate(events, || {
            roles
                .iter()
                .filter_map(|role| {
                    let names = self.clear_source(&role.character_id, source);
                    *counted += names.len();
                    (!names.is_empty()).then(|| {
                        change_for(
                            role,
                            CatalogChange {
                                removed: names,
                                ..Default::default()
                            },
                        )
                    })
                })
                .collect()
        })
        .await;
        tracing::info!(%source, removed, affected = ?report.affected_roles, "remote tools cleared");
        (removed, report)
    }
}
