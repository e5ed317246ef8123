-- Forks and rewinds: a session's parent and fork point, and the segments of its ancestors' logs
-- it reads as the start of its own (see lineage.rs). Neither column changes after
-- the row is made, so appends' row updates stay in place (HOT).
ALTER TABLE steadfast_sessions ADD COLUMN parent TEXT;
ALTER TABLE steadfast_sessions ADD COLUMN forked_at BIGINT;
-- The first position of the session's own records (those before are its lineage's).
ALTER TABLE steadfast_sessions ADD COLUMN own_from BIGINT NOT NULL DEFAULT 1;
CREATE INDEX steadfast_sessions_by_parent ON steadfast_sessions (parent) WHERE parent IS NOT NULL;
CREATE TABLE steadfast_lineage (
    session_id TEXT NOT NULL,
    ancestor   TEXT NOT NULL,
    lo         BIGINT NOT NULL,
    hi         BIGINT NOT NULL,
    PRIMARY KEY (session_id, lo)
);
CREATE INDEX steadfast_lineage_by_ancestor ON steadfast_lineage (ancestor, hi);
