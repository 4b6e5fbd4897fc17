-- Sandbox effects (variable and resource writes) made inside a run, buffered
-- until the run ends: applied in `seq` order to session_variables /
-- session_resources in the commit's transaction, dropped at discard. Durable,
-- so a run committed after a restart still applies its writes.
CREATE TABLE run_effects (
    run_id        TEXT NOT NULL REFERENCES floor_runs(id) ON DELETE CASCADE,
    -- 1, 2, 3... within the run: the order the writes were made in.
    seq           INTEGER NOT NULL,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    kind          TEXT NOT NULL CHECK (kind IN ('variable', 'resource')),
    name          TEXT NOT NULL,
    op            TEXT NOT NULL CHECK (op IN ('set', 'delete')),
    -- For `set`: the variable's value as JSON, or the resource's stored content.
    payload       TEXT,
    -- For a resource `set`: `text` or `json`.
    content_kind  TEXT CHECK (content_kind IN ('text', 'json')),
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq),
    CHECK ((op = 'set') = (payload IS NOT NULL)),
    CHECK ((kind = 'resource' AND op = 'set') = (content_kind IS NOT NULL))
);
-- Read-your-writes: the latest write of one name in a run.
CREATE INDEX run_effects_by_name ON run_effects(run_id, kind, name, seq);
