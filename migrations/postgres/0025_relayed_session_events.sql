-- A chat session's events (a generation's tokens and end, approvals, deferred
-- results) published on one instance, for the event streams other instances
-- hold open on that session. A row is a batch of events; its id goes out in a
-- notification on `toolgate_changes` (whose 8,000-byte payload cannot carry a
-- `run_finished` of up to 256 KiB) and the others read it by that id. Rows are
-- only needed while the notification is in flight: each instance deletes the
-- ones older than a minute with its heartbeat.
CREATE TABLE relayed_session_events (
    id          BIGSERIAL PRIMARY KEY,
    origin      TEXT NOT NULL,
    events      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX relayed_session_events_by_age ON relayed_session_events(created_at);
