-- A call outside a floor, run or page has nothing to find in the indexes on
-- those columns: indexing only the rows that have them spares every such
-- call's row three index pages in each of its writes (issue 20). A query on
-- `floor_id = ?` (and the others) implies `IS NOT NULL`, so it still uses them.
DROP INDEX IF EXISTS texec_floor_started;
DROP INDEX IF EXISTS texec_run_started;
DROP INDEX IF EXISTS texec_page_created;
CREATE INDEX texec_floor_started ON tool_execution_record(floor_id, started_at) WHERE floor_id IS NOT NULL;
CREATE INDEX texec_run_started ON tool_execution_record(run_id, started_at) WHERE run_id IS NOT NULL;
CREATE INDEX texec_page_created ON tool_execution_record(page_id, created_at) WHERE page_id IS NOT NULL;

-- Every journal list has `account_id = ?` beside its session: with the account
-- in the created/finished indexes the filter is answered from the index, and an
-- `offset` page skips its first rows without reading them from the table.
DROP INDEX IF EXISTS texec_session_created;
DROP INDEX IF EXISTS texec_session_finished;
CREATE INDEX texec_session_created ON tool_execution_record(session_id, account_id, created_at);
CREATE INDEX texec_session_finished ON tool_execution_record(session_id, account_id, finished_at NULLS FIRST);
