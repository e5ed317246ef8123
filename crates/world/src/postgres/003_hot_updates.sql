-- Appends update their session's row every time; with no index on the columns they
-- change, PostgreSQL can update the row in place (HOT) instead of writing index
-- entries on every append.
DROP INDEX IF EXISTS steadfast_sessions_active;
CREATE INDEX steadfast_sessions_status ON steadfast_sessions (status)
    WHERE status IN ('running', 'idle', 'waiting');
