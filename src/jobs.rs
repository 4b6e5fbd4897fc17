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
/// How long shutdown waits for running jobs.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
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
    /// Stores a wake-up even when no worker is waiting right now, so a job queued
    /// while the worker is busy is picked up as soon as it looks again.
    pub fn wake(&self) {
        self.0.notify_one();
    }
}

/// Runs queued jobs until `shutdown` is cancelled.
pub async fn run_worker(runtime: ToolRuntime, concurrency: usize, shutdown: CancellationToken) {
    let owner = new_id("worker");
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    tracing::info!(%owner, concurrency, "job worker started");
    // Leases run out in LEASE, so looking for lost ones once per heartbeat is
    // enough; doing it before every claim would add a write to every job.
    let mut last_lease_check: Option<tokio::time::Instant> = None;
    loop {
        if last_lease_check.is_none_or(|at| at.elapsed() >= HEARTBEAT) {
            last_lease_check = Some(tokio::time::Instant::now());
            match runtime.store.expire_lost_jobs(false).await {
                Ok(lost) if !lost.is_empty() => {
                    tracing::warn!(executions = ?lost, "jobs lost their lease and are now uncertain")
                }
                Ok(_) => {}
                Err(err) => tracing::error!(error = %err, "checking job leases failed"),
            }
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
    // Give running jobs a moment to finish before the database closes; one still
    // running after that is found `running` at the next start and becomes
    // `uncertain` (never re-run), which is the honest outcome.
    let all = concurrency.max(1) as u32;
    if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(%owner, "jobs still running at shutdown; they will be marked uncertain at the next start");
    }
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
            match runtime
                .store
                .heartbeat_job(&job.id, owner, lease_until)
                .await
            {
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

async fn finish(
    runtime: &ToolRuntime,
    owner: &str,
    job: &RuntimeJob,
    call_id: &str,
    outcome: ToolOutcome,
) {
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
        Ok(None) => {
            tracing::warn!(job_id = %job.id, "job finished after its lease was lost; result dropped")
        }
        Err(err) => {
            tracing::error!(job_id = %job.id, error = %err, "recording a job result failed")
        }
    }
}

impl JobInvocation {
    /// The snapshot of a remote call, taken when the call is made.
    pub fn remote(
        tool: &crate::tools::remote::RemoteTool,
        call: &crate::dispatch::ToolCall,
        args: &Value,
    ) -> Self {
        JobInvocation::Remote {
            name: tool.name.clone(),
            callback_url: tool.callback_url.as_str().to_owned(),
            source: tool.source.clone(),
            role: tool.role.clone(),
            timeout_seconds: tool.timeout_seconds,
            call_id: call.call_id.clone(),
            raw_arguments: call.arguments.raw.clone(),
            arguments: args.clone(),
        }
    }
}

impl ToolRuntime {
    /// Runs a job's tool from its snapshot.
    async fn invoke_job(&self, invocation: &JobInvocation) -> ToolOutcome {
        match invocation {
            JobInvocation::Remote {
                name,
                callback_url,
                source,
                role,
                timeout_seconds,
                call_id,
                raw_arguments,
                arguments,
            } => {
                let callback_url = match crate::domain::CallbackUrl::parse(callback_url) {
                    Ok(url) => url,
                    Err(err) => {
                        return ToolOutcome::Error(format!(
                            "stored callback URL is invalid: {err}"
                        ));
                    }
                };
                let tool = crate::tools::remote::RemoteTool {
                    name: name.clone(),
                    description: String::new(),
                    parameters: Value::Object(Default::default()),
                    callback_url,
                    source: source.clone(),
                    timeout_seconds: *timeout_seconds,
                    role: role.clone(),
                    metadata: crate::domain::tool::ToolMetadata::declared(
                        crate::domain::tool::SideEffectLevel::None,
                        Vec::new(),
                        None,
                    ),
                };
                let call = crate::dispatch::ToolCall {
                    name: name.clone(),
                    arguments: crate::dispatch::CallArguments {
                        raw: raw_arguments.clone(),
                        parsed: Ok(arguments.clone()),
                    },
                    call_id: call_id.clone(),
                    caller_slot: crate::domain::tool::Slot::Narrator,
                    floor_id: None,
                    run_id: None,
                    step: None,
                };
                self.call_remote(&Arc::new(tool), &call, arguments).await
            }
        }
    }

    /// Sends a delivered result to the session's live model sessions.
    async fn publish_tool_result(&self, delivery: &crate::store::Delivery) {
        let event = crate::model_sessions::ModelSessionEvent {
            kind: "tool_result",
            data: serde_json::to_value(delivery).unwrap_or_default(),
        };
        let reached = self
            .model_sessions
            .publish_to_session(&delivery.session_id, event);
        tracing::debug!(session = %delivery.session_id, reached, "tool_result published");
    }
}
