-- A known value sealed with the secrets key of the first start that found
-- this table empty. Every start opens it: an instance whose key differs (a
-- second instance started without the shared TOOLGATE_SECRETS_KEY, a data
-- directory's key file lost or replaced) refuses to start instead of sealing
-- secrets the others cannot open. `toolgate forget-secrets` empties it.
CREATE TABLE secrets_key_check (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    sealed      BYTEA NOT NULL,
    created_at  BIGINT NOT NULL
);
