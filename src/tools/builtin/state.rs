//! The session state builtins read and write (variables and resources), behind
//! one small interface: outside a run writes go straight to the store
//! ([`StoreSessionState`]); inside an open run they are buffered in the run's
//! overlay and applied only when it commits ([`RunSessionState`]), so a
//! discarded attempt leaves no trace.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::Result;
use crate::store::{Resource, ResourceContent, ResourceSummary, RunScope, Store};

/// Variables and resources of one session, as a tool call sees them.
pub trait SessionState: Send + Sync {
    fn variable<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Value>>>;
    /// A sandbox write.
    fn set_variable<'a>(&'a self, name: &'a str, value: &'a Value) -> BoxFuture<'a, Result<()>>;
    fn list_resources(&self) -> BoxFuture<'_, Result<Vec<ResourceSummary>>>;
    fn resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Resource>>>;
    /// A sandbox write; answers whether the resource was created.
    fn write_resource<'a>(
        &'a self,
        name: &'a str,
        content: &'a ResourceContent,
    ) -> BoxFuture<'a, Result<bool>>;
    /// A sandbox write; answers whether the resource existed.
    fn delete_resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool>>;
}

/// Session state read from and written straight to the store.
pub struct StoreSessionState {
    store: Store,
    session_id: String,
}

impl StoreSessionState {
    pub fn new(store: Store, session_id: String) -> Self {
        Self { store, session_id }
    }
}

impl SessionState for StoreSessionState {
    fn variable<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Value>>> {
        Box::pin(self.store.variable(&self.session_id, name))
    }

    fn set_variable<'a>(&'a self, name: &'a str, value: &'a Value) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.store.set_variable(&self.session_id, name, value))
    }

    fn list_resources(&self) -> BoxFuture<'_, Result<Vec<ResourceSummary>>> {
        Box::pin(self.store.list_resources(&self.session_id))
    }

    fn resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Resource>>> {
        Box::pin(self.store.resource(&self.session_id, name))
    }

    fn write_resource<'a>(
        &'a self,
        name: &'a str,
        content: &'a ResourceContent,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.store.write_resource(&self.session_id, name, content))
    }

    fn delete_resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.store.delete_resource(&self.session_id, name))
    }
}

/// Session state as one open run sees it: the session's state under the run's
/// own buffered writes. Writes go to the run's overlay, checked like direct
/// writes, and reach the session only when the run commits.
pub struct RunSessionState {
    store: Store,
    session_id: String,
    run_id: String,
}

impl RunSessionState {
    pub fn new(store: Store, session_id: String, run_id: String) -> Self {
        Self {
            store,
            session_id,
            run_id,
        }
    }

    fn scope(&self) -> RunScope<'_> {
        RunScope {
            session_id: &self.session_id,
            run_id: &self.run_id,
        }
    }
}

impl SessionState for RunSessionState {
    fn variable<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Value>>> {
        Box::pin(self.store.run_variable(self.scope(), name))
    }

    fn set_variable<'a>(&'a self, name: &'a str, value: &'a Value) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.store.run_set_variable(self.scope(), name, value))
    }

    fn list_resources(&self) -> BoxFuture<'_, Result<Vec<ResourceSummary>>> {
        Box::pin(self.store.run_list_resources(self.scope()))
    }

    fn resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Resource>>> {
        Box::pin(self.store.run_resource(self.scope(), name))
    }

    fn write_resource<'a>(
        &'a self,
        name: &'a str,
        content: &'a ResourceContent,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.store.run_write_resource(self.scope(), name, content))
    }

    fn delete_resource<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.store.run_delete_resource(self.scope(), name))
    }
}
