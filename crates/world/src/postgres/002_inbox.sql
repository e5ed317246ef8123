-- The inbox (messages, steers, signals waiting for a driver) and waits on signals.
ALTER TABLE steadfast_sessions ADD COLUMN waiting_for TEXT;
CREATE TABLE steadfast_inbox (
    id         BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES steadfast_sessions (id) ON DELETE CASCADE,
    kind       TEXT NOT NULL,
    name       TEXT NOT NULL,
    body       TEXT NOT NULL,
    at_ms      BIGINT NOT NULL,
    taken      BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX steadfast_inbox_pending ON steadfast_inbox (session_id, id) WHERE NOT taken;
CREATE INDEX steadfast_sessions_active ON steadfast_sessions (updated_at_ms)
    WHERE status IN ('running', 'idle', 'waiting');
