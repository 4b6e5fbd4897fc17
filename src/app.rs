//! Building and running one server: storage, bootstrap, listener, shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::bootstrap::{self, Bootstrap};
use crate::config::Settings;
use crate::runtime::ToolRuntime;
use crate::state::AppState;
use crate::store::Store;
use crate::tools::remote::RemoteRegistry;

/// A server that is bound to its address and ready to serve.
pub struct App {
    listener: TcpListener,
    state: AppState,
    pub bootstrap: Bootstrap,
}

impl App {
    /// Opens storage, creates first-start defaults and binds the listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let store = Store::open(settings.database_url.as_deref(), &settings.data_dir).await?;
        let bootstrap = bootstrap::ensure_defaults(&store, &settings).await?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("binding {}", settings.listen))?;
        let settings = Arc::new(settings);
        let runtime = ToolRuntime {
            store: store.clone(),
            settings: settings.clone(),
            remote: Arc::new(RemoteRegistry::default()),
            scripts: crate::tools::script::ScriptRunner::with_default_concurrency(
                settings.script_limits(),
            ),
        };
        let state = AppState {
            store,
            settings,
            runtime,
        };
        Ok(Self {
            listener,
            state,
            bootstrap,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves, lets in-flight requests finish, then
    /// closes the database.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let store = self.state.store.clone();
        let router = crate::api::router(self.state);
        axum::serve(
            self.listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")?;
        store.close().await;
        tracing::info!("shut down cleanly");
        Ok(())
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown signal received; finishing in-flight requests");
}
