-- Deleting a session cancels its deferred calls that have not started
-- (store/runs.rs end_calls_of_deleted_session): found by session, without a
-- scan of every job ever run.
CREATE INDEX runtime_jobs_unstarted_by_session ON runtime_jobs(session_id)
    WHERE state IN ('staged', 'queued', 'awaiting_approval');
