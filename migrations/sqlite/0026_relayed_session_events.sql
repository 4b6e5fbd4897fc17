-- Events relayed between instances sharing a PostgreSQL database (see
-- migrations/postgres/0025_relayed_session_events.sql). An SQLite database
-- has one instance, which relays nothing: the table stays empty and exists so
-- that both schemas hold the same tables.
CREATE TABLE relayed_session_events (
    id          INTEGER PRIMARY KEY,
    origin      TEXT NOT NULL,
    events      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX relayed_session_events_by_age ON relayed_session_events(created_at);
