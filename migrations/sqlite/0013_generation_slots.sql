-- The generation loop's optional slots and its durable state (issue 15).

-- Extra slots a character's turns pass through besides the narrator, as a
-- JSON array of slot names (`director`, `verifier`, `memory`); NULL: none.
ALTER TABLE characters ADD COLUMN slots TEXT;

-- Where the generation loop is with a run it drives: `running`, then
-- `finished` (an answer is on the page; the next floor commits it) or
-- `failed`. NULL for runs opened by an external loop (POST /runs).
-- Durable, so a restart neither loses "commit on the next floor" nor leaves a
-- run that no process drives open forever.
ALTER TABLE floor_runs ADD COLUMN generation TEXT
    CHECK (generation IN ('running', 'finished', 'failed'));
CREATE INDEX floor_runs_by_generation ON floor_runs(session_id, generation, state);

-- Memories the memory slot wrote during a run: they land in session_memories
-- in the run's commit transaction and are dropped at its discard, so a page
-- that was swiped away leaves nothing behind.
CREATE TABLE run_memories (
    run_id      TEXT NOT NULL REFERENCES floor_runs(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    content     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
