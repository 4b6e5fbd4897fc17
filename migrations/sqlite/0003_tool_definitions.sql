-- Custom tool definitions (`/tools/definitions`), scoped to an account.
CREATE TABLE tool_definitions (
    id                  TEXT PRIMARY KEY NOT NULL,
    account_id          TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    description         TEXT NOT NULL DEFAULT '',
    parameters_json     TEXT NOT NULL,
    side_effect_level   TEXT NOT NULL,
    allowed_slots_json  TEXT NOT NULL DEFAULT '[]',
    source              TEXT NOT NULL,
    source_id           TEXT,
    enabled             INTEGER NOT NULL DEFAULT 1,
    handler_type        TEXT,
    handler_json        TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
);

-- Identity is (name, source, source_id) within an account, with a NULL source_id
-- counted as a value of its own: `source_id IS NULL` keeps NULL apart from every
-- real id (including ''), and COALESCE lets NULLs compare equal to each other.
CREATE UNIQUE INDEX tool_definitions_identity
    ON tool_definitions (account_id, name, source, source_id IS NULL, COALESCE(source_id, ''));
CREATE INDEX tool_definitions_by_account ON tool_definitions (account_id, updated_at);
