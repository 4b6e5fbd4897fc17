-- `GET /sessions?sort_by=updated_at` (and the console's session list) sorts
-- an account's sessions by their last change: without this index every
-- session of the account was read and sorted (5.7 s at 1,000,000, probe I).
CREATE INDEX sessions_by_account_updated ON sessions(account_id, updated_at, id);
