//! The session state builtins read and write (variables and resources), behind
//! one small interface. Today writes go straight to the store; buffering sandbox
//! writes per attempt (applied when the floor commits) only needs another
//! implementation of [`SessionState`] that keeps its own overlay of writes.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::Result;
use crate::store::{Resource, ResourceContent, ResourceSummary, Store};

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
