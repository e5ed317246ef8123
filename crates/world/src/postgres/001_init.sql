-- Sessions, their leases and their event logs.
CREATE TABLE steadfast_sessions (
    id               TEXT PRIMARY KEY,
    owner            TEXT NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'new',
    title            TEXT NOT NULL DEFAULT '',
    last_seq         BIGINT NOT NULL DEFAULT 0,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    lease_holder     TEXT,
    lease_host       TEXT,
    lease_pid        INTEGER,
    lease_expires_ms BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX steadfast_sessions_created ON steadfast_sessions (created_at_ms DESC, id DESC);

CREATE TABLE steadfast_events (
    session_id TEXT NOT NULL REFERENCES steadfast_sessions (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    epoch      BIGINT NOT NULL,
    at_ms      BIGINT NOT NULL,
    schema     SMALLINT NOT NULL,
    kind       TEXT NOT NULL,
    body       BYTEA NOT NULL,
    checksum   TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- The fence, enforced by the database itself: an event can only be written under the
-- session's current lease epoch, whatever the client does.
CREATE FUNCTION steadfast_fence() RETURNS trigger AS $$
DECLARE
    current BIGINT;
BEGIN
    SELECT lease_epoch INTO current FROM steadfast_sessions WHERE id = NEW.session_id FOR SHARE;
    IF current IS DISTINCT FROM NEW.epoch THEN
        RAISE EXCEPTION 'stale fence: epoch % on session %, current %', NEW.epoch, NEW.session_id, current
            USING ERRCODE = 'SF001';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER steadfast_events_fence BEFORE INSERT ON steadfast_events
    FOR EACH ROW EXECUTE FUNCTION steadfast_fence();
