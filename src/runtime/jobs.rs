//! The runtime-job worker: claims queued jobs with a lease, keeps the lease alive
//! while the tool runs, finishes the journal row and delivers the result to the
//! session. A job whose lease is lost becomes `uncertain` and is never re-run,
//! unless its tool is replay-safe: then it is handed over again (same
//! idempotency key, the next attempt number), up to `MAX_JOB_ATTEMPTS`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::ToolRuntime;
use crate::call::{JobInvocation, ToolOutcome, settle};
use crate::catalog::CallContext;
use crate::domain::tool::SideEffectLevel;
use crate::failure_log::FailureLog;
use crate::ids::now_ms;
use crate::reason::ReasonCode;
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

/// Wakes workers when a job becomes claimable, and tells readiness whether
/// the worker runs.
#[derive(Debug, Default)]
pub struct JobSignal {
    notify: Notify,
    worker_alive: std::sync::atomic::AtomicBool,
}

impl JobSignal {
    /// Stores a wake-up even when no worker is waiting right now, so a job queued
    /// while the worker is busy is picked up as soon as it looks again.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// After a commit made `count` staged jobs claimable: wakes a worker only
    /// when there is one to claim (a woken worker's claim that finds nothing
    /// is a statement for nothing).
    pub fn queued(&self, count: u64) {
        if count > 0 {
            self.wake();
        }
    }

    /// Marks the worker as running; set before its task is spawned so that
    /// readiness holds as soon as the server answers.
    pub fn worker_started(&self) {
        self.worker_alive
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the job worker is running.
    pub fn worker_alive(&self) -> bool {
        self.worker_alive.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Clears the worker's liveness however its task ends (a panic included).
struct AliveGuard(Arc<JobSignal>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0
            .worker_alive
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs queued jobs until `shutdown` is cancelled.
pub async fn run_worker(runtime: ToolRuntime, concurrency: usize, shutdown: CancellationToken) {
    let _alive = AliveGuard(runtime.jobs.clone());
    // Leases are held by the instance, so that an instance known to be dead
    // (the previous one on a data directory) can have its jobs ended at once.
    let owner = runtime.store.instance_id().to_owned();
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    tracing::info!(%owner, concurrency, "job worker started");
    // Leases run out in LEASE, so looking for lost ones once per heartbeat is
    // enough; doing it before every claim would add a write to every job.
    let mut last_lease_check: Option<tokio::time::Instant> = None;
    let mut lease_failures = FailureLog::new("checking job leases");
    let mut claim_failures = FailureLog::new("claiming jobs");
    loop {
        if last_lease_check.is_none_or(|at| at.elapsed() >= HEARTBEAT) {
            last_lease_check = Some(tokio::time::Instant::now());
            match runtime.store.expire_lost_jobs(false, None).await {
                Ok(lost) => {
                    lease_failures.succeeded();
                    report_lost_jobs(&runtime, &lost)
                }
                Err(err) => lease_failures.failed(&err),
            }
        }
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("semaphore is never closed"),
            _ = shutdown.cancelled() => break,
        };
        let lease_until = now_ms() + LEASE.as_millis() as i64;
        match runtime.store.claim_job(&owner, lease_until).await {
            Ok(Some(job)) => {
                claim_failures.succeeded();
                let runtime = runtime.clone();
                let owner = owner.clone();
                tokio::spawn(async move {
                    run_job(&runtime, &owner, job).await;
                    drop(permit);
                });
                continue;
            }
            Ok(None) => {
                claim_failures.succeeded();
                drop(permit)
            }
            Err(err) => {
                drop(permit);
                claim_failures.failed(&err);
            }
        }
        tokio::select! {
            _ = runtime.jobs.notify.notified() => {}
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

/// Logs what became of lost jobs, and wakes the workers for the ones queued
/// again.
pub fn report_lost_jobs(runtime: &ToolRuntime, lost: &crate::store::LostJobs) {
    if !lost.uncertain.is_empty() {
        tracing::warn!(executions = ?lost.uncertain, "jobs lost their lease and are now uncertain");
    }
    if !lost.delivered.is_empty() {
        let runtime = runtime.clone();
        let delivered = lost.delivered.clone();
        tokio::spawn(async move {
            for delivery in &delivered {
                runtime.publish_tool_result(delivery).await;
            }
        });
    }
    if !lost.redelivered.is_empty() {
        tracing::warn!(
            executions = ?lost.redelivered,
            max_attempts = crate::store::MAX_JOB_ATTEMPTS,
            "jobs of replay-safe tools lost their lease and are queued again under the same idempotency key"
        );
        runtime.jobs.wake();
    }
}

async fn run_job(runtime: &ToolRuntime, owner: &str, job: RuntimeJob) {
    tracing::debug!(job_id = %job.id, tool = ?job.tool_name, attempt = job.attempts, "job started");
    let invocation: JobInvocation = match serde_json::from_value(job.invocation.clone()) {
        Ok(invocation) => invocation,
        Err(err) => {
            let message = format!("the job's stored invocation is unreadable: {err}");
            let outcome = ToolOutcome::not_started(ReasonCode::JobInvocationUnreadable, message);
            finish(runtime, owner, &job, "", SideEffectLevel::None, outcome).await;
            return;
        }
    };
    let heartbeat = async {
        let mut ticker = tokio::time::interval(HEARTBEAT);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let lease_until = now_ms() + LEASE.as_millis() as i64;
            match runtime.store.heartbeat_job(&job, owner, lease_until).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(job_id = %job.id, "job lease lost while running");
                    crate::metrics::metrics().job_lease_losses.inc();
                    return;
                }
                Err(err) => tracing::error!(job_id = %job.id, error = %err, "heartbeat failed"),
            }
        }
    };
    let outcome = tokio::select! {
        outcome = runtime.invoke_job(&job, &invocation) => Some(outcome),
        _ = heartbeat => None,
    };
    let level = invocation.effective_side_effect_level();
    match outcome {
        Some(outcome) => finish(runtime, owner, &job, &invocation.call_id, level, outcome).await,
        None => match runtime.store.expire_lost_jobs(false, None).await {
            Ok(lost) => report_lost_jobs(runtime, &lost),
            Err(err) => tracing::error!(error = %err, "ending a lost job failed"),
        },
    }
}

async fn finish(
    runtime: &ToolRuntime,
    owner: &str,
    job: &RuntimeJob,
    call_id: &str,
    side_effect_level: SideEffectLevel,
    outcome: ToolOutcome,
) {
    let settled = settle(outcome, side_effect_level);
    let status = settled.status.as_str();
    let reason_code = settled.reason_code.map(ReasonCode::as_str);
    match runtime
        .store
        .complete_job(job, owner, &settled, call_id)
        .await
    {
        Ok(Some(delivery)) => {
            tracing::info!(job_id = %job.id, status, reason_code, "job finished; result delivered");
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

impl ToolRuntime {
    /// Runs a job's tool from its snapshot, through the provider that took it.
    async fn invoke_job(&self, job: &RuntimeJob, invocation: &JobInvocation) -> ToolOutcome {
        let Some(provider) = self.provider(&invocation.kind) else {
            return ToolOutcome::not_started(
                ReasonCode::JobProviderMissing,
                format!("no provider of kind {:?} can run this job", invocation.kind),
            );
        };
        let handler = match provider.restore(invocation) {
            Ok(handler) => handler,
            Err(message) => {
                return ToolOutcome::not_started(ReasonCode::JobSnapshotInvalid, message);
            }
        };
        let session = match self.store.session(&job.account_id, &job.session_id).await {
            Ok(session) => session,
            Err(err) => {
                return ToolOutcome::not_started(
                    ReasonCode::JobSessionGone,
                    format!("the job's session is gone: {err}"),
                );
            }
        };
        let call = invocation.to_call(&job.tool_name);
        let cx = CallContext {
            session: &session,
            run: None,
            call: &call,
            attempt: crate::call::Attempt {
                idempotency_key: &job.execution_id,
                number: u32::try_from(job.attempts).unwrap_or(u32::MAX).max(1),
            },
            catalog_events: self,
        };
        handler.invoke(&cx, &invocation.arguments).await
    }

    /// Sends a delivered result to the session's live model sessions.
    pub(super) async fn publish_tool_result(&self, delivery: &crate::store::Delivery) {
        let event = crate::model_sessions::ModelSessionEvent::new("tool_result", delivery);
        let reached = self.publish_to_session(&delivery.session_id, event);
        tracing::debug!(session_id = ?delivery.session_id, reached, "tool_result published");
    }
}
