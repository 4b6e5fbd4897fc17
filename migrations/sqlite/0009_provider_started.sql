-- Whether a call's provider was started is recorded, not guessed from the
-- status: an invalid-arguments refusal and a refused connection are `error`
-- rows whose provider never ran, and they must count as neither a step, a
-- replay parent nor against the call budget.
ALTER TABLE tool_execution_record ADD COLUMN provider_started INTEGER NOT NULL DEFAULT 0;

-- Rows written before this column existed: everything but a refusal started,
-- except the argument refusals the dispatcher wrote as `error` before running
-- anything (their messages are the dispatcher's own).
UPDATE tool_execution_record SET provider_started = CASE
    WHEN status IN ('denied', 'blocked') THEN 0
    WHEN status = 'error' AND (error_message LIKE 'invalid arguments:%'
        OR error_message LIKE 'tool arguments %'
        OR error_message LIKE 'could not connect to the callback at %') THEN 0
    ELSE 1 END;

-- The call budget is now counted from the journal per run (or per floor outside
-- runs), from calls that were decided to run.
DROP TABLE IF EXISTS floor_tool_call_counts;

-- Partial, so that calls outside runs and floors (the common case of a plain
-- integration) do not pay for them on every journal write.
CREATE INDEX texec_run_started_steps ON tool_execution_record(run_id, provider_started, step_key)
    WHERE run_id IS NOT NULL;
CREATE INDEX texec_floor_budget ON tool_execution_record(floor_id, provider_started)
    WHERE run_id IS NULL AND floor_id IS NOT NULL;
