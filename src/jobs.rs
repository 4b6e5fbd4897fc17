//! The runtime-job worker: claims queued jobs with a lease, keeps the lease alive
//! while the tool runs, finishes the journal row and delivers the result to the
//! session. A job whose lease is lost becomes `uncertain` and is never re-run.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::dispatch::ToolOutcome;
use crate::ids::{new_id, now_ms};
use crate::runtime::ToolRuntime;
use crate::store::RuntimeJob;

/// How long a claim lasts without a heartbeat.
const LEASE: Duration = Duration::from_secs(30);
/// How often a running job renews its lease.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often an idle worker looks for work it was not told about (e.g. jobs
/// queued by another process, or leases that ran out).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Everything needed to run a deferred call later, even after a restart has
/// emptied the runtime registries: a snapshot of the tool taken at call time.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobInvocation {
    /// A remote callback.
    Remote {
        name: String,
        callback_url: String,
        source: String,
        role: String,
        timeout_seconds: f64,
        call_id: String,
        raw_arguments: String,
        arguments: Value,
    },
}

impl JobInvocation {
    fn call_id(&self) -> &str {
        match self {
            JobInvocation::Remote { call_id, .. } => call_id,
        }
    }
}

/// Wakes workers when a job becomes claimable.
#[derive(Debug, Default)]
pub struct JobSignal(Notify);

impl JobSignal {
    pub fn wake(&self) {
        self.0.notify_waiters();
    }
}

/// Runs queued jobs until `shutdown` is cancelled.
pub async fn run_worker(runtime: ToolRuntime, concurrency: usize, shutdown: CancellationToken) {
    let owner = new_id("worker");
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    tracing::info!(%owner, concurrency, "job worker started");
    loop {
        match runtime.store.expire_lost_jobs(false).await {
            Ok(lost) if !lost.is_empty() => {
                tracing::warn!(executions = ?lost, "jobs lost their lease and are now uncertain")
            }
            Ok(_) => {}
            Err(err) => tracing::error!(error = %err, "checking job leases failed"),
        }
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("semaphore is never closed"),
            _ = shutdown.cancelled() => break,
        };
        let lease_until = now_ms() + LEASE.as_millis() as i64;
        match runtime.store.claim_job(&owner, lease_until).await {
            Ok(Some(job)) => {
                let runtime = runtime.clone();
                let owner = owner.clone();
                tokio::spawn(async move {
                    run_job(&runtime, &owner, job).await;
                    drop(permit);
                });
                continue;
            }
            Ok(None) => drop(permit),
            Err(err) => {
                drop(permit);
                tracing::error!(error = %err, "claiming a job failed");
            }
        }
        tokio::select! {
            _ = runtime.jobs.0.notified() => {}
            _ = tokio::time::sleep(IDLE_POLL) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    // Let running jobs finish within their own timeouts before the database closes.
    let _ = permits.acquire_many(concurrency.max(1) as u32).await;
    tracing::info!(%owner, "job worker stopped");
}

async fn run_job(runtime: &ToolRuntime, owner: &str, job: RuntimeJob) {
    tracing::info!(job_id = %job.id, tool = %job.tool_name, attempt = job.attempts, "job started");
    let invocation: JobInvocation = match serde_json::from_value(job.invocation.clone()) {
        Ok(invocation) => invocation,
        Err(err) => {
            let message = format!("the job's stored invocation is unreadable: {err}");
            finish(runtime, owner, &job, "", ToolOutcome::Error(message)).await;
            return;
        }
    };
    let heartbeat = async {
        let mut ticker = tokio::time::interval(HEARTBEAT);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let lease_until = now_ms() + LEASE.as_millis() as i64;
            match runtime.store.heartbeat_job(&job.id, owner, lease_until).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(job_id = %job.id, "job lease lost while running");
                    return;
                }
                Err(err) => tracing::error!(job_id = %job.id, error = %err, "heartbeat failed"),
            }
        }
    };
    let outcome = tokio::select! {
        outcome = runtime.invoke_job(&invocation) => Some(outcome),
        _ = heartbeat => None,
    };
    match outcome {
        Some(outcome) => finish(runtime, owner, &job, invocation.call_id(), outcome).await,
        None => {
            if let Err(err) = runtime.store.expire_lost_jobs(false).await {
                tracing::error!(error = %err, "marking a lost job uncertain failed");
            }
        }
    }
}

async fn finish(runtime: &ToolRuntime, owner: &str, job: &RuntimeJob, call_id: &str, outcome: ToolOutcome) {
    let (status, output, is_error) = match outcome {
        ToolOutcome::Success(output) => ("success", output, false),
        ToolOutcome::Error(message) => ("error", Value::String(message), true),
        ToolOutcome::Timeout(message) => ("timeout", Value::String(message), true),
    };
    match runtime
        .store
        .complete_job(job, owner, status, &output, is_error, call_id)
        .await
    {
        Ok(Some(delivery)) => {
            tracing::info!(job_id = %job.id, status, "job finished; result delivered");
            runtime.publish_tool_result(&delivery).await;
        }
        Ok(None) => tracing::warn!(job_id = %job.id, "job finished after its lease was lost; result dropped"),
        Err(err) => tracing::error!(job_id = %job.id, error = %err, "recording a job result failed"),
    }
}
