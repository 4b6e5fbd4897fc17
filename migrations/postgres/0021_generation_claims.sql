-- A session's right to generate, shared by every instance on the database:
-- at most one row per session, taken in one statement (an insert, or a
-- takeover of a dead instance's row) before a floor or regeneration starts a
-- run, and removed when the run's generation ends.
CREATE TABLE generation_claims (
    session_id TEXT PRIMARY KEY,
    instance_id TEXT NOT NULL,
    claim_id TEXT NOT NULL,
    claimed_at BIGINT NOT NULL
);
-- A cancel asked on an instance that does not drive the run: the driving
-- instance is told at once, and reads this when it may have missed the news.
ALTER TABLE floor_runs ADD COLUMN cancel_requested_at BIGINT;
