-- The web console's activity page reads one account's calls of the last hour
-- (provider, start, duration): a range of this index instead of a scan of the
-- whole journal.
CREATE INDEX IF NOT EXISTS texec_account_started ON tool_execution_record(account_id, started_at, provider_id, duration_ms);
