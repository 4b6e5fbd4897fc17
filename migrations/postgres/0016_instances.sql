-- Which toolgate process opened a journal row, and the processes that are
-- alive, so that the rows a dead process left `opened` become `uncertain`
-- without touching the rows of a process still running them (several
-- instances on one PostgreSQL database; on SQLite there is one instance, and
-- start-up treats every other one as dead).
ALTER TABLE tool_execution_record ADD COLUMN instance_id TEXT;

CREATE TABLE toolgate_instances (
    id            TEXT PRIMARY KEY NOT NULL,
    host          TEXT NOT NULL,
    pid           BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL
);
