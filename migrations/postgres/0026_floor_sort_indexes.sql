-- A floor's journal page (`GET /tool-executions?floor_id=…`) in any of its
-- sorts is a range of one index, as a session's is (0019): with only
-- (floor_id, started_at), a page sorted by `created_at` or `finished_at` read
-- every row of the floor through a sort, and those columns sit after the
-- arguments and results in the row, so every large result's overflow pages
-- were read too. A client may journal any number of calls on one floor.
-- Partial like 0017: calls outside floors pay nothing.
DROP INDEX IF EXISTS texec_floor_started;
CREATE INDEX texec_floor_started ON tool_execution_record(floor_id, account_id, started_at, id) WHERE floor_id IS NOT NULL;
CREATE INDEX texec_floor_created ON tool_execution_record(floor_id, account_id, created_at, id) WHERE floor_id IS NOT NULL;
CREATE INDEX texec_floor_finished ON tool_execution_record(floor_id, account_id, finished_at NULLS FIRST, id) WHERE floor_id IS NOT NULL;
