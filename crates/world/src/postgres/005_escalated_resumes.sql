-- An escalated session waits for a `resume` signal like a waiting one waits for its
-- signal, so the turn queue looks at it too.
DROP INDEX IF EXISTS steadfast_sessions_status;
CREATE INDEX steadfast_sessions_status ON steadfast_sessions (status)
    WHERE status IN ('running', 'idle', 'waiting', 'escalated');
