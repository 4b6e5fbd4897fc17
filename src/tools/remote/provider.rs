//! The remote provider: each character's registered callbacks in its sessions'
//! catalogs, the remote half of the call path (where the plugin eviction rule
//! lives), and the snapshots deferred callbacks run from.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{Declaration, FailureEffect, Registration, RemoteRegistry, RemoteTool};
use crate::call::{JobInvocation, ToolCall, ToolOutcome};
use crate::catalog::{
    CallContext, CatalogChange, CatalogEntry, CatalogEvents, CatalogScope, EntryKey, ToolHandler,
    ToolProvider, mutate_with,
};
use crate::domain::CallbackUrl;
use crate::domain::tool::ToolMetadata;
use crate::error::Result;
use crate::reason::ReasonCode;
use crate::store::Session;

/// The `kind` of remote job snapshots.
const KIND: &str = "remote";

/// Offers the callbacks registered for a session's character.
pub struct RemoteProvider {
    registry: Arc<RemoteRegistry>,
}

impl RemoteProvider {
    pub fn new(registry: Arc<RemoteRegistry>) -> Self {
        Self { registry }
    }

    /// A registration as a catalog entry that runs it.
    fn entry(&self, tool: Arc<RemoteTool>) -> CatalogEntry {
        let spec = tool.spec();
        let handler = RemoteHandler {
            tool,
            registry: self.registry.clone(),
        };
        CatalogEntry::available(spec, Arc::new(handler))
    }
}

impl ToolProvider for RemoteProvider {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn entries<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        let entries = self
            .registry
            .list(&session.character_id)
            .into_iter()
            .map(|tool| self.entry(tool))
            .collect();
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn entry_keys(&self, session: &Session, keys: &mut Vec<EntryKey>) -> bool {
        self.registry.entry_keys(&session.character_id, keys);
        true
    }

    fn entries_named<'a>(
        &'a self,
        session: &'a Session,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogEntry>>> {
        let entries = self
            .registry
            .named(&session.character_id, name)
            .map(|tool| self.entry(tool))
            .into_iter()
            .collect();
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn restore(
        &self,
        invocation: &JobInvocation,
    ) -> std::result::Result<Arc<dyn ToolHandler>, String> {
        let text = |field: &str| invocation.tool_text(field);
        let callback_url = CallbackUrl::parse(&text("callback_url")?)
            .map_err(|err| format!("stored callback URL is invalid: {err}"))?;
        let timeout_seconds = invocation
            .tool
            .get("timeout_seconds")
            .and_then(Value::as_f64)
            .ok_or("the job snapshot has no timeout_seconds")?;
        let registration = Registration {
            name: text("name")?,
            callback_url,
            source: text("source")?,
            timeout_seconds,
            listing: Default::default(),
            spec: Default::default(),
            declaration: Arc::new(Declaration {
                description: String::new(),
                parameters: Arc::new(Value::Object(Default::default())),
                validator: Default::default(),
                metadata: ToolMetadata::declared(
                    invocation.effective_side_effect_level(),
                    Vec::new(),
                    None,
                ),
            }),
        };
        let tool = RemoteTool {
            role: text("role")?,
            registration: Arc::new(registration),
        };
        Ok(Arc::new(RemoteHandler {
            tool: Arc::new(tool),
            registry: self.registry.clone(),
        }))
    }
}

/// Runs one registered callback.
#[derive(Debug)]
struct RemoteHandler {
    tool: Arc<RemoteTool>,
    registry: Arc<RemoteRegistry>,
}

impl ToolHandler for RemoteHandler {
    fn invoke<'a>(
        &'a self,
        cx: &'a CallContext<'a>,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(self.call(cx, args))
    }

    fn snapshot(&self, call: &ToolCall, args: &Value) -> Option<JobInvocation> {
        let tool = &self.tool;
        let mut fields = serde_json::Map::new();
        fields.insert("name".into(), tool.name.clone().into());
        fields.insert("callback_url".into(), tool.callback_url.as_str().into());
        fields.insert("source".into(), tool.source.clone().into());
        fields.insert("role".into(), tool.role.clone().into());
        fields.insert("timeout_seconds".into(), tool.timeout_seconds.into());
        Some(JobInvocation {
            kind: KIND.to_owned(),
            call_id: call.call_id.clone(),
            raw_arguments: call.arguments.raw.clone(),
            arguments: args.clone(),
            side_effect_level: Some(tool.metadata().side_effect_level),
            replay_safety: None,
            tool: fields,
        })
    }
}

impl RemoteHandler {
    /// Runs the callback and applies the plugin eviction rule.
    async fn call(&self, cx: &CallContext<'_>, args: &Value) -> ToolOutcome {
        let tool = &self.tool;
        let exchange = self
            .registry
            .client()
            .call(tool, cx.call, cx.attempt, args)
            .await;
        let outcome = exchange.outcome;
        self.log_outage(&exchange.effect, &outcome);
        if matches!(exchange.effect, FailureEffect::Count) {
            crate::metrics::metrics().record_connect_failure(&tool.source);
        }
        if !tool.is_plugin() {
            return outcome;
        }
        let origin = tool.callback_url.origin();
        match exchange.effect {
            FailureEffect::Count => {
                if self
                    .registry
                    .failures()
                    .record_failure(origin, &tool.source)
                {
                    let evicted = self.evict_origin(cx.catalog_events).await;
                    crate::metrics::metrics().record_eviction(&tool.source);
                    if let ToolOutcome::NotStarted {
                        message,
                        retry_after_ms,
                        ..
                    } = outcome
                    {
                        return ToolOutcome::NotStarted {
                            reason: ReasonCode::RemotePluginEvicted,
                            message: format!(
                                "{message}; after {} consecutive connection failures the {} tool(s) of {} at {origin} were unregistered",
                                super::EVICTION_THRESHOLD,
                                evicted,
                                tool.source
                            ),
                            retry_after_ms,
                        };
                    }
                }
            }
            FailureEffect::Reset => self.registry.failures().reset(origin, &tool.source),
            FailureEffect::Neutral => {}
        }
        outcome
    }

    /// One line when the tool's callback origin stops accepting connections
    /// and one when it answers again, not one per call: a plugin that is down
    /// is visible at the default level whatever its source.
    fn log_outage(&self, effect: &FailureEffect, outcome: &ToolOutcome) {
        let (tool, failures) = (&self.tool, self.registry.failures());
        let origin = tool.callback_url.origin();
        match effect {
            FailureEffect::Count if failures.note_unreachable(origin, &tool.source) => {
                let error = match outcome {
                    ToolOutcome::NotStarted { message, .. } => message.as_str(),
                    _ => "",
                };
                tracing::warn!(%origin, source = ?tool.source, tool = ?tool.name, error,
                    "a callback origin stopped accepting connections; its calls fail until it answers");
            }
            FailureEffect::Reset if failures.note_answered(origin, &tool.source) => {
                tracing::info!(%origin, source = ?tool.source, "a callback origin answers again");
            }
            _ => {}
        }
    }

    /// Evicts the source's tools at this origin from every registry and
    /// synchronises the affected model sessions; returns how many registrations
    /// were removed.
    async fn evict_origin(&self, events: &dyn CatalogEvents) -> usize {
        let origin = self.tool.callback_url.origin().to_owned();
        let source = self.tool.source.clone();
        let registry = self.registry.clone();
        let (count, results) = mutate_with(events, async move {
            let evicted = registry.evict_origin(&origin, &source);
            let count: usize = evicted.iter().map(|(_, names)| names.len()).sum();
            // One line per eviction, however many characters held the tools.
            let mut tools: Vec<&String> = evicted.iter().flat_map(|(_, names)| names).collect();
            tools.sort();
            tools.dedup();
            tracing::warn!(%origin, source = ?source, characters = evicted.len(), registrations = count,
                tools = ?tools.iter().take(10).collect::<Vec<_>>(),
                "evicted plugin tools after repeated connection failures");
            let changes = evicted
                .into_iter()
                .map(|(character_id, names)| {
                    CatalogChange {
                        removed: names,
                        ..CatalogChange::new(CatalogScope::Character(character_id))
                    }
                })
                .collect();
            (count, changes)
        })
        .await;
        for error in results.into_iter().filter_map(std::result::Result::err) {
            tracing::warn!(%error, "a model session refused the catalog after eviction");
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::CallArguments;
    use crate::domain::tool::{SideEffectLevel, Slot};

    fn session_of(character_id: &str) -> Session {
        Session {
            id: format!("sess_{character_id}"),
            account_id: "acct_test".into(),
            character_id: character_id.into(),
            character: character_id.into(),
            title: String::new(),
            metadata: serde_json::json!({}),
            created_at: 0,
            updated_at: 0,
        }
    }

    /// A live model session takes an earlier verdict by these keys without
    /// its entries being built: they must be exactly its entries' keys.
    #[tokio::test]
    async fn entry_keys_are_the_keys_of_the_entries_each_role_is_offered() {
        let settings = crate::config::Settings::for_data_dir(std::path::Path::new("/tmp"));
        let registry = Arc::new(RemoteRegistry::new(&settings).unwrap());
        let role = |id: &str| super::super::Role {
            character_id: id.into(),
            name: id.into(),
        };
        let tool = |name: &str| {
            super::super::NewRemoteTool::validate(super::super::RegistrationInput {
                name: name.to_owned(),
                callback_url: "http://127.0.0.1:9333/cb".to_owned(),
                ..Default::default()
            })
            .unwrap()
        };
        registry
            .register(&[role("char_a"), role("char_b")], &tool("shared"))
            .unwrap();
        registry
            .register(&[role("char_a")], &tool("only_a"))
            .unwrap();
        let provider = RemoteProvider::new(registry);

        let keys_of = |session: &Session| {
            let mut keys = Vec::new();
            assert!(provider.entry_keys(session, &mut keys));
            keys
        };
        for character in ["char_a", "char_b", "char_none"] {
            let session = session_of(character);
            let entries = provider.entries(&session).await.unwrap();
            let expected: Vec<EntryKey> = entries.iter().map(EntryKey::of).collect();
            assert_eq!(keys_of(&session), expected, "{character}");
        }
        let (a, b) = (
            keys_of(&session_of("char_a")),
            keys_of(&session_of("char_b")),
        );
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 1);
        assert!(
            a.contains(&b[0]),
            "every role shares the one spec of `shared`"
        );
    }

    #[test]
    fn snapshots_keep_the_tools_side_effect_level() {
        let registration = Registration {
            name: "send_mail".into(),
            callback_url: CallbackUrl::parse("http://127.0.0.1:9/cb").unwrap(),
            source: "mail".into(),
            timeout_seconds: 2.0,
            listing: Default::default(),
            spec: Default::default(),
            declaration: Arc::new(Declaration {
                description: String::new(),
                parameters: Arc::new(Value::Object(Default::default())),
                validator: Default::default(),
                metadata: ToolMetadata::declared(SideEffectLevel::Irreversible, vec![], None),
            }),
        };
        let tool = RemoteTool {
            role: "Lanlan".into(),
            registration: Arc::new(registration),
        };
        let registry = Arc::new(
            RemoteRegistry::new(&crate::config::Settings::for_data_dir(
                std::path::Path::new("/tmp"),
            ))
            .unwrap(),
        );
        let handler = RemoteHandler {
            tool: Arc::new(tool),
            registry: registry.clone(),
        };
        let call = ToolCall {
            name: "send_mail".into(),
            arguments: CallArguments::from_json(None),
            call_id: "c1".into(),
            caller_slot: Slot::Narrator,
            floor_id: None,
            run_id: None,
            step: None,
        };
        let snapshot = handler.snapshot(&call, &serde_json::json!({})).unwrap();
        let stored: JobInvocation =
            serde_json::from_value(serde_json::to_value(&snapshot).unwrap()).unwrap();
        assert_eq!(
            stored.side_effect_level,
            Some(SideEffectLevel::Irreversible)
        );
        let restored = RemoteProvider::new(registry).restore(&stored);
        assert!(restored.is_ok());
    }
}
