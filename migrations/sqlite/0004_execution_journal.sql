-- The execution journal (tool_execution_record): the single source of truth of
-- tool calls, and the runs (generation attempts) they belong to.
CREATE TABLE floor_runs (
    id            TEXT PRIMARY KEY NOT NULL,
    account_id    TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    floor_id      TEXT NOT NULL REFERENCES floors(id) ON DELETE CASCADE,
    page_id       TEXT NOT NULL,
    state         TEXT NOT NULL, -- open | committed | discarded
    confirmed_execution_ids TEXT NOT NULL DEFAULT '[]',
    created_at    INTEGER NOT NULL,
    finished_at   INTEGER
);
CREATE INDEX floor_runs_by_floor ON floor_runs(floor_id, created_at);

CREATE TABLE tool_execution_record (
    id                          TEXT PRIMARY KEY NOT NULL,
    account_id                  TEXT NOT NULL,
    session_id                  TEXT NOT NULL,
    run_id                      TEXT,
    floor_id                    TEXT,
    page_id                     TEXT,
    call_id                     TEXT NOT NULL,
    caller_slot                 TEXT NOT NULL,
    provider_id                 TEXT NOT NULL,
    provider_type               TEXT NOT NULL,
    tool_name                   TEXT NOT NULL,
    args_json                   TEXT NOT NULL,
    args_canonical              TEXT NOT NULL,
    result_json                 TEXT,
    status                      TEXT NOT NULL,
    lifecycle_state             TEXT NOT NULL,
    commit_outcome              TEXT NOT NULL,
    side_effect_level           TEXT NOT NULL,
    replay_safety               TEXT NOT NULL,
    error_message               TEXT,
    duration_ms                 INTEGER NOT NULL DEFAULT 0,
    started_at                  INTEGER NOT NULL,
    finished_at                 INTEGER,
    delivery_mode               TEXT NOT NULL,
    attempt_no                  INTEGER NOT NULL DEFAULT 1,
    runtime_job_id              TEXT,
    replay_parent_execution_id  TEXT,
    created_at                  INTEGER NOT NULL
);
-- Every query is scoped by one of session, floor or run and sorted by a time
-- column; these keep the first page of any such query an index range scan.
CREATE INDEX texec_session_started ON tool_execution_record(session_id, started_at);
CREATE INDEX texec_session_created ON tool_execution_record(session_id, created_at);
CREATE INDEX texec_floor_started ON tool_execution_record(floor_id, started_at);
CREATE INDEX texec_run_started ON tool_execution_record(run_id, started_at);
CREATE INDEX texec_page_created ON tool_execution_record(page_id, created_at);
CREATE INDEX texec_open ON tool_execution_record(lifecycle_state) WHERE lifecycle_state = 'opened';
