//! Building and running one server: storage, bootstrap, listener, shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::bootstrap::{self, Bootstrap};
use crate::config::Settings;
use crate::listener::{self, ConnectionLimits};
use crate::runtime::ToolRuntime;
use crate::secrets::{KeySource, SecretsKey};
use crate::state::AppState;
use crate::store::{SecretsKeyMismatch, Store};

/// A server that is bound to its address and ready to serve.
pub struct App {
    listener: TcpListener,
    /// The keyless `/metrics` listener (`--metrics-listen`), if configured.
    metrics_listener: Option<TcpListener>,
    limits: ConnectionLimits,
    state: AppState,
    /// Other instances' announcements since before the stored MCP servers
    /// were read, for the follower `run` starts.
    cluster_events: tokio::sync::broadcast::Receiver<crate::store::ClusterEvent>,
    pub bootstrap: Bootstrap,
}

impl App {
    /// Opens storage, creates first-start defaults, ends what a previous
    /// process left running, attaches the stored MCP servers and binds the
    /// listener.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Before anything opens a descriptor: idle clients must not be able to
        // take them all (the connection cap is fitted under this limit).
        let open_files = listener::raise_open_file_limit();
        let limits = ConnectionLimits::new(&settings, open_files);
        let mut secrets = SecretsKey::load(
            settings.secrets_key.as_ref().map(|k| k.expose()),
            &settings.data_dir,
        )?;
        let store = Store::open_with_secrets(
            settings.database_url.as_deref(),
            &settings.data_dir,
            secrets.key.clone(),
        )
        .await?;
        // Only now: a database this binary refuses (a newer schema) leaves
        // the data directory without a key that was never used.
        secrets.save()?;
        log_key_source(&secrets.source);
        if let Err(err) = store.check_secrets_key().await {
            if err.is::<SecretsKeyMismatch>() {
                secrets.discard_generated();
            }
            // Deregisters: a refused instance must not look alive to the others.
            store.close().await;
            return Err(err);
        }
        let bootstrap = bootstrap::ensure_defaults(&store, &settings).await?;
        let recovered = store
            .recover_interrupted_at_start()
            .await
            .context("recovering interrupted tool executions")?;
        if recovered > 0 {
            tracing::warn!(
                recovered,
                "tool executions interrupted by a previous stop are now uncertain"
            );
        }
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("binding {}", settings.listen))?;
        crate::metrics::set_enabled(settings.metrics == crate::config::MetricsSwitch::On);
        let metrics_listener = match settings.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the metrics listener {addr}"))?,
            ),
            None => None,
        };
        let settings = Arc::new(settings);
        let runtime = ToolRuntime::new(store, settings)?;
        // Before the caller says it is listening: a database that fails these
        // reads fails the start, not a server a supervisor already saw ready.
        recover_at_start(&runtime).await?;
        // Subscribed before the stored MCP servers are read: a change another
        // instance announces from here on reaches the follower.
        let cluster_events = runtime.store.cluster_events();
        // Servers connect in the background: start-up never waits on one.
        runtime
            .start_mcp()
            .await
            .context("attaching the stored MCP servers")?;
        let state = AppState::new(runtime);
        Ok(Self {
            listener,
            metrics_listener,
            limits,
            state,
            cluster_events,
            bootstrap,
        })
    }

    /// The address of the keyless metrics listener, if one is configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
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
        let runtime = self.state.runtime.clone();
        let store = runtime.store.clone();
        let cluster_events = self.cluster_events;
        let workers = tokio_util::sync::CancellationToken::new();
        let worker = (runtime.settings.job_workers > 0).then(|| {
            runtime.jobs.worker_started();
            tokio::spawn(crate::runtime::jobs::run_worker(
                runtime.clone(),
                runtime.settings.job_workers,
                workers.clone(),
            ))
        });
        let sweeper = tokio::spawn(crate::runtime::approvals::run_approval_sweeper(
            runtime.clone(),
            workers.clone(),
        ));
        let gone_sessions = tokio::spawn(crate::runtime::run_gone_session_sweeper(
            runtime.clone(),
            workers.clone(),
        ));
        // Stopped last of the tasks, so that the results and runs' ends of
        // the stop reach the other instances.
        let relay_stop = tokio_util::sync::CancellationToken::new();
        let relay = runtime.start_event_relay(relay_stop.clone());
        let follower = store.shared_database().then(|| {
            tokio::spawn(crate::runtime::cluster::follow_other_instances(
                runtime.clone(),
                cluster_events,
                workers.clone(),
            ))
        });
        // Event streams never end on their own; closing them lets graceful
        // shutdown finish instead of waiting for subscribers to hang up.
        let model_sessions = self.state.runtime.model_sessions.clone();
        // The job worker stops claiming as the stop begins, not after the
        // requests drained: a job claimed then could be cut off by a
        // supervisor's kill, and a queued one is safe where it is.
        let stop_claiming = workers.clone();
        let shutdown = async move {
            shutdown.await;
            stop_claiming.cancel();
            model_sessions.close_all();
        };
        let metrics_server = self
            .metrics_listener
            .map(|listener| tokio::spawn(crate::api::serve_metrics(listener, self.state.clone())));
        let router = crate::api::router(self.state);
        // Stops accepting at `shutdown`, then waits for in-flight requests.
        listener::serve(self.listener, router, self.limits, shutdown).await;
        // A call whose client hung up is no longer an in-flight request, but it
        // has started and must be journalled to its end.
        runtime.finish_started_calls().await;
        // Stdio servers' process groups are killed here.
        runtime.mcp.shutdown().await;
        workers.cancel();
        if let Some(worker) = worker {
            let _ = worker.await;
        }
        if let Some(follower) = follower {
            let _ = follower.await;
        }
        let _ = sweeper.await;
        let _ = gone_sessions.await;
        relay_stop.cancel();
        if let Some(relay) = relay {
            let _ = relay.await;
        }
        if let Some(server) = metrics_server {
            server.abort();
        }
        store.close().await;
        tracing::info!("shut down cleanly");
        Ok(())
    }
}

/// Ends what the previous process left running: its jobs, and its
/// generations (on a shared database, only dead instances').
async fn recover_at_start(runtime: &crate::runtime::ToolRuntime) -> anyhow::Result<()> {
    let store = &runtime.store;
    // The embedded database has one instance: a job still marked running was
    // lost with the previous process. On a shared database another
    // instance may be running it: only leases that ran out are lost.
    // The previous process on this data directory is dead for certain
    // (its lock was free): its jobs are lost at once.
    let lost = store
        .expire_lost_jobs(!store.shared_database(), store.previous_instance())
        .await?;
    let interrupted = runtime.discard_interrupted_generations().await?;
    if interrupted > 0 {
        tracing::warn!(
            interrupted,
            "generations interrupted by the previous stop were discarded"
        );
    }
    crate::runtime::jobs::report_lost_jobs(runtime, &lost);
    Ok(())
}

/// Says where the secrets key came from, never what it is.
fn log_key_source(source: &KeySource) {
    match source {
        KeySource::Configured => tracing::info!("secrets key: from TOOLGATE_SECRETS_KEY"),
        KeySource::File {
            path,
            generated: true,
        } => {
            tracing::info!(path = %path.display(), "secrets key: generated into the data directory")
        }
        KeySource::File {
            path,
            generated: false,
        } => tracing::info!(path = %path.display(), "secrets key: from the data directory"),
    }
}

/// A future that resolves on SIGINT or SIGTERM. The handlers are installed
/// when this is called, not when the future is first polled: a server that
/// says it is listening must already stop gracefully on a signal (a test or a
/// supervisor may send one at once).
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &'static str| match signal(kind) {
            Ok(stream) => Some(stream),
            Err(err) => {
                tracing::warn!(%err, signal = name, "cannot listen for the signal");
                None
            }
        };
        (
            install(SignalKind::interrupt(), "SIGINT"),
            install(SignalKind::terminate(), "SIGTERM"),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let (mut interrupt, mut terminate) = signals;
            let wait = |stream: Option<tokio::signal::unix::Signal>| async move {
                match stream {
                    Some(mut stream) => {
                        stream.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(interrupt.take()) => {},
                _ = wait(terminate.take()) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received; finishing in-flight requests");
    }
}
