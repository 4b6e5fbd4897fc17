-- Human approval (issue 21): a call that needs approval is a journal row with
-- status `awaiting_approval` and a runtime job in state `awaiting_approval`
-- holding its snapshot, until an operator approves (the job is queued),
-- rejects it, or this deadline passes (both end it `denied`).
ALTER TABLE runtime_jobs ADD COLUMN approval_deadline_at BIGINT;
CREATE INDEX runtime_jobs_approval_deadline ON runtime_jobs(approval_deadline_at)
    WHERE approval_deadline_at IS NOT NULL;
