-- The outbox (see the world's `outbox` module): a trigger queues each record of a
-- kind the operator's webhook hears of, in the transaction that appends it.
CREATE TABLE steadfast_outbox (
    id              BIGSERIAL PRIMARY KEY,
    session_id      TEXT NOT NULL,
    seq             BIGINT NOT NULL,
    kind            TEXT NOT NULL,
    at_ms           BIGINT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_at_ms      BIGINT NOT NULL DEFAULT 0,
    delivered_at_ms BIGINT,
    status          INTEGER,
    last_error      TEXT,
    abandoned       BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX steadfast_outbox_due ON steadfast_outbox (next_at_ms, id)
    WHERE delivered_at_ms IS NULL AND NOT abandoned;

CREATE FUNCTION steadfast_outbox_queue() RETURNS trigger AS $$
BEGIN
    INSERT INTO steadfast_outbox (session_id, seq, kind, at_ms)
        VALUES (NEW.session_id, NEW.seq, NEW.kind, NEW.at_ms);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

-- The WHEN clause is checked without calling the function: other records cost
-- nothing more to append.
CREATE TRIGGER steadfast_events_outbox AFTER INSERT ON steadfast_events
    FOR EACH ROW
    WHEN (NEW.kind IN ('wait_started', 'escalated', 'turn_ended', 'turn_interrupted', 'session_ended'))
    EXECUTE FUNCTION steadfast_outbox_queue();
