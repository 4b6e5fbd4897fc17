-- Journal indexes for large journals (BENCHMARKS.md, journal queries on 1,000,000
-- rows). Every journal query is scoped to one account, and `meta.total` counts
-- every matching row: with account_id in the session indexes that count is an
-- index-only scan instead of one table lookup per row of the session.
DROP INDEX IF EXISTS texec_session_started;
CREATE INDEX texec_session_started ON tool_execution_record(session_id, account_id, started_at);
-- The most common filter within a session: a range per status, counted and paged
-- in order without touching the other statuses.
CREATE INDEX texec_session_status ON tool_execution_record(session_id, account_id, status, started_at);
-- sort_by=finished_at pages in index order instead of sorting the whole session.
CREATE INDEX texec_session_finished ON tool_execution_record(session_id, finished_at);
-- "Which calls of this tool (from this slot)": a range per tool name instead of
-- a table lookup for every row of the session.
CREATE INDEX texec_session_tool ON tool_execution_record(session_id, account_id, tool_name, caller_slot, started_at);
