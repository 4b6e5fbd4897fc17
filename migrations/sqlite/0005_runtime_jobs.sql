-- Durable async tool jobs (an outbox: a job becomes claimable only when its run
-- commits) and the tool results delivered to sessions.
CREATE TABLE runtime_jobs (
    id                TEXT PRIMARY KEY NOT NULL,
    account_id        TEXT NOT NULL,
    session_id        TEXT NOT NULL,
    execution_id      TEXT NOT NULL,
    run_id            TEXT,
    tool_name         TEXT NOT NULL,
    state             TEXT NOT NULL, -- staged | queued | running | succeeded | failed | uncertain | cancelled
    invocation_json   TEXT NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    attempts          INTEGER NOT NULL DEFAULT 0,
    result_json       TEXT,
    error_message     TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    started_at        INTEGER,
    finished_at       INTEGER
);
CREATE INDEX runtime_jobs_claimable ON runtime_jobs(state, created_at);
CREATE INDEX runtime_jobs_by_run ON runtime_jobs(run_id);

CREATE TABLE session_deliveries (
    id              TEXT PRIMARY KEY NOT NULL,
    session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    execution_id    TEXT NOT NULL,
    runtime_job_id  TEXT,
    call_id         TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    output_json     TEXT NOT NULL,
    is_error        INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    consumed_at     INTEGER
);
CREATE INDEX session_deliveries_by_session ON session_deliveries(session_id, created_at);
