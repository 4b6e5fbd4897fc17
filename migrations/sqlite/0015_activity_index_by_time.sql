-- 0014's activity index led with account_id. With no statistics, SQLite's
-- planner ranks one equality on any index's first column alike, and every
-- journal query has `account_id = ?`: floor and run queries (and the replay
-- guard's) took that index and scanned the account's whole journal (about
-- 220 ms at 1,000,000 rows instead of 0.3 ms; BENCHMARKS.md, issue 20).
-- Leading with started_at keeps the activity page a range scan of the last
-- hour (covering) and is never an equality candidate for the journal's queries.
DROP INDEX IF EXISTS texec_account_started;
CREATE INDEX IF NOT EXISTS texec_started_account ON tool_execution_record(started_at, account_id, provider_id, duration_ms);
