-- Accounts, characters, sessions, floors and pages.
CREATE TABLE accounts (
    id            TEXT PRIMARY KEY NOT NULL,
    name          TEXT NOT NULL,
    api_key_hash  TEXT NOT NULL UNIQUE,
    is_admin      INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL
);

CREATE TABLE characters (
    id           TEXT PRIMARY KEY NOT NULL,
    account_id   TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    name         TEXT NOT NULL UNIQUE,
    description  TEXT NOT NULL DEFAULT '',
    persona      TEXT NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX characters_by_account ON characters(account_id, created_at);

CREATE TABLE sessions (
    id             TEXT PRIMARY KEY NOT NULL,
    account_id     TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    character_id   TEXT NOT NULL REFERENCES characters(id) ON DELETE CASCADE,
    title          TEXT NOT NULL DEFAULT '',
    metadata_json  TEXT NOT NULL DEFAULT '{}',
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
CREATE INDEX sessions_by_account ON sessions(account_id, created_at);
CREATE INDEX sessions_by_character ON sessions(character_id);

CREATE TABLE floors (
    id              TEXT PRIMARY KEY NOT NULL,
    session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    user_content    TEXT NOT NULL,
    active_page_id  TEXT,
    created_at      INTEGER NOT NULL,
    UNIQUE (session_id, seq)
);

CREATE TABLE pages (
    id          TEXT PRIMARY KEY NOT NULL,
    floor_id    TEXT NOT NULL REFERENCES floors(id) ON DELETE CASCADE,
    page_no     INTEGER NOT NULL,
    content     TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    UNIQUE (floor_id, page_no)
);
