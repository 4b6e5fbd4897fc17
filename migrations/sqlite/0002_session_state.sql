-- Session state the builtin tools read and write: variables, resources and
-- memories; a full-text index over the session's text; per-floor call counters.

CREATE TABLE session_variables (
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    value_json  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (session_id, name)
);

CREATE TABLE session_resources (
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('text', 'json')),
    -- The text itself for `text`, the serialized value for `json`.
    content     TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (session_id, name)
);

CREATE TABLE session_memories (
    id          TEXT PRIMARY KEY NOT NULL,
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    content     TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX session_memories_by_session ON session_memories(session_id, created_at);

-- Calls that passed the permission checks on a floor: the `max_calls_per_turn`
-- budget is reserved here with one atomic statement, so parallel calls cannot
-- race past it and the count survives a restart.
CREATE TABLE floor_tool_call_counts (
    floor_id  TEXT PRIMARY KEY NOT NULL REFERENCES floors(id) ON DELETE CASCADE,
    calls     INTEGER NOT NULL
);

-- Every searchable text of a session in one table, so that bm25 ranks floors,
-- pages and memories against the same corpus statistics. Rows are maintained
-- only by the triggers below; `ref_id` is the id of the source row.
CREATE TABLE session_texts (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL,
    source      TEXT NOT NULL CHECK (source IN ('floor', 'page', 'memory')),
    ref_id      TEXT NOT NULL UNIQUE,
    floor_id    TEXT,
    content     TEXT NOT NULL
);
CREATE INDEX session_texts_by_session ON session_texts(session_id);

CREATE VIRTUAL TABLE session_texts_fts USING fts5(
    content,
    content = 'session_texts',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER session_texts_ai AFTER INSERT ON session_texts BEGIN
    INSERT INTO session_texts_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER session_texts_ad AFTER DELETE ON session_texts BEGIN
    INSERT INTO session_texts_fts (session_texts_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER session_texts_au AFTER UPDATE OF content ON session_texts BEGIN
    INSERT INTO session_texts_fts (session_texts_fts, rowid, content)
        VALUES ('delete', old.id, old.content);
    INSERT INTO session_texts_fts (rowid, content) VALUES (new.id, new.content);
END;

-- Floors: the user's message.
CREATE TRIGGER floors_text_ai AFTER INSERT ON floors BEGIN
    INSERT INTO session_texts (session_id, source, ref_id, floor_id, content)
        VALUES (new.session_id, 'floor', new.id, new.id, new.user_content);
END;
CREATE TRIGGER floors_text_au AFTER UPDATE OF user_content ON floors BEGIN
    UPDATE session_texts SET content = new.user_content WHERE ref_id = new.id;
END;
CREATE TRIGGER floors_text_ad AFTER DELETE ON floors BEGIN
    DELETE FROM session_texts WHERE ref_id = old.id;
END;

-- Pages: the replies. Every page is indexed; searches keep only active pages.
CREATE TRIGGER pages_text_ai AFTER INSERT ON pages BEGIN
    INSERT INTO session_texts (session_id, source, ref_id, floor_id, content)
        SELECT f.session_id, 'page', new.id, new.floor_id, new.content
        FROM floors f WHERE f.id = new.floor_id;
END;
CREATE TRIGGER pages_text_au AFTER UPDATE OF content ON pages BEGIN
    UPDATE session_texts SET content = new.content WHERE ref_id = new.id;
END;
CREATE TRIGGER pages_text_ad AFTER DELETE ON pages BEGIN
    DELETE FROM session_texts WHERE ref_id = old.id;
END;

-- Memories.
CREATE TRIGGER memories_text_ai AFTER INSERT ON session_memories BEGIN
    INSERT INTO session_texts (session_id, source, ref_id, floor_id, content)
        VALUES (new.session_id, 'memory', new.id, NULL, new.content);
END;
CREATE TRIGGER memories_text_au AFTER UPDATE OF content ON session_memories BEGIN
    UPDATE session_texts SET content = new.content WHERE ref_id = new.id;
END;
CREATE TRIGGER memories_text_ad AFTER DELETE ON session_memories BEGIN
    DELETE FROM session_texts WHERE ref_id = old.id;
END;

-- Text written before this migration.
INSERT INTO session_texts (session_id, source, ref_id, floor_id, content)
    SELECT session_id, 'floor', id, id, user_content FROM floors;
INSERT INTO session_texts (session_id, source, ref_id, floor_id, content)
    SELECT f.session_id, 'page', p.id, p.floor_id, p.content
    FROM pages p JOIN floors f ON f.id = p.floor_id;
