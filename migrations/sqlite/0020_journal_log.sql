-- The journal's append-only log (src/store/journal_log.rs): a call's rows are
-- appended there first and folded into tool_execution_record afterwards. This
-- row says which of the log's records the table already has: the log's
-- generation and the offset folded up to, written in the same transaction as
-- the rows, so start-up folds every record exactly once.
CREATE TABLE journal_log_position (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    generation  INTEGER NOT NULL,
    folded_to   INTEGER NOT NULL
);
INSERT INTO journal_log_position (id, generation, folded_to) VALUES (1, 0, 0);
